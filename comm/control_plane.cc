#include "comm/control_plane.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <cstdlib>
#include <sstream>

#include "comm/init_guard.h"
#include "comm/net.h"

namespace accel::dist {

namespace {

using Clock = NetClock;

constexpr uint32_t kHelloMagic = 0x4c544341;  // "ACTL"
constexpr uint32_t kData = 1;
constexpr uint32_t kAbort = 2;
constexpr size_t kMaxAbortText = 4096;

struct FrameHeader {
  uint32_t type;
  uint32_t len;
};

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Writes all of `n` bytes or throws; `peer` only for the message.
void write_all(int fd, const void* p, size_t n, Clock::time_point deadline, int peer) {
  const char* c = static_cast<const char*>(p);
  size_t off = 0;
  while (off < n) {
    ssize_t w = send(fd, c + off, n - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      off += size_t(w);
      continue;
    }
    if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
      pollfd pf{fd, POLLOUT, 0};
      if (poll(&pf, 1, remaining_ms(deadline)) == 0)
        throw PeerError("rank " + std::to_string(peer) + " stopped reading control messages");
      continue;
    }
    throw PeerError("lost the connection to rank " + std::to_string(peer) + " (" +
                    std::strerror(errno) + "): it exited or crashed");
  }
}

// A setup poll: at most 100 ms at a time while `guard` may end the setup (the caller checks it
// when this returns 0 before the deadline).
int setup_poll(pollfd* pf, Clock::time_point deadline, const InitGuard* guard) {
  const int left = remaining_ms(deadline);
  return poll(pf, 1, guard ? std::min(left, 100) : left);
}

// Reads exactly n bytes (blocking with deadline) during setup.
bool read_exact(int fd, void* p, size_t n, Clock::time_point deadline, const InitGuard* guard) {
  char* c = static_cast<char*>(p);
  size_t off = 0;
  while (off < n) {
    pollfd pf{fd, POLLIN, 0};
    int pr = setup_poll(&pf, deadline, guard);
    if (pr == 0 && (remaining_ms(deadline) == 0 || (guard && guard->failed()))) return false;
    if (pr == 0) continue;
    if (pr < 0 && errno == EINTR) continue;
    ssize_t r = recv(fd, c + off, n - off, MSG_DONTWAIT);
    if (r > 0) {
      off += size_t(r);
    } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
      return false;
    }
  }
  return true;
}

std::string ranks_str(const std::vector<int>& v) {
  std::ostringstream os;
  os << (v.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  return os.str();
}

}  // namespace

