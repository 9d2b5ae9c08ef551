// The elastic rendezvous (launcher/rendezvous.h, Note [elastic rendezvous]): --num_machines
// parsing, the rounds' state machine driven with a fake clock, and the TCP server's
// authentication and stale-round refusal. The three-host run is tests/launcher/elastic_test.sh.
#include <doctest/doctest.h>

#include <string>

#include "launcher/rendezvous.h"
#include "launcher/util.h"

using namespace accel::launcher;
using namespace std::chrono_literals;

namespace {

struct Table {
  RoundTable t;
  RdzvClock::time_point now = RdzvClock::now();
  explicit Table(int min, int max, int max_restarts = 1)
      : t([&] {
          RendezvousLimits l;
          l.min_machines = min;
          l.max_machines = max;
          l.last_call_s = 2.0;
          l.keep_alive_s = 5.0;
          l.max_restarts = max_restarts;
          l.host_addr = "10.0.0.1";
          return l;
        }()) {}
  std::string ask(const std::string& req, const std::string& addr = "10.0.0.9") {
    return t.handle(req, addr, now);
  }
  void wait(std::chrono::milliseconds d) {
    now += d;
    t.tick(now);
  }
};

bool starts(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

TEST_CASE("--num_machines is N or MIN:MAX") {
  MachineCount c = parse_num_machines("3");
  CHECK((c.min == 3 && c.max == 3 && !c.elastic));
  c = parse_num_machines(" 1:4 ");
  CHECK((c.min == 1 && c.max == 4 && c.elastic));
  c = parse_num_machines("2:2");
  CHECK((c.min == 2 && c.max == 2 && c.elastic));
  for (const char* bad : {"0", "4:2", "1:", ":3", "a:b", "1:2:3", "", "0:2", "70000"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(parse_num_machines(bad), ConfigError);
  }
  CHECK_THROWS_WITH(parse_num_machines("4:2"), doctest::Contains("MIN must not exceed MAX"));
}

TEST_CASE("a round forms once MIN joined, after the last call or at MAX") {
  Table r(2, 3);
  CHECK(r.ask("join a 0", "10.0.0.2") == "joined 1");
  CHECK(r.ask("poll a 1") == "pending 1");
  CHECK(r.ask("join b 0", "10.0.0.1") == "joined 1");  // MIN: the last call starts
  r.wait(1500ms);
  CHECK(r.ask("poll a 1") == "pending 1");  // still in the last call
  r.wait(600ms);
  // Closed: the serving agent's address (10.0.0.1) is node rank 0 and MASTER_ADDR.
  CHECK(r.ask("poll b 1") == "go 1 0 2 10.0.0.1");
  CHECK(r.ask("poll a 1") == "go 1 1 2 10.0.0.1");

  Table full(1, 2);
  CHECK(full.ask("join a 0") == "joined 1");
  CHECK(full.ask("join b 0") == "joined 1");  // MAX: closes at once
  CHECK(starts(full.ask("poll a 1"), "go 1 0 2"));
  CHECK(starts(full.ask("poll b 1"), "go 1 1 2"));
}

TEST_CASE("a machine that arrives while a round runs waits for the next one") {
  Table r(2, 3);
  r.ask("join a 0", "10.0.0.1");
  r.ask("join b 0", "10.0.0.2");
  r.wait(2100ms);
  CHECK(r.ask("beat a 1") == "ok 1");
  CHECK(r.ask("join c 0", "10.0.0.3") == "wait 1");
  CHECK(r.ask("poll c 0") == "wait 1");
  // The next keep-alive opens round 2 (no restart counted) and tells the member to rejoin.
  const std::string news = r.ask("beat a 1");
  CHECK(starts(news, "rejoin 2 (1 machine(s) asked to join in round 1)"));
  CHECK(starts(r.ask("beat b 1"), "rejoin 2"));
  CHECK(starts(r.ask("poll c 0"), "rejoin 2"));
  CHECK(r.ask("join c 0", "10.0.0.3") == "joined 2");
  CHECK(r.ask("join b 1", "10.0.0.2") == "joined 2");
  CHECK(r.ask("join a 1", "10.0.0.1") == "joined 2");  // MAX: closes
  // Node ranks: the server's machine, then by the last round's ranks, then the newcomer.
  CHECK(r.ask("poll a 2") == "go 2 0 3 10.0.0.1");
  CHECK(r.ask("poll b 2") == "go 2 1 3 10.0.0.1");
  CHECK(r.ask("poll c 2") == "go 2 2 3 10.0.0.1");
  // A round at MAX has no room: a fourth machine keeps waiting, and no round opens for it.
  CHECK(r.ask("join d 0") == "wait 2");
  CHECK(r.ask("beat a 2") == "ok 2");
}

TEST_CASE("a lost machine opens a new round; --max_restarts bounds those rounds") {
  Table r(1, 3, /*max_restarts=*/1);
  r.ask("join a 0", "10.0.0.1");
  r.ask("join b 0", "10.0.0.2");
  r.wait(2100ms);
  REQUIRE(starts(r.ask("poll b 1"), "go 1 1 2"));
  // b falls silent for longer than the keep-alive timeout.
  for (int i = 0; i < 6; ++i) {
    r.wait(1000ms);
    r.ask("beat a 1");
  }
  const std::string news = r.ask("beat a 1");
  CHECK(starts(news, "rejoin 2 (machine 1 (10.0.0.2) was lost: no keep-alive for"));
  CHECK(news.find("restart 1 of 1") != std::string::npos);
  CHECK(r.ask("join a 1", "10.0.0.1") == "joined 2");
  r.wait(2100ms);
  CHECK(r.ask("poll a 2") == "go 2 0 1 10.0.0.1");
  // A second failure is one round too many: every agent is told to stop.
  const std::string abort = r.ask("fail a 2");
  CHECK(starts(abort, "abort the workers of machine 0 failed in round 2"));
  CHECK(abort.find("--max_restarts 1") != std::string::npos);
  CHECK(starts(r.ask("beat a 2"), "abort"));
  CHECK(starts(r.ask("join z 0"), "abort"));
}

TEST_CASE("an agent that presents a stale round is refused") {
  Table r(1, 3, /*max_restarts=*/3);
  r.ask("join a 0", "10.0.0.1");
  r.ask("join b 0", "10.0.0.2");
  r.wait(2100ms);
  r.ask("poll a 1");
  // a's workers fail: round 2 opens; b, told at its next keep-alive, does not come back in time.
  REQUIRE(starts(r.ask("fail a 1"), "rejoin 2"));
  REQUIRE(r.ask("join a 1", "10.0.0.1") == "joined 2");
  r.wait(2100ms);
  REQUIRE(r.ask("poll a 2") == "go 2 0 1 10.0.0.1");
  for (const char* req : {"beat b 1", "join b 1", "fail b 1", "poll b 1"}) {
    CAPTURE(req);
    const std::string reply = r.ask(req);
    CHECK(starts(reply,
                 "refused stale round 1: the job is at round 2 (running without this "
                 "machine)"));
    CHECK(reply.find("start accel-run again to join as a new machine") != std::string::npos);
  }
  CHECK(starts(r.ask("beat a 7"), "refused round 7 was never opened"));
  CHECK(starts(r.ask("beat a x"), "refused malformed round"));
  CHECK(starts(r.ask("dance a 1"), "refused unknown request"));
  // A fresh accel-run on b's machine presents no round: it is a new machine and waits.
  CHECK(r.ask("join b2 0", "10.0.0.2") == "wait 2");
}

TEST_CASE("the rendezvous server answers only the job's token, over TCP") {
  const std::string token = random_hex(16);
  RendezvousLimits l;
  l.min_machines = l.max_machines = 1;
  const int port = pick_free_port("127.0.0.1");
  auto server = RendezvousServer::try_start("127.0.0.1", port, token, l);
  REQUIRE(server);
  // The port is taken: a second agent on this machine becomes a client.
  CHECK_FALSE(RendezvousServer::try_start("127.0.0.1", port, token, l));
  CHECK(rendezvous_request("127.0.0.1", port, token, "join a 0", 5) == "joined 1");
  CHECK(rendezvous_request("127.0.0.1", port, token, "poll a 1", 5) == "go 1 0 1 127.0.0.1");
  // Another token: the server refuses the request, and its reply does not prove the client's
  // token either (the client says so).
  CHECK_THROWS_WITH(rendezvous_request("127.0.0.1", port, random_hex(16), "join b 0", 5),
                    doctest::Contains("does not prove the rendezvous token"));
  CHECK(starts(rendezvous_request("127.0.0.1", port, token, "beat b 3", 5),
               "refused round 3 was never opened"));
  CHECK(rendezvous_request("127.0.0.1", port, token, "done a 1", 5) == "ok 1");
  CHECK(server->all_done());
  server.reset();
  CHECK_THROWS_WITH(rendezvous_request("127.0.0.1", port, token, "join a 0", 0.5),
                    doctest::Contains("no answer from the rendezvous server"));
}
