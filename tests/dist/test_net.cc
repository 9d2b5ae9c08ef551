// In-process tests of the network plumbing: address selection, bounded group initialisation
// (a peer that never shows up, or advertises an address nobody answers on), and the heartbeat.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <string>
#include <thread>

#include <doctest/doctest.h>
#include <gloo/transport/tcp/address.h>

#include "dist/control_plane.h"
#include "dist/heartbeat.h"
#include "dist/net.h"
#include "dist/process_group.h"
#include "tests/dist/spawn.h"

using namespace accel;
using namespace accel::dist;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

// Sets an environment variable for one scope, restoring the old value after.
struct ScopedEnv {
  std::string name;
  std::string old;
  bool had;
  ScopedEnv(const char* n, const char* v) : name(n) {
    const char* o = std::getenv(n);
    had = o != nullptr;
    if (had) old = o;
    if (v)
      setenv(n, v, 1);
    else
      unsetenv(n);
  }
  ~ScopedEnv() {
    if (had)
      setenv(name.c_str(), old.c_str(), 1);
    else
      unsetenv(name.c_str());
  }
};

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const DistError& e) {
    return e.what();
  }
  return "";
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A loopback port nothing listens on (bound, then closed; SO_REUSEADDR is not set anywhere).
int closed_port() { return accel::test::free_port(); }

}  // namespace

TEST_CASE("net: the bind address follows the route to MASTER_ADDR, or the named interface") {
  ScopedEnv h("ACCEL_GLOO_HOSTNAME", nullptr), a("ACCEL_SOCKET_IFNAME", nullptr),
      g("GLOO_SOCKET_IFNAME", nullptr);
  CHECK(route_source_address("127.0.0.1", 29500) == "127.0.0.1");
  CHECK(route_source_address("127.3.4.5", 29500) == "127.0.0.1");
  CHECK(interface_address("lo") == "127.0.0.1");
  CHECK(select_bind_address("127.0.0.1", 29500) == "127.0.0.1");
  CHECK(select_bind_address("localhost", 29500) == "127.0.0.1");

  std::string msg = error_of([] { interface_address("accel-no-such-if0"); });
  CHECK(msg.find("accel-no-such-if0") != std::string::npos);
  CHECK(msg.find("lo") != std::string::npos);  // the list of existing interfaces
  {
    ScopedEnv s("ACCEL_SOCKET_IFNAME", "lo");
    CHECK(select_bind_address("10.251.0.1", 29500) == "127.0.0.1");
  }
  {
    ScopedEnv s("GLOO_SOCKET_IFNAME", "accel-no-such-if0");
    msg = error_of([] { select_bind_address("127.0.0.1", 29500); });
    CHECK(msg.find("GLOO_SOCKET_IFNAME=accel-no-such-if0") != std::string::npos);
    CHECK(msg.find("does not exist") != std::string::npos);
  }
  {
    ScopedEnv s("ACCEL_GLOO_HOSTNAME", "127.0.0.7");
    CHECK(select_bind_address("10.251.0.1", 29500) == "127.0.0.7");
  }
  // Not the host name: a non-loopback master is reached through a real interface (never a
  // 127.x address, which is what gethostname() resolved to on the reporter's machine). This
  // needs a default route; a machine without one fails with a clear error instead.
  std::string routed;
  msg = error_of([&] { routed = select_bind_address("192.0.2.1", 29500); });
  if (msg.empty()) {
    CHECK(routed.rfind("127.", 0) != 0);
  } else {
    CHECK(msg.find("no route to MASTER_ADDR 192.0.2.1:29500") != std::string::npos);
  }
}

TEST_CASE("init: a peer that never shows up fails the group within the timeout, naming it") {
  auto store = std::make_shared<MemoryStore>();
  ProcessGroupOptions o;
  o.timeout = 1500ms;
  o.name = "alone";
  auto t0 = Clock::now();
  std::string msg = error_of([&] { new_gloo_group(store, 0, 2, o); });
  double took = seconds_since(t0);
  INFO(msg);
  CHECK(msg.find("[init] rank 0 of 2") != std::string::npos);
  CHECK(msg.find("rank 1 did not publish") != std::string::npos);
  CHECK(took < 1.5 + 10);
}

