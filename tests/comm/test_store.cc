// TCP rendezvous store: protocol, timeouts, hostile input, many clients; and the env contract.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include "core/error.h"
#include "comm/auth.h"
#include "comm/env.h"
#include "comm/store.h"
#include "tests/common/scoped_env.h"

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

bool raw_handshake(int fd, const std::string& token, std::chrono::milliseconds timeout,
                   int member = -1);

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
  bool handshake(const std::string& token = "", std::chrono::milliseconds timeout = 5000ms) {
    return raw_handshake(fd, token, timeout);
  }
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
std::string frame(const std::string& body) { return le32(uint32_t(body.size())) + body; }

// The client side of the version-2 handshake by hand (Note [store authentication]).
const std::string kRawNonce(32, 'n');
std::string hello_frame(const std::string& token, int member = -1,
                        const std::string& joined = std::string(16, '\0')) {
  std::string body;
  body.push_back(0);                   // HELLO
  body += le32(0x54534341);            // magic
  body += std::string("\x02\x00", 2);  // version 2
  body.push_back(token.empty() ? 0 : 1);
  body += kRawNonce;
  body += le32(uint32_t(member));
  body += joined;
  return frame(body);
}
// The AUTH frame answering a HELLO reply body (status byte first), or "" when the reply is not
// a challenge whose proof checks out under `token`.
std::string auth_frame(const std::string& reply, const std::string& token) {
  if (reply.size() != 1 + 1 + 32 + 16 + 32 || reply[0] != 0) return "";
  std::string ns = reply.substr(2, 32), gen = reply.substr(34, 16), proof = reply.substr(50, 32);
  if (auth::hmac_sha256_str(token, "accel-store-v2 server" + kRawNonce + ns + gen) != proof)
    return "";
  return frame(std::string("\x09\x01", 2) +
               auth::hmac_sha256_str(token, "accel-store-v2 client" + kRawNonce + ns + gen));
}

// Reads one frame body within `timeout`: 1 got it, 0 nothing came, -1 closed, malformed, or
// only part of a frame came.
int read_frame(int fd, std::chrono::milliseconds timeout, std::string* body) {
  std::string got;
  size_t need = 4;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (got.size() < need) {
    if (std::chrono::steady_clock::now() >= deadline) return got.empty() ? 0 : -1;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    char buf[4096];
    ssize_t r = recv(fd, buf, std::min(sizeof(buf), need - got.size()), 0);
    if (r <= 0) return -1;
    got.append(buf, size_t(r));
    if (got.size() == 4 && need == 4) {
      uint32_t len = uint32_t(uint8_t(got[0])) | uint32_t(uint8_t(got[1])) << 8 |
                     uint32_t(uint8_t(got[2])) << 16 | uint32_t(uint8_t(got[3])) << 24;
      if (len > (1u << 20)) return -1;
      need = 4 + len;
    }
  }
  *body = got.substr(4);
  return 1;
}

// The whole handshake on a raw connection; true when the server accepted it.
bool raw_handshake(int fd, const std::string& token, std::chrono::milliseconds timeout,
                   int member) {
  std::string h = hello_frame(token, member), reply;
  if (send(fd, h.data(), h.size(), MSG_NOSIGNAL) != ssize_t(h.size())) return false;
  if (read_frame(fd, timeout, &reply) != 1) return false;
  std::string a = auth_frame(reply, token);
  if (a.empty() || send(fd, a.data(), a.size(), MSG_NOSIGNAL) != ssize_t(a.size())) return false;
  return read_frame(fd, timeout, &reply) == 1 && reply.size() == 33 && reply[0] == 0;
}

