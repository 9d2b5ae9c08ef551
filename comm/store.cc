#include "comm/store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>

#include "core/error.h"
#include "comm/auth.h"

// Note [store protocol]
// Every message is a frame: u32 body length (little endian) followed by the body. A request body
// is a u8 opcode and its fields; strings are u32 length + bytes, integers little endian, "B<n>"
// n raw bytes. A connection starts with the two-step handshake of Note [store authentication]:
//   HELLO   u32 magic, u16 version (2), u8 flags (1: the client holds a token), B32 client nonce,
//           i32 member (the client's rank, -1: none), B16 generation it joined before (zeros: none)
//           -> u8 flags (1: the store holds a token), B32 server nonce, B16 generation,
//              B32 server proof
//   AUTH    u8 verified (1: the server's proof checked out), B32 client proof (when verified)
//           -> B32 job secret                       (the connection is authenticated)
// then any of
//   SET     str key, str value
//   GET     u64 timeout_ms, str key, u32 m, m x i32 watched rank   -> str value
//   ADD     str key, i64 delta                       -> i64 new value (stored as decimal text)
//   WAIT    u64 timeout_ms, u32 n, n x str key, u32 m, m x i32 watched rank -> (nothing)
//   CHECK   u32 n, n x str key                       -> u8 all present
//   DELETE  str key                                  -> u8 existed
//   CAS     str key, str expected, str desired       -> str value after the call
//   NUMKEYS                                          -> i64
//   MEMBERS                                          -> u32 n, n x (i32 rank, u8 state,
//                                                       str address, u64 ms since)
//   LEAVE   str reason (empty: finished)             -> (nothing); this client leaves cleanly
// A reply body is a u8 status (OK, TIMEOUT, ERROR, LEFT) and the result, or a str message for
// ERROR and LEFT (a watched rank left, Note [store membership]).
// The server never trusts a length: a frame longer than max_message_bytes (or, before the
// handshake completed, longer than kMaxHelloBytes, so an unauthenticated peer cannot make it
// allocate much), a body that ends inside a field, an unknown opcode, or trailing bytes get an
// ERROR reply and the connection is closed; other clients are unaffected. GET and WAIT carry
// their timeout so the server answers TIMEOUT itself and the client's connection stays in sync and
// usable. Version 1 (the token in clear in HELLO) is refused with a message naming both versions.
//
// Note [store authentication]
// Whoever listens on MASTER_PORT first receives every rank's handshake, so no rank may send its
// token, and a rank must not trust a server that cannot prove it holds the token either. With K
// the rendezvous token (empty without one), Nc and Ns 32 random bytes chosen by the client and
// the server for this connection, and G the server's generation:
//   server proof = HMAC-SHA256(K, "accel-store-v2 server" | Nc | Ns | G)
//   client proof = HMAC-SHA256(K, "accel-store-v2 client" | Nc | Ns | G)
// The server proves first; a client whose check fails sends AUTH with verified = 0 (so the server
// can count and log the refusal) and nothing derived from K, then fails: a squatter on the port
// learns the client's nonce and nothing else, and its answers are refused. Fresh nonces on both
// sides and the role in the label make a recorded or relayed proof useless on another connection
// (a reflection of the server's proof is not a client proof). Both sides compare in constant
// time (auth::equal_ct). A token on one side only is refused at HELLO, naming the side that
// lacks it (the flags say whether each holds one, nothing more). After AUTH the server sends a
// random job secret S; every client derives
//   job key = HMAC-SHA256(K, "accel-job-key" | G | S),  derive_key(p) = HMAC(job key, p)
// which keys the heartbeat datagrams (Note [heartbeat authentication]): without a token S is
// what keeps another job's or a stale generation's datagrams out (anyone who can reach a tokenless
// store can read it: such a store is for one host or a trusted network).
// Not covered: the frames after the handshake are neither encrypted nor authenticated, so a host
// on the path that can intercept and rewrite TCP (a man in the middle relaying both handshakes)
// can read and alter keys; use a private network for the rendezvous.
//
// Note [store generations]
// Each TcpStoreServer draws a random 16-byte generation G when it starts. A client records the G
// of its first handshake and presents it on every reconnect; a server of another generation
// refuses it ("the rendezvous store at ... restarted"), so a rank of an earlier
// init_process_group cannot wander into a later one's keys. init_process_group passes the
// generation of the previous group's store in this process as StoreOptions::avoid_generation:
// when rank 1 re-initialises faster than rank 0 has torn its old store down, it finds the old
// generation, closes, and keeps retrying until rank 0's new store answers, instead of reading
// the previous cycle's addresses (it used to fail within 1-3 init/destroy cycles).
//
// Note [store membership]
// HELLO carries the client's rank (StoreOptions::member). The server counts each rank's
// authenticated connections; when the last one closes the rank has *left* (it sent LEAVE first:
// its TcpStore was destroyed, on a normal exit or after its init failed) or *departed* (no LEAVE:
// the process exited or was killed; the kernel closes its socket at once). A GET or WAIT lists
// the ranks it watches; if one of them has left or departed (or does so while the request waits)
// the request ends with LEFT and a message naming the rank, its address and when, instead of
// running into its timeout. MEMBERS lists every rank seen, so a rank whose wait timed out can say
// which peers never connected at all. A stopped process keeps its connection open: that is the
// heartbeat's to find (comm/heartbeat.h), which runs from the start of group formation.

namespace accel::dist {

namespace {

constexpr uint32_t kMagic = 0x54534341;  // "ACST"
constexpr uint16_t kVersion = 2;
constexpr size_t kNonceBytes = 32;
constexpr size_t kGenerationBytes = 16;
constexpr size_t kProofBytes = 32;
constexpr size_t kSecretBytes = 32;
constexpr uint8_t kFlagToken = 1;
// Ranks a client may claim (HELLO's member); the map of members is bounded by max_connections.
constexpr int32_t kMaxMemberRank = 1 << 24;
const char* const kServerLabel = "accel-store-v2 server";
const char* const kClientLabel = "accel-store-v2 client";
const char* const kJobKeyLabel = "accel-job-key";
constexpr size_t kMaxHelloBytes = 4096;
constexpr size_t kMaxKeysPerRequest = 1 << 16;
// Added to a request's own wait budget before a client gives up on a silent server.
constexpr Milliseconds kReplyGrace{std::chrono::seconds(10)};

enum Op : uint8_t {
  kHello = 0,
  kSet = 1,
  kGet = 2,
  kAdd = 3,
  kWait = 4,
  kCheck = 5,
  kDelete = 6,
  kCompareSet = 7,
  kNumKeys = 8,
  kAuth = 9,
  kMembers = 10,
  kLeave = 11,
};
enum Status : uint8_t { kOk = 0, kTimeout = 1, kErr = 2, kLeft = 3 };

// ---- encoding ----
void put_u8(std::string& s, uint8_t v) { s.push_back(char(v)); }
template <typename T>
void put_int(std::string& s, T v) {
  static_assert(std::is_integral_v<T>);
  using U = std::make_unsigned_t<T>;
  U u = U(v);
  for (size_t i = 0; i < sizeof(T); ++i) s.push_back(char((u >> (8 * i)) & 0xff));
}
void put_str(std::string& s, const std::string& v) {
  put_int<uint32_t>(s, uint32_t(v.size()));
  s.append(v);
}
std::string frame(const std::string& body) {
  std::string f;
  f.reserve(body.size() + 4);
  put_int<uint32_t>(f, uint32_t(body.size()));
  f.append(body);
  return f;
}

struct ParseError {
  std::string what;
};

// Bounds-checked reader over one frame body.
class Reader {
 public:
  Reader(const char* p, size_t n) : p_(p), n_(n) {}
  uint8_t u8() {
    need(1);
    return uint8_t(p_[pos_++]);
  }
  template <typename T>
  T integer() {
    need(sizeof(T));
    using U = std::make_unsigned_t<T>;
    U u = 0;
    for (size_t i = 0; i < sizeof(T); ++i) u |= U(uint8_t(p_[pos_ + i])) << (8 * i);
    pos_ += sizeof(T);
    return T(u);
  }
  std::string bytes(size_t n) {
    need(n);
    std::string s(p_ + pos_, n);
    pos_ += n;
    return s;
  }
  std::string str(size_t max_len) {
    uint32_t len = integer<uint32_t>();
    if (len > max_len)
      throw ParseError{"string of " + std::to_string(len) + " bytes exceeds " +
                       std::to_string(max_len)};
    need(len);
    std::string s(p_ + pos_, len);
    pos_ += len;
    return s;
  }
  void finish() const {
    if (pos_ != n_) throw ParseError{std::to_string(n_ - pos_) + " trailing bytes"};
  }
  size_t remaining() const { return n_ - pos_; }

