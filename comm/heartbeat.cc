#include "comm/heartbeat.h"

#include <fcntl.h>
#include <linux/errqueue.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "comm/auth.h"
#include "comm/init_guard.h"
#include "comm/net.h"

// Note [heartbeat authentication]
// A datagram is
//   u32 magic "ACB2", u8 type (beat, bye, fail), u8 flags (0), u16 reason length,
//   u32 from rank, u32 to rank, u32 group size, u64 sequence number, the reason (fail only),
//   16 bytes: HMAC-SHA256 under the group's key, truncated, over everything before it.
// The key is store->derive_key("heartbeat") (Note [store authentication] in comm/store_protocol.h):
// only ranks of this job that completed the store's handshake can compute it, and it differs for
// every group, every generation of the store and every job, so a datagram of another group, an
// earlier init_process_group or another job fails the check. The sequence number counts the
// datagrams from one rank to one peer; a datagram whose number is not above the highest accepted
// from that peer is a replay (or reordered) and ignored. The destination rank is covered, so a
// datagram captured on its way to one rank is no use at another. Datagrams that fail any check
// are counted (forged_datagrams, replayed_datagrams) and change nothing: forged "bye"s can no
// longer stretch a 15 s detection into a minute. An authentic datagram is accepted whatever
// address it comes from (that is how a peer becomes known before its store key is read).
// Not authenticated: ICMP errors (a closed port is reported only after two in a row, with no
// authentic datagram in between; a host on the path could forge them, as it could cut the link).
//
// Note [heartbeat during init]
// The heartbeat is the first thing a group builds (gloo/process_group_gloo.cc), and this rank's
// thread runs before its address is published, so whoever reads the address gets answers. A peer
// is watched from the moment its address is known: read from the store (ranks are read in order,
// each wait bounded by the setup deadline and ended early by the store when the peer's connection
// closes, Note [store membership]) or learned from its first authentic datagram (a peer that read
// our address before we read its one is known at once, so neither side's clock runs on a peer
// that does not yet know where to send). A rank stopped while the group forms is therefore found
// within `timeout` of the first moment anyone knew its address, and the group's InitGuard ends
// whatever step the others are blocked in (a store wait, a Gloo pair connect).

namespace accel::dist {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kBeatMagic = 0x32424341;  // "ACB2"
constexpr size_t kHeaderBytes = 28;
constexpr size_t kMacBytes = 16;
constexpr size_t kMaxReason = 480;  // a datagram stays well under any MTU
// A bye travels as UDP: sent a few times so that one lost datagram does not turn a clean exit
// into a reported failure.
constexpr int kByeRepeats = 3;
// ICMP port unreachable in a row before a peer's socket counts as closed.
constexpr int kRefusalsToReport = 2;
// The farewell datagrams' sequence numbers: above any a rank reaches by beating.
constexpr uint64_t kFarewellSeq = uint64_t(1) << 62;
// Loss is measured over windows of this many intervals; a window losing at least
// kLossWarnFraction of a peer's datagrams is logged once per peer.
constexpr int kLossWindow = 10;
constexpr double kLossWarnFraction = 0.2;

void put32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(char((v >> (8 * i)) & 0xff));
}
uint32_t get32(const unsigned char* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
uint64_t get64(const unsigned char* p) { return uint64_t(get32(p)) | uint64_t(get32(p + 4)) << 32; }

// sendto, once more when it fails with an error an earlier datagram's ICMP left on the socket:
// with IP_RECVERR a pending error makes the next send fail (and is cleared by it), so a peer
// whose port is closed would otherwise swallow the beat meant for the next peer.
void send_datagram(int fd, const std::string& d, const std::vector<char>& dest) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    ssize_t w = sendto(fd, d.data(), d.size(), MSG_DONTWAIT | MSG_NOSIGNAL,
                       reinterpret_cast<const sockaddr*>(dest.data()), socklen_t(dest.size()));
    if (w >= 0 || (errno != ECONNREFUSED && errno != EHOSTUNREACH && errno != ENETUNREACH &&
                   errno != EHOSTDOWN && errno != EINTR))
      return;
  }
}

std::string seconds_str(double s) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.1f", s);
  return b;
}

}  // namespace

std::string Heartbeat::lost_message(int rank, const std::string& address, double silent_s) {
  return "rank " + std::to_string(rank) + " at " + address + " sent no heartbeat for " +
         seconds_str(silent_s) + " s (stopped, hung or unreachable)";
}

std::string Heartbeat::failed_message(int rank, const std::string& address,
                                      const std::string& why) {
  return "rank " + std::to_string(rank) + " at " + address + " failed: " + why;
}

