#include "dist/store.h"

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
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <thread>
#include <unordered_map>

#include "core/error.h"

// Note [store protocol]
// Every message is a frame: u32 body length (little endian) followed by the body. A request body
// is a u8 opcode and its fields; strings are u32 length + bytes, integers little endian.
//   HELLO   u32 magic, u16 version, str token        (must be the first frame of a connection)
//   SET     str key, str value
//   GET     u64 timeout_ms, str key                  -> str value (waits until key exists)
//   ADD     str key, i64 delta                       -> i64 new value (stored as decimal text)
//   WAIT    u64 timeout_ms, u32 n, n x str key       -> (nothing)
//   CHECK   u32 n, n x str key                       -> u8 all present
//   DELETE  str key                                  -> u8 existed
//   CAS     str key, str expected, str desired       -> str value after the call
//   NUMKEYS                                          -> i64
// A reply body is a u8 status (OK, TIMEOUT, ERROR) and the result, or a str message for ERROR.
// The server never trusts a length: a frame longer than max_message_bytes (or, before HELLO,
// longer than kMaxHelloBytes, so an unauthenticated peer cannot make it allocate much), a body
// that ends inside a field, an unknown opcode, or trailing bytes get an ERROR reply and the
// connection is closed; other clients are unaffected. GET and WAIT carry their timeout so the
// server answers TIMEOUT itself and the client's connection stays in sync and usable.

