// Rendezvous key-value store.
//
// `TcpStore` is served by rank 0 (a server thread inside that process) on MASTER_ADDR:MASTER_PORT;
// every rank, rank 0 included, talks to it as a client. Process groups use it to exchange Gloo
// addresses and the NCCL unique id, and to publish failures. See Note [store protocol] in
// comm/store_protocol.h for the wire format and its limits.
//
// Every blocking call has a timeout; a call that times out throws DistError and the store stays
// usable for the next call. Client and server prove to each other that they hold the job's
// rendezvous token without sending it (Note [store authentication]); every server instance is a
// new generation whose clients cannot be confused with another's (Note [store generations]); the
// server knows which ranks have connected and which left (Note [store membership]).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"

namespace accel::dist {

using Milliseconds = std::chrono::milliseconds;

constexpr Milliseconds kDefaultStoreTimeout{std::chrono::minutes(5)};
// The largest frame (one request or reply) the server accepts by default.
constexpr size_t kDefaultMaxStoreMessage = size_t(64) << 20;
// Keys are names, not data.
constexpr size_t kMaxStoreKeyBytes = 4096;
// A TcpStore get/wait asks the server for at most this long at a time, so that interrupt() and
// the caller's own deadline take effect within it.
constexpr Milliseconds kWaitSlice{200};

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

  // A 32-byte key that every client of this store can compute and nobody else can, for one
  // `purpose` (the heartbeat datagrams of a group): derived from the rendezvous token and the
  // store's generation (TcpStore, Note [store authentication]); in-process stores use a random
  // secret of their own. Equal on every rank for the same purpose.
  virtual std::string derive_key(const std::string& purpose);
  // Makes a blocked get/wait of this client (and every later one, until clear_interrupt()) fail
  // within kWaitSlice with DistError(`why`): how a failure detected elsewhere (a lost heartbeat)
  // ends a rank's wait during initialisation. Thread-safe.
  virtual void interrupt(const std::string& why);
  virtual void clear_interrupt();
  // The reason given to interrupt(), empty when not interrupted.
  std::string interrupted() const;
  // What the store knows about `rank` when a wait for one of its keys timed out: e.g. "it never
  // connected to the rendezvous store (ranks 0, 2 did)". Empty when the store does not track
  // ranks (init_process_group's TcpStore does while it forms the default group).
  virtual std::string describe_rank(int /*rank*/) { return {}; }

 protected:
  Milliseconds timeout_ = kDefaultStoreTimeout;
  // For the in-process defaults of derive_key/interrupt.
  mutable std::mutex base_mu_;
  std::string local_secret_;  // random, made on first use
  std::string interrupted_;   // non-empty: waits fail with it
};

// A blocking get/wait ended because a rank it watched left the rendezvous store (its connection
// closed: the process exited, was killed, or gave up; Note [store membership]).
class StoreMemberLeft : public DistError {
 public:
  StoreMemberLeft(int rank, std::string detail, const std::string& what)
      : DistError(what), rank_(rank), detail_(std::move(detail)) {}
  int rank() const { return rank_; }
  // The server's words without the op prefix: "rank 1 closed its connection to ...".
  const std::string& detail() const { return detail_; }

 private:
  int rank_;
  std::string detail_;
};

// Waits until `key` exists, up to `deadline`, for a key that rank `peer` publishes while a group
// forms. On failure throws DistError "[init] <who>: rank <peer> did not publish its <what> within
// <timeout> ms (<what the store knows about it: Store::describe_rank>)", or "... left before
// publishing its <what>: <why>" when the store saw it go (StoreMemberLeft).
void wait_peer_key(Store& store, const std::string& key, int peer,
                   std::chrono::steady_clock::time_point deadline, Milliseconds timeout,
                   const std::string& who, const char* what);

// A rank as the store's server saw it (TcpStore::members()).
struct StoreMember {
  enum class State : uint8_t { kConnected = 1, kLeft = 2, kDeparted = 3 };
  int rank = -1;
  State state = State::kConnected;
  std::string address;  // "ip:port" of its latest connection
  double seconds = 0;   // since it connected (kConnected) or its connection closed
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
  // Shared secret. Client and server must hold the same one (both empty counts as the same);
  // each proves it to the other without sending it (Note [store authentication]); the server
  // refuses any other and counts the refusal (TcpStoreServer::stats()).
  std::string token;
  // Client: this client's rank in the job, or -1. The server records which ranks connected and
  // which left (Note [store membership]); init_process_group sets it.
  int member = -1;
  // Client: a server of this generation (TcpStore::generation()) counts as not up yet, and the
  // client keeps retrying until another one answers: the store of this process's previous
  // init_process_group, which a fast rank must not join (Note [store generations]).
  std::string avoid_generation;

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
  int64_t stale_generation = 0;         // clients of another generation of the store, refused
  int64_t members = 0;                  // ranks that have connected (Note [store membership])
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
  std::string derive_key(const std::string& purpose) override;
  std::string describe_rank(int rank) override;

  // Blocking get/wait requests of this client fail with StoreMemberLeft as soon as one of these
  // ranks leaves the store (immediately if one already has); empty: none. init_process_group
  // watches every other rank while the default group forms.
  void watch_members(std::vector<int> ranks);
  // Every rank that has connected to the server (with StoreOptions::member set), by rank.
  std::vector<StoreMember> members();
  // Leaves the store saying why this rank gives up (its initialisation failed) and closes the
  // connection; ranks watching it get the reason (Note [store membership]). Never reconnects
  // (the store may be gone). The destructor leaves without a reason.
  void leave(const std::string& reason);

  const std::string& host() const { return host_; }
  int port() const { return port_; }
  bool is_server() const { return bool(server_); }
  TcpStoreServer* server() const { return server_.get(); }  // null on clients
  // The server's generation (16 random bytes it chose when it started), as this client joined it.
  const std::string& generation() const { return generation_; }

 private:
  struct Reply {
    uint8_t status;
    std::string body;
  };
  // Connects and authenticates, retrying with backoff until `timeout` while the server is not up
  // (or drops us to make room, or is the generation to avoid); a refusal (wrong token, store
  // full, another generation) throws at once.
  void connect_locked(Milliseconds timeout);
  void disconnect_locked();
  // Throws DistError(op, why) when interrupt() was called.
  void check_interrupt(const char* op);
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
  std::string generation_;    // set by the first handshake; later reconnects must find the same
  std::string job_secret_;    // from the server after authentication
  std::vector<int> watched_;  // under mu_
  bool left_ = false;         // leave() was called
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
  std::string derive_key(const std::string& purpose) override;  // the base's, for prefix/purpose
  void interrupt(const std::string& why) override;              // the base's
  void clear_interrupt() override;
  std::string describe_rank(int rank) override;

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
// The server's nonce (32 x 0x5a), generation (16 x 0x01) and job secret (32 x 0x02) are fixed,
// so that a seed can carry a valid handshake (tests/fuzz/make_corpus.py computes its proof).
// Returns how many frames the fuzzed connection sent after it was authenticated (tests check
// that the seeds still get that far after a protocol change).
size_t store_fuzz_one(const uint8_t* data, size_t size);
}  // namespace detail

}  // namespace accel::dist