 private:
  void need(size_t k) const {
    if (n_ - pos_ < k) throw ParseError{"message ends inside a field"};
  }
  const char* p_;
  size_t n_;
  size_t pos_ = 0;
};

uint32_t read_u32_le(const char* p) {
  return uint32_t(uint8_t(p[0])) | uint32_t(uint8_t(p[1])) << 8 | uint32_t(uint8_t(p[2])) << 16 |
         uint32_t(uint8_t(p[3])) << 24;
}

std::string errno_str(int e) { return std::strerror(e); }

bool parse_i64(const std::string& s, int64_t* out) {
  if (s.empty() || s.size() > 20) return false;
  size_t i = 0;
  bool neg = false;
  if (s[0] == '-') {
    neg = true;
    i = 1;
    if (s.size() == 1) return false;
  }
  __int128 v = 0;
  for (; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
    v = v * 10 + (s[i] - '0');
    if (v > (__int128(1) << 63)) return false;
  }
  if (neg) v = -v;
  if (v > std::numeric_limits<int64_t>::max() || v < std::numeric_limits<int64_t>::min())
    return false;
  *out = int64_t(v);
  return true;
}

std::string proof(const std::string& token, const char* label, const std::string& nc,
                  const std::string& ns, const std::string& gen) {
  return auth::hmac_sha256_str(token, std::string(label) + nc + ns + gen);
}

std::string join_keys(const std::vector<std::string>& keys) {
  std::string s;
  for (size_t i = 0; i < keys.size() && i < 8; ++i) {
    if (i) s += ", ";
    s += "'" + keys[i] + "'";
  }
  if (keys.size() > 8) s += ", ... (" + std::to_string(keys.size()) + " keys)";
  return s;
}

void set_nonblocking(int fd) {
  int fl = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}
void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

using Clock = std::chrono::steady_clock;

// Frame limit for a connection: small until the client has said HELLO.
size_t authed_limit_impl(bool authed, size_t max_message) {
  return authed ? max_message : kMaxHelloBytes;
}

// getaddrinfo wrapper: resolved addresses for host:port (port may be 0 for bind).
struct AddrList {
  addrinfo* head = nullptr;
  ~AddrList() {
    if (head) freeaddrinfo(head);
  }
};
// Returns getaddrinfo's code (0 on success).
int resolve(const std::string& host, int port, bool passive, AddrList* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  std::string h = host;
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  std::string p = std::to_string(port);
  return getaddrinfo(h.empty() ? nullptr : h.c_str(), p.c_str(), &hints, &out->head);
}

}  // namespace

// =============================== server ===============================

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

namespace {
constexpr Milliseconds kAcceptBackoffMin{50};
constexpr Milliseconds kAcceptBackoffMax{1000};
constexpr Milliseconds kPollRetry{10};
constexpr Milliseconds kMinAgeToEvictForFd{1000};
constexpr int kMaxLoggedRefusals = 10;
}  // namespace

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
  std::atomic<int64_t> rejected{0};
  std::atomic<int64_t> open{0};
  std::atomic<int64_t> unauthed_open{0};
  std::atomic<int64_t> auth_failures{0};
  std::atomic<int64_t> handshake_timeouts{0};
  std::atomic<int64_t> evicted{0};
  std::atomic<int64_t> refused_full{0};
  std::atomic<int64_t> accept_pauses{0};
  std::atomic<int64_t> stale_generation{0};
  std::atomic<int64_t> members_stat{0};
  std::atomic<int64_t> keys_stat{0};
  std::atomic<int64_t> bytes_stat{0};

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

namespace {
std::string peer_name(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "unknown peer";
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
    return "[" + std::string(host) + "]:" + std::to_string(port);
  }
  auto* a = reinterpret_cast<sockaddr_in*>(&ss);
  inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
  port = ntohs(a->sin_port);
  return std::string(host) + ":" + std::to_string(port);
}

// A key as an error message shows it: bounded, non-printable bytes escaped.
std::string printable_key(const std::string& k) {
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
}  // namespace

void TcpStoreServer::Impl::configure(const StoreOptions& o) {
  ACCEL_CHECK(o.max_message_bytes >= kMaxHelloBytes && o.max_message_bytes <= UINT32_MAX - 64,
              DistError, "store", "max_message_bytes ", o.max_message_bytes, " is outside [",
              kMaxHelloBytes, ", ", UINT32_MAX - 64, "]");
  ACCEL_CHECK(o.handshake_timeout.count() > 0, DistError, "store",
              "handshake_timeout must be positive, got ", o.handshake_timeout.count(), " ms");
  ACCEL_CHECK(o.max_connections >= 1 && o.max_unauthenticated >= 1, DistError, "store",
              "max_connections (", o.max_connections, ") and max_unauthenticated (",
              o.max_unauthenticated, ") must be at least 1");
  max_message = o.max_message_bytes;
  token = o.token;
  handshake_timeout = o.handshake_timeout;
  max_connections = o.max_connections;
  max_unauthenticated = std::min(o.max_unauthenticated, o.max_connections);
  max_keys = o.max_keys;
  max_total_bytes = o.max_total_bytes;
  generation = auth::random_bytes(kGenerationBytes);
  job_secret = auth::random_bytes(kSecretBytes);
}

TcpStoreServer::TcpStoreServer(const std::string& host, int port, size_t max_message_bytes,
                               std::string token)
    : TcpStoreServer(host, port, [&] {
        StoreOptions o;
        o.max_message_bytes = max_message_bytes;
        o.token = std::move(token);
        return o;
      }()) {}

TcpStoreServer::TcpStoreServer(const std::string& host, int port, const StoreOptions& options)
    : impl_(std::make_unique<Impl>()) {
  ACCEL_CHECK(port >= 0 && port <= 65535, DistError, "store", "port ", port,
              " is outside [0, 65535]");
  impl_->configure(options);
  AddrList addrs;
  int rc = resolve(host, port, false, &addrs);
  ACCEL_CHECK(rc == 0, DistError, "store", "cannot resolve '", host, "': ", gai_strerror(rc));
  int last_errno = 0;
  for (addrinfo* a = addrs.head; a; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last_errno = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 1024) == 0) {
      impl_->listen_fd = fd;
      break;
    }
    last_errno = errno;
    close(fd);
  }
  ACCEL_CHECK(impl_->listen_fd >= 0, DistError, "store", "cannot listen on ", host, ":", port, ": ",
              errno_str(last_errno));
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  getsockname(impl_->listen_fd, reinterpret_cast<sockaddr*>(&ss), &len);
  port_ = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                   : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  set_nonblocking(impl_->listen_fd);
  if (pipe2(impl_->wake_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    int e = errno;
    close(impl_->listen_fd);
    ACCEL_THROW(DistError, "store", "pipe failed: ", errno_str(e));
  }
  impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
}

TcpStoreServer::~TcpStoreServer() {
  impl_->stop = true;
  char b = 1;
  ssize_t ignored = write(impl_->wake_pipe[1], &b, 1);
  (void)ignored;
  if (impl_->thread.joinable()) impl_->thread.join();
  for (auto& [id, c] : impl_->conns) close(c.fd);
  close(impl_->listen_fd);
  close(impl_->wake_pipe[0]);
  close(impl_->wake_pipe[1]);
}

int64_t TcpStoreServer::rejected_connections() const { return impl_->rejected.load(); }
int64_t TcpStoreServer::open_connections() const { return impl_->open.load(); }
StoreServerStats TcpStoreServer::stats() const {
  StoreServerStats s;
  s.open_connections = impl_->open.load();
  s.unauthenticated_connections = impl_->unauthed_open.load();
  s.rejected_connections = impl_->rejected.load();
  s.auth_failures = impl_->auth_failures.load();
  s.handshake_timeouts = impl_->handshake_timeouts.load();
  s.evicted_unauthenticated = impl_->evicted.load();
  s.refused_full = impl_->refused_full.load();
  s.accept_pauses = impl_->accept_pauses.load();
  s.stale_generation = impl_->stale_generation.load();
  s.members = impl_->members_stat.load();
  s.keys = impl_->keys_stat.load();
  s.bytes = impl_->bytes_stat.load();
  return s;
}

int TcpStoreServer::Impl::poll_timeout_ms(Clock::time_point now) const {
  std::optional<Clock::time_point> next;
  auto consider = [&](Clock::time_point t) {
    if (!next || t < *next) next = t;
  };
  for (auto& w : waiters) consider(w.deadline);
  if (!unauthed.empty()) consider(conns.at(*unauthed.begin()).accepted_at + handshake_timeout);
  if (now < accept_resume) consider(accept_resume);
  if (!next) return -1;
  auto d = std::chrono::duration_cast<Milliseconds>(*next - now).count() + 1;
  return int(std::clamp<int64_t>(d, 0, 60000));
}

void TcpStoreServer::Impl::run() {
  std::vector<pollfd> fds;
  std::vector<uint64_t> ids;
  bool last_pass = false;
  while (true) {
    // Stopping: one more pass without waiting, so that what clients sent last (a rank's LEAVE
    // with the reason its initialisation failed, its closed connection) still reaches the ranks
    // waiting on it (Note [store membership]).
    if (stop.load()) {
      if (last_pass) break;
      last_pass = true;
    }
    fds.clear();
    ids.clear();
    auto now = Clock::now();
    bool listening = now >= accept_resume;
    fds.push_back({wake_pipe[0], POLLIN, 0});
    fds.push_back({listening ? listen_fd : -1, POLLIN, 0});  // poll() skips a negative fd
    for (auto& [id, c] : conns) {
      short ev = 0;
      // Stop reading from a connection whose buffered input already exceeds one frame (it is
      // blocked on a wait) or whose replies pile up unread: bounded memory per client.
      if (input_room(c) > 0 && c.out.size() < 2 * max_message + 64) ev |= POLLIN;
      if (!c.out.empty()) ev |= POLLOUT;
      fds.push_back({c.fd, ev, 0});
      ids.push_back(id);
    }
    int n = poll(fds.data(), fds.size(), last_pass ? 0 : poll_timeout_ms(now));
    if (n < 0 && errno != EINTR) {
      // Cannot happen with valid arguments; back off rather than spin or leave clients hanging.
      std::this_thread::sleep_for(kPollRetry);
      continue;
    }
    if (stop.load() && !last_pass) continue;  // take the last pass from the top
    if (n > 0) {
      // Existing connections first, then new ones: see Note [store hardening].
      for (size_t i = 0; i < ids.size(); ++i) {
        short re = fds[i + 2].revents;
        if (!re) continue;
        auto it = conns.find(ids[i]);
        if (it == conns.end()) continue;
        Conn& c = it->second;
        if (re & (POLLERR | POLLNVAL)) {
          close_conn(ids[i]);
          continue;
        }
        if (re & POLLOUT) flush(c);
        if (re & (POLLIN | POLLHUP)) on_readable(c);  // read() reports EOF for POLLHUP
      }
      if (fds[1].revents & POLLIN) accept_some();
    }
    now = Clock::now();
    expire_waiters(now);
    expire_handshakes(now);
  }
}