std::string Heartbeat::closed_message(int rank, const std::string& address) {
  return "rank " + std::to_string(rank) + " at " + address +
         ": its heartbeat port is closed (the process exited or was killed)";
}

std::string Heartbeat::unreachable_message(int rank, const std::string& address_port) {
  return "rank " + std::to_string(rank) + " at " + address_port +
         " (its heartbeat address) answers that no such port is open, and nothing was ever "
         "received from it: an address it cannot be reached at from here (a loopback address "
         "advertised to another machine? choose the interface with ACCEL_SOCKET_IFNAME), or "
         "the process exited";
}

std::string Heartbeat::encode(const std::string& key, uint8_t type, int from, int to, int size,
                              uint64_t seq, const std::string& reason) {
  std::string r = reason.substr(0, kMaxReason);
  std::string d;
  d.reserve(kHeaderBytes + r.size() + kMacBytes);
  put32(d, kBeatMagic);
  d.push_back(char(type));
  d.push_back(0);
  d.push_back(char(r.size() & 0xff));
  d.push_back(char(r.size() >> 8));
  put32(d, uint32_t(from));
  put32(d, uint32_t(to));
  put32(d, uint32_t(size));
  put32(d, uint32_t(seq));
  put32(d, uint32_t(seq >> 32));
  d += r;
  auth::Digest mac = auth::hmac_sha256(key, d);
  d.append(reinterpret_cast<const char*>(mac.data()), kMacBytes);
  return d;
}

Heartbeat::Heartbeat(const std::shared_ptr<Store>& store, int rank, int size,
                     const std::string& hostname, Milliseconds interval, Milliseconds timeout,
                     Milliseconds setup_timeout, LostFn on_lost, const InitGuard* guard)
    : rank_(rank),
      size_(size),
      interval_(std::max(Milliseconds(1), std::min(interval, timeout / 4))),
      timeout_(timeout),
      on_lost_(std::move(on_lost)),
      peers_(static_cast<size_t>(size)) {
  ACCEL_CHECK(timeout.count() > 0, DistError, "init", "heartbeat timeout must be positive, got ",
              timeout.count(), " ms");
  const auto deadline = guard ? guard->deadline() : Clock::now() + setup_timeout;
  if (guard) setup_timeout = guard->timeout();
  const std::string who = "rank " + std::to_string(rank) + " of " + std::to_string(size);
  key_ = store->derive_key("heartbeat");
  // Bind a UDP socket on the selected address, port 0.
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(hostname.c_str(), "0", &hints, &res);
  ACCEL_CHECK(rc == 0, DistError, "init", who, ": heartbeat: cannot resolve '", hostname,
              "': ", gai_strerror(rc));
  std::string err = "no address";
  for (addrinfo* a = res; a && fd_ < 0; a = a->ai_next) {
    int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) continue;
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0) {
      fd_ = fd;
      // ICMP errors (a peer's port closed) are queued for this unconnected socket.
      int one = 1;
      if (a->ai_family == AF_INET6)
        setsockopt(fd_, IPPROTO_IPV6, IPV6_RECVERR, &one, sizeof(one));
      else
        setsockopt(fd_, IPPROTO_IP, IP_RECVERR, &one, sizeof(one));
    } else {
      err = std::strerror(errno);
      close(fd);
    }
  }
  freeaddrinfo(res);
  ACCEL_CHECK(fd_ >= 0, DistError, "init", who, ": heartbeat: cannot bind UDP on '", hostname,
              "': ", err);
  if (pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    int e = errno;
    close(fd_);
    ACCEL_THROW(DistError, "init", "heartbeat: pipe failed: ", std::strerror(e));
  }
  auto now = Clock::now();
  for (auto& p : peers_) p.last_seen = now;
  // The thread first, then the address: whoever reads it gets answers (Note [heartbeat during
  // init]).
  thread_ = std::thread([this] { loop(); });
  try {
    sockaddr_storage ss{};
    socklen_t sl = sizeof(ss);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&ss), &sl);
    std::string port = format_sockaddr(reinterpret_cast<sockaddr*>(&ss), true);
    port = port.substr(port.rfind(':') + 1);
    store->set("hb/" + std::to_string(rank), hostname + "\n" + port);
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank) continue;
      const std::string key = "hb/" + std::to_string(peer);
      wait_peer_key(*store, key, peer, deadline, setup_timeout, who, "heartbeat address");
      std::string v = store->get(key);
      auto nl = v.find('\n');
      ACCEL_CHECK(nl != std::string::npos, DistError, "init", who, ": bad heartbeat address '", v,
                  "' from rank ", peer);
      addrinfo h2{};
      h2.ai_family = AF_UNSPEC;
      h2.ai_socktype = SOCK_DGRAM;
      h2.ai_flags = AI_NUMERICSERV;
      addrinfo* pr = nullptr;
      std::string host = v.substr(0, nl);
      rc = getaddrinfo(host.c_str(), v.substr(nl + 1).c_str(), &h2, &pr);
      ACCEL_CHECK(rc == 0 && pr, DistError, "init", who, ": cannot resolve rank ", peer,
                  "'s heartbeat address '", v, "': ", gai_strerror(rc));
      {
        std::lock_guard<std::mutex> g(mu_);
        learn(peer, host, format_sockaddr(pr->ai_addr, true), pr->ai_addr, pr->ai_addrlen);
      }
      freeaddrinfo(pr);
    }
  } catch (...) {
    char c = 1;
    ssize_t w = write(wake_[1], &c, 1);
    (void)w;
    thread_.join();
    close(fd_);
    for (int fd : wake_) close(fd);
    throw;
  }
}

