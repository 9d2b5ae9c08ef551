// Rendezvous key-value store.
//
// `TcpStore` is served by rank 0 (a server thread inside that process) on MASTER_ADDR:MASTER_PORT;
// every rank, rank 0 included, talks to it as a client. Process groups use it to exchange Gloo
// addresses and the NCCL unique id, and to publish failures. See Note [store protocol] in
// store.cc for the wire format and its limits.
//
// Every blocking call has a timeout; a call that times out throws DistError and the store stays
// usable for the next call.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace accel::dist {

using Milliseconds = std::chrono::milliseconds;

constexpr Milliseconds kDefaultStoreTimeout{std::chrono::minutes(5)};
// The largest frame (one request or reply) the server accepts by default.
constexpr size_t kDefaultMaxStoreMessage = size_t(64) << 20;
// Keys are names, not data.
constexpr size_t kMaxStoreKeyBytes = 4096;

class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, const std::string& value) = 0;
  // Waits (up to the store timeout) until `key` exists, then returns its value.
  virtual std::string get(const std::string& key) = 0;
  // Adds `delta` to the integer stored at `key` (absent counts as 0); returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Waits until every key exists. Throws DistError naming the missing keys after `timeout`.
  virtual void wait(const std::vector<std::string>& keys, Milliseconds timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }
  // True when every key exists (does not wait).
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Returns whether the key existed.
  virtual bool delete_key(const std::string& key) = 0;
  // Sets `key` to `desired` when its current value is `expected` (or when it is absent and
  // `expected` is empty); returns the value after the call.
  virtual std::string compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) = 0;
  virtual int64_t num_keys() = 0;

  Milliseconds timeout() const { return timeout_; }
  virtual void set_timeout(Milliseconds t) { timeout_ = t; }

 protected:
  Milliseconds timeout_ = kDefaultStoreTimeout;
};

struct StoreOptions {
  Milliseconds timeout = kDefaultStoreTimeout;  // get/wait, and how long to retry connecting
  size_t max_message_bytes = kDefaultMaxStoreMessage;
  std::string token;  // shared secret; the server rejects clients that present another one
};

class TcpStoreServer;

class TcpStore : public Store {
 public:
  // When `is_server`, starts the server on host:port first (port 0 picks a free port; see
  // port()). Clients retry connecting until `options.timeout`, so ranks may start in any order.
  TcpStore(const std::string& host, int port, bool is_server, StoreOptions options = {});
  ~TcpStore() override;
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  std::string get(const std::string& key, Milliseconds timeout);
  int64_t add(const std::string& key, int64_t delta) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, Milliseconds timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  int64_t num_keys() override;

  const std::string& host() const { return host_; }
  int port() const { return port_; }
  bool is_server() const { return bool(server_); }
  TcpStoreServer* server() const { return server_.get(); }  // null on clients

 private:
  struct Reply {
    uint8_t status;
    std::string body;
  };
  void connect_locked();
  void disconnect_locked();
  // Sends one request frame and reads its reply; `wait_budget` is how long the server may
  // legitimately hold the request (get/wait), on top of a fixed grace for the round trip.
  Reply request(const char* op, const std::string& body, Milliseconds wait_budget);

  std::string host_;
  int port_;
  StoreOptions options_;
  std::unique_ptr<TcpStoreServer> server_;
  std::mutex mu_;  // one request in flight per client connection
  int fd_ = -1;
};

// Namespaces keys: every key is stored as "<prefix>/<key>".
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, Milliseconds timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  int64_t num_keys() override;  // of the whole base store
  void set_timeout(Milliseconds t) override;

  const std::shared_ptr<Store>& base() const { return base_; }

 private:
  std::string join(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> join(const std::vector<std::string>& keys) const;

  std::string prefix_;
  std::shared_ptr<Store> base_;
};

// The server alone: owns the listening socket and one thread that multiplexes all clients.
class TcpStoreServer {
 public:
  TcpStoreServer(const std::string& host, int port, size_t max_message_bytes, std::string token);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }
  // Counters for tests and diagnostics.
  int64_t rejected_connections() const;
  int64_t open_connections() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace accel::dist
