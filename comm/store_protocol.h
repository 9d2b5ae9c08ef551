// The store's wire format, shared by its server (comm/store_server.cc, comm/store_requests.cc),
// its client (comm/store_client.cc) and the fuzz hook (comm/store_fuzz.cc): opcodes, frames,
// the handshake's labels and sizes, the encoding helpers. Internal to comm/store_*.cc; the public
// interface is comm/store.h.
//
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

#pragma once

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

namespace accel::dist::store_wire {

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

// clang-format off
enum Op : uint8_t {
  kHello = 0, kSet = 1, kGet = 2, kAdd = 3, kWait = 4, kCheck = 5, kDelete = 6, kCompareSet = 7,
  kNumKeys = 8, kAuth = 9, kMembers = 10, kLeave = 11,
};
// clang-format on
enum Status : uint8_t { kOk = 0, kTimeout = 1, kErr = 2, kLeft = 3 };

// ---- encoding ----
inline void put_u8(std::string& s, uint8_t v) { s.push_back(char(v)); }
template <typename T>
inline void put_int(std::string& s, T v) {
  static_assert(std::is_integral_v<T>);
  using U = std::make_unsigned_t<T>;
  U u = U(v);
  for (size_t i = 0; i < sizeof(T); ++i) s.push_back(char((u >> (8 * i)) & 0xff));
}
inline void put_str(std::string& s, const std::string& v) {
  put_int<uint32_t>(s, uint32_t(v.size()));
  s.append(v);
}
inline std::string frame(const std::string& body) {
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

inline uint32_t read_u32_le(const char* p) {
  return uint32_t(uint8_t(p[0])) | uint32_t(uint8_t(p[1])) << 8 | uint32_t(uint8_t(p[2])) << 16 |
         uint32_t(uint8_t(p[3])) << 24;
}

inline std::string errno_str(int e) { return std::strerror(e); }

inline bool parse_i64(const std::string& s, int64_t* out) {
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

inline std::string proof(const std::string& token, const char* label, const std::string& nc,
                         const std::string& ns, const std::string& gen) {
  return auth::hmac_sha256_str(token, std::string(label) + nc + ns + gen);
}

inline std::string join_keys(const std::vector<std::string>& keys) {
  std::string s;
  for (size_t i = 0; i < keys.size() && i < 8; ++i) {
    if (i) s += ", ";
    s += "'" + keys[i] + "'";
  }
  if (keys.size() > 8) s += ", ... (" + std::to_string(keys.size()) + " keys)";
  return s;
}

inline void set_nonblocking(int fd) {
  int fl = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}
inline void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

using Clock = std::chrono::steady_clock;

// Frame limit for a connection: small until the client has said HELLO.
inline size_t authed_limit_impl(bool authed, size_t max_message) {
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
inline int resolve(const std::string& host, int port, bool passive, AddrList* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  std::string h = host;
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  std::string p = std::to_string(port);
  return getaddrinfo(h.empty() ? nullptr : h.c_str(), p.c_str(), &hints, &out->head);
}

}  // namespace accel::dist::store_wire
