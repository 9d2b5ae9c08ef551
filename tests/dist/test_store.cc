// TCP rendezvous store: protocol, timeouts, hostile input, many clients; and the env contract.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include "core/error.h"
#include "dist/env.h"
#include "dist/store.h"

using namespace accel;
using namespace accel::dist;
using namespace std::chrono_literals;

namespace {

StoreOptions opts(Milliseconds timeout = 5000ms, std::string token = "") {
  StoreOptions o;
  o.timeout = timeout;
  o.token = std::move(token);
  return o;
}

// A raw TCP connection to the server for sending hand-made bytes.
struct RawConn {
  int fd = -1;
  explicit RawConn(int port) {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  }
  ~RawConn() { close(fd); }
  void send_bytes(const std::string& s) {
    ssize_t w = send(fd, s.data(), s.size(), MSG_NOSIGNAL);
    (void)w;  // the server may already have closed: that is what some tests check
  }
  // Reads until EOF or `timeout`; returns whether EOF (connection closed by server) was seen.
  bool closed_by_server(std::chrono::milliseconds timeout, std::string* got = nullptr) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    char buf[4096];
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      ssize_t r = recv(fd, buf, sizeof(buf), 0);
      if (r <= 0) return true;
      if (got) got->append(buf, size_t(r));
    }
    return false;
  }
};

std::string le32(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[size_t(i)] = char((v >> (8 * i)) & 0xff);
  return s;
}
std::string hello_frame(const std::string& token) {
  std::string body;
  body.push_back(0);               // HELLO
  body += le32(0x54534341);        // magic
  body += std::string("\x01\x00", 2);  // version 1
  body += le32(uint32_t(token.size())) + token;
  return le32(uint32_t(body.size())) + body;
}

struct EnvGuard {
  std::vector<std::string> names{"RANK",        "WORLD_SIZE",  "LOCAL_RANK",
                                 "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                 "ACCEL_RENDEZVOUS_TOKEN"};
  std::vector<std::pair<std::string, std::string>> saved;
  EnvGuard() {
    for (auto& n : names) {
      if (const char* v = getenv(n.c_str())) saved.emplace_back(n, v);
      unsetenv(n.c_str());
    }
  }
  ~EnvGuard() {
    for (auto& n : names) unsetenv(n.c_str());
    for (auto& [n, v] : saved) setenv(n.c_str(), v.c_str(), 1);
  }
};

}  // namespace

TEST_CASE("store: set/get/add/check/delete/compare_set between clients") {
  TcpStore server("127.0.0.1", 0, true, opts());
  TcpStore client("127.0.0.1", server.port(), false, opts());
  server.set("a", std::string("x\0y", 3));  // binary-safe
  CHECK(client.get("a") == std::string("x\0y", 3));
  CHECK(client.add("n", 5) == 5);
  CHECK(server.add("n", -2) == 3);
  CHECK(client.get("n") == "3");
  CHECK(client.check({"a", "n"}));
  CHECK_FALSE(client.check({"a", "missing"}));
  CHECK(client.num_keys() == 2);
  CHECK(client.delete_key("a"));
  CHECK_FALSE(client.delete_key("a"));
  CHECK_FALSE(server.check({"a"}));
  // compare_set: absent + empty expected creates; wrong expected keeps the value.
  CHECK(client.compare_set("c", "", "1") == "1");
  CHECK(client.compare_set("c", "0", "2") == "1");
  CHECK(client.compare_set("c", "1", "2") == "2");
  // add on a non-integer value is an error, and the connection stays usable.
  client.set("s", "text");
  CHECK_THROWS_AS(client.add("s", 1), DistError);
  CHECK(client.get("c") == "2");
  // Large values travel in one piece.
  std::string big(3 << 20, 'q');
  big[12345] = 'z';
  client.set("big", big);
  CHECK(server.get("big") == big);
}