// The rendezvous variables unset for a scope.
struct EnvGuard : accel::test::ScopedEnv {
  EnvGuard() {
    for (const char* n : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                          "MASTER_PORT", "ACCEL_RENDEZVOUS_TOKEN"})
      unset(n);
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
    REQUIRE(raw.handshake());
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
    REQUIRE(raw.handshake());
    raw.send_bytes(le32(0xffffffffu));  // 4 GiB claimed
    std::string got;
    CHECK(raw.closed_by_server(2s, &got));
    CHECK(got.find("exceeds the limit") != std::string::npos);
  }
  {
    // A string length pointing past the end of its frame.
    RawConn raw(server.port());
    REQUIRE(raw.handshake());
    std::string body = std::string(1, char(1)) + le32(1000) + "abc";  // SET, key len 1000
    raw.send_bytes(le32(uint32_t(body.size())) + body);
    std::string got;
    CHECK(raw.closed_by_server(2s, &got));
    CHECK(got.find("malformed") != std::string::npos);
  }
  {
    // WAIT claiming 2^31 keys in a tiny frame must not reserve memory for them.
    RawConn raw(server.port());
    REQUIRE(raw.handshake());
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
  {
    TcpStore probe("127.0.0.1", 0, true, opts());
    port = probe.port();
  }
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

// ---------------------------------------------------------------------------------------------
// Store hardening (Note [store hardening] in comm/store.cc): hostile or idle connections, fd
// exhaustion, size caps, tokens, and a client facing a missing or silent server.

namespace {

using Clock = std::chrono::steady_clock;

// Waits until at least `want` of `conns` are closed by the server (EOF or reset), or until
// `timeout`; returns how many were seen closed.
size_t count_closed(std::vector<std::unique_ptr<RawConn>>& conns, size_t want,
                    std::chrono::milliseconds timeout) {
  std::vector<bool> closed(conns.size(), false);
  size_t n = 0;
  auto deadline = Clock::now() + timeout;
  while (n < want && Clock::now() < deadline) {
    std::vector<pollfd> fds;
    for (auto& c : conns) fds.push_back({c->fd, POLLIN, 0});
    if (poll(fds.data(), fds.size(), 100) <= 0) continue;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (closed[i] || !fds[i].revents) continue;
      char buf[256];
      ssize_t r = recv(conns[i]->fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
        closed[i] = true;
        ++n;
      }
    }
  }
  return n;
}

// Reads the server's reply to HELLO within `timeout`: kHelloOk (the challenge, in *body),
// kHelloNone (nothing came), or kHelloBad (closed, or something else came).
enum HelloReply { kHelloOk, kHelloNone, kHelloBad };
HelloReply hello_reply(RawConn& c, std::chrono::milliseconds timeout, std::string* body = nullptr) {
  std::string got;
  int r = read_frame(c.fd, timeout, &got);
  if (r == 0) return kHelloNone;
  if (r < 0 || got.empty() || got[0] != 0) return kHelloBad;
  if (body) *body = got;
  return kHelloOk;
}
bool hello_ok(RawConn& c, std::chrono::milliseconds timeout) {
  return hello_reply(c, timeout) == kHelloOk;
}
// Completes a handshake whose challenge `reply` came: AUTH, then the server's OK.
bool finish_auth(RawConn& c, const std::string& reply, const std::string& token = "") {
  std::string a = auth_frame(reply, token), ok;
  c.send_bytes(a);
  return !a.empty() && read_frame(c.fd, 5000ms, &ok) == 1 && ok.size() == 33 && ok[0] == 0;
}

// CPU time (user + system) a process has used so far, from /proc/<pid>/stat.
double cpu_seconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(f, line);
  // Fields after the parenthesised command name (which may hold spaces); utime, stime are
  // fields 14 and 15 of the whole line, 12 and 13 after ')'.
  std::istringstream rest(line.substr(line.rfind(')') + 2));
  std::string field;
  double ticks = 0;
  for (int i = 1; i <= 13 && rest >> field; ++i)
    if (i >= 12) ticks += std::stod(field);
  return ticks / double(sysconf(_SC_CLK_TCK));
}