TEST_CASE("init: a peer whose Gloo address nobody answers on fails within the timeout") {
  // Rank 1 is faked: its published Gloo address is a closed loopback port. Rank 0 is the
  // listening side of that pair (the higher port connects), so before the bound it waited 5x the
  // timeout for a connection that never came (25 minutes with the default timeout).
  auto store = std::make_shared<MemoryStore>();
  sockaddr_in fake{};
  fake.sin_family = AF_INET;
  fake.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // Gloo orders a pair by the raw (network order) port, the higher one connecting: the
  // all-ones port (65535, where nothing listens here) makes rank 0 the listening side.
  fake.sin_port = 0xffff;
  gloo::transport::tcp::Address addr(reinterpret_cast<sockaddr*>(&fake), sizeof(fake));
  auto bytes = addr.bytes();
  store->set("fake/gloo/1", std::string(bytes.begin(), bytes.end()));
  ProcessGroupOptions o;
  o.timeout = 2000ms;
  o.name = "fake";
  auto t0 = Clock::now();
  std::string msg = error_of([&] { new_gloo_group(store, 0, 2, o); });
  double took = seconds_since(t0);
  INFO(msg);
  CHECK(msg.find("[init] rank 0 of 2: could not connect to rank 1 at 127.0.0.1:65535 within "
                 "2000 ms") != std::string::npos);
  CHECK(took < 2.0 + 6);  // the old code took 5 x 2 s
}

TEST_CASE("init: the control channel to an unreachable or absent peer fails in time") {
  SUBCASE("a lower rank advertises a closed port: the higher rank names it") {
    auto store = std::make_shared<MemoryStore>();
    const int port = closed_port();
    store->set("ctl/0", "127.0.0.1\n" + std::to_string(port));
    auto t0 = Clock::now();
    std::string msg = error_of([&] { ControlPlane cp(store, 1, 2, "127.0.0.1", 2000ms); });
    INFO(msg);
    CHECK(msg.find("rank 1 of 2: could not connect to rank 0 at 127.0.0.1:" +
                   std::to_string(port)) != std::string::npos);
    CHECK(seconds_since(t0) < 2.0 + 6);
  }
  SUBCASE("a higher rank never connects: the lower rank names it and where it is") {
    auto store = std::make_shared<MemoryStore>();
    store->set("ctl/1", "127.0.0.9\n4242");  // published, but never connects
    auto t0 = Clock::now();
    std::string msg = error_of([&] { ControlPlane cp(store, 0, 2, "127.0.0.1", 1500ms); });
    INFO(msg);
    CHECK(msg.find("rank 0 of 2: no control connection from rank 1 at 127.0.0.9:4242 within "
                   "1500 ms") != std::string::npos);
    CHECK(seconds_since(t0) < 1.5 + 6);
  }
}

TEST_CASE("heartbeat: a silent peer is reported once, a departing one is not") {
  SUBCASE("silent") {
    auto store = std::make_shared<MemoryStore>();
    std::atomic<int> lost_rank{-1};
    std::string lost_msg;
    std::mutex mu;
    Clock::time_point lost_at{};
    auto on_lost = [&](int r, const std::string& a, double s) {
      std::lock_guard<std::mutex> g(mu);
      lost_msg = Heartbeat::lost_message(r, a, s);
      lost_at = Clock::now();
      lost_rank = r;
    };
    // Rank 1 beats only every 20 s (its own timeout is long): to rank 0, with a 1 s timeout,
    // it falls silent right after the first beat.
    auto quiet = std::async(std::launch::async, [&] {
      return std::make_unique<Heartbeat>(store, 1, 2, "127.0.0.1", 20000ms, 80000ms, 10000ms,
                                         nullptr);
    });
    Heartbeat hb0(store, 0, 2, "127.0.0.1", 250ms, 1000ms, 10000ms, on_lost);
    auto hb1 = quiet.get();
    auto t0 = Clock::now();
    for (int i = 0; i < 400 && lost_rank.load() < 0; ++i) std::this_thread::sleep_for(25ms);
    REQUIRE(lost_rank.load() == 1);
    std::lock_guard<std::mutex> g(mu);
    CHECK(lost_msg.find("rank 1 at 127.0.0.1 sent no heartbeat for ") == 0);
    CHECK(lost_msg.find("(stopped, hung or unreachable)") != std::string::npos);
    CHECK(std::chrono::duration<double>(lost_at - t0).count() < 1.0 + 5);
  }
  SUBCASE("bye") {
    auto store = std::make_shared<MemoryStore>();
    std::atomic<int> lost{0};
    auto other = std::async(std::launch::async, [&] {
      return std::make_unique<Heartbeat>(store, 1, 2, "127.0.0.1", 100ms, 1500ms, 10000ms, nullptr);
    });
    Heartbeat hb0(store, 0, 2, "127.0.0.1", 100ms, 1500ms, 10000ms,
                  [&](int, const std::string&, double) { ++lost; });
    auto hb1 = other.get();
    std::this_thread::sleep_for(1000ms);
    CHECK(hb0.beats_received() > 0);
    hb1.reset();                          // a clean exit: says bye
    std::this_thread::sleep_for(4000ms);  // > 2.5x the timeout
    CHECK(lost.load() == 0);
  }
}