TEST_CASE("store: get and wait block until another client sets the key") {
  TcpStore server("127.0.0.1", 0, true, opts());
  TcpStore waiter("127.0.0.1", server.port(), false, opts());
  auto t0 = std::chrono::steady_clock::now();
  std::thread setter([&] {
    std::this_thread::sleep_for(200ms);
    TcpStore c("127.0.0.1", server.port(), false, opts());
    c.set("k1", "v1");
    std::this_thread::sleep_for(100ms);
    c.set("k2", "v2");
  });
  CHECK(waiter.get("k1") == "v1");
  waiter.wait({"k1", "k2"});
  auto dt = std::chrono::steady_clock::now() - t0;
  CHECK(dt >= 250ms);
  setter.join();
  CHECK(waiter.get("k2") == "v2");
}

TEST_CASE("store: a wait past its timeout throws DistError and the client stays usable") {
  TcpStore server("127.0.0.1", 0, true, opts());
  TcpStore client("127.0.0.1", server.port(), false, opts());
  client.set("present", "1");
  auto t0 = std::chrono::steady_clock::now();
  try {
    client.wait({"present", "never"}, 300ms);
    FAIL("wait did not time out");
  } catch (const DistError& e) {
    std::string msg = e.what();
    CHECK(msg.find("[store.wait]") == 0);
    CHECK(msg.find("'never'") != std::string::npos);
    CHECK(msg.find("'present'") == std::string::npos);  // only the missing key is named
  }
  auto dt = std::chrono::steady_clock::now() - t0;
  CHECK(dt >= 290ms);
  CHECK(dt < 3s);
  CHECK_THROWS_AS(client.get("never", 100ms), DistError);
  // Same connection, next requests work and see consistent replies.
  client.set("after", "ok");
  CHECK(client.get("after") == "ok");
  CHECK(client.add("cnt", 1) == 1);
  CHECK(server.server()->open_connections() == 2);
}

TEST_CASE("store: garbage bytes close that connection only") {
  TcpStore server("127.0.0.1", 0, true, opts());
  TcpStore good("127.0.0.1", server.port(), false, opts());
  good.set("k", "v");
  {
    RawConn raw(server.port());
    raw.send_bytes(std::string("\x05\x00\x00\x00GARBAGE!!", 13));  // not a HELLO
    CHECK(raw.closed_by_server(2s));
  }
  {
    RawConn raw(server.port());
    raw.send_bytes("GET / HTTP/1.1\r\nHost: x\r\n\r\n");  // length field reads as 542393671
    CHECK(raw.closed_by_server(2s));
  }
  // Deterministic random frames after a valid HELLO: the server must never crash or hang.
  std::mt19937 rng(1234);
  for (int i = 0; i < 200; ++i) {
    RawConn raw(server.port());
    raw.send_bytes(hello_frame(""));
    std::string body;
    size_t n = 1 + rng() % 40;
    for (size_t j = 0; j < n; ++j) body.push_back(char(rng() & 0xff));
    body[0] = char(rng() % 12);  // mostly valid opcodes with broken fields
    raw.send_bytes(le32(uint32_t(body.size())) + body);
    // Either a reply or a close; a pending WAIT with a huge timeout keeps it open, that is
    // fine too. What matters is that the server still answers afterwards.
    raw.closed_by_server(5ms);
  }
  CHECK(good.get("k") == "v");
  CHECK(server.server()->rejected_connections() >= 2);
}