// A TCP listener that is not a working store. kMute accepts and never answers; kHung completes
// the handshake with `token` (a hung rank 0), then never replies again; kSquatter listens on the
// port first, answers HELLO with a challenge it cannot prove (it does not know the token), and
// records every byte each client sent.
struct SilentServer {
  enum Mode { kMute, kHung, kSquatter };
  int listen_fd = -1;
  int port = 0;
  Mode mode;
  std::string token;
  std::atomic<bool> stop{false};
  std::thread thread;
  std::vector<int> accepted;
  std::mutex mu;
  std::vector<std::string> received;  // per connection (kSquatter)
  explicit SilentServer(Mode m, std::string tok = "") : mode(m), token(std::move(tok)) {
    listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(bind(listen_fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    REQUIRE(listen(listen_fd, 16) == 0);
    socklen_t len = sizeof(a);
    getsockname(listen_fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
    thread = std::thread([this] {
      while (!stop.load()) {
        pollfd p{listen_fd, POLLIN, 0};
        if (poll(&p, 1, 50) <= 0) continue;
        int fd = accept(listen_fd, nullptr, nullptr);
        if (fd < 0) continue;
        accepted.push_back(fd);
        if (mode == kMute) continue;
        std::string hello;
        if (read_frame(fd, 2000ms, &hello) != 1 || hello.size() < 8 + 32) continue;
        const std::string nc = hello.substr(8, 32);
        const std::string ns(32, 's'), gen(16, 'g');
        std::string proof =
            mode == kHung ? auth::hmac_sha256_str(token, "accel-store-v2 server" + nc + ns + gen)
                          : std::string(32, '?');  // a squatter cannot compute it
        std::string challenge =
            frame(std::string(1, '\0') + std::string(1, token.empty() ? 0 : 1) + ns + gen + proof);
        ssize_t w = send(fd, challenge.data(), challenge.size(), MSG_NOSIGNAL);
        (void)w;
        std::string auth;
        int got = read_frame(fd, 2000ms, &auth);
        if (mode == kSquatter) {
          // Whatever else the client sends before it closes.
          std::string rest;
          char buf[4096];
          pollfd q{fd, POLLIN, 0};
          while (poll(&q, 1, 500) > 0) {
            ssize_t r = recv(fd, buf, sizeof(buf), 0);
            if (r <= 0) break;
            rest.append(buf, size_t(r));
          }
          std::lock_guard<std::mutex> g(mu);
          received.push_back(hello + (got == 1 ? auth : std::string()) + rest);
          continue;
        }
        if (got == 1) {
          std::string ok = frame(std::string(1, '\0') + std::string(32, 'S'));
          w = send(fd, ok.data(), ok.size(), MSG_NOSIGNAL);
          (void)w;
        }
      }
    });
  }
  ~SilentServer() {
    stop = true;
    thread.join();
    for (int fd : accepted) close(fd);
    close(listen_fd);
  }
};

}  // namespace

TEST_CASE("store hardening: 300 idle connections do not lock out a real client") {
  // Default limits: at most 128 connections may wait for their HELLO; older idle ones go.
  TcpStore server("127.0.0.1", 0, true, opts(20000ms));
  std::vector<std::unique_ptr<RawConn>> idle;
  constexpr size_t kIdle = 300;
  for (size_t i = 0; i < kIdle; ++i) idle.push_back(std::make_unique<RawConn>(server.port()));
  const size_t cap = kDefaultStoreMaxUnauthenticated;
  CHECK(count_closed(idle, kIdle - cap, 20000ms) >= kIdle - cap);
  TcpStore client("127.0.0.1", server.port(), false, opts(20000ms));
  client.set("k", "v");
  CHECK(server.get("k") == "v");
  StoreServerStats st = server.server()->stats();
  CHECK(st.unauthenticated_connections <= int64_t(cap));
  CHECK(st.evicted_unauthenticated >= int64_t(kIdle - cap));
}

TEST_CASE("store hardening: connection caps, oldest unauthenticated dropped first") {
  StoreOptions o = opts(20000ms);
  o.max_connections = 24;
  o.max_unauthenticated = 8;
  TcpStore server("127.0.0.1", 0, true, o);  // its own client is connection 1
  std::vector<std::unique_ptr<TcpStore>> clients;
  for (int i = 0; i < 5; ++i)
    clients.push_back(std::make_unique<TcpStore>("127.0.0.1", server.port(), false, o));
  std::vector<std::unique_ptr<RawConn>> idle;
  for (int i = 0; i < 300; ++i) idle.push_back(std::make_unique<RawConn>(server.port()));
  CHECK(count_closed(idle, 300 - 8, 20000ms) >= 300 - 8);
  // Real clients keep getting in while idle sockets hold every unauthenticated slot ...
  for (int i = 0; i < 10; ++i) {
    clients.push_back(std::make_unique<TcpStore>("127.0.0.1", server.port(), false, o));
    clients.back()->add("n", 1);
  }
  CHECK(server.get("n") == "10");
  // ... the earlier ones were not disturbed ...
  for (auto& c : clients) CHECK(c->get("n") == "10");
  StoreServerStats st = server.server()->stats();
  CHECK(st.open_connections <= 24);
  CHECK(st.unauthenticated_connections <= 8);
  // ... and once every slot holds an authenticated client, a newcomer gets a clear refusal.
  idle.clear();
  while (clients.size() < 23)
    clients.push_back(std::make_unique<TcpStore>("127.0.0.1", server.port(), false, o));
  auto t0 = Clock::now();
  try {
    TcpStore extra("127.0.0.1", server.port(), false, o);
    FAIL("a 25th connection was accepted");
  } catch (const DistError& e) {
    std::string msg = e.what();
    CHECK(msg.find("max_connections") != std::string::npos);
    CHECK(msg.find("24") != std::string::npos);
  }
  CHECK(Clock::now() - t0 < 15s);  // refused, not left to time out
  CHECK(server.server()->stats().refused_full >= 1);
  clients.pop_back();  // a slot frees up: the next client gets in
  for (int i = 0; i < 200 && server.server()->open_connections() > 23; ++i)
    std::this_thread::sleep_for(50ms);  // the server sees the close in its own time
  TcpStore late("127.0.0.1", server.port(), false, o);
  CHECK(late.get("n") == "10");
}

TEST_CASE("store hardening: a connection that does not say HELLO in time is closed") {
  StoreOptions o = opts(20000ms);
  o.handshake_timeout = 300ms;
  TcpStore server("127.0.0.1", 0, true, o);
  TcpStore client("127.0.0.1", server.port(), false, o);
  auto t0 = Clock::now();
  RawConn silent(server.port());
  RawConn partial(server.port());
  partial.send_bytes(hello_frame("").substr(0, 7));  // a HELLO that never completes
  CHECK(silent.closed_by_server(20s));
  CHECK(partial.closed_by_server(20s));
  CHECK(Clock::now() - t0 >= 250ms);
  CHECK(server.server()->stats().handshake_timeouts >= 2);
  // An authenticated connection may stay idle for longer than that.
  std::this_thread::sleep_for(600ms);
  client.set("still", "here");
  CHECK(client.get("still") == "here");
}

TEST_CASE("store hardening: out of file descriptors the server neither spins nor stays stuck") {
  // The server runs in a child whose RLIMIT_NOFILE is low; this process opens authenticated
  // connections until the child cannot accept more, queues a few more, and measures the
  // child's CPU time while it is out of descriptors.
  constexpr rlim_t kChildFdLimit = 48;
  int ports[2];
  REQUIRE(pipe(ports) == 0);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(ports[0]);
    rlimit rl{kChildFdLimit, kChildFdLimit};
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) _exit(2);
    try {
      TcpStore s("127.0.0.1", 0, true, opts(30000ms));
      s.set("ready", "1");
      int port = s.port();
      if (write(ports[1], &port, sizeof(port)) != sizeof(port)) _exit(3);
      while (true) pause();  // until the parent kills us
    } catch (...) {
      _exit(4);
    }
  }
  close(ports[1]);
  struct Reaper {
    pid_t pid;
    ~Reaper() {
      if (pid <= 0) return;  // already reaped (never kill(0, ...): that is our process group)
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    bool alive() {
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == 0) return true;
      MESSAGE("the server child ended: status ", status);
      pid = 0;
      return false;
    }
  } reaper{pid};
  int port = 0;
  pollfd p{ports[0], POLLIN, 0};
  REQUIRE(poll(&p, 1, 30000) == 1);
  REQUIRE(read(ports[0], &port, sizeof(port)) == sizeof(port));
  close(ports[0]);