ControlPlane::ControlPlane(const std::shared_ptr<Store>& store, int rank, int size,
                           const std::string& hostname, Milliseconds timeout,
                           const InitGuard* guard)
    : rank_(rank), size_(size), fds_(static_cast<size_t>(size), -1) {
  if (size == 1) return;
  // Note [bounded setup]: every wait below (the store, connect, accept, the hello) is bounded by
  // one deadline, and a failure names the peer and its address, so a peer that never shows up or
  // advertises an address we cannot reach fails the group within `timeout`.
  // With a guard, the formation's deadline, and its configured timeout in messages.
  auto deadline = guard ? guard->deadline() : Clock::now() + timeout;
  if (guard) timeout = guard->timeout();
  const std::string who = "rank " + std::to_string(rank) + " of " + std::to_string(size);
  auto peer_address = [&](int peer) -> std::string {
    // The address a peer published, or a note that it did not (non-blocking).
    std::string key = "ctl/" + std::to_string(peer);
    try {
      if (!store->check({key})) {
        std::string known = store->describe_rank(peer);
        return "(it did not publish its address: " + (known.empty() ? "did it start?" : known) +
               ")";
      }
      std::string v = store->get(key);
      auto nl = v.find('\n');
      return nl == std::string::npos ? v : "at " + v.substr(0, nl) + ":" + v.substr(nl + 1);
    } catch (const std::exception&) {
      return "(address unknown: the store is unreachable)";
    }
  };
  // Listen on hostname:0 and publish where.
  int port = 0;
  int lfd = listen_tcp(hostname, size, &port, "init");
  store->set("ctl/" + std::to_string(rank), hostname + "\n" + std::to_string(port));
  try {
    // Connect to every lower rank (their listen backlog holds us until they accept).
    std::function<bool()> cancelled;
    if (guard) cancelled = [guard] { return guard->failed(); };
    for (int peer = 0; peer < rank; ++peer) {
      std::string key = "ctl/" + std::to_string(peer);
      wait_peer_key(*store, key, peer, deadline, timeout, who, "control address");
      std::string v = store->get(key);
      auto nl = v.find('\n');
      ACCEL_CHECK(nl != std::string::npos, DistError, "init", "bad control address '", v, "'");
      std::string host = v.substr(0, nl), pstr = v.substr(nl + 1);
      std::string error;
      int fd = connect_tcp(host, std::atoi(pstr.c_str()), deadline, &error, cancelled);
      if (guard) guard->check(who);
      ACCEL_CHECK(fd >= 0, DistError, "init", who, ": could not connect to rank ", peer, " at ",
                  host, ":", pstr, " within ", timeout.count(), " ms (control channel): ", error,
                  " (an address rank ", rank,
                  " cannot reach? choose the interface with ACCEL_SOCKET_IFNAME)");
      set_nodelay(fd);
      uint32_t hello[2] = {kHelloMagic, uint32_t(rank)};
      write_all(fd, hello, sizeof(hello), deadline, peer);
      fds_[size_t(peer)] = fd;
    }
    // Accept every higher rank; each says who it is.
    for (int n = rank + 1; n < size; ++n) {
      pollfd pf{lfd, POLLIN, 0};
      int pr = setup_poll(&pf, deadline, guard);
      if (guard) guard->check(who);
      if ((pr < 0 && errno == EINTR) || (pr == 0 && remaining_ms(deadline) > 0)) {
        --n;
        continue;
      }
      if (pr <= 0) {
        std::ostringstream os;
        for (int peer = rank + 1; peer < size; ++peer) {
          if (fds_[size_t(peer)] >= 0) continue;
          os << (os.tellp() > 0 ? "; " : "") << "rank " << peer << " " << peer_address(peer);
        }
        ACCEL_THROW(DistError, "init", who, ": no control connection from ", os.str(), " within ",
                    timeout.count(), " ms (listening at ", hostname, ":", port,
                    "; is that address reachable from the peer?)");
      }
      int fd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        --n;
        continue;
      }
      uint32_t hello[2] = {0, 0};
      if (!read_exact(fd, hello, sizeof(hello), deadline, guard) || hello[0] != kHelloMagic ||
          hello[1] <= uint32_t(rank) || hello[1] >= uint32_t(size) || fds_[hello[1]] >= 0) {
        close(fd);  // not one of ours (or a duplicate): keep waiting for the real peers
        --n;
        continue;
      }
      set_nodelay(fd);
      fds_[hello[1]] = fd;
    }
  } catch (...) {
    close(lfd);
    for (int& fd : fds_)
      if (fd >= 0) close(fd), fd = -1;
    throw;
  }
  close(lfd);
}

ControlPlane::~ControlPlane() {
  for (int fd : fds_)
    if (fd >= 0) close(fd);
}

void ControlPlane::all_gather(const void* mine, void* out, size_t bytes, Milliseconds timeout) {
  std::vector<std::string> all;
  all_gather_v(mine, bytes, all, bytes, timeout);
  char* o = static_cast<char*>(out);
  for (int r = 0; r < size_; ++r) {
    if (all[size_t(r)].size() != bytes)
      throw PeerError("rank " + std::to_string(r) + " sent a " +
                      std::to_string(all[size_t(r)].size()) + "-byte control message, expected " +
                      std::to_string(bytes));
    std::memcpy(o + size_t(r) * bytes, all[size_t(r)].data(), bytes);
  }
}