TEST_CASE("store: oversized and truncated messages are rejected") {
  StoreOptions o = opts();
  o.max_message_bytes = 1 << 20;
  TcpStore server("127.0.0.1", 0, true, o);
  TcpStore good("127.0.0.1", server.port(), false, o);
  {
    // Before HELLO, even a modest length is refused: unauthenticated peers get 4 KiB.
    RawConn raw(server.port());
    raw.send_bytes(le32(100000));
    std::string got;
    CHECK(raw.closed_by_server(2s, &got));
    CHECK(got.find("exceeds") != std::string::npos);
  }
  {
    RawConn raw(server.port());
    raw.send_bytes(hello_frame(""));
    raw.send_bytes(le32(0xffffffffu));  // 4 GiB claimed
    std::string got;
    CHECK(raw.closed_by_server(2s, &got));
    CHECK(got.find("exceeds the limit") != std::string::npos);
  }
  {
    // A string length pointing past the end of its frame.
    RawConn raw(server.port());
    raw.send_bytes(hello_frame(""));
    std::string body = std::string(1, char(1)) + le32(1000) + "abc";  // SET, key len 1000
    raw.send_bytes(le32(uint32_t(body.size())) + body);
    std::string got;
    CHECK(raw.closed_by_server(2s, &got));
    CHECK(got.find("malformed") != std::string::npos);
  }
  {
    // WAIT claiming 2^31 keys in a tiny frame must not reserve memory for them.
    RawConn raw(server.port());
    raw.send_bytes(hello_frame(""));
    std::string body = std::string(1, char(4)) + std::string(8, '\0') + le32(0x7fffffff);
    raw.send_bytes(le32(uint32_t(body.size())) + body);
    CHECK(raw.closed_by_server(2s));
  }
  // The client refuses to send past the limit itself, and stays usable.
  CHECK_THROWS_AS(good.set("huge", std::string(2 << 20, 'x')), DistError);
  good.set("small", "1");
  CHECK(good.get("small") == "1");
}

TEST_CASE("store: rendezvous token") {
  TcpStore server("127.0.0.1", 0, true, opts(5000ms, "s3cret"));
  TcpStore ok("127.0.0.1", server.port(), false, opts(5000ms, "s3cret"));
  ok.set("k", "v");
  try {
    TcpStore bad("127.0.0.1", server.port(), false, opts(1000ms, "guess"));
    FAIL("wrong token accepted");
  } catch (const DistError& e) {
    CHECK(std::string(e.what()).find("token") != std::string::npos);
  }
  CHECK_THROWS_AS(TcpStore("127.0.0.1", server.port(), false, opts(1000ms, "")), DistError);
  {
    // A raw client that skips HELLO cannot read keys.
    RawConn raw(server.port());
    std::string body = std::string(1, char(2)) + std::string(8, '\0') + le32(1) + "k";
    raw.send_bytes(le32(uint32_t(body.size())) + body);
    std::string got;
    CHECK(raw.closed_by_server(2s, &got));
    CHECK(got.find("v") == std::string::npos);
  }
  CHECK(ok.get("k") == "v");
}