Heartbeat::~Heartbeat() {
  if (thread_.joinable()) {
    char c = 1;
    ssize_t w = write(wake_[1], &c, 1);
    (void)w;
    thread_.join();
  }
  {
    // Signed ahead of time (sign_farewell): no cryptography here.
    std::lock_guard<std::mutex> g(mu_);
    for (int peer = 0; peer < size_; ++peer) {
      Peer& p = peers_[size_t(peer)];
      if (peer == rank_ || p.dest.empty() || (p.departed && failure_.empty())) continue;
      for (const std::string& d : p.farewell) send_datagram(fd_, d, p.dest);
    }
  }
  if (fd_ >= 0) close(fd_);
  for (int fd : wake_)
    if (fd >= 0) close(fd);
}

void Heartbeat::fail(const std::string& why) {
  std::lock_guard<std::mutex> g(mu_);
  if (!failure_.empty()) return;
  failure_ = why.empty() ? std::string("failed") : why.substr(0, kMaxReason);
  send_all(kFail);  // at once; the thread repeats it every interval
  for (int peer = 0; peer < size_; ++peer)
    if (peer != rank_ && !peers_[size_t(peer)].dest.empty()) sign_farewell(peer);
}

void Heartbeat::sign_farewell(int peer) {
  Peer& p = peers_[size_t(peer)];
  p.farewell.clear();
  const uint8_t type = failure_.empty() ? kBye : kFail;
  for (int i = 1; i <= kByeRepeats; ++i)
    p.farewell.push_back(encode(key_, type, rank_, peer, size_, kFarewellSeq + uint64_t(i),
                                type == kFail ? failure_ : std::string()));
}

void Heartbeat::set_on_tick(std::function<void()> fn) {
  std::lock_guard<std::mutex> g(tick_mu_);
  on_tick_ = std::move(fn);
}

double Heartbeat::loss_fraction(int peer) const {
  std::lock_guard<std::mutex> g(mu_);
  if (peer < 0 || peer >= size_ || peer == rank_) return 0;
  const Peer& p = peers_[size_t(peer)];
  if (p.last_got < 0 || p.last_got + p.last_lost == 0) return 0;
  return double(p.last_lost) / double(p.last_got + p.last_lost);
}

std::string Heartbeat::peer_address(int peer) const {
  std::lock_guard<std::mutex> g(mu_);
  if (peer < 0 || peer >= size_ || peer == rank_) return {};
  return peers_[size_t(peer)].address;
}

std::string Heartbeat::loss_report(int peer) const {
  std::lock_guard<std::mutex> g(mu_);
  if (peer < 0 || peer >= size_ || peer == rank_) return {};
  const Peer& p = peers_[size_t(peer)];
  // The last complete window, or the current one when that has seen more.
  int64_t got = p.last_got < 0 ? p.window_got : p.last_got;
  int64_t lost = p.last_got < 0 ? p.window_lost : p.last_lost;
  if (p.window_lost > lost) {
    got = p.window_got;
    lost = p.window_lost;
  }
  if (lost == 0) return {};
  return std::to_string(lost) + " of " + std::to_string(got + lost) +
         " heartbeats from it lost in the last " +
         seconds_str(double(kLossWindow) * double(interval_.count()) / 1000.0) + " s";
}

