// TcpStore: the client (connect, handshake, requests, reconnects).
#include "comm/store.h"

#include "comm/store_protocol.h"

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

namespace accel::dist {

using namespace store_wire;  // NOLINT: the wire format of comm/store_protocol.h

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