  std::vector<std::unique_ptr<RawConn>> in;
  std::unique_ptr<RawConn> first_stuck;
  for (rlim_t i = 0; i < 2 * kChildFdLimit && !first_stuck; ++i) {
    auto c = std::make_unique<RawConn>(port);
    c->send_bytes(hello_frame(""));
    std::string challenge;
    HelloReply h = hello_reply(*c, 3000ms, &challenge);
    REQUIRE(h != kHelloBad);  // a connection that said HELLO at once is never dropped
    if (h == kHelloOk) {
      REQUIRE(finish_auth(*c, challenge));  // authenticated: never dropped for another
      in.push_back(std::move(c));
    } else {
      first_stuck = std::move(c);  // queued in the backlog: the child is out of descriptors
    }
  }
  REQUIRE(first_stuck);
  CHECK(in.size() > 10);
  std::vector<std::unique_ptr<RawConn>> stuck;
  for (int i = 0; i < 3; ++i) {
    stuck.push_back(std::make_unique<RawConn>(port));
    stuck.back()->send_bytes(hello_frame(""));
  }
  std::this_thread::sleep_for(200ms);
  double cpu0 = cpu_seconds(pid);
  auto t0 = Clock::now();
  std::this_thread::sleep_for(3s);
  double cpu = cpu_seconds(pid) - cpu0;
  double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  MESSAGE("server CPU while out of descriptors: ", cpu, " s in ", wall, " s");
  CHECK(cpu < 0.3);  // a spinning accept loop burns about 1 s per second