void Heartbeat::send_all(uint8_t type) {
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    Peer& p = peers_[size_t(peer)];
    // Not to a peer that said bye (its socket is closed), nor to one reported lost, unless this
    // rank failed: then everyone hears it.
    if (p.dest.empty() || ((p.departed || p.reported) && type != kFail)) continue;
    std::string d = encode(key_, type, rank_, peer, size_, ++p.sent_seq,
                           type == kFail ? failure_ : std::string());
    // Errors (a link that is down, a full buffer) are what the peer's timeout is for.
    send_datagram(fd_, d, p.dest);
  }
}

void Heartbeat::learn(int peer, const std::string& address, const std::string& key,
                      const sockaddr* sa, size_t sa_len) {
  Peer& p = peers_[size_t(peer)];
  const bool was_known = !p.dest.empty();
  const char* b = reinterpret_cast<const char*>(sa);
  p.dest.assign(b, b + sa_len);
  p.address = address;
  p.key = key;
  if (!was_known) {
    sign_farewell(peer);
    // Its clock starts now: it is watched from the moment its address is known.
    p.last_seen = Clock::now();
    const uint8_t type = failure_.empty() ? kBeat : kFail;
    std::string d = encode(key_, type, rank_, peer, size_, ++p.sent_seq,
                           type == kFail ? failure_ : std::string());
    send_datagram(fd_, d, p.dest);
  }
}

void Heartbeat::read_datagrams(std::vector<std::pair<int, std::string>>& reports) {
  unsigned char buf[kHeaderBytes + kMaxReason + kMacBytes + 64];
  for (int spins = 0; spins < 4096; ++spins) {
    sockaddr_storage from{};
    socklen_t fl = sizeof(from);
    ssize_t r =
        recvfrom(fd_, buf, sizeof(buf), MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&from), &fl);
    if (r < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      continue;  // EINTR, or a queued ICMP error reported here as well (read_errors has it)
    }
    const size_t n = size_t(r);
    bool ok = n >= kHeaderBytes + kMacBytes && get32(buf) == kBeatMagic;
    size_t reason_len = ok ? size_t(buf[6]) | size_t(buf[7]) << 8 : 0;
    uint8_t type = ok ? buf[4] : 0;
    uint32_t src = ok ? get32(buf + 8) : 0, dst = ok ? get32(buf + 12) : 0;
    ok = ok && (type == kBeat || type == kBye || type == kFail) && reason_len <= kMaxReason &&
         n == kHeaderBytes + reason_len + kMacBytes && src < uint32_t(size_) && int(src) != rank_ &&
         dst == uint32_t(rank_) && get32(buf + 16) == uint32_t(size_);
    if (ok) {
      auth::Digest mac = auth::hmac_sha256(
          key_, std::string_view(reinterpret_cast<const char*>(buf), n - kMacBytes));
      ok = auth::equal_ct(mac.data(), buf + n - kMacBytes, kMacBytes);
    }
    if (!ok) {
      ++forged_;
      continue;
    }
    const uint64_t seq = get64(buf + 20);
    std::lock_guard<std::mutex> g(mu_);
    Peer& p = peers_[src];
    if (seq <= p.last_seq) {
      ++replayed_;
      continue;
    }
    if (p.last_seq > 0 && seq > p.last_seq + 1 && seq < kFarewellSeq)
      p.window_lost += int64_t(seq - p.last_seq - 1);
    p.last_seq = seq;
    ++p.window_got;
    if (p.dest.empty()) {
      // Known from its authentic datagram before its store key was read (Note [heartbeat
      // during init]); the store's address replaces this one when it is read.
      learn(int(src), format_sockaddr(reinterpret_cast<sockaddr*>(&from), false),
            format_sockaddr(reinterpret_cast<sockaddr*>(&from), true),
            reinterpret_cast<sockaddr*>(&from), fl);
    }
    ++received_;
    p.last_seen = Clock::now();
    p.refused = 0;
    if (type == kBye) p.departed = true;
    if (type == kFail && !p.reported && !p.departed) {
      p.reported = true;
      reports.emplace_back(
          int(src), failed_message(int(src), p.address,
                                   std::string(reinterpret_cast<const char*>(buf) + kHeaderBytes,
                                               reason_len)));
    }
  }
}