void TcpStoreServer::Impl::evict_oldest_unauthed() {
  if (unauthed.empty()) return;
  ++evicted;
  close_conn(*unauthed.begin());
}

bool TcpStoreServer::Impl::make_room_for_one() {
  if (unauthed.size() >= max_unauthenticated) evict_oldest_unauthed();
  if (conns.size() >= max_connections) evict_oldest_unauthed();
  return conns.size() < max_connections;
}

uint64_t TcpStoreServer::Impl::add_conn(int fd, std::string peer) {
  Conn c;
  c.fd = fd;
  c.id = next_id++;
  c.accepted_at = Clock::now();
  c.peer = std::move(peer);
  uint64_t id = c.id;
  conns.emplace(id, std::move(c));
  unauthed.insert(id);
  open = int64_t(conns.size());
  unauthed_open = int64_t(unauthed.size());
  return id;
}

void TcpStoreServer::Impl::accept_some() {
  size_t budget = std::max<size_t>(1, max_unauthenticated / 2);
  for (size_t k = 0; k < budget; ++k) {
    int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      int e = errno;
      if (e == EINTR || e == ECONNABORTED || e == EPROTO) continue;  // that peer gave up
      if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) {
        // accept() reports EMFILE whether or not anyone is queued, so only a connection that
        // had its chance to say HELLO is dropped for it, never one accepted a moment ago.
        if (!unauthed.empty() &&
            Clock::now() - conns.at(*unauthed.begin()).accepted_at >= kMinAgeToEvictForFd) {
          evict_oldest_unauthed();  // free a descriptor the cheap way, then try again
          continue;
        }
        // See Note [store hardening]: back off instead of polling a listener we cannot drain.
        bool episode_starts = accept_backoff.count() == 0;  // reset by a successful accept
        accept_backoff = std::clamp(accept_backoff * 2, kAcceptBackoffMin, kAcceptBackoffMax);
        accept_resume = Clock::now() + accept_backoff;
        ++accept_pauses;
        if (episode_starts)
          log("accept failed: ", errno_str(e), " with ", conns.size(),
              " connections open; new connections wait (retried every ", kAcceptBackoffMin.count(),
              " ms, backing off to ", kAcceptBackoffMax.count(), " ms) until descriptors free up");
      }
      return;  // EAGAIN: nothing queued
    }
    accept_backoff = Milliseconds(0);
    // Only now that someone is really waiting: make room for them.
    if (!make_room_for_one()) {
      // Every connection is authenticated: refuse the newcomer with a reason it can report.
      ++refused_full;
      ++rejected;
      char drain[kMaxHelloBytes + 4];
      ssize_t ignored = recv(fd, drain, sizeof(drain), MSG_DONTWAIT);  // avoid an RST
      (void)ignored;
      std::string p;
      put_str(p, "the store is full: it serves at most " + std::to_string(max_connections) +
                     " connections (StoreOptions::max_connections)");
      std::string body;
      put_u8(body, kErr);
      body += p;
      std::string f = frame(body);
      ignored = send(fd, f.data(), f.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      close(fd);
      continue;
    }
    set_nodelay(fd);
    uint64_t id = add_conn(fd, peer_name(fd));
    on_readable(conns.at(id));  // its HELLO is usually here already
  }
}

void TcpStoreServer::Impl::expire_handshakes(Clock::time_point now) {
  while (!unauthed.empty()) {
    Conn& c = conns.at(*unauthed.begin());
    if (now < c.accepted_at + handshake_timeout) break;
    ++handshake_timeouts;
    close_conn(c.id);
  }
}

size_t TcpStoreServer::Impl::input_room(const Conn& c) const {
  size_t limit = authed_limit_impl(c.authed, max_message) + 4;
  return c.in.size() < limit ? limit - c.in.size() : 0;
}

void TcpStoreServer::Impl::on_readable(Conn& c) {
  uint64_t id = c.id;
  char buf[65536];
  while (true) {
    size_t room = input_room(c);
    if (room == 0) break;
    ssize_t r = recv(c.fd, buf, std::min(sizeof(buf), room), 0);
    if (r > 0) {
      if (!on_bytes(c, buf, size_t(r))) {
        close_conn(id);
        return;
      }
      continue;
    }
    if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      close_conn(id);  // peer closed or broke: drop it and its pending waits
      return;
    }
    if (errno == EINTR) continue;
    break;
  }
}

bool TcpStoreServer::Impl::on_bytes(Conn& c, const char* p, size_t n) {
  c.in.append(p, n);
  return process_frames(c);
}

bool TcpStoreServer::Impl::process_frames(Conn& c) {
  size_t pos = 0;
  bool ok = true;
  while (!c.blocked && c.in.size() - pos >= 4) {
    uint32_t len = read_u32_le(c.in.data() + pos);
    size_t limit = authed_limit_impl(c.authed, max_message);
    if (len > limit) {
      ++rejected;
      reply_error_and_close(c, "message of " + std::to_string(len) +
                                   " bytes exceeds the limit of " + std::to_string(limit) +
                                   " bytes");
      ok = false;
      break;
    }
    if (c.in.size() - pos - 4 < len) break;
    if (!handle(c, c.in.data() + pos + 4, len)) {
      ok = false;
      break;
    }
    pos += 4 + size_t(len);
  }
  if (ok) c.in.erase(0, pos);
  return ok;
}

void TcpStoreServer::Impl::reply(Conn& c, uint8_t status, const std::string& payload) {
  std::string body;
  body.reserve(payload.size() + 1);
  put_u8(body, status);
  body.append(payload);
  c.out += frame(body);
  flush(c);
}

void TcpStoreServer::Impl::reply_error(Conn& c, const std::string& msg) {
  std::string p;
  put_str(p, msg);
  reply(c, kErr, p);
}

void TcpStoreServer::Impl::reply_error_and_close(Conn& c, const std::string& msg) {
  std::string p;
  put_str(p, msg);
  std::string body;
  put_u8(body, kErr);
  body += p;
  c.out += frame(body);
  // One best-effort write: the connection is closed right after, whatever the peer does.
  if (c.fd >= 0) {
    ssize_t ignored = send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)ignored;
    c.out.clear();
  }
}

void TcpStoreServer::Impl::flush(Conn& c) {
  if (c.fd < 0) return;  // in-memory: the caller reads c.out
  while (!c.out.empty()) {
    ssize_t w = send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      c.out.erase(0, size_t(w));
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    return;  // EAGAIN: POLLOUT resumes; a hard error shows up as POLLERR/EOF
  }
}

void TcpStoreServer::Impl::close_conn(uint64_t id) {
  auto it = conns.find(id);
  if (it == conns.end()) return;
  if (it->second.fd >= 0) close(it->second.fd);
  Conn closing = std::move(it->second);
  conns.erase(it);
  unauthed.erase(id);
  open = int64_t(conns.size());
  unauthed_open = int64_t(unauthed.size());
  waiters.erase(std::remove_if(waiters.begin(), waiters.end(),
                               [id](const Waiter& w) { return w.conn_id == id; }),
                waiters.end());
  if (closing.authed) member_closed(closing);  // may end other connections' waits
}

void TcpStoreServer::Impl::member_joined(Conn& c) {
  if (c.member < 0) return;
  auto it = members.find(c.member);
  // Bounded: a tokenless store lets anyone claim ranks. Past the cap a rank is not tracked.
  if (it == members.end() && members.size() >= max_connections) {
    c.member = -1;
    return;
  }
  Member& m = members[c.member];
  ++m.conns;
  m.state = StoreMember::State::kConnected;
  m.address = c.peer;
  m.since = Clock::now();
  members_stat = int64_t(members.size());
}

void TcpStoreServer::Impl::member_closed(const Conn& c) {
  if (c.member < 0) return;
  auto it = members.find(c.member);
  if (it == members.end() || it->second.conns <= 0) return;
  Member& m = it->second;
  if (--m.conns > 0) return;  // another connection of that rank is still open
  m.state = c.left ? StoreMember::State::kLeft : StoreMember::State::kDeparted;
  m.since = Clock::now();
  m.reason = c.left ? c.leave_reason : std::string();
  // Waiters watching that rank end now (a linear scan: waiters are few, one per blocked client).
  for (size_t i = 0; i < waiters.size();) {
    int32_t who = -1;
    std::string why = left_message(waiters[i].watch, &who);
    if (!why.empty() && !all_present(waiters[i].keys)) {
      Waiter w = std::move(waiters[i]);
      waiters.erase(waiters.begin() + long(i));
      complete_waiter(w, kLeft, why, who);
      i = 0;
    } else {
      ++i;
    }
  }
}