  REQUIRE(reaper.alive());
  // Descriptors free up: the queued clients are served, and new ones too.
  for (int i = 0; i < 8; ++i) in.pop_back();
  CHECK(hello_ok(*first_stuck, 15000ms));
  for (auto& c : stuck) CHECK(hello_ok(*c, 15000ms));
  stuck.clear();
  first_stuck.reset();
  TcpStore late("127.0.0.1", port, false, opts(15000ms));
  CHECK(late.get("ready") == "1");
  CHECK(reaper.alive());
}

TEST_CASE("store hardening: key and byte caps give an error naming the limit") {
  StoreOptions o = opts();
  o.max_keys = 4;
  o.max_total_bytes = 1000;
  TcpStore server("127.0.0.1", 0, true, o);
  TcpStore client("127.0.0.1", server.port(), false, o);
  for (char i = '0'; i < '4'; ++i) client.set(std::string("k") + i, "v");
  auto expect_limit = [](auto&& fn, const char* limit) {
    try {
      fn();
      FAIL("the store took a write past ", limit);
    } catch (const DistError& e) {
      CHECK(std::string(e.what()).find(limit) != std::string::npos);
    }
  };
  expect_limit([&] { client.set("k4", "v"); }, "max_keys");
  expect_limit([&] { client.add("counter", 1); }, "max_keys");
  expect_limit([&] { client.compare_set("fresh", "", "x"); }, "max_keys");
  CHECK(client.num_keys() == 4);
  client.set("k0", "overwrite");  // no new key: fine
  CHECK(client.delete_key("k3"));
  client.set("k3", std::string(900, 'x'));  // 4 keys, 2 + 900 + 2 + 9 + 2 + 1 + 2 + 1 bytes
  expect_limit([&] { client.set("k1", std::string(100, 'y')); }, "max_total_bytes");
  expect_limit([&] { client.compare_set("k1", "v", std::string(100, 'y')); }, "max_total_bytes");
  CHECK(client.get("k1") == "v");  // unchanged by the refused writes
  StoreServerStats st = server.server()->stats();
  CHECK(st.keys == 4);
  CHECK(st.bytes == 2 + 9 + 2 + 1 + 2 + 1 + 2 + 900);
  // Freeing space makes room again; the same connection was usable all along.
  CHECK(client.delete_key("k3"));
  client.set("k1", std::string(100, 'y'));
  CHECK(server.get("k1").size() == 100);
}

TEST_CASE("store hardening: a wrong, missing or unexpected token is refused and counted") {
  TcpStore server("127.0.0.1", 0, true, opts(5000ms, "s3cret"));
  auto refused = [&](const std::string& token, const char* why) {
    auto t0 = Clock::now();
    try {
      TcpStore bad("127.0.0.1", server.port(), false, opts(20000ms, token));
      FAIL("token '", token, "' accepted");
    } catch (const DistError& e) {
      std::string msg = e.what();
      CHECK(msg.find("rendezvous token rejected") != std::string::npos);
      CHECK(msg.find(why) != std::string::npos);
      CHECK(msg.find("127.0.0.1:" + std::to_string(server.port())) != std::string::npos);
    }
    CHECK(Clock::now() - t0 < 10s);  // refused at once, not retried until the timeout
  };
  refused("guess", "differs");
  refused("", "presented none");
  CHECK(server.server()->stats().auth_failures == 2);
  // A client holding a token that reaches a store without one has found the wrong store.
  TcpStore open_store("127.0.0.1", 0, true, opts());
  try {
    TcpStore stray("127.0.0.1", open_store.port(), false, opts(20000ms, "s3cret"));
    FAIL("a tokenless store accepted a client with a token");
  } catch (const DistError& e) {
    CHECK(std::string(e.what()).find("has none") != std::string::npos);
  }
  CHECK(open_store.server()->stats().auth_failures == 1);
  TcpStore good("127.0.0.1", server.port(), false, opts(5000ms, "s3cret"));
  good.set("k", "v");
  CHECK(server.get("k") == "v");
}

