#include "comm/net.h"

#include <arpa/inet.h>
#include <linux/tcp.h>  // struct tcp_info with tcpi_bytes_acked (glibc's stops before it)
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "core/env_contract.h"
#include "core/error.h"
#include "comm/env.h"

namespace accel::dist {

namespace {

const char* getenv_nonempty(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

struct AddrInfoList {
  addrinfo* head = nullptr;
  ~AddrInfoList() {
    if (head) freeaddrinfo(head);
  }
};

}  // namespace

int remaining_ms(NetClock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - NetClock::now());
  return int(std::max<int64_t>(0, std::min<int64_t>(left.count(), int64_t(1) << 30)));
}

std::string format_sockaddr(const sockaddr* sa, bool with_port) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (sa->sa_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf));
    std::string s = buf;
    return with_port ? s + ":" + std::to_string(ntohs(in->sin_port)) : s;
  }
  if (sa->sa_family == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof(buf));
    std::string s = buf;
    return with_port ? "[" + s + "]:" + std::to_string(ntohs(in6->sin6_port)) : s;
  }
  return "<address family " + std::to_string(sa->sa_family) + ">";
}

std::string route_source_address(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  AddrInfoList res;
  int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res.head);
  ACCEL_CHECK(rc == 0, DistError, "init", "cannot resolve MASTER_ADDR '", host,
              "': ", gai_strerror(rc));
  std::string last_error = "no address";
  for (addrinfo* a = res.head; a; a = a->ai_next) {
    int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    // A UDP connect() only picks the route and the source address; nothing goes on the wire.
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      last_error = std::strerror(errno);
      close(fd);
      continue;
    }
    sockaddr_storage ss{};
    socklen_t sl = sizeof(ss);
    int gr = getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &sl);
    close(fd);
    if (gr == 0) return format_sockaddr(reinterpret_cast<sockaddr*>(&ss), false);
    last_error = std::strerror(errno);
  }
  ACCEL_THROW(DistError, "init", "no route to MASTER_ADDR ", host, ":", port, " (", last_error,
              "); set ACCEL_SOCKET_IFNAME to the interface that reaches it");
}

std::vector<std::string> interface_names() {
  std::vector<std::string> names;
  ifaddrs* ifa = nullptr;
  if (getifaddrs(&ifa) != 0) return names;
  for (ifaddrs* i = ifa; i; i = i->ifa_next) {
    if (!i->ifa_addr || (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6))
      continue;
    if (std::find(names.begin(), names.end(), i->ifa_name) == names.end())
      names.push_back(i->ifa_name);
  }
  freeifaddrs(ifa);
  return names;
}

std::string interface_address(const std::string& ifname, const char* source) {
  ifaddrs* ifa = nullptr;
  ACCEL_CHECK(getifaddrs(&ifa) == 0, DistError, "init",
              "getifaddrs failed: ", std::strerror(errno));
  std::string v4, v6;
  for (ifaddrs* i = ifa; i; i = i->ifa_next) {
    if (!i->ifa_addr || ifname != i->ifa_name) continue;
    if (i->ifa_addr->sa_family == AF_INET && v4.empty()) {
      v4 = format_sockaddr(i->ifa_addr, false);
    } else if (i->ifa_addr->sa_family == AF_INET6 && v6.empty()) {
      // Link-local IPv6 addresses need a scope id that peers cannot know: skip them.
      auto* in6 = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr);
      if (!IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr)) v6 = format_sockaddr(i->ifa_addr, false);
    }
  }
  freeifaddrs(ifa);
  if (!v4.empty()) return v4;
  if (!v6.empty()) return v6;
  std::string have;
  for (auto& n : interface_names()) have += (have.empty() ? "" : ", ") + n;
  ACCEL_THROW(DistError, "init", source ? source : "", source ? "=" : "", source ? ifname : "",
              source ? ": " : "", "network interface '", ifname,
              "' does not exist or has no usable address (have: ", have.empty() ? "none" : have,
              ")");
}

std::string select_bind_address(const std::string& master_addr, int master_port) {
  if (const char* h = getenv_nonempty(env::kGlooHostname)) return h;
  for (const char* var : {env::kSocketIfname, env::kGlooSocketIfname}) {
    if (const char* ifname = getenv_nonempty(var)) return interface_address(ifname, var);
  }
  if (is_loopback_address(master_addr)) return "127.0.0.1";
  return route_source_address(master_addr, master_port);
}

int listen_tcp(const std::string& host, int backlog, int* port, const char* op) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  AddrInfoList res;
  int rc = getaddrinfo(host.c_str(), "0", &hints, &res.head);
  ACCEL_CHECK(rc == 0, DistError, op, "cannot resolve '", host, "': ", gai_strerror(rc));
  std::string last_error = "no address";
  for (addrinfo* a = res.head; a; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, backlog) == 0) {
      sockaddr_storage ss{};
      socklen_t sl = sizeof(ss);
      getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &sl);
      *port = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                       : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
      return fd;
    }
    last_error = std::strerror(errno);
    close(fd);
  }
  ACCEL_THROW(DistError, op, "cannot listen on '", host, "': ", last_error,
              " (is it an address of this host? see ACCEL_SOCKET_IFNAME)");
}

int connect_tcp(const std::string& host, int port, NetClock::time_point deadline,
                std::string* error, const std::function<bool()>& cancelled) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  AddrInfoList res;
  int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res.head);
  if (rc != 0) {
    *error = std::string("cannot resolve: ") + gai_strerror(rc);
    return -1;
  }
  *error = "no address";
  for (addrinfo* a = res.head; a; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      *error = std::strerror(errno);
      continue;
    }
    int cr = connect(fd, a->ai_addr, a->ai_addrlen);
    if (cr != 0 && errno == EINPROGRESS) {
      pollfd pf{fd, POLLOUT, 0};
      int pr;
      bool gave_up = false;
      while (true) {
        const int left = remaining_ms(deadline);
        pr = poll(&pf, 1, cancelled ? std::min(left, 100) : left);
        if (pr < 0 && errno == EINTR) continue;
        if (pr != 0 || left == 0) break;
        if (cancelled && cancelled()) {
          gave_up = true;
          break;
        }
      }
      if (gave_up) {
        *error = "cancelled";
        close(fd);
        return -1;
      }
      if (pr == 0) {
        *error = "no answer";
        close(fd);
        continue;
      }
      int so_error = 0;
      socklen_t len = sizeof(so_error);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len);
      cr = so_error == 0 ? 0 : -1;
      errno = so_error;
    }
    if (cr != 0) {
      *error = std::strerror(errno);
      close(fd);
      continue;
    }
    int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    return fd;
  }
  return -1;
}

TcpProgress tcp_progress(int fd) {
  TcpProgress p;
  if (fd < 0) return p;
  tcp_info ti{};
  socklen_t len = sizeof(ti);
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) return p;
  // Kernels before 4.1 fill less: without bytes_acked there is no progress to watch.
  if (len < offsetof(tcp_info, tcpi_bytes_acked) + sizeof(ti.tcpi_bytes_acked)) return p;
  p.ok = true;
  p.bytes_acked = ti.tcpi_bytes_acked;
  p.unacked = ti.tcpi_unacked;
  p.retransmits = ti.tcpi_retransmits;
  p.total_retrans = ti.tcpi_total_retrans;
  p.last_ack_recv_ms = ti.tcpi_last_ack_recv;
  if (len >= offsetof(tcp_info, tcpi_bytes_received) + sizeof(ti.tcpi_bytes_received))
    p.bytes_received = ti.tcpi_bytes_received;
  return p;
}

}  // namespace accel::dist