std::string TcpStoreServer::Impl::left_message(const std::vector<int32_t>& watch,
                                               int32_t* who) const {
  for (int32_t r : watch) {
    auto it = members.find(r);
    if (it == members.end() || it->second.state == StoreMember::State::kConnected) continue;
    const Member& m = it->second;
    char ago[32];
    std::snprintf(ago, sizeof(ago), "%.1f",
                  std::chrono::duration<double>(Clock::now() - m.since).count());
    *who = r;
    if (m.state == StoreMember::State::kLeft)
      return "rank " + std::to_string(r) + " left the rendezvous store (from " + m.address + ") " +
             ago + " s ago: " +
             (m.reason.empty() ? std::string("it gave up or finished")
                               : "its initialisation failed: " + m.reason);
    return "rank " + std::to_string(r) + " closed its connection to the rendezvous store (from " +
           m.address + ") " + ago + " s ago without leaving: the process exited or was killed";
  }
  return {};
}

std::string TcpStoreServer::Impl::members_reply() const {
  std::string p;
  put_int<uint32_t>(p, uint32_t(members.size()));
  const auto now = Clock::now();
  for (auto& [r, m] : members) {
    put_int<int32_t>(p, r);
    put_u8(p, uint8_t(m.state));
    put_str(p, m.address);
    put_int<uint64_t>(p, uint64_t(std::chrono::duration_cast<Milliseconds>(now - m.since).count()));
  }
  return p;
}

void TcpStoreServer::Impl::complete_waiter(const Waiter& w, uint8_t status,
                                           const std::string& message, int32_t who) {
  auto it = conns.find(w.conn_id);
  if (it == conns.end()) return;
  Conn& c = it->second;
  std::string payload;
  if (status == kOk && w.op == kGet) put_str(payload, data.at(w.keys[0]));
  if (status == kLeft) {
    put_int<int32_t>(payload, who);
    put_str(payload, message);
  }
  reply(c, status, payload);
  c.blocked = false;
  // Frames that arrived while blocked are processed now.
  if (!process_frames(c)) close_conn(w.conn_id);
}

void TcpStoreServer::Impl::on_key_created() {
  // Waiters are few (one per blocked client); a linear scan keeps the order deterministic.
  for (size_t i = 0; i < waiters.size();) {
    if (all_present(waiters[i].keys)) {
      Waiter w = std::move(waiters[i]);
      waiters.erase(waiters.begin() + long(i));
      complete_waiter(w, kOk);
      i = 0;  // complete_waiter may have processed frames that changed the list
    } else {
      ++i;
    }
  }
}

void TcpStoreServer::Impl::expire_waiters(Clock::time_point now) {
  for (size_t i = 0; i < waiters.size();) {
    if (waiters[i].deadline <= now) {
      Waiter w = std::move(waiters[i]);
      waiters.erase(waiters.begin() + long(i));
      complete_waiter(w, kTimeout);
      i = 0;
    } else {
      ++i;
    }
  }
}

std::string TcpStoreServer::Impl::check_room(const std::string& key, size_t value_size) const {
  auto it = data.find(key);
  size_t keys_after = data.size() + (it == data.end() ? 1 : 0);
  size_t freed = it == data.end() ? 0 : key.size() + it->second.size();
  size_t bytes_after = total_bytes - freed + key.size() + value_size;
  if (keys_after > max_keys)
    return "cannot create key '" + printable_key(key) + "': the store holds " +
           std::to_string(data.size()) + " keys, its limit (StoreOptions::max_keys) is " +
           std::to_string(max_keys);
  if (bytes_after > max_total_bytes)
    return "cannot store " + std::to_string(value_size) + " bytes under key '" +
           printable_key(key) + "': the store would hold " + std::to_string(bytes_after) +
           " bytes, its limit (StoreOptions::max_total_bytes) is " +
           std::to_string(max_total_bytes);
  return {};
}

void TcpStoreServer::Impl::put_value(const std::string& key, std::string value) {
  auto it = data.find(key);
  if (it == data.end()) {
    total_bytes += key.size() + value.size();
    data.emplace(key, std::move(value));
  } else {
    total_bytes = total_bytes - it->second.size() + value.size();
    it->second = std::move(value);
  }
  update_data_stats();
}

bool TcpStoreServer::Impl::erase_key(const std::string& key) {
  auto it = data.find(key);
  if (it == data.end()) return false;
  total_bytes -= key.size() + it->second.size();
  data.erase(it);
  update_data_stats();
  return true;
}

std::string TcpStoreServer::Impl::server_nonce() {
  if (!deterministic) return auth::random_bytes(kNonceBytes);
  std::string n(kNonceBytes, '\x5a');  // Note: store_fuzz_one; seeds hold proofs over this
  return n;
}

bool TcpStoreServer::Impl::refuse(Conn& c, const std::string& why, bool auth_failure) {
  ++rejected;
  int64_t n = auth_failure ? ++auth_failures : ++stale_generation;
  if (n <= kMaxLoggedRefusals)
    log("refused a client from ", c.peer, ": ", why,
        n == kMaxLoggedRefusals ? " (further refusals are counted, not logged)" : "");
  reply_error_and_close(c, why);
  return false;
}

bool TcpStoreServer::Impl::handle_hello(Conn& c, Reader& r) {
  uint32_t magic = r.integer<uint32_t>();
  uint16_t version = r.integer<uint16_t>();
  if (magic != kMagic) throw ParseError{"bad magic (not an accel store client)"};
  if (version != kVersion)
    throw ParseError{"protocol version " + std::to_string(version) + ", this store speaks " +
                     std::to_string(kVersion) +
                     " (every rank must run the same accel; version 1 sent the token in clear)"};
  uint8_t flags = r.u8();
  std::string nc = r.bytes(kNonceBytes);
  int32_t member = r.integer<int32_t>();
  std::string joined = r.bytes(kGenerationBytes);
  r.finish();
  if (member < -1 || member >= kMaxMemberRank)
    throw ParseError{"rank " + std::to_string(member) + " is outside [-1, " +
                     std::to_string(kMaxMemberRank) + ")"};
  // Both sides must hold a token or neither: a client with a token that reaches a tokenless
  // store has found some other job's store (or rank 0 lacks the token). Whether the tokens are
  // equal is for the proofs (Note [store authentication]).
  const bool client_token = (flags & kFlagToken) != 0;
  if (client_token != !token.empty()) {
    return refuse(c,
                  token.empty()
                      ? "rendezvous token rejected: the client presented one, but rank 0's store "
                        "has none (ACCEL_RENDEZVOUS_TOKEN is set on this rank but not on rank 0, "
                        "or this is another job's store)"
                      : "rendezvous token rejected: the store requires one and the client "
                        "presented none (ACCEL_RENDEZVOUS_TOKEN is unset on this rank)",
                  true);
  }
  if (joined != std::string(kGenerationBytes, '\0') && joined != generation) {
    return refuse(c,
                  "this client joined generation " + auth::hex(joined) +
                      " of the rendezvous store, which has been replaced by generation " +
                      auth::hex(generation) +
                      " (rank 0 destroyed its process group and initialised a new one, or "
                      "another job took the port): call init_process_group again",
                  false);
  }
  c.client_nonce = std::move(nc);
  c.server_nonce = server_nonce();
  c.member = member;
  c.stage = kExpectAuth;
  std::string p;
  put_u8(p, token.empty() ? 0 : kFlagToken);
  p += c.server_nonce;
  p += generation;
  p += proof(token, kServerLabel, c.client_nonce, c.server_nonce, generation);
  reply(c, kOk, p);
  return true;
}

bool TcpStoreServer::Impl::handle_auth(Conn& c, Reader& r) {
  uint8_t verified = r.u8();
  if (verified != 1) {
    r.finish();
    return refuse(c,
                  "rendezvous token rejected: the client could not verify this store's proof "
                  "(its ACCEL_RENDEZVOUS_TOKEN differs from rank 0's)",
                  true);
  }
  std::string theirs = r.bytes(kProofBytes);
  r.finish();
  std::string want = proof(token, kClientLabel, c.client_nonce, c.server_nonce, generation);
  if (!auth::equal_ct(theirs.data(), want.data(), kProofBytes)) {
    return refuse(c,
                  "rendezvous token rejected: the client's ACCEL_RENDEZVOUS_TOKEN differs from "
                  "rank 0's",
                  true);
  }
  c.stage = kAuthenticated;
  c.authed = true;
  c.client_nonce.clear();
  c.server_nonce.clear();
  unauthed.erase(c.id);
  unauthed_open = int64_t(unauthed.size());
  member_joined(c);
  reply(c, kOk, job_secret);
  return true;
}