namespace accel::dist {

namespace {

constexpr uint32_t kMagic = 0x54534341;  // "ACST"
constexpr uint16_t kVersion = 1;
constexpr size_t kMaxHelloBytes = 4096;
constexpr size_t kMaxConnections = 4096;
constexpr size_t kMaxKeysPerRequest = 1 << 16;
// Added to a request's own wait budget before a client gives up on a silent server.
constexpr Milliseconds kReplyGrace{std::chrono::seconds(10)};
constexpr Milliseconds kConnectRetry{50};

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
};
enum Status : uint8_t { kOk = 0, kTimeout = 1, kErr = 2 };

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
  std::string str(size_t max_len) {
    uint32_t len = integer<uint32_t>();
    if (len > max_len) throw ParseError{"string of " + std::to_string(len) + " bytes exceeds " +
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

bool tokens_equal(const std::string& a, const std::string& b) {
  // Constant time in the content so the token cannot be guessed byte by byte.
  unsigned diff = unsigned(a.size() ^ b.size());
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    unsigned char x = i < a.size() ? a[i] : 0;
    unsigned char y = i < b.size() ? b[i] : 0;
    diff |= unsigned(x ^ y);
  }
  return diff == 0;
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
void resolve(const std::string& host, int port, bool passive, AddrList* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  std::string h = host;
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  std::string p = std::to_string(port);
  int rc = getaddrinfo(h.empty() ? nullptr : h.c_str(), p.c_str(), &hints, &out->head);
  ACCEL_CHECK(rc == 0, DistError, "store", "cannot resolve '", host, "': ", gai_strerror(rc));
}

}  // namespace

// =============================== server ===============================

struct TcpStoreServer::Impl {
  struct Conn {
    int fd = -1;
    uint64_t id = 0;
    bool authed = false;
    bool blocked = false;  // a GET/WAIT of this connection is pending; later frames wait
    std::string in;
    std::string out;
  };
  struct Waiter {
    uint64_t conn_id;
    uint8_t op;  // kGet or kWait
    std::vector<std::string> keys;
    Clock::time_point deadline;
  };

  int listen_fd = -1;
  int wake_pipe[2] = {-1, -1};
  size_t max_message = kDefaultMaxStoreMessage;
  std::string token;
  std::thread thread;
  std::atomic<bool> stop{false};
  std::atomic<int64_t> rejected{0};
  std::atomic<int64_t> open{0};

  std::map<uint64_t, Conn> conns;  // ordered: deterministic service order
  uint64_t next_id = 1;
  std::unordered_map<std::string, std::string> data;
  std::deque<Waiter> waiters;

  void run();
  void accept_all();
  void on_readable(Conn& c);
  bool process_frames(Conn& c);  // false: connection must close
  // Handles one request; returns false when the connection must close.
  bool handle(Conn& c, const char* body, size_t n);
  void reply(Conn& c, uint8_t status, const std::string& payload);
  void reply_error_and_close(Conn& c, const std::string& msg);
  void flush(Conn& c);
  void close_conn(uint64_t id);
  bool all_present(const std::vector<std::string>& keys) const {
    for (auto& k : keys)
      if (!data.count(k)) return false;
    return true;
  }
  void on_key_created();
  void expire_waiters(Clock::time_point now);
  void complete_waiter(const Waiter& w, uint8_t status);
};

TcpStoreServer::TcpStoreServer(const std::string& host, int port, size_t max_message_bytes,
                               std::string token)
    : impl_(std::make_unique<Impl>()) {
  ACCEL_CHECK(port >= 0 && port <= 65535, DistError, "store", "port ", port,
              " is outside [0, 65535]");
  impl_->max_message = max_message_bytes;
  impl_->token = std::move(token);
  AddrList addrs;
  resolve(host, port, false, &addrs);
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
  ACCEL_CHECK(impl_->listen_fd >= 0, DistError, "store", "cannot listen on ", host, ":", port,
              ": ", errno_str(last_errno));
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  getsockname(impl_->listen_fd, reinterpret_cast<sockaddr*>(&ss), &len);
  port_ = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                   : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  set_nonblocking(impl_->listen_fd);
  if (pipe2(impl_->wake_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    close(impl_->listen_fd);
    ACCEL_THROW(DistError, "store", "pipe failed: ", errno_str(errno));
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

void TcpStoreServer::Impl::run() {
  std::vector<pollfd> fds;
  std::vector<uint64_t> ids;
  while (!stop.load()) {
    fds.clear();
    ids.clear();
    fds.push_back({wake_pipe[0], POLLIN, 0});
    fds.push_back({listen_fd, POLLIN, 0});
    for (auto& [id, c] : conns) {
      short ev = 0;
      // Stop reading from a connection whose buffered input already exceeds one frame (it is
      // blocked on a wait) or whose replies pile up unread: bounded memory per client.
      size_t in_limit = authed_limit_impl(c.authed, max_message) + 4;
      if (c.in.size() < in_limit && c.out.size() < 2 * max_message + 64) ev |= POLLIN;
      if (!c.out.empty()) ev |= POLLOUT;
      fds.push_back({c.fd, ev, 0});
      ids.push_back(id);
    }
    int timeout_ms = -1;
    if (!waiters.empty()) {
      auto next = std::min_element(waiters.begin(), waiters.end(), [](auto& a, auto& b) {
                    return a.deadline < b.deadline;
                  })->deadline;
      auto d = std::chrono::duration_cast<Milliseconds>(next - Clock::now()).count() + 1;
      timeout_ms = int(std::clamp<int64_t>(d, 0, 60000));
    }
    int n = poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0 && errno != EINTR) break;  // nothing sane left to do; clients will time out
    if (stop.load()) break;
    if (n > 0) {
      if (fds[1].revents & POLLIN) accept_all();
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
    }
    expire_waiters(Clock::now());
  }
}

void TcpStoreServer::Impl::accept_all() {
  while (true) {
    int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN, or a transient error: try on the next readiness
    if (conns.size() >= kMaxConnections) {
      close(fd);
      ++rejected;
      continue;
    }
    set_nodelay(fd);
    Conn c;
    c.fd = fd;
    c.id = next_id++;
    conns.emplace(c.id, std::move(c));
    ++open;
  }
}

void TcpStoreServer::Impl::on_readable(Conn& c) {
  uint64_t id = c.id;
  char buf[65536];
  while (true) {
    size_t limit = authed_limit_impl(c.authed, max_message) + 4;
    if (c.in.size() >= limit) break;
    ssize_t r = recv(c.fd, buf, std::min(sizeof(buf), limit - c.in.size()), 0);
    if (r > 0) {
      c.in.append(buf, size_t(r));
      if (!process_frames(c)) {
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

bool TcpStoreServer::Impl::process_frames(Conn& c) {
  size_t pos = 0;
  bool ok = true;
  while (!c.blocked && c.in.size() - pos >= 4) {
    uint32_t len = read_u32_le(c.in.data() + pos);
    size_t limit = authed_limit_impl(c.authed, max_message);
    if (len > limit) {
      ++rejected;
      reply_error_and_close(c, "message of " + std::to_string(len) + " bytes exceeds the limit of " +
                                   std::to_string(limit) + " bytes");
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

void TcpStoreServer::Impl::reply_error_and_close(Conn& c, const std::string& msg) {
  std::string p;
  put_str(p, msg);
  std::string body;
  put_u8(body, kErr);
  body += p;
  c.out += frame(body);
  // One best-effort write: the connection is closed right after, whatever the peer does.
  ssize_t ignored = send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  (void)ignored;
  c.out.clear();
}

void TcpStoreServer::Impl::flush(Conn& c) {
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
  close(it->second.fd);
  conns.erase(it);
  --open;
  waiters.erase(std::remove_if(waiters.begin(), waiters.end(),
                               [id](const Waiter& w) { return w.conn_id == id; }),
                waiters.end());
}

void TcpStoreServer::Impl::complete_waiter(const Waiter& w, uint8_t status) {
  auto it = conns.find(w.conn_id);
  if (it == conns.end()) return;
  Conn& c = it->second;
  std::string payload;
  if (status == kOk && w.op == kGet) put_str(payload, data.at(w.keys[0]));
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

bool TcpStoreServer::Impl::handle(Conn& c, const char* body, size_t n) {
  try {
    Reader r(body, n);
    uint8_t op = r.u8();
    if (!c.authed) {
      if (op != kHello) throw ParseError{"the first message must be HELLO"};
      uint32_t magic = r.integer<uint32_t>();
      uint16_t version = r.integer<uint16_t>();
      std::string tok = r.str(kMaxHelloBytes);
      r.finish();
      if (magic != kMagic) throw ParseError{"bad magic (not an accel store client)"};
      if (version != kVersion)
        throw ParseError{"protocol version " + std::to_string(version) + ", server speaks " +
                         std::to_string(kVersion)};
      if (!token.empty() && !tokens_equal(tok, token)) {
        ++rejected;
        reply_error_and_close(c, "rendezvous token rejected (ACCEL_RENDEZVOUS_TOKEN differs)");
        return false;
      }
      c.authed = true;
      reply(c, kOk, "");
      return true;
    }
    switch (op) {
      case kSet: {
        std::string key = r.str(kMaxStoreKeyBytes);
        std::string value = r.str(max_message);
        r.finish();
        bool created = !data.count(key);
        data[key] = std::move(value);
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
        r.finish();
        if (all_present(keys)) {
          std::string payload;
          if (op == kGet) put_str(payload, data.at(keys[0]));
          reply(c, kOk, payload);
          return true;
        }
        // Clamp so the deadline arithmetic cannot overflow.
        timeout_ms = std::min<uint64_t>(timeout_ms, uint64_t(365) * 24 * 3600 * 1000);
        c.blocked = true;
        waiters.push_back({c.id, op, std::move(keys), Clock::now() + Milliseconds(timeout_ms)});
        return true;
      }
      case kAdd: {
        std::string key = r.str(kMaxStoreKeyBytes);
        int64_t delta = r.integer<int64_t>();
        r.finish();
        auto it = data.find(key);
        int64_t cur = 0;
        if (it != data.end() && !parse_i64(it->second, &cur)) {
          std::string p;
          put_str(p, "value of key '" + key + "' is not an integer");
          reply(c, kErr, p);
          return true;
        }
        int64_t next = int64_t(uint64_t(cur) + uint64_t(delta));  // wraps, never UB
        bool created = it == data.end();
        data[key] = std::to_string(next);
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
        put_u8(p, data.erase(key) ? 1 : 0);
        reply(c, kOk, p);
        return true;
      }
      case kCompareSet: {
        std::string key = r.str(kMaxStoreKeyBytes);
        std::string expected = r.str(max_message);
        std::string desired = r.str(max_message);
        r.finish();
        auto it = data.find(key);
        bool created = false;
        if (it == data.end()) {
          if (expected.empty()) {
            data[key] = desired;
            created = true;
          }
        } else if (it->second == expected) {
          it->second = desired;
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
      default:
        throw ParseError{"unknown opcode " + std::to_string(op)};
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

// =============================== client ===============================

TcpStore::TcpStore(const std::string& host, int port, bool is_server, StoreOptions options)
    : host_(host), port_(port), options_(std::move(options)) {
  timeout_ = options_.timeout;
  if (is_server) {
    server_ = std::make_unique<TcpStoreServer>(host, port, options_.max_message_bytes,
                                               options_.token);
    port_ = server_->port();
  }
  ACCEL_CHECK(port_ > 0 && port_ <= 65535, DistError, "store", "port ", port_,
              " is outside [1, 65535]");
  std::lock_guard<std::mutex> g(mu_);
  connect_locked();
}

TcpStore::~TcpStore() {
  disconnect_locked();
  server_.reset();
}

void TcpStore::disconnect_locked() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

namespace {
// Blocking I/O with a deadline on a blocking socket: poll, then one syscall.
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  while (true) {
    auto left = std::chrono::duration_cast<Milliseconds>(deadline - Clock::now()).count();
    if (left < 0) return false;
    pollfd p{fd, events, 0};
    int n = poll(&p, 1, int(std::min<int64_t>(left, 1 << 30)));
    if (n > 0) return true;  // readable, writable, or error (the syscall reports it)
    if (n == 0) return false;
    if (errno != EINTR) return true;
  }
}
void send_all(int fd, const std::string& data, Clock::time_point deadline, const char* op) {
  size_t off = 0;
  while (off < data.size()) {
    ACCEL_CHECK(wait_fd(fd, POLLOUT, deadline), DistError, op,
                "timed out sending to the store server");
    ssize_t w = send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      off += size_t(w);
    } else if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
      continue;
    } else {
      ACCEL_THROW(DistError, op, "lost the connection to the store server: ",
                  errno_str(errno));
    }
  }
}
void recv_exact(int fd, char* dst, size_t n, Clock::time_point deadline, const char* op) {
  size_t off = 0;
  while (off < n) {
    ACCEL_CHECK(wait_fd(fd, POLLIN, deadline), DistError, op,
                "timed out waiting for the store server's reply");
    ssize_t r = recv(fd, dst + off, n - off, MSG_DONTWAIT);
    if (r > 0) {
      off += size_t(r);
    } else if (r == 0) {
      ACCEL_THROW(DistError, op, "the store server closed the connection");
    } else if (errno != EAGAIN && errno != EINTR) {
      ACCEL_THROW(DistError, op, "lost the connection to the store server: ",
                  errno_str(errno));
    }
  }
}
}  // namespace

void TcpStore::connect_locked() {
  auto deadline = Clock::now() + options_.timeout;
  std::string last_error = "no address";
  while (true) {
    AddrList addrs;
    resolve(host_, port_, false, &addrs);
    for (addrinfo* a = addrs.head; a && fd_ < 0; a = a->ai_next) {
      int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) {
        last_error = errno_str(errno);
        continue;
      }
      // Non-blocking connect so an unreachable host cannot hold us past the deadline.
      set_nonblocking(fd);
      int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
      int err = rc == 0 ? 0 : errno;
      if (err == EINPROGRESS) {
        auto attempt_deadline = std::min(deadline, Clock::now() + kReplyGrace);
        err = ETIMEDOUT;
        if (wait_fd(fd, POLLOUT, attempt_deadline)) {
          socklen_t len = sizeof(err);
          if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        }
      }
      if (err == 0) {
        set_nodelay(fd);
        fd_ = fd;
      } else {
        last_error = errno_str(err);
        close(fd);
      }
    }
    if (fd_ >= 0) break;
    ACCEL_CHECK(Clock::now() < deadline, DistError, "store",
                "cannot connect to the store at ", host_, ":", port_, " within ",
                options_.timeout.count(), " ms: ", last_error);
    std::this_thread::sleep_for(kConnectRetry);
  }
  std::string body;
  put_u8(body, kHello);
  put_int<uint32_t>(body, kMagic);
  put_int<uint16_t>(body, kVersion);
  put_str(body, options_.token);
  try {
    auto hello_deadline = Clock::now() + std::min(options_.timeout, kReplyGrace * 3);
    send_all(fd_, frame(body), hello_deadline, "store");
    char hdr[4];
    recv_exact(fd_, hdr, 4, hello_deadline, "store");
    uint32_t len = read_u32_le(hdr);
    ACCEL_CHECK(len >= 1 && len <= kMaxHelloBytes, DistError, "store",
                "invalid handshake reply of ", len, " bytes (is ", host_, ":", port_,
                " an accel store?)");
    std::string reply(len, '\0');
    recv_exact(fd_, reply.data(), len, hello_deadline, "store");
    if (uint8_t(reply[0]) != kOk) {
      Reader r(reply.data() + 1, reply.size() - 1);
      std::string msg;
      try {
        msg = r.str(kMaxHelloBytes);
      } catch (const ParseError&) {
        msg = "handshake refused";
      }
      ACCEL_THROW(DistError, "store", "server at ", host_, ":", port_, " refused: ", msg);
    }
  } catch (...) {
    disconnect_locked();
    throw;
  }
}

TcpStore::Reply TcpStore::request(const char* op, const std::string& body,
                                  Milliseconds wait_budget) {
  ACCEL_CHECK(body.size() <= options_.max_message_bytes, DistError, op, "request of ",
              body.size(), " bytes exceeds the store limit of ", options_.max_message_bytes);
  std::lock_guard<std::mutex> g(mu_);
  if (fd_ < 0) connect_locked();  // a previous failure dropped the connection
  auto deadline = Clock::now() + wait_budget + kReplyGrace;
  try {
    send_all(fd_, frame(body), deadline, op);
    char hdr[4];
    recv_exact(fd_, hdr, 4, deadline, op);
    uint32_t len = read_u32_le(hdr);
    ACCEL_CHECK(len >= 1 && len <= options_.max_message_bytes + 64, DistError, op,
                "invalid reply length ", len, " from the store server");
    Reply rep;
    std::string buf(len, '\0');
    recv_exact(fd_, buf.data(), len, deadline, op);
    rep.status = uint8_t(buf[0]);
    rep.body = buf.substr(1);
    if (rep.status == kErr) {
      Reader r(rep.body.data(), rep.body.size());
      std::string msg;
      try {
        msg = r.str(len);
      } catch (const ParseError&) {
        msg = "unreadable error";
      }
      ACCEL_THROW(DistError, op, "store server: ", msg);
    }
    ACCEL_CHECK(rep.status == kOk || rep.status == kTimeout, DistError, op,
                "invalid reply status ", int(rep.status));
    return rep;
  } catch (const DistError&) {
    // An error reply leaves the stream in sync, but a timeout or a broken socket may not:
    // reconnect on the next call. Dropping the connection is always safe.
    disconnect_locked();
    throw;
  }
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

std::string TcpStore::get(const std::string& key, Milliseconds timeout) {
  ACCEL_CHECK(key.size() <= kMaxStoreKeyBytes, DistError, "store.get", "key of ", key.size(),
              " bytes exceeds ", kMaxStoreKeyBytes);
  std::string body;
  put_u8(body, kGet);
  put_int<uint64_t>(body, uint64_t(std::max<int64_t>(0, timeout.count())));
  put_str(body, key);
  Reply rep = request("store.get", body, timeout);
  ACCEL_CHECK(rep.status == kOk, DistError, "store.get", "timed out after ", timeout.count(),
              " ms waiting for key '", key, "'");
  Reader r(rep.body.data(), rep.body.size());
  try {
    return r.str(options_.max_message_bytes);
  } catch (const ParseError& e) {
    ACCEL_THROW(DistError, "store.get", "malformed reply: ", e.what);
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
  std::string body;
  put_u8(body, kWait);
  put_int<uint64_t>(body, uint64_t(std::max<int64_t>(0, timeout.count())));
  put_int<uint32_t>(body, uint32_t(keys.size()));
  for (auto& k : keys) {
    ACCEL_CHECK(k.size() <= kMaxStoreKeyBytes, DistError, "store.wait", "key of ", k.size(),
                " bytes exceeds ", kMaxStoreKeyBytes);
    put_str(body, k);
  }
  Reply rep = request("store.wait", body, timeout);
  if (rep.status == kTimeout) {
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

// =============================== prefix ===============================

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

}  // namespace accel::dist