TEST_CASE("store hardening: connecting where nothing listens names rank 0's address") {
  // A bound socket that does not listen holds the port, so nobody else can start listening
  // there meanwhile, and connecting to it is refused.
  int holder = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(holder, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  socklen_t len = sizeof(a);
  getsockname(holder, reinterpret_cast<sockaddr*>(&a), &len);
  int port = ntohs(a.sin_port);
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{holder};
  auto t0 = Clock::now();
  try {
    TcpStore client("127.0.0.1", port, false, opts(1500ms));
    FAIL("connected to a closed port");
  } catch (const DistError& e) {
    std::string msg = e.what();
    std::string want =
        "could not reach the rendezvous store of rank 0 at 127.0.0.1:" + std::to_string(port) +
        " within 1500 ms: connection refused";
    CHECK_MESSAGE(msg.find(want) != std::string::npos, msg);
  }
  auto dt = Clock::now() - t0;
  CHECK(dt >= 1400ms);  // it kept retrying until the timeout ...
  CHECK(dt < 10s);      // ... and no longer
}

TEST_CASE("store hardening: a silent server costs each call at most the store timeout") {
  {
    SilentServer hung(SilentServer::kHung);
    TcpStore client("127.0.0.1", hung.port, false, opts(1000ms));
    auto t0 = Clock::now();
    CHECK_THROWS_AS(client.set("k", "v"), DistError);
    CHECK(Clock::now() - t0 < 6s);  // the timeout, not a fixed 10 s grace
  }
  {
    SilentServer mute(SilentServer::kMute);
    auto t0 = Clock::now();
    try {
      TcpStore client("127.0.0.1", mute.port, false, opts(1000ms));
      FAIL("connected to a server that never answered");
    } catch (const DistError& e) {
      CHECK(std::string(e.what()).find("did not answer the handshake") != std::string::npos);
    }
    CHECK(Clock::now() - t0 < 6s);
  }
}

// ---------------------------------------------------------------------------------------------
// Authentication, generations and membership (issue 22 items 8-10; Notes [store
// authentication], [store generations], [store membership] in comm/store.cc).

TEST_CASE("store authentication: a squatter on the port learns nothing reusable and is refused") {
  const std::string token = "squat-test-token-0123456789abcdef";
  SilentServer squatter(SilentServer::kSquatter);
  auto t0 = Clock::now();
  try {
    TcpStore victim("127.0.0.1", squatter.port, false, opts(20000ms, token));
    FAIL("the client trusted a server that cannot prove the token");
  } catch (const DistError& e) {
    std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("could not prove that it holds this rank's token") != std::string::npos);
    CHECK(msg.find("127.0.0.1:" + std::to_string(squatter.port)) != std::string::npos);
  }
  CHECK(Clock::now() - t0 < 10s);  // refused at once, not retried until the timeout
  std::vector<std::string> got;
  for (int i = 0; i < 100; ++i) {
    {
      std::lock_guard<std::mutex> g(squatter.mu);
      got = squatter.received;
    }
    if (!got.empty()) break;
    std::this_thread::sleep_for(20ms);
  }
  REQUIRE(got.size() == 1);
  const std::string& bytes = got[0];
  // Version 1 sent the token itself in HELLO.
  CHECK(bytes.find(token) == std::string::npos);
  // The frames' bodies: HELLO (1 + 4 + 2 + 1 + 32 + 4 + 16 bytes) and AUTH "not verified" (2
  // bytes), then nothing: no proof, nothing else computed from the token.
  CHECK(bytes.size() == 60 + 2);
  CHECK(bytes.substr(60) == std::string("\x09\x00", 2));
}