void Heartbeat::read_errors(std::vector<std::pair<int, std::string>>& reports) {
  for (int spins = 0; spins < 4096; ++spins) {
    char data[256];
    char control[512];
    sockaddr_storage offender{};
    iovec iov{data, sizeof(data)};
    msghdr m{};
    m.msg_name = &offender;
    m.msg_namelen = sizeof(offender);
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = control;
    m.msg_controllen = sizeof(control);
    if (recvmsg(fd_, &m, MSG_ERRQUEUE | MSG_DONTWAIT) < 0) break;
    bool refused = false;
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
      if ((c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_RECVERR) ||
          (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_RECVERR)) {
        sock_extended_err e{};
        std::memcpy(&e, CMSG_DATA(c), sizeof(e));
        refused =
            refused || ((e.ee_origin == SO_EE_ORIGIN_ICMP || e.ee_origin == SO_EE_ORIGIN_ICMP6) &&
                        e.ee_errno == ECONNREFUSED);
      }
    }
    if (!refused || m.msg_namelen == 0) continue;
    // msg_name is where the datagram that bounced was going.
    const std::string where = format_sockaddr(reinterpret_cast<sockaddr*>(&offender), true);
    std::lock_guard<std::mutex> g(mu_);
    for (int peer = 0; peer < size_; ++peer) {
      Peer& p = peers_[size_t(peer)];
      if (peer == rank_ || p.key != where || p.departed || p.reported) continue;
      if (++p.refused >= kRefusalsToReport) {
        p.reported = true;
        // Never heard from: more likely an address that leads elsewhere than a dead process.
        reports.emplace_back(peer, p.last_seq == 0 ? unreachable_message(peer, p.key)
                                                   : closed_message(peer, p.address));
      }
    }
  }
}

void Heartbeat::loop() {
  auto next_send = Clock::now();  // peers known by now get a beat at once
  auto next_tick = Clock::now() + interval_;
  auto window_end = Clock::now() + interval_ * kLossWindow;
  auto last_wake = Clock::now();
  std::vector<std::pair<int, std::string>> reports;
  for (;;) {
    auto now = Clock::now();
    if (now >= next_send) {
      std::lock_guard<std::mutex> g(mu_);
      send_all(failure_.empty() ? kBeat : kFail);
      next_send = now + interval_;
    }
    pollfd pf[2] = {{fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    int pr = poll(pf, 2, remaining_ms(std::min(next_send, next_tick)));
    if (pr < 0 && errno != EINTR) break;
    if (pf[1].revents) break;  // stop
    reports.clear();
    // Read every queued datagram before judging anyone: when this thread was starved of CPU,
    // the peers' beats wait in the socket buffer and must not count as silence.
    read_datagrams(reports);
    read_errors(reports);
    now = Clock::now();
    bool tick = false;
    {
      std::lock_guard<std::mutex> g(mu_);
      // This thread itself did not run for longer than the timeout (the process was stopped and
      // continued, or the machine suspended; it normally wakes every interval): the silence it
      // sees is its own, not the peers'. Judge them afresh from now on.
      if (now - last_wake > timeout_) {
        for (auto& p : peers_) p.last_seen = now;
      }
      last_wake = now;
      for (int peer = 0; peer < size_; ++peer) {
        Peer& p = peers_[size_t(peer)];
        if (peer == rank_ || p.dest.empty() || p.departed || p.reported) continue;
        auto silent = now - p.last_seen;
        if (silent > timeout_) {
          p.reported = true;
          reports.emplace_back(
              peer, lost_message(peer, p.address, std::chrono::duration<double>(silent).count()));
        }
      }
      if (now >= window_end) {
        window_end = now + interval_ * kLossWindow;
        for (int peer = 0; peer < size_; ++peer) {
          Peer& p = peers_[size_t(peer)];
          if (peer == rank_ || p.dest.empty()) continue;
          p.last_got = p.window_got;
          p.last_lost = p.window_lost;
          p.window_got = p.window_lost = 0;
          const int64_t sent = p.last_got + p.last_lost;
          if (!p.loss_warned && sent > 0 &&
              double(p.last_lost) >= kLossWarnFraction * double(sent)) {
            p.loss_warned = true;
            std::fprintf(stderr,
                         "[heartbeat] rank %d: %lld of %lld heartbeats from rank %d at %s were "
                         "lost in the last %.1f s: the network path to it is losing packets\n",
                         rank_, static_cast<long long>(p.last_lost), static_cast<long long>(sent),
                         peer, p.address.c_str(),
                         double(kLossWindow) * double(interval_.count()) / 1000.0);
          }
        }
      }
      if (now >= next_tick) {
        next_tick = now + interval_;
        tick = true;
      }
    }
    for (auto& [peer, msg] : reports) {
      if (!on_lost_) continue;
      try {
        on_lost_(peer, msg);
      } catch (...) {
        // The callback records the failure; nothing useful to do with its own errors here.
      }
    }
    if (tick) {
      std::lock_guard<std::mutex> g(tick_mu_);
      try {
        if (on_tick_) on_tick_();
      } catch (...) {
      }
    }
  }
}

}  // namespace accel::dist