bool TcpStoreServer::Impl::handle(Conn& c, const char* body, size_t n) {
  try {
    Reader r(body, n);
    uint8_t op = r.u8();
    if (c.authed && c.id == counted_conn) ++counted_frames;
    if (c.stage == kExpectHello) {
      if (op != kHello) throw ParseError{"the first message must be HELLO"};
      return handle_hello(c, r);
    }
    if (c.stage == kExpectAuth) {
      if (op != kAuth) throw ParseError{"the second message must be AUTH"};
      return handle_auth(c, r);
    }
    switch (op) {
      case kSet: {
        std::string key = r.str(kMaxStoreKeyBytes);
        std::string value = r.str(max_message);
        r.finish();
        if (std::string why = check_room(key, value.size()); !why.empty()) {
          reply_error(c, why);
          return true;
        }
        bool created = !data.count(key);
        put_value(key, std::move(value));
        reply(c, kOk, "");
        if (created) on_key_created();
        return true;
      }
      case kGet:
      case kWait: {
        uint64_t timeout_ms = r.integer<uint64_t>();
        std::vector<std::string> keys;
        if (op == kGet) {
          keys.push_back(r.str(kMaxStoreKeyBytes));
        } else {
          uint32_t nk = r.integer<uint32_t>();
          if (nk > kMaxKeysPerRequest) throw ParseError{"too many keys"};
          // Each key needs at least its 4-byte length: reject counts the body cannot hold
          // before reserving anything.
          if (size_t(nk) * 4 > r.remaining()) throw ParseError{"key count exceeds message"};
          keys.reserve(nk);
          for (uint32_t i = 0; i < nk; ++i) keys.push_back(r.str(kMaxStoreKeyBytes));
        }
        uint32_t nw = r.integer<uint32_t>();
        if (nw > kMaxKeysPerRequest || size_t(nw) * 4 > r.remaining())
          throw ParseError{"watched rank count exceeds message"};
        std::vector<int32_t> watch(nw);
        for (auto& w : watch) w = r.integer<int32_t>();
        r.finish();
        if (all_present(keys)) {
          std::string payload;
          if (op == kGet) put_str(payload, data.at(keys[0]));
          reply(c, kOk, payload);
          return true;
        }
        int32_t who = -1;
        if (std::string why = left_message(watch, &who); !why.empty()) {
          std::string payload;
          put_int<int32_t>(payload, who);
          put_str(payload, why);
          reply(c, kLeft, payload);
          return true;
        }
        // Clamp so the deadline arithmetic cannot overflow.
        timeout_ms = std::min<uint64_t>(timeout_ms, uint64_t(365) * 24 * 3600 * 1000);
        c.blocked = true;
        waiters.push_back(
            {c.id, op, std::move(keys), Clock::now() + Milliseconds(timeout_ms), std::move(watch)});
        return true;
      }
      case kAdd: {
        std::string key = r.str(kMaxStoreKeyBytes);
        int64_t delta = r.integer<int64_t>();
        r.finish();
        auto it = data.find(key);
        int64_t cur = 0;
        if (it != data.end() && !parse_i64(it->second, &cur)) {
          reply_error(c, "value of key '" + printable_key(key) + "' is not an integer");
          return true;
        }
        int64_t next = int64_t(uint64_t(cur) + uint64_t(delta));  // wraps, never UB
        std::string text = std::to_string(next);
        if (std::string why = check_room(key, text.size()); !why.empty()) {
          reply_error(c, why);
          return true;
        }
        bool created = it == data.end();
        put_value(key, std::move(text));
        std::string p;
        put_int<int64_t>(p, next);
        reply(c, kOk, p);
        if (created) on_key_created();
        return true;
      }
      case kCheck: {
        uint32_t nk = r.integer<uint32_t>();
        if (nk > kMaxKeysPerRequest || size_t(nk) * 4 > r.remaining())
          throw ParseError{"key count exceeds message"};
        std::vector<std::string> keys;
        for (uint32_t i = 0; i < nk; ++i) keys.push_back(r.str(kMaxStoreKeyBytes));
        r.finish();
        std::string p;
        put_u8(p, all_present(keys) ? 1 : 0);
        reply(c, kOk, p);
        return true;
      }
      case kDelete: {
        std::string key = r.str(kMaxStoreKeyBytes);
        r.finish();
        std::string p;
        put_u8(p, erase_key(key) ? 1 : 0);
        reply(c, kOk, p);
        return true;
      }
      case kCompareSet: {
        std::string key = r.str(kMaxStoreKeyBytes);
        std::string expected = r.str(max_message);
        std::string desired = r.str(max_message);
        r.finish();
        auto it = data.find(key);
        bool swap = it == data.end() ? expected.empty() : it->second == expected;
        bool created = swap && it == data.end();
        if (swap) {
          if (std::string why = check_room(key, desired.size()); !why.empty()) {
            reply_error(c, why);
            return true;
          }
          put_value(key, std::move(desired));
        }
        auto now = data.find(key);
        std::string p;
        put_str(p, now == data.end() ? std::string() : now->second);
        reply(c, kOk, p);
        if (created) on_key_created();
        return true;
      }
      case kNumKeys: {
        r.finish();
        std::string p;
        put_int<int64_t>(p, int64_t(data.size()));
        reply(c, kOk, p);
        return true;
      }
      case kMembers: {
        r.finish();
        reply(c, kOk, members_reply());
        return true;
      }
      case kLeave: {
        std::string why = r.str(kMaxHelloBytes);
        r.finish();
        c.left = true;
        c.leave_reason = std::move(why);
        reply(c, kOk, "");
        return true;
      }
      default: throw ParseError{"unknown opcode " + std::to_string(op)};
    }
  } catch (const ParseError& e) {
    ++rejected;
    reply_error_and_close(c, "malformed request: " + e.what);
    return false;
  } catch (const std::bad_alloc&) {
    reply_error_and_close(c, "out of memory");
    return false;
  }
}

// =============================== fuzzing ===============================

namespace detail {

namespace {
// Limits small enough that a fuzzer reaches them.
constexpr size_t kFuzzMaxMessage = size_t(1) << 16;
constexpr size_t kFuzzMaxKeys = 32;
constexpr size_t kFuzzMaxBytes = size_t(1) << 14;
constexpr int kFuzzMaxUnblocks = 4096;

std::string fuzz_frame_set(const std::string& key) {
  std::string body;
  put_u8(body, kSet);
  put_str(body, key);
  put_str(body, "1");
  return frame(body);
}

void fuzz_check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "store_fuzz_one: invariant broken: %s\n", what);
    std::abort();
  }
}
}  // namespace

size_t store_fuzz_one(const uint8_t* data, size_t size) {
  using Impl = TcpStoreServer::Impl;
  Impl s;
  s.max_message = kFuzzMaxMessage;
  s.max_keys = kFuzzMaxKeys;
  s.max_total_bytes = kFuzzMaxBytes;
  s.log_enabled = false;
  // Fixed server nonce (0x5a bytes), generation (0x01) and job secret (0x02), so that a seed
  // can complete the handshake: tests/fuzz/make_corpus.py computes the client proof.
  s.deterministic = true;
  s.generation = std::string(kGenerationBytes, '\x01');
  s.job_secret = std::string(kSecretBytes, '\x02');
  // Byte 0: bit 7 the token (none or "tok"); bit 6 starts the connection authenticated (as rank
  // 3), so that mutations reach the request handler without a valid proof; bits 0-5 the size of
  // the pieces the stream arrives in (0: all at once), so partial frames and frames split across
  // reads are exercised.
  if (size == 0) return 0;
  s.token = (data[0] & 0x80) ? "tok" : "";
  const bool pre_authed = (data[0] & 0x40) != 0;
  size_t piece = (data[0] & 0x3f) == 0 ? size : size_t(data[0] & 0x3f);
  const char* p = reinterpret_cast<const char*>(data) + 1;
  size_t left = size - 1;

  auto authenticate = [&](uint64_t id, int32_t member) {
    Impl::Conn& c = s.conns.at(id);
    c.authed = true;
    c.stage = Impl::kAuthenticated;
    c.member = member;
    s.unauthed.erase(id);
    s.member_joined(c);
  };
  uint64_t fuzz_id = s.add_conn(-1, "fuzz");
  s.counted_conn = fuzz_id;
  if (pre_authed) authenticate(fuzz_id, 3);
  // A second client that is already in (as rank 1) and sets the keys the first one waits for.
  uint64_t peer_id = s.add_conn(-1, "peer");
  authenticate(peer_id, 1);
  auto check_invariants = [&] {
    size_t bytes = 0;
    for (auto& [k, v] : s.data) bytes += k.size() + v.size();
    fuzz_check(bytes == s.total_bytes, "total_bytes matches the stored keys and values");
    fuzz_check(s.data.size() <= s.max_keys, "keys within max_keys");
    fuzz_check(s.total_bytes <= s.max_total_bytes, "bytes within max_total_bytes");
    for (auto& [id, c] : s.conns) {
      fuzz_check(c.in.size() <= s.max_message + 4, "input buffer within one frame");
      fuzz_check(c.authed != bool(s.unauthed.count(id)), "unauthenticated set in step");
      fuzz_check(c.authed == (c.stage == Impl::kAuthenticated), "stage in step with authed");
    }
    int open_members = 0;
    for (auto& [r, m] : s.members) {
      fuzz_check(m.conns >= 0, "member connection count >= 0");
      open_members += m.conns;
    }
    int authed_members = 0;
    for (auto& [id, c] : s.conns) authed_members += c.authed && c.member >= 0;
    fuzz_check(open_members == authed_members, "member counts match the open connections");
    for (auto& w : s.waiters) fuzz_check(s.conns.count(w.conn_id) == 1, "waiter has a conn");
  };
  // Resolves the first connection's pending request: alternately let the peer create the
  // missing keys (the reply path through on_key_created) or let the deadline pass.
  int unblocks = 0;
  auto unblock = [&] {
    ++unblocks;
    if (s.waiters.empty()) {
      fuzz_check(false, "a blocked connection has a waiter");
    }
    if (unblocks % 2 == 1) {
      std::vector<std::string> keys = s.waiters.front().keys;
      for (auto& k : keys) {
        if (s.data.count(k)) continue;
        auto pit = s.conns.find(peer_id);
        if (pit == s.conns.end()) break;
        std::string f = fuzz_frame_set(k);
        if (!s.on_bytes(pit->second, f.data(), f.size())) s.close_conn(peer_id);
        if (auto q = s.conns.find(peer_id); q != s.conns.end()) q->second.out.clear();
      }
    }
    if (!s.waiters.empty()) s.expire_waiters(Clock::time_point::max());
  };
  while (unblocks < kFuzzMaxUnblocks) {
    auto it = s.conns.find(fuzz_id);
    if (it == s.conns.end()) break;
    Impl::Conn& c = it->second;
    c.out.clear();  // the replies are not checked, only that producing them is sound
    size_t room = s.input_room(c);
    if (c.blocked && (room == 0 || left == 0)) {
      unblock();
    } else if (left == 0) {
      break;
    } else if (room == 0) {
      fuzz_check(false, "an unblocked connection always has room for a frame");
    } else {
      size_t n = std::min({piece, left, room});
      if (!s.on_bytes(c, p, n)) s.close_conn(fuzz_id);
      p += n;
      left -= n;
    }
    check_invariants();
  }
  return s.counted_frames;
}

}  // namespace detail