TEST_CASE("store authentication: a proof recorded on one connection is refused on another") {
  TcpStore server("127.0.0.1", 0, true, opts(5000ms, "tok-0123456789abcdef"));
  RawConn first(server.port());
  first.send_bytes(hello_frame("tok-0123456789abcdef"));
  std::string challenge;
  REQUIRE(hello_reply(first, 5000ms, &challenge) == kHelloOk);
  const std::string recorded = auth_frame(challenge, "tok-0123456789abcdef");
  REQUIRE(!recorded.empty());
  REQUIRE(finish_auth(first, challenge, "tok-0123456789abcdef"));
  // The same client nonce, the recorded AUTH: the server's nonce differs, so the proof does not
  // fit this connection.
  RawConn replay(server.port());
  replay.send_bytes(hello_frame("tok-0123456789abcdef"));
  REQUIRE(hello_reply(replay, 5000ms, &challenge) == kHelloOk);
  replay.send_bytes(recorded);
  std::string got;
  CHECK(replay.closed_by_server(5s, &got));
  CHECK(got.find("rendezvous token rejected") != std::string::npos);
  CHECK(server.server()->stats().auth_failures == 1);
  // Version 1 clients (the token in clear) are refused, naming the versions.
  RawConn old(server.port());
  std::string v1 = std::string(1, '\0') + le32(0x54534341) + std::string("\x01\x00", 2) + le32(20) +
                   "tok-0123456789abcdef";
  old.send_bytes(frame(v1));
  got.clear();
  CHECK(old.closed_by_server(5s, &got));
  CHECK(got.find("protocol version 1, this store speaks 2") != std::string::npos);
}

TEST_CASE("store generations: a restarted server refuses the old generation's clients") {
  auto first = std::make_unique<TcpStore>("127.0.0.1", 0, true, opts());
  const int port = first->port();
  const std::string gen1 = first->generation();
  TcpStore client("127.0.0.1", port, false, opts(3000ms));
  CHECK(client.generation() == gen1);
  CHECK(gen1.size() == 16);
  client.set("k", "v");
  first.reset();  // rank 0 tears its store down and starts a new one on the same port
  TcpStore second("127.0.0.1", port, true, opts());
  CHECK(second.generation() != gen1);
  // The old connection is gone; the client reconnects, and the new server refuses it instead of
  // serving it a store that does not hold its keys.
  std::string msg;
  for (int i = 0; i < 3 && msg.find("generation") == std::string::npos; ++i) {
    try {
      client.set("k2", "v2");
    } catch (const DistError& e) {
      msg = e.what();
    }
  }
  INFO(msg);
  CHECK(msg.find("this client joined generation " + auth::hex(gen1)) != std::string::npos);
  CHECK(msg.find("replaced by generation " + auth::hex(second.generation())) != std::string::npos);
  CHECK(second.server()->stats().stale_generation >= 1);
  CHECK_FALSE(second.check({"k2"}));
}

TEST_CASE("store generations: a client avoiding the previous generation waits for the next") {
  auto first = std::make_unique<TcpStore>("127.0.0.1", 0, true, opts());
  const int port = first->port();
  const std::string gen1 = first->generation();
  first->set("stale", "previous cycle's address");
  std::unique_ptr<TcpStore> second;
  std::thread restarter([&] {
    std::this_thread::sleep_for(400ms);
    first.reset();
    second = std::make_unique<TcpStore>("127.0.0.1", port, true, opts());
    second->set("fresh", "1");
  });
  StoreOptions o = opts(10000ms);
  o.avoid_generation = gen1;
  auto t0 = Clock::now();
  TcpStore late("127.0.0.1", port, false, o);  // the old store is up: not that one
  CHECK(Clock::now() - t0 >= 350ms);
  CHECK(late.generation() != gen1);
  CHECK(late.get("fresh", 5000ms) == "1");
  CHECK_FALSE(late.check({"stale"}));
  restarter.join();
  CHECK(late.generation() == second->generation());
}

