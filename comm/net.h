// Network plumbing shared by the process group's own channels: which local address a rank binds
// and advertises, and TCP listen/connect with a deadline.
//
// Address selection (select_bind_address), first match wins:
//   1. ACCEL_GLOO_HOSTNAME    an explicit address (or host name) to bind and advertise;
//   2. ACCEL_SOCKET_IFNAME, then GLOO_SOCKET_IFNAME
//                             an interface name; its IPv4 address (else its IPv6 one);
//   3. a loopback MASTER_ADDR 127.0.0.1 (all ranks on this host);
//   4. otherwise              the local address of the route to MASTER_ADDR:MASTER_PORT, found by
//                             connect()ing a UDP socket and reading getsockname() (no packet is
//                             sent), as torchrun/c10d does.
// The hostname is deliberately not used: on many machines it resolves to 127.0.1.1 or 127.0.0.1,
// and ranks on other hosts cannot reach that.
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace accel::dist {

using NetClock = std::chrono::steady_clock;

// The local address the kernel would use to reach host:port (numeric form). Throws DistError
// naming host and port when there is no route or the host does not resolve.
std::string route_source_address(const std::string& host, int port);

// The address of interface `ifname` (IPv4 preferred). Throws DistError naming the interface (and
// `source`, the variable it came from, when given) and listing the existing ones when it does
// not exist or has no address.
std::string interface_address(const std::string& ifname, const char* source = nullptr);

// Names of the local interfaces that have an IPv4 or IPv6 address, in getifaddrs order.
std::vector<std::string> interface_names();

// The address this rank binds its listeners to and advertises to its peers (rules above).
std::string select_bind_address(const std::string& master_addr, int master_port);

// "a.b.c.d" / "::1" for an address; with_port appends ":port" ("[::1]:port" for IPv6).
std::string format_sockaddr(const sockaddr* sa, bool with_port);

// A listening TCP socket on host:0 (an ephemeral port). Returns the fd and sets *port. Throws
// DistError naming host on failure. `op` is the bracketed op name of errors.
int listen_tcp(const std::string& host, int backlog, int* port, const char* op);

// Connects to host:port, giving up at `deadline` (an unreachable host otherwise holds connect()
// for the kernel's SYN retries, about two minutes). Returns the connected, blocking fd, or -1
// with *error set ("connection refused", "no answer", ...). A refusal is not retried: callers
// connect only to listeners that their peers opened before publishing the address.
// `cancelled`, when given, is polled every 100 ms while the connect is pending: true gives up
// with *error "cancelled" (the group's InitGuard failed).
int connect_tcp(const std::string& host, int port, NetClock::time_point deadline,
                std::string* error, const std::function<bool()>& cancelled = {});

// Milliseconds left until deadline, clamped to [0, 2^30] (a poll() timeout).
int remaining_ms(NetClock::time_point deadline);

// What the kernel says about a TCP connection's progress (getsockopt TCP_INFO), for the progress
// watchdog (Note [progress watchdog] in gloo/process_group_gloo.cc).
struct TcpProgress {
  bool ok = false;           // false: not a TCP socket, or TCP_INFO failed
  uint64_t bytes_acked = 0;  // sent and acknowledged by the peer, since the connection began
  uint64_t bytes_received = 0;
  uint32_t unacked = 0;      // segments sent and not yet acknowledged
  uint32_t retransmits = 0;  // retransmission timeouts in a row of the oldest of them
  uint32_t total_retrans = 0;
  uint32_t last_ack_recv_ms = 0;
};
TcpProgress tcp_progress(int fd);

}  // namespace accel::dist