TEST_CASE("store: many clients add concurrently") {
  TcpStore server("127.0.0.1", 0, true, opts());
  constexpr int kClients = 48, kAdds = 50;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      try {
        TcpStore c("127.0.0.1", server.port(), false, opts());
        for (int j = 0; j < kAdds; ++j) c.add("counter", 1);
        c.set("done/" + std::to_string(i), "1");
        // Everyone waits for everyone: exercises many simultaneous blocked waits.
        std::vector<std::string> all;
        for (int k = 0; k < kClients; ++k) all.push_back("done/" + std::to_string(k));
        c.wait(all, 20000ms);
      } catch (const std::exception&) {
        ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(failures.load() == 0);
  CHECK(server.get("counter") == std::to_string(kClients * kAdds));
}

TEST_CASE("store: a dead server or a missing one is a DistError, not a hang") {
  auto server = std::make_unique<TcpStore>("127.0.0.1", 0, true, opts());
  int port = server->port();
  TcpStore client("127.0.0.1", port, false, opts(3000ms));
  std::thread killer([&] {
    std::this_thread::sleep_for(200ms);
    server.reset();
  });
  auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(client.get("never", 20000ms), DistError);
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  killer.join();
  // Nothing listens now: connecting gives up after the timeout.
  t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(TcpStore("127.0.0.1", port, false, opts(300ms)), DistError);
  CHECK(std::chrono::steady_clock::now() - t0 < 3s);
}

TEST_CASE("store: binding a busy port fails clearly; clients may start before the server") {
  TcpStore server("127.0.0.1", 0, true, opts());
  try {
    TcpStore second("127.0.0.1", server.port(), true, opts());
    FAIL("bound a busy port");
  } catch (const DistError& e) {
    CHECK(std::string(e.what()).find("cannot listen") != std::string::npos);
  }
  // Pick a free port, then start the client first and the server 300 ms later.
  int port;
  { TcpStore probe("127.0.0.1", 0, true, opts()); port = probe.port(); }
  std::unique_ptr<TcpStore> late;
  std::thread starter([&] {
    std::this_thread::sleep_for(300ms);
    late = std::make_unique<TcpStore>("127.0.0.1", port, true, opts());
    late->set("hello", "world");
  });
  TcpStore early("127.0.0.1", port, false, opts());
  CHECK(early.get("hello") == "world");
  starter.join();
}

TEST_CASE("store: PrefixStore namespaces keys") {
  auto server = std::make_shared<TcpStore>("127.0.0.1", 0, true, opts());
  PrefixStore a("pg0", server), b("pg1", server);
  a.set("x", "A");
  b.set("x", "B");
  CHECK(a.get("x") == "A");
  CHECK(b.get("x") == "B");
  CHECK(server->get("pg0/x") == "A");
  CHECK(a.add("n", 2) == 2);
  CHECK_FALSE(b.check({"n"}));
  a.set_timeout(200ms);
  CHECK_THROWS_AS(a.get("absent"), DistError);
}

TEST_CASE("env: none set is a single process; values are validated") {
  EnvGuard guard;
  DistEnv e = read_dist_env();
  CHECK_FALSE(e.distributed);
  CHECK(e.rank == 0);
  CHECK(e.world_size == 1);
  CHECK(e.master_addr == "127.0.0.1");
  CHECK(e.master_port == kDefaultMasterPort);

  setenv("RANK", "2", 1);
  setenv("WORLD_SIZE", "4", 1);
  setenv("MASTER_ADDR", "10.0.0.7", 1);
  setenv("MASTER_PORT", "4567", 1);
  e = read_dist_env();
  CHECK(e.distributed);
  CHECK(e.rank == 2);
  CHECK(e.world_size == 4);
  CHECK(e.local_rank == 2);
  CHECK(e.local_world_size == 4);
  CHECK(e.master_addr == "10.0.0.7");
  CHECK(e.master_port == 4567);
  setenv("LOCAL_WORLD_SIZE", "2", 1);
  e = read_dist_env();
  CHECK(e.local_rank == 0);  // rank 2 of 2 per host
  setenv("LOCAL_RANK", "1", 1);
  CHECK(read_dist_env().local_rank == 1);

  setenv("RANK", "4", 1);
  CHECK_THROWS_AS(read_dist_env(), DistError);  // rank >= world
  setenv("RANK", "1x", 1);
  CHECK_THROWS_AS(read_dist_env(), DistError);
  setenv("RANK", "1", 1);
  setenv("MASTER_PORT", "70000", 1);
  CHECK_THROWS_AS(read_dist_env(), DistError);
  setenv("MASTER_PORT", "4567", 1);
  unsetenv("WORLD_SIZE");
  try {
    read_dist_env();
    FAIL("RANK without WORLD_SIZE accepted");
  } catch (const DistError& e2) {
    CHECK(std::string(e2.what()).find("WORLD_SIZE") != std::string::npos);
  }
  CHECK(is_loopback_address("127.0.0.1"));
  CHECK(is_loopback_address("localhost"));
  CHECK_FALSE(is_loopback_address("10.1.2.3"));
}