// =============================== client ===============================

TcpStore::TcpStore(const std::string& host, int port, bool is_server, StoreOptions options)
    : host_(host), port_(port), options_(std::move(options)) {
  timeout_ = options_.timeout;
  if (is_server) {
    server_ = std::make_unique<TcpStoreServer>(host, port, options_);
    port_ = server_->port();
  }
  ACCEL_CHECK(port_ > 0 && port_ <= 65535, DistError, "store", "port ", port_,
              " is outside [1, 65535]");
  std::lock_guard<std::mutex> g(mu_);
  connect_locked(timeout_);
}

TcpStore::~TcpStore() {
  if (fd_ >= 0 && !left_) {
    // LEAVE, best effort and without waiting for the reply: ranks watching this one learn that
    // it left on purpose (Note [store membership]); the server reads the frame before the EOF.
    std::string body;
    put_u8(body, kLeave);
    put_str(body, "");
    std::string f = frame(body);
    ssize_t w = send(fd_, f.data(), f.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)w;
  }
  disconnect_locked();
  server_.reset();
}

void TcpStore::disconnect_locked() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

void TcpStore::check_interrupt(const char* op) {
  std::string why = interrupted();
  ACCEL_CHECK(why.empty(), DistError, op, why);
}

std::string TcpStore::where() const {
  bool v6 = host_.find(':') != std::string::npos && host_.front() != '[';
  return (v6 ? "[" + host_ + "]" : host_) + ":" + std::to_string(port_);
}

namespace {
// Blocking I/O with a deadline on a non-blocking socket: poll, then one syscall.
// Polls at least once, even past the deadline, so a last attempt still sees what is there.
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  while (true) {
    auto left = std::max<int64_t>(
        0, std::chrono::duration_cast<Milliseconds>(deadline - Clock::now()).count());
    pollfd p{fd, events, 0};
    int n = poll(&p, 1, int(std::min<int64_t>(left, 1 << 30)));
    if (n > 0) return true;  // readable, writable, or error (the syscall reports it)
    if (n == 0) return false;
    if (errno != EINTR) return true;
  }
}
// These return an empty string on success, else why not (lower case, for messages).
std::string try_send_all(int fd, const std::string& data, Clock::time_point deadline) {
  size_t off = 0;
  while (off < data.size()) {
    if (!wait_fd(fd, POLLOUT, deadline)) return "timed out sending to the store server";
    ssize_t w = send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      off += size_t(w);
    } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      continue;
    } else {
      return "lost the connection to the store server: " + errno_str(errno);
    }
  }
  return {};
}
std::string try_recv_exact(int fd, char* dst, size_t n, Clock::time_point deadline) {
  size_t off = 0;
  while (off < n) {
    if (!wait_fd(fd, POLLIN, deadline)) return "timed out waiting for the store server's reply";
    ssize_t r = recv(fd, dst + off, n - off, MSG_DONTWAIT);
    if (r > 0) {
      off += size_t(r);
    } else if (r == 0) {
      return "the store server closed the connection";
    } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return "lost the connection to the store server: " + errno_str(errno);
    }
  }
  return {};
}
void send_all(int fd, const std::string& data, Clock::time_point deadline, const char* op) {
  std::string err = try_send_all(fd, data, deadline);
  ACCEL_CHECK(err.empty(), DistError, op, err);
}
void recv_exact(int fd, char* dst, size_t n, Clock::time_point deadline, const char* op) {
  std::string err = try_recv_exact(fd, dst, n, deadline);
  ACCEL_CHECK(err.empty(), DistError, op, err);
}
std::string lower_first(std::string s) {
  if (!s.empty() && s[0] >= 'A' && s[0] <= 'Z' && (s.size() < 2 || !(s[1] >= 'A' && s[1] <= 'Z')))
    s[0] = char(s[0] - 'A' + 'a');
  return s;
}

// Connects to one resolved address within `deadline`; returns the fd or -1 with `err` set
// (left alone when the attempt merely ran out of time and `keep_err_on_timeout`).
int try_connect(const addrinfo* a, Clock::time_point deadline, bool keep_err_on_timeout,
                std::string* err) {
  int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
  if (fd < 0) {
    *err = lower_first(errno_str(errno));
    return -1;
  }
  // Non-blocking connect so an unreachable host cannot hold us past the deadline.
  set_nonblocking(fd);
  int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
  int e = rc == 0 ? 0 : errno;
  if (e == EINPROGRESS) {
    e = ETIMEDOUT;
    if (wait_fd(fd, POLLOUT, deadline)) {
      socklen_t len = sizeof(e);
      if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) != 0) e = errno;
    }
  }
  if (e != 0) {
    if (e != ETIMEDOUT || !keep_err_on_timeout) *err = lower_first(errno_str(e));
    close(fd);
    return -1;
  }
  set_nodelay(fd);
  return fd;
}

enum class Handshake { kOk, kRetry, kRefused };

// Reads one reply frame of at most kMaxHelloBytes during the handshake. Empty string: read it
// into *body; else the error (lower case).
std::string read_handshake_reply(int fd, Clock::time_point deadline, std::string* body) {
  char hdr[4];
  std::string err = try_recv_exact(fd, hdr, 4, deadline);
  if (!err.empty()) return err;
  uint32_t len = read_u32_le(hdr);
  if (len < 1 || len > kMaxHelloBytes)
    return "invalid handshake reply of " + std::to_string(len) +
           " bytes (is it an accel rendezvous store of this version?)";
  body->assign(len, '\0');
  return try_recv_exact(fd, body->data(), len, deadline);
}

std::string reply_message(const std::string& body) {
  Reader r(body.data() + 1, body.size() - 1);
  try {
    return r.str(kMaxHelloBytes);
  } catch (const ParseError&) {
    return "handshake refused";
  }
}

struct HandshakeOut {
  std::string generation;
  std::string secret;
};

// The client's side of Note [store authentication] on a fresh connection. kRetry: the connection
// broke or went unanswered (the server may be starting, or dropped us to make room), or it is
// the generation to avoid; kRefused: the server said no, or could not prove the token; `why`
// says which.
Handshake handshake(int fd, const StoreOptions& o, const std::string& joined,
                    Clock::time_point deadline, HandshakeOut* out, std::string* why) {
  const std::string nc = auth::random_bytes(kNonceBytes);
  std::string body;
  put_u8(body, kHello);
  put_int<uint32_t>(body, kMagic);
  put_int<uint16_t>(body, kVersion);
  put_u8(body, o.token.empty() ? 0 : kFlagToken);
  body += nc;
  put_int<int32_t>(body, int32_t(o.member));
  body += joined.empty() ? std::string(kGenerationBytes, '\0') : joined;
  std::string err = try_send_all(fd, frame(body), deadline);
  std::string reply;
  if (err.empty()) err = read_handshake_reply(fd, deadline, &reply);
  if (!err.empty()) {
    *why = err == "timed out waiting for the store server's reply"
               ? "connected, but the server did not answer the handshake"
               : err;
    return err.rfind("invalid handshake reply", 0) == 0 ? Handshake::kRefused : Handshake::kRetry;
  }
  if (uint8_t(reply[0]) != kOk) {
    *why = reply_message(reply);
    return Handshake::kRefused;
  }
  if (reply.size() != 1 + 1 + kNonceBytes + kGenerationBytes + kProofBytes) {
    *why = "invalid handshake reply (is it an accel rendezvous store of this version?)";
    return Handshake::kRefused;
  }
  const std::string ns = reply.substr(2, kNonceBytes);
  const std::string gen = reply.substr(2 + kNonceBytes, kGenerationBytes);
  const std::string theirs = reply.substr(2 + kNonceBytes + kGenerationBytes, kProofBytes);
  const std::string want = proof(o.token, kServerLabel, nc, ns, gen);
  if (!auth::equal_ct(theirs.data(), want.data(), kProofBytes)) {
    // Say so (the server counts it) but send nothing derived from the token.
    std::string no;
    put_u8(no, kAuth);
    put_u8(no, 0);
    try_send_all(fd, frame(no), std::min(deadline, Clock::now() + Milliseconds(100)));
    *why =
        "rendezvous token rejected: the server could not prove that it holds this rank's "
        "token (its ACCEL_RENDEZVOUS_TOKEN differs from this rank's, or what listens there "
        "is not this job's rendezvous store)";
    return Handshake::kRefused;
  }
  if (!o.avoid_generation.empty() && gen == o.avoid_generation) {
    *why = "only the store of the previous process group (generation " + auth::hex(gen) +
           ") answered: rank 0 has not started the new one yet";
    return Handshake::kRetry;
  }
  std::string a;
  put_u8(a, kAuth);
  put_u8(a, 1);
  a += proof(o.token, kClientLabel, nc, ns, gen);
  err = try_send_all(fd, frame(a), deadline);
  if (err.empty()) err = read_handshake_reply(fd, deadline, &reply);
  if (!err.empty()) {
    *why = err;
    return Handshake::kRetry;
  }
  if (uint8_t(reply[0]) != kOk || reply.size() != 1 + kSecretBytes) {
    *why = uint8_t(reply[0]) == kOk ? "invalid handshake reply" : reply_message(reply);
    return Handshake::kRefused;
  }
  out->generation = gen;
  out->secret = reply.substr(1);
  return Handshake::kOk;
}