void ControlPlane::all_gather_v(const void* mine, size_t n, std::vector<std::string>& out,
                                size_t max_bytes, Milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  out.assign(size_t(size_), std::string());
  out[size_t(rank_)].assign(static_cast<const char*>(mine), n);
  if (size_ == 1) return;
  FrameHeader h{kData, uint32_t(n)};
  std::string frame(sizeof(h) + n, '\0');
  std::memcpy(frame.data(), &h, sizeof(h));
  std::memcpy(frame.data() + sizeof(h), mine, n);
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    if (fds_[size_t(peer)] < 0) throw PeerError("the control channel is closed");
    write_all(fds_[size_t(peer)], frame.data(), frame.size(), deadline, peer);
  }
  // Read one frame from every peer, whichever answers first.
  struct Pending {
    int peer;
    std::string buf;  // header + payload so far
  };
  std::vector<Pending> pending;
  for (int peer = 0; peer < size_; ++peer)
    if (peer != rank_) pending.push_back({peer, {}});
  std::vector<pollfd> pfds;
  bool first = true;
  while (!pending.empty()) {
    pfds.clear();
    for (auto& p : pending) pfds.push_back({fds_[size_t(p.peer)], POLLIN, 0});
    // The first pass reads what is already there without a poll (the peers that arrived first
    // sent their frames long ago); afterwards poll sleeps until something comes.
    int pr = 1;
    if (first) {
      for (auto& pf : pfds) pf.revents = POLLIN;
      first = false;
    } else {
      pr = poll(pfds.data(), pfds.size(), remaining_ms(deadline));
    }
    if (pr < 0 && errno == EINTR) continue;
    if (pr == 0) {
      std::vector<int> late;
      for (auto& p : pending) late.push_back(p.peer);
      throw PeerError(ranks_str(late) + " did not answer within " +
                      std::to_string(timeout.count()) + " ms (stopped, hung, or far behind)");
    }
    for (size_t i = pfds.size(); i-- > 0;) {
      if (!pfds[i].revents) continue;
      Pending& p = pending[i];
      // Read until the frame is complete or the socket is drained.
      while (true) {
        size_t want;
        FrameHeader ph{};
        if (p.buf.size() < sizeof(FrameHeader)) {
          want = sizeof(FrameHeader) - p.buf.size();
        } else {
          std::memcpy(&ph, p.buf.data(), sizeof(ph));
          want = sizeof(FrameHeader) + ph.len - p.buf.size();
        }
        char tmp[4096];
        ssize_t r = recv(pfds[i].fd, tmp, std::min(want, sizeof(tmp)), MSG_DONTWAIT);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
          throw PeerError("rank " + std::to_string(p.peer) +
                          " closed its control connection: it exited or crashed");
        }
        if (r < 0) break;  // drained for now
        p.buf.append(tmp, size_t(r));
        if (p.buf.size() < sizeof(FrameHeader)) continue;
        std::memcpy(&ph, p.buf.data(), sizeof(ph));
        if (ph.type == kAbort && ph.len > kMaxAbortText)
          throw PeerError("rank " + std::to_string(p.peer) + " aborted");
        if (ph.type == kData && ph.len > max_bytes)
          throw PeerError("rank " + std::to_string(p.peer) + " sent a " + std::to_string(ph.len) +
                          "-byte control message, at most " + std::to_string(max_bytes) +
                          " expected");
        if (ph.type != kData && ph.type != kAbort)
          throw PeerError("corrupt control message from rank " + std::to_string(p.peer));
        if (p.buf.size() < sizeof(FrameHeader) + ph.len) continue;
        if (ph.type == kAbort) {
          throw PeerError("rank " + std::to_string(p.peer) +
                          " aborted: " + p.buf.substr(sizeof(FrameHeader)));
        }
        out[size_t(p.peer)] = p.buf.substr(sizeof(FrameHeader));
        pending.erase(pending.begin() + long(i));
        break;
      }
    }
  }
}

void ControlPlane::abort(const std::string& reason) {
  std::string text = reason.substr(0, kMaxAbortText);
  FrameHeader h{kAbort, uint32_t(text.size())};
  std::string frame(sizeof(h), '\0');
  std::memcpy(frame.data(), &h, sizeof(h));
  frame += text;
  for (int& fd : fds_) {
    if (fd < 0) continue;
    // Non-blocking, once: a stopped peer must not hold us here.
    ssize_t w = send(fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)w;
    // shutdown, not close: another thread may be polling this fd; it wakes with EOF, and the
    // descriptor number cannot be reused under it. The destructor closes.
    shutdown(fd, SHUT_RDWR);
  }
}

}  // namespace accel::dist
