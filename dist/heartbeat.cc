#include "dist/heartbeat.h"

#include <fcntl.h>
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
#include "dist/net.h"

namespace accel::dist {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kBeatMagic = 0x54424341;  // "ACBT"
constexpr uint32_t kBeat = 1;
constexpr uint32_t kBye = 2;
// A bye travels as UDP: sent a few times so that one lost datagram does not turn a clean exit
// into a reported failure.
constexpr int kByeRepeats = 3;

struct Datagram {
  uint32_t magic;
  uint32_t type;
  uint32_t rank;
  uint32_t size;
};

}  // namespace

std::string Heartbeat::lost_message(int rank, const std::string& address, double silent_s) {
  char secs[32];
  std::snprintf(secs, sizeof(secs), "%.1f", silent_s);
  return "rank " + std::to_string(rank) + " at " + address + " sent no heartbeat for " + secs +
         " s (stopped, hung or unreachable)";
}

Heartbeat::Heartbeat(const std::shared_ptr<Store>& store, int rank, int size,
                     const std::string& hostname, Milliseconds interval, Milliseconds timeout,
                     Milliseconds setup_timeout, LostFn on_lost)
    : rank_(rank),
      size_(size),
      interval_(std::max(Milliseconds(1), std::min(interval, timeout / 4))),
      timeout_(timeout),
      on_lost_(std::move(on_lost)),
      peers_(static_cast<size_t>(size)) {
  ACCEL_CHECK(timeout.count() > 0, DistError, "init", "heartbeat timeout must be positive, got ",
              timeout.count(), " ms");
  const auto deadline = Clock::now() + setup_timeout;
  const std::string who = "rank " + std::to_string(rank) + " of " + std::to_string(size);
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
    } else {
      err = std::strerror(errno);
      close(fd);
    }
  }
  freeaddrinfo(res);
  ACCEL_CHECK(fd_ >= 0, DistError, "init", who, ": heartbeat: cannot bind UDP on '", hostname,
              "': ", err);
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
      try {
        store->wait({key}, std::max(Milliseconds(1), std::chrono::duration_cast<Milliseconds>(
                                                         deadline - Clock::now())));
      } catch (const DistError& e) {
        ACCEL_THROW(DistError, "init", who, ": rank ", peer,
                    " did not publish its heartbeat address within ", setup_timeout.count(),
                    " ms (did it start?): ", e.what());
      }
      std::string v = store->get(key);
      auto nl = v.find('\n');
      ACCEL_CHECK(nl != std::string::npos, DistError, "init", who, ": bad heartbeat address '", v,
                  "' from rank ", peer);
      Peer& p = peers_[size_t(peer)];
      p.address = v.substr(0, nl);
      addrinfo h2{};
      h2.ai_family = AF_UNSPEC;
      h2.ai_socktype = SOCK_DGRAM;
      h2.ai_flags = AI_NUMERICSERV;
      addrinfo* pr = nullptr;
      rc = getaddrinfo(p.address.c_str(), v.substr(nl + 1).c_str(), &h2, &pr);
      ACCEL_CHECK(rc == 0 && pr, DistError, "init", who, ": cannot resolve rank ", peer,
                  "'s heartbeat address '", v, "': ", gai_strerror(rc));
      const char* sa = reinterpret_cast<const char*>(pr->ai_addr);
      p.dest.assign(sa, sa + pr->ai_addrlen);
      p.key = format_sockaddr(pr->ai_addr, true);
      freeaddrinfo(pr);
    }
    ACCEL_CHECK(pipe2(wake_, O_CLOEXEC | O_NONBLOCK) == 0, DistError, "init",
                "heartbeat: pipe failed: ", std::strerror(errno));
  } catch (...) {
    close(fd_);
    throw;
  }
  // Peers start at different times; the clock of each starts now, when all addresses are known
  // (every peer has bound its socket, and is at most setup time away from beating).
  auto now = Clock::now();
  for (auto& p : peers_) p.last_seen = now;
  send_all(kBeat);
  thread_ = std::thread([this] { loop(); });
}

Heartbeat::~Heartbeat() {
  if (thread_.joinable()) {
    char c = 1;
    ssize_t w = write(wake_[1], &c, 1);
    (void)w;
    thread_.join();
  }
  for (int i = 0; i < kByeRepeats; ++i) send_all(kBye);
  if (fd_ >= 0) close(fd_);
  for (int fd : wake_)
    if (fd >= 0) close(fd);
}

void Heartbeat::send_all(uint32_t type) {
  Datagram d{kBeatMagic, type, uint32_t(rank_), uint32_t(size_)};
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    const Peer& p = peers_[size_t(peer)];
    if (p.dest.empty()) continue;
    // Errors (a link that is down, a full buffer) are what the peer's timeout is for.
    ssize_t w = sendto(fd_, &d, sizeof(d), MSG_DONTWAIT | MSG_NOSIGNAL,
                       reinterpret_cast<const sockaddr*>(p.dest.data()), socklen_t(p.dest.size()));
    (void)w;
  }
}

void Heartbeat::loop() {
  auto next_send = Clock::now() + interval_;
  auto last_wake = Clock::now();
  for (;;) {
    auto now = Clock::now();
    if (now >= next_send) {
      send_all(kBeat);
      next_send = now + interval_;
    }
    pollfd pf[2] = {{fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    int pr = poll(pf, 2, remaining_ms(next_send));
    if (pr < 0 && errno != EINTR) break;
    if (pf[1].revents) break;  // stop
    // Read every queued datagram before judging anyone: when this thread was starved of CPU,
    // the peers' beats wait in the socket buffer and must not count as silence.
    for (;;) {
      Datagram d{};
      sockaddr_storage from{};
      socklen_t fl = sizeof(from);
      ssize_t r =
          recvfrom(fd_, &d, sizeof(d), MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&from), &fl);
      if (r < 0) break;
      if (r != ssize_t(sizeof(d)) || d.magic != kBeatMagic || d.size != uint32_t(size_) ||
          d.rank >= uint32_t(size_) || int(d.rank) == rank_)
        continue;
      Peer& p = peers_[d.rank];
      // Only the peer's own socket counts (not a stray sender that knows the format).
      if (format_sockaddr(reinterpret_cast<sockaddr*>(&from), true) != p.key) continue;
      ++received_;
      p.last_seen = Clock::now();
      if (d.type == kBye) p.departed = true;
    }
    now = Clock::now();
    // This thread itself did not run for longer than the timeout (the process was stopped and
    // continued, or the machine suspended; it normally wakes every interval): the silence it
    // sees is its own, not the peers'. Judge them afresh from now on.
    if (now - last_wake > timeout_) {
      for (auto& p : peers_) p.last_seen = now;
    }
    last_wake = now;
    for (int peer = 0; peer < size_; ++peer) {
      Peer& p = peers_[size_t(peer)];
      if (peer == rank_ || p.departed || p.reported) continue;
      auto silent = now - p.last_seen;
      if (silent > timeout_) {
        p.reported = true;
        if (on_lost_) {
          try {
            on_lost_(peer, p.address, std::chrono::duration<double>(silent).count());
          } catch (...) {
            // The callback records the failure; nothing useful to do with its own errors here.
          }
        }
      }
    }
  }
}

}  // namespace accel::dist
