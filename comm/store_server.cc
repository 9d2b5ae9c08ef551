// TcpStoreServer: the listener, connections, keys and waiters (Note [store hardening] in
// comm/store_server_impl.h); the requests are comm/store_requests.cc.
#include "comm/store_server_impl.h"

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

}  // namespace accel::dist
