// TcpStoreServer's state, shared by the event loop (comm/store_server.cc), the request handlers
// (comm/store_requests.cc) and the fuzz hook (comm/store_fuzz.cc). Internal to comm/store_*.cc.
#pragma once

#include "comm/store.h"
#include "comm/store_protocol.h"

namespace accel::dist {

// Note [store hardening]
// The store listens on a port that anyone on the network can reach, before any rank has proven
// anything, so the server must stay available to the job's own ranks whatever else connects:
//  * A connection has handshake_timeout to complete its HELLO, and at most max_unauthenticated
//    connections may be waiting to; a newcomer beyond that cap evicts the OLDEST of them. A real
//    client sends HELLO right after connecting and is served within one loop iteration, so
//    idle or slow sockets are what gets evicted; a client evicted anyway retries (the client
//    treats a dropped handshake as "not up yet", only an explicit refusal is final).
//  * Connections are read before new ones are accepted in each loop iteration, at most
//    max_unauthenticated / 2 are accepted per iteration, and a new connection is read at once
//    (its HELLO is usually there already): a connection accepted in one iteration is read
//    before the next batch of accepts can evict it.
//  * max_connections caps all connections. At the cap an unauthenticated one is evicted; when
//    all are authenticated the newcomer is refused with an error that names the limit.
//  * accept() failing with EMFILE/ENFILE (out of file descriptors) leaves the connection in the
//    backlog, so the listener stays readable and a loop that polls it again would spin at
//    100 % CPU. Instead the oldest unauthenticated connection is dropped to free a descriptor
//    (if it is older than kMinAgeToEvictForFd: accept() says EMFILE even when nobody is queued,
//    right after taking the last descriptor for a client whose HELLO is still in flight), or,
//    if there is none, the listener is left out of poll() for a backoff (50 ms doubling to
//    1 s). Queued clients are accepted once descriptors free up; they wait in the backlog
//    meanwhile, within their own connect timeout.
//  * Stored keys and bytes (keys plus values) are capped; a write past a cap gets an error
//    reply naming the limit and changes nothing. Frame sizes were capped already (Note [store
//    protocol]).
// Authenticated connections are never timed out: ranks keep theirs for the whole job.

namespace store_wire {
constexpr Milliseconds kAcceptBackoffMin{50};
constexpr Milliseconds kAcceptBackoffMax{1000};
constexpr Milliseconds kPollRetry{10};
constexpr Milliseconds kMinAgeToEvictForFd{1000};
constexpr int kMaxLoggedRefusals = 10;

// A key as an error message shows it: bounded, non-printable bytes escaped.
inline std::string printable_key(const std::string& k) {
  constexpr size_t kShown = 80;
  std::string s;
  for (size_t i = 0; i < k.size() && i < kShown; ++i) {
    unsigned char ch = static_cast<unsigned char>(k[i]);
    if (ch >= 0x20 && ch < 0x7f && ch != '\\') {
      s.push_back(char(ch));
    } else {
      static const char* hex = "0123456789abcdef";
      s += "\\x";
      s.push_back(hex[ch >> 4]);
      s.push_back(hex[ch & 15]);
    }
  }
  if (k.size() > kShown) s += "... (" + std::to_string(k.size()) + " bytes)";
  return s;
}
}  // namespace store_wire

using namespace store_wire;  // NOLINT: internal header of comm/store_*.cc

struct TcpStoreServer::Impl {
  enum Stage : uint8_t { kExpectHello, kExpectAuth, kAuthenticated };
  struct Conn {
    int fd = -1;  // -1: an in-memory connection (store_fuzz_one)
    uint64_t id = 0;
    bool authed = false;  // the handshake completed (stage == kAuthenticated)
    Stage stage = kExpectHello;
    bool blocked = false;  // a GET/WAIT of this connection is pending; later frames wait
    Clock::time_point accepted_at;
    std::string peer;  // "address:port", for log lines
    std::string in;
    std::string out;
    std::string client_nonce, server_nonce;  // during the handshake
    int32_t member = -1;                     // the rank it claimed in HELLO
    bool left = false;                       // it sent LEAVE
    std::string leave_reason;                // and why, when it gave up
  };
  struct Waiter {
    uint64_t conn_id;
    uint8_t op;  // kGet or kWait
    std::vector<std::string> keys;
    Clock::time_point deadline;
    std::vector<int32_t> watch;  // ranks whose leaving ends the wait (Note [store membership])
  };
  struct Member {
    int conns = 0;  // open authenticated connections claiming this rank
    StoreMember::State state = StoreMember::State::kConnected;
    std::string address;
    Clock::time_point since;
    std::string reason;  // LEAVE's: why its initialisation failed (empty: it finished)
  };