TEST_CASE("store membership: a wait watching a rank ends when it leaves or dies") {
  TcpStore server("127.0.0.1", 0, true, opts());
  StoreOptions o0 = opts(20000ms);
  o0.member = 0;
  TcpStore rank0("127.0.0.1", server.port(), false, o0);
  rank0.watch_members({1, 2});
  auto expect_left = [&](int who, const char* what) {
    auto t0 = Clock::now();
    try {
      rank0.wait({"never"}, 20000ms);
      FAIL("the wait outlived rank ", who);
    } catch (const StoreMemberLeft& e) {
      std::string msg = e.what();
      INFO(msg);
      CHECK(e.rank() == who);
      CHECK(msg.find("rank " + std::to_string(who) + " ") != std::string::npos);
      CHECK(msg.find(what) != std::string::npos);
    }
    CHECK(Clock::now() - t0 < 10s);  // not the 20 s timeout
  };
  {
    // Rank 2 "dies": its connection closes without LEAVE (a killed process).
    RawConn two(server.port());
    REQUIRE(raw_handshake(two.fd, "", 5000ms, 2));
    std::thread killer([&] {
      std::this_thread::sleep_for(300ms);
      shutdown(two.fd, SHUT_RDWR);
    });
    expect_left(2, "without leaving: the process exited or was killed");
    killer.join();
  }
  // Already gone: the next wait ends at once.
  expect_left(2, "without leaving");
  rank0.watch_members({1});
  {
    StoreOptions o1 = opts(20000ms);
    o1.member = 1;
    auto one = std::make_unique<TcpStore>("127.0.0.1", server.port(), false, o1);
    one->set("from1", "x");
    CHECK(rank0.get("from1", 1000ms) == "x");  // keys present: no reason to fail
    std::thread leaver([&] {
      std::this_thread::sleep_for(300ms);
      one.reset();  // a clean exit says LEAVE
    });
    expect_left(1, "left the rendezvous store");
    leaver.join();
  }
  // What the store knows about ranks, for a timeout's message.
  auto members = rank0.members();
  REQUIRE(members.size() == 3);
  CHECK(members[0].rank == 0);
  CHECK(members[0].state == StoreMember::State::kConnected);
  CHECK(members[1].state == StoreMember::State::kLeft);
  CHECK(members[2].state == StoreMember::State::kDeparted);
  CHECK(rank0.describe_rank(5).find("it never connected to the rendezvous store") !=
        std::string::npos);
  CHECK(rank0.describe_rank(5).find("ranks 0, 1, 2 did") != std::string::npos);
  CHECK(rank0.describe_rank(0).find("is still connected") != std::string::npos);
  rank0.watch_members({});
  CHECK(rank0.describe_rank(5).empty());  // ranks are described only while watched
  CHECK(server.server()->stats().members == 3);
}

TEST_CASE("store: interrupt() ends a blocked wait within a slice, until cleared") {
  TcpStore server("127.0.0.1", 0, true, opts());
  TcpStore client("127.0.0.1", server.port(), false, opts(20000ms));
  std::thread t([&] {
    std::this_thread::sleep_for(300ms);
    client.interrupt("rank 1 at 10.0.0.2 sent no heartbeat for 15.0 s");
  });
  auto t0 = Clock::now();
  try {
    client.wait({"never"}, 20000ms);
    FAIL("not interrupted");
  } catch (const DistError& e) {
    CHECK(std::string(e.what()).find("sent no heartbeat") != std::string::npos);
  }
  CHECK(Clock::now() - t0 < 5s);
  t.join();
  CHECK_THROWS_AS(client.get("never", 20000ms), DistError);  // sticky ...
  client.clear_interrupt();                                  // ... until cleared
  client.set("k", "v");
  CHECK(client.get("k", 1000ms) == "v");
  // Keys derived for a purpose are equal on every client and differ between purposes and stores.
  TcpStore other("127.0.0.1", server.port(), false, opts());
  CHECK(client.derive_key("default/heartbeat") == other.derive_key("default/heartbeat"));
  CHECK(client.derive_key("default/heartbeat").size() == 32);
  CHECK(client.derive_key("default/heartbeat") != client.derive_key("pg1/heartbeat"));
  TcpStore elsewhere("127.0.0.1", 0, true, opts());
  CHECK(elsewhere.derive_key("default/heartbeat") != client.derive_key("default/heartbeat"));
}

TEST_CASE("store fuzzing: the seed corpus follows the protocol") {
  // tests/fuzz/corpus/fuzz_store (tests/fuzz/make_corpus.py): the session seeds complete the
  // version-2 handshake and get their requests handled; the refused ones get nothing handled.
  auto run = [](const std::string& name) {
    std::ifstream f(std::string(ACCEL_SOURCE_ROOT) + "/tests/fuzz/corpus/fuzz_store/seed-" + name,
                    std::ios::binary);
    REQUIRE_MESSAGE(f.good(), "missing seed ", name);
    std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    return dist::detail::store_fuzz_one(reinterpret_cast<const uint8_t*>(bytes.data()),
                                        bytes.size());
  };
  for (const char* ok : {"token-session", "open-session", "split-reads", "preauthed"}) {
    CAPTURE(ok);
    CHECK(run(ok) >= 10);
  }
  for (const char* refused :
       {"bad-proof", "not-verified", "token-missing", "stale-generation", "version-1"}) {
    CAPTURE(refused);
    CHECK(run(refused) == 0);
  }
}
