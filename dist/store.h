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

// Server limits (see "Store hardening" in docs/dist.md). The defaults are far above what a
// rendezvous needs (a few keys per rank) and far below what exhausts a host.
constexpr Milliseconds kDefaultStoreHandshakeTimeout{std::chrono::seconds(10)};
constexpr size_t kDefaultStoreMaxConnections = 4096;
constexpr size_t kDefaultStoreMaxUnauthenticated = 128;
constexpr size_t kDefaultStoreMaxKeys = size_t(1) << 20;
constexpr size_t kDefaultStoreMaxTotalBytes = size_t(1) << 30;

struct StoreOptions {
  // Client: get/wait, how long to retry connecting, and the bound on every other request.
  Milliseconds timeout = kDefaultStoreTimeout;
  size_t max_message_bytes = kDefaultMaxStoreMessage;  // one request or reply, both sides
  // Shared secret. Client and server must present the same one (both empty counts as the same);
  // the server refuses any other and counts the refusal (TcpStoreServer::stats()).
  std::string token;

  // Server only.
  // A connection that has not completed its HELLO within this time is closed.
  Milliseconds handshake_timeout = kDefaultStoreHandshakeTimeout;
  // All open connections; beyond it the oldest unauthenticated one is dropped, or, when every
  // connection is authenticated, the newcomer is refused with an error naming this limit.
  size_t max_connections = kDefaultStoreMaxConnections;
  // Connections that have not said HELLO yet; beyond it the oldest of them is dropped.
  size_t max_unauthenticated = kDefaultStoreMaxUnauthenticated;
  // Stored keys, and stored bytes (keys plus values). A write past either gets an error reply
  // (DistError at the client naming the limit); the store is unchanged and stays usable.
  size_t max_keys = kDefaultStoreMaxKeys;
  size_t max_total_bytes = kDefaultStoreMaxTotalBytes;
};

// What the server has seen, for tests and diagnostics (a snapshot; counters only grow).
struct StoreServerStats {
  int64_t open_connections = 0;
  int64_t unauthenticated_connections = 0;  // open, HELLO not yet completed
  int64_t rejected_connections = 0;     // closed for a malformed or oversized frame or a bad HELLO
  int64_t auth_failures = 0;            // HELLOs with a wrong or missing token
  int64_t handshake_timeouts = 0;       // closed for not completing HELLO in handshake_timeout
  int64_t evicted_unauthenticated = 0;  // dropped to make room for newer connections
  int64_t refused_full = 0;             // refused: max_connections authenticated clients already
  int64_t accept_pauses = 0;            // accept() ran out of file descriptors; listening paused
  int64_t keys = 0;
  int64_t bytes = 0;  // keys plus values
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
  // Connects and says HELLO, retrying with backoff until `timeout` while the server is not up
  // (or drops us to make room); a refusal (wrong token, store full) throws at once.
  void connect_locked(Milliseconds timeout);
  void disconnect_locked();
  std::string where() const;  // host:port as a message names it
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
  // Only the server fields of `options` (and max_message_bytes, token) are used.
  TcpStoreServer(const std::string& host, int port, const StoreOptions& options);
  TcpStoreServer(const std::string& host, int port, size_t max_message_bytes, std::string token);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }
  // Counters for tests and diagnostics.
  int64_t rejected_connections() const;
  int64_t open_connections() const;
  StoreServerStats stats() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

namespace detail {
// Fuzzing entry point: feeds `data` to the server's real frame decoder and request handler as
// the byte stream of one connection, against a fresh in-memory store with small limits; no
// sockets, no threads. Pending get/wait requests are resolved by a second in-memory client
// setting the keys, or by expiring them. Aborts when the store's own accounting goes wrong.
void store_fuzz_one(const uint8_t* data, size_t size);
}  // namespace detail

}  // namespace accel::dist