  int listen_fd = -1;
  int wake_pipe[2] = {-1, -1};
  size_t max_message = kDefaultMaxStoreMessage;
  std::string token;
  std::string generation;      // Note [store generations]
  std::string job_secret;      // Note [store authentication]
  bool deterministic = false;  // store_fuzz_one: fixed nonces, so seeds can hold valid proofs
  Milliseconds handshake_timeout = kDefaultStoreHandshakeTimeout;
  size_t max_connections = kDefaultStoreMaxConnections;
  size_t max_unauthenticated = kDefaultStoreMaxUnauthenticated;
  size_t max_keys = kDefaultStoreMaxKeys;
  size_t max_total_bytes = kDefaultStoreMaxTotalBytes;
  bool log_enabled = true;
  std::thread thread;
  std::atomic<bool> stop{false};

  // Counters, read by other threads through stats().
  std::atomic<int64_t> rejected{0}, open{0}, unauthed_open{0}, auth_failures{0},
      handshake_timeouts{0}, evicted{0}, refused_full{0}, accept_pauses{0}, stale_generation{0},
      members_stat{0}, keys_stat{0}, bytes_stat{0};

  // Owned by the server thread.
  std::map<uint64_t, Conn> conns;  // ordered: deterministic service order
  std::set<uint64_t> unauthed;     // ids grow with accept time: begin() is the oldest
  uint64_t next_id = 1;
  std::unordered_map<std::string, std::string> data;
  size_t total_bytes = 0;  // sum of key and value sizes in `data`
  std::deque<Waiter> waiters;
  std::map<int32_t, Member> members;  // Note [store membership]
  Clock::time_point accept_resume{};  // listener left out of poll() until then (EMFILE)
  Milliseconds accept_backoff{0};
  uint64_t counted_conn = 0;  // store_fuzz_one: frames this connection sent once authenticated
  size_t counted_frames = 0;

  void configure(const StoreOptions& o);
  void run();
  int poll_timeout_ms(Clock::time_point now) const;
  void accept_some();
  bool make_room_for_one();
  uint64_t add_conn(int fd, std::string peer);
  void on_readable(Conn& c);
  size_t input_room(const Conn& c) const;
  // Appends received bytes and handles the complete frames; false: the connection must close.
  bool on_bytes(Conn& c, const char* p, size_t n);
  bool process_frames(Conn& c);  // false: connection must close
  // Handles one request; returns false when the connection must close.
  bool handle(Conn& c, const char* body, size_t n);
  bool handle_hello(Conn& c, Reader& r);
  bool handle_auth(Conn& c, Reader& r);
  bool handle_wait(Conn& c, Reader& r, uint8_t op);  // GET and WAIT
  bool handle_add(Conn& c, Reader& r);
  bool handle_compare_set(Conn& c, Reader& r);
  void reply_flag(Conn& c, bool flag);  // kOk with one byte: 1 or 0
  // Refuses the handshake: counts it, logs the first few, replies `why` and closes.
  bool refuse(Conn& c, const std::string& why, bool auth_failure);
  std::string server_nonce();
  void reply(Conn& c, uint8_t status, const std::string& payload);
  void reply_error(Conn& c, const std::string& msg);  // connection stays open
  void reply_error_and_close(Conn& c, const std::string& msg);
  void flush(Conn& c);
  void close_conn(uint64_t id);
  void evict_oldest_unauthed();
  void expire_handshakes(Clock::time_point now);
  bool all_present(const std::vector<std::string>& keys) const {
    for (auto& k : keys)
      if (!data.count(k)) return false;
    return true;
  }
  // Empty when `key` may hold `value_size` bytes within max_keys/max_total_bytes, else why not.
  std::string check_room(const std::string& key, size_t value_size) const;
  void put_value(const std::string& key, std::string value);
  bool erase_key(const std::string& key);
  void update_data_stats() {
    keys_stat = int64_t(data.size());
    bytes_stat = int64_t(total_bytes);
  }
  void on_key_created();
  void expire_waiters(Clock::time_point now);
  void complete_waiter(const Waiter& w, uint8_t status, const std::string& message = {},
                       int32_t who = -1);
  // Membership (Note [store membership]).
  void member_joined(Conn& c);
  void member_closed(const Conn& c);
  // Why a watched rank cannot be waited for any more (it left), or empty.
  std::string left_message(const std::vector<int32_t>& watch, int32_t* who) const;
  std::string members_reply() const;
  template <typename... Args>
  void log(Args&&... args) {
    if (!log_enabled) return;
    std::string line = accel::detail::format_message("store", std::forward<Args>(args)...);
    std::fprintf(stderr, "%s\n", line.c_str());
  }
};

}  // namespace accel::dist