constexpr Milliseconds kConnectBackoffMin{50};
constexpr Milliseconds kConnectBackoffMax{1000};
// One connect attempt may not take longer, so an address that swallows SYNs is retried.
constexpr Milliseconds kConnectAttempt{std::chrono::seconds(10)};
// Floor for the reply deadline of a request that does not wait, whatever the store timeout.
constexpr Milliseconds kMinReplyGrace{100};
}  // namespace

void TcpStore::connect_locked(Milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  std::string last_error = "no address";
  Milliseconds backoff = kConnectBackoffMin;
  int attempts = 0;
  // Jitter spreads the retries of many ranks that started together.
  std::minstd_rand jitter(uint32_t(Clock::now().time_since_epoch().count()) ^
                          uint32_t(reinterpret_cast<uintptr_t>(this)));
  while (true) {
    AddrList addrs;
    int rc = resolve(host_, port_, false, &addrs);
    // A name that does not resolve *yet* (DNS not up) is retried; a wrong name fails now.
    ACCEL_CHECK(rc == 0 || rc == EAI_AGAIN, DistError, "store", "cannot resolve '", host_,
                "', the address of rank 0's rendezvous store: ", gai_strerror(rc));
    if (rc != 0) last_error = std::string("cannot resolve '") + host_ + "': " + gai_strerror(rc);
    for (addrinfo* a = addrs.head; a && fd_ < 0; a = a->ai_next) {
      // An attempt cut short by the overall deadline says nothing new: the previous attempt's
      // reason ("connection refused") is the one to report.
      auto attempt_deadline = Clock::now() + kConnectAttempt;
      bool cut_short = deadline < attempt_deadline && attempts > 0;
      int fd = try_connect(a, std::min(deadline, attempt_deadline), cut_short, &last_error);
      ++attempts;
      if (fd < 0) continue;
      fd_ = fd;
      std::string why;
      HandshakeOut hs;
      Handshake h = handshake(fd_, options_, generation_, deadline, &hs, &why);
      if (h == Handshake::kOk) {
        generation_ = hs.generation;
        job_secret_ = hs.secret;
        return;
      }
      disconnect_locked();
      ACCEL_CHECK(h != Handshake::kRefused, DistError, "store",
                  "the rendezvous store of rank 0 at ", where(), " refused this client: ", why);
      last_error = why;
    }
    auto now = Clock::now();
    ACCEL_CHECK(now < deadline, DistError, "store",
                "could not reach the rendezvous store of rank 0 at ", where(), " within ",
                timeout.count(), " ms: ", last_error);
    auto pause = backoff + Milliseconds(jitter() % (uint64_t(backoff.count()) / 4 + 1));
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    backoff = std::min(backoff * 2, kConnectBackoffMax);
  }
}

TcpStore::Reply TcpStore::request(const char* op, const std::string& body,
                                  Milliseconds wait_budget) {
  ACCEL_CHECK(body.size() <= options_.max_message_bytes, DistError, op, "request of ", body.size(),
              " bytes exceeds the store limit of ", options_.max_message_bytes);
  std::lock_guard<std::mutex> g(mu_);
  if (fd_ < 0) connect_locked(timeout_);  // a previous failure dropped the connection
  // Beyond what the server may legitimately hold the request, the round trip gets the store
  // timeout (at most kReplyGrace): a silent server costs a request no more than that.
  Milliseconds grace = std::clamp(timeout_, kMinReplyGrace, kReplyGrace);
  auto deadline = Clock::now() + wait_budget + grace;
  Reply rep;
  uint32_t len = 0;
  try {
    send_all(fd_, frame(body), deadline, op);
    char hdr[4];
    recv_exact(fd_, hdr, 4, deadline, op);
    len = read_u32_le(hdr);
    ACCEL_CHECK(len >= 1 && len <= options_.max_message_bytes + 64, DistError, op,
                "invalid reply length ", len, " from the store server");
    std::string buf(len, '\0');
    recv_exact(fd_, buf.data(), len, deadline, op);
    rep.status = uint8_t(buf[0]);
    rep.body = buf.substr(1);
    ACCEL_CHECK(
        rep.status == kOk || rep.status == kTimeout || rep.status == kErr || rep.status == kLeft,
        DistError, op, "invalid reply status ", int(rep.status));
  } catch (const DistError&) {
    // A timeout or a broken socket may leave the stream out of step: reconnect on the next
    // call. Dropping the connection is always safe.
    disconnect_locked();
    throw;
  }
  if (rep.status == kErr) {
    // A whole error reply leaves the stream in step: the connection stays.
    Reader r(rep.body.data(), rep.body.size());
    std::string msg;
    try {
      msg = r.str(len);
    } catch (const ParseError&) {
      msg = "unreadable error";
    }
    ACCEL_THROW(DistError, op, "store server: ", msg);
  }
  if (rep.status == kLeft) {
    // A watched rank left (Note [store membership]): i32 rank, str message.
    Reader r(rep.body.data(), rep.body.size());
    int32_t who = -1;
    std::string msg = "a watched rank left the rendezvous store";
    try {
      who = r.integer<int32_t>();
      msg = r.str(len);
    } catch (const ParseError&) {
    }
    throw StoreMemberLeft(who, msg, accel::detail::format_message(op, msg));
  }
  return rep;
}

void TcpStore::set(const std::string& key, const std::string& value) {
  ACCEL_CHECK(key.size() <= kMaxStoreKeyBytes, DistError, "store.set", "key of ", key.size(),
              " bytes exceeds ", kMaxStoreKeyBytes);
  std::string body;
  put_u8(body, kSet);
  put_str(body, key);
  put_str(body, value);
  request("store.set", body, Milliseconds(0));
}

std::string TcpStore::get(const std::string& key) { return get(key, timeout_); }

namespace {
void put_watch(std::string& body, const std::vector<int>& watch) {
  put_int<uint32_t>(body, uint32_t(watch.size()));
  for (int r : watch) put_int<int32_t>(body, int32_t(r));
}
}  // namespace

std::string TcpStore::get(const std::string& key, Milliseconds timeout) {
  ACCEL_CHECK(key.size() <= kMaxStoreKeyBytes, DistError, "store.get", "key of ", key.size(),
              " bytes exceeds ", kMaxStoreKeyBytes);
  // In slices of kWaitSlice, so that interrupt() and the deadline take effect within one.
  const auto deadline = Clock::now() + std::max(timeout, Milliseconds(0));
  while (true) {
    check_interrupt("store.get");
    auto left = std::chrono::duration_cast<Milliseconds>(deadline - Clock::now());
    Milliseconds slice = std::clamp(left, Milliseconds(0), kWaitSlice);
    std::string body;
    put_u8(body, kGet);
    put_int<uint64_t>(body, uint64_t(slice.count()));
    put_str(body, key);
    {
      std::lock_guard<std::mutex> g(mu_);
      put_watch(body, watched_);
    }
    Reply rep = request("store.get", body, slice);
    if (rep.status == kOk) {
      Reader r(rep.body.data(), rep.body.size());
      try {
        return r.str(options_.max_message_bytes);
      } catch (const ParseError& e) {
        ACCEL_THROW(DistError, "store.get", "malformed reply: ", e.what);
      }
    }
    ACCEL_CHECK(Clock::now() < deadline, DistError, "store.get", "timed out after ",
                timeout.count(), " ms waiting for key '", key, "'");
  }
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  ACCEL_CHECK(key.size() <= kMaxStoreKeyBytes, DistError, "store.add", "key of ", key.size(),
              " bytes exceeds ", kMaxStoreKeyBytes);
  std::string body;
  put_u8(body, kAdd);
  put_str(body, key);
  put_int<int64_t>(body, delta);
  Reply rep = request("store.add", body, Milliseconds(0));
  ACCEL_CHECK(rep.body.size() == 8, DistError, "store.add", "malformed reply");
  Reader r(rep.body.data(), 8);
  return r.integer<int64_t>();
}

void TcpStore::wait(const std::vector<std::string>& keys, Milliseconds timeout) {
  for (auto& k : keys)
    ACCEL_CHECK(k.size() <= kMaxStoreKeyBytes, DistError, "store.wait", "key of ", k.size(),
                " bytes exceeds ", kMaxStoreKeyBytes);
  const auto deadline = Clock::now() + std::max(timeout, Milliseconds(0));
  while (true) {
    check_interrupt("store.wait");
    auto left = std::chrono::duration_cast<Milliseconds>(deadline - Clock::now());
    Milliseconds slice = std::clamp(left, Milliseconds(0), kWaitSlice);
    std::string body;
    put_u8(body, kWait);
    put_int<uint64_t>(body, uint64_t(slice.count()));
    put_int<uint32_t>(body, uint32_t(keys.size()));
    for (auto& k : keys) put_str(body, k);
    {
      std::lock_guard<std::mutex> g(mu_);
      put_watch(body, watched_);
    }
    Reply rep = request("store.wait", body, slice);
    if (rep.status == kOk) return;
    if (Clock::now() < deadline) continue;
    // Name the keys still missing, which is what a user needs to find the late rank.
    std::vector<std::string> missing;
    for (auto& k : keys) {
      try {
        if (!check({k})) missing.push_back(k);
      } catch (const DistError&) {
        missing = keys;
        break;
      }
    }
    ACCEL_THROW(DistError, "store.wait", "timed out after ", timeout.count(),
                " ms waiting for keys ", join_keys(missing.empty() ? keys : missing));
  }
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  std::string body;
  put_u8(body, kCheck);
  put_int<uint32_t>(body, uint32_t(keys.size()));
  for (auto& k : keys) put_str(body, k);
  Reply rep = request("store.check", body, Milliseconds(0));
  ACCEL_CHECK(rep.body.size() == 1, DistError, "store.check", "malformed reply");
  return rep.body[0] != 0;
}

bool TcpStore::delete_key(const std::string& key) {
  std::string body;
  put_u8(body, kDelete);
  put_str(body, key);
  Reply rep = request("store.delete_key", body, Milliseconds(0));
  ACCEL_CHECK(rep.body.size() == 1, DistError, "store.delete_key", "malformed reply");
  return rep.body[0] != 0;
}

std::string TcpStore::compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) {
  std::string body;
  put_u8(body, kCompareSet);
  put_str(body, key);
  put_str(body, expected);
  put_str(body, desired);
  Reply rep = request("store.compare_set", body, Milliseconds(0));
  Reader r(rep.body.data(), rep.body.size());
  try {
    return r.str(options_.max_message_bytes);
  } catch (const ParseError& e) {
    ACCEL_THROW(DistError, "store.compare_set", "malformed reply: ", e.what);
  }
}

int64_t TcpStore::num_keys() {
  std::string body;
  put_u8(body, kNumKeys);
  Reply rep = request("store.num_keys", body, Milliseconds(0));
  ACCEL_CHECK(rep.body.size() == 8, DistError, "store.num_keys", "malformed reply");
  Reader r(rep.body.data(), 8);
  return r.integer<int64_t>();
}

std::string TcpStore::derive_key(const std::string& purpose) {
  std::lock_guard<std::mutex> g(mu_);
  if (fd_ < 0 && generation_.empty()) connect_locked(timeout_);
  // Note [store authentication]: only holders of the token can compute the job key.
  std::string job_key =
      auth::hmac_sha256_str(options_.token, std::string(kJobKeyLabel) + generation_ + job_secret_);
  return auth::hmac_sha256_str(job_key, purpose);
}

void TcpStore::leave(const std::string& reason) {
  std::string body;
  put_u8(body, kLeave);
  put_str(body, reason.substr(0, kMaxHelloBytes - 16));
  std::lock_guard<std::mutex> g(mu_);
  // Best effort, and never a reconnect: the store may be gone (rank 0 died), and a rank that
  // gives up must not then wait for it. The server reads the frame before the connection's end.
  if (fd_ < 0) return;
  try_send_all(fd_, frame(body), Clock::now() + std::min(timeout_, Milliseconds(1000)));
  // Its reply is not read: the connection ends here (a later request reconnects).
  disconnect_locked();
  left_ = true;
}

void TcpStore::watch_members(std::vector<int> ranks) {
  std::lock_guard<std::mutex> g(mu_);
  watched_ = std::move(ranks);
}

std::vector<StoreMember> TcpStore::members() {
  std::string body;
  put_u8(body, kMembers);
  Reply rep = request("store.members", body, Milliseconds(0));
  std::vector<StoreMember> out;
  Reader r(rep.body.data(), rep.body.size());
  try {
    uint32_t n = r.integer<uint32_t>();
    ACCEL_CHECK(size_t(n) * 17 <= r.remaining(), DistError, "store.members", "malformed reply");
    for (uint32_t i = 0; i < n; ++i) {
      StoreMember m;
      m.rank = r.integer<int32_t>();
      uint8_t st = r.u8();
      ACCEL_CHECK(st >= 1 && st <= 3, DistError, "store.members", "malformed reply");
      m.state = StoreMember::State(st);
      m.address = r.str(kMaxHelloBytes);
      m.seconds = double(r.integer<uint64_t>()) / 1000.0;
      out.push_back(std::move(m));
    }
    r.finish();
  } catch (const ParseError& e) {
    ACCEL_THROW(DistError, "store.members", "malformed reply: ", e.what);
  }
  return out;
}

std::string TcpStore::describe_rank(int rank) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (watched_.empty()) return {};  // ranks are tracked only while init_process_group runs
  }
  std::vector<StoreMember> all;
  try {
    all = members();
  } catch (const DistError&) {
    return {};
  }
  char secs[32];
  std::vector<int> present;
  for (const StoreMember& m : all) {
    if (m.rank != rank) {
      present.push_back(m.rank);
      continue;
    }
    std::snprintf(secs, sizeof(secs), "%.1f", m.seconds);
    switch (m.state) {
      case StoreMember::State::kConnected:
        return "it connected to the rendezvous store " + std::string(secs) + " s ago (from " +
               m.address + ") and is still connected: stopped, or stuck before it got this far?";
      case StoreMember::State::kLeft:
        return "it left the rendezvous store " + std::string(secs) + " s ago (from " + m.address +
               "): its own initialisation failed";
      case StoreMember::State::kDeparted:
        return "its connection to the rendezvous store (from " + m.address + ") closed " +
               std::string(secs) + " s ago: the process exited or was killed";
    }
  }
  std::string list;
  for (size_t i = 0; i < present.size(); ++i) list += (i ? ", " : "") + std::to_string(present[i]);
  return "it never connected to the rendezvous store at " + where() +
         (present.empty()
              ? std::string()
              : " (" + std::string(present.size() == 1 ? "rank " : "ranks ") + list + " did)") +
         ": is it running, with this MASTER_ADDR and MASTER_PORT?";
}

// =============================== base and prefix ===============================

void wait_peer_key(Store& store, const std::string& key, int peer, Clock::time_point deadline,
                   Milliseconds timeout, const std::string& who, const char* what) {
  try {
    store.wait({key}, std::max(Milliseconds(1),
                               std::chrono::duration_cast<Milliseconds>(deadline - Clock::now())));
  } catch (const StoreMemberLeft& e) {
    if (e.rank() == peer)
      ACCEL_THROW(DistError, "init", who, ": rank ", peer, " left before publishing its ", what,
                  ": ", e.detail());
    ACCEL_THROW(DistError, "init", who, ": ", e.detail(), " (while waiting for rank ", peer, "'s ",
                what, ")");
  } catch (const DistError& e) {
    if (!store.interrupted().empty()) throw;  // the caller knows the reason (InitGuard)
    if (Clock::now() + Milliseconds(50) < deadline) {
      // Not a timeout: the store itself failed (rank 0, which serves it, exited or was killed).
      ACCEL_THROW(DistError, "init", who, ": lost the rendezvous store while waiting for rank ",
                  peer, "'s ", what, ": ", e.what(),
                  " (rank 0 serves it: did it exit, crash or get killed?)");
    }
    std::string known = store.describe_rank(peer);
    ACCEL_THROW(DistError, "init", who, ": rank ", peer, " did not publish its ", what, " within ",
                timeout.count(), " ms (", known.empty() ? "did it start?" : known, ")");
  }
}

std::string Store::derive_key(const std::string& purpose) {
  std::lock_guard<std::mutex> g(base_mu_);
  if (local_secret_.empty()) local_secret_ = auth::random_bytes(32);
  return auth::hmac_sha256_str(local_secret_, purpose);
}

void Store::interrupt(const std::string& why) {
  std::lock_guard<std::mutex> g(base_mu_);
  if (interrupted_.empty()) interrupted_ = why.empty() ? "interrupted" : why;
}

void Store::clear_interrupt() {
  std::lock_guard<std::mutex> g(base_mu_);
  interrupted_.clear();
}

std::string Store::interrupted() const {
  std::lock_guard<std::mutex> g(base_mu_);
  return interrupted_;
}

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : prefix_(std::move(prefix)), base_(std::move(base)) {
  ACCEL_CHECK(base_ != nullptr, DistError, "store", "PrefixStore needs a base store");
  timeout_ = base_->timeout();
}
std::vector<std::string> PrefixStore::join(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (auto& k : keys) out.push_back(join(k));
  return out;
}
void PrefixStore::set(const std::string& key, const std::string& value) {
  base_->set(join(key), value);
}
std::string PrefixStore::get(const std::string& key) {
  // Honour this store's timeout, which may differ from the base's.
  base_->wait({join(key)}, timeout_);
  return base_->get(join(key));
}
int64_t PrefixStore::add(const std::string& key, int64_t delta) {
  return base_->add(join(key), delta);
}
void PrefixStore::wait(const std::vector<std::string>& keys, Milliseconds timeout) {
  base_->wait(join(keys), timeout);
}
bool PrefixStore::check(const std::vector<std::string>& keys) { return base_->check(join(keys)); }
bool PrefixStore::delete_key(const std::string& key) { return base_->delete_key(join(key)); }
std::string PrefixStore::compare_set(const std::string& key, const std::string& expected,
                                     const std::string& desired) {
  return base_->compare_set(join(key), expected, desired);
}
int64_t PrefixStore::num_keys() { return base_->num_keys(); }
void PrefixStore::set_timeout(Milliseconds t) { timeout_ = t; }
std::string PrefixStore::derive_key(const std::string& purpose) {
  return base_->derive_key(prefix_ + "/" + purpose);
}
void PrefixStore::interrupt(const std::string& why) { base_->interrupt(why); }
void PrefixStore::clear_interrupt() { base_->clear_interrupt(); }
std::string PrefixStore::describe_rank(int rank) { return base_->describe_rank(rank); }

}  // namespace accel::dist
