// Elastic membership for accel-run (`--num_machines MIN:MAX`): the numbered rendezvous rounds
// that decide which machines form the world, served by one agent and spoken over TCP by every
// agent. See Note [elastic rendezvous] in launcher/rendezvous.cc and docs/launcher.md "Elastic
// membership".
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "launcher/config.h"  // MachineCount, parse_num_machines

namespace accel::launcher {

using RdzvClock = std::chrono::steady_clock;

struct RendezvousLimits {
  int min_machines = 1;
  int max_machines = 1;
  double last_call_s = 3.0;    // after MIN have joined, how long more may join a forming round
  double keep_alive_s = 10.0;  // a member silent this long is lost (a new round opens)
  int max_restarts = 0;        // rounds opened because of a failure, at most
  std::string host_addr;       // the server's own address: its agent gets node rank 0
};

// The world one round formed, as an agent sees it.
struct RoundAssignment {
  int round = 0;
  int node_rank = 0;
  int num_machines = 1;
  std::string master_addr;  // node rank 0's address, as the rendezvous server saw it
};

// The rounds' state machine, without sockets (RendezvousServer feeds it; the unit tests drive it
// directly). Every request returns one reply line: its first word is the verb the agent acts on.
//   join <agent> <round>      -> joined R | wait R | refused <why>
//   poll <agent> <round>      -> pending R | go R <node_rank> <nnodes> <master_addr> | rejoin R |
//                                wait R | abort <why> | refused <why>
//   beat <agent> <round>      -> ok R | rejoin R | abort <why> | refused <why>
//   fail <agent> <round>      -> rejoin R | abort <why> | refused <why>
//   done <agent> <round>      -> ok R
// `round` is the round the agent last saw (0: none). `addr` is the agent's address (join only).
class RoundTable {
 public:
  explicit RoundTable(RendezvousLimits limits) : limits_(limits) {}
  std::string handle(const std::string& request, const std::string& addr,
                     RdzvClock::time_point now);
  // Moves time on: closes a round whose last call ended, opens a new one when a member is lost.
  void tick(RdzvClock::time_point now);
  int round() const { return round_; }
  // Every member of the running round said done (or none was ever running).
  bool all_done() const;

 private:
  enum class Phase { kOpen, kLastCall, kRunning, kAborted };
  struct Member {
    std::string addr;
    int previous_rank = 1 << 30;  // node rank in the last round it ran in (ordering only)
    size_t order = 0;             // join order in this round
    RdzvClock::time_point last_beat;
    bool done = false;
  };
  std::string join(const std::string& agent, int seen, const std::string& addr,
                   RdzvClock::time_point now);
  std::string poll(const std::string& agent, int seen);
  std::string beat(const std::string& agent, int seen, RdzvClock::time_point now);
  std::string fail(const std::string& agent, int seen, RdzvClock::time_point now);
  std::optional<std::string> stale(const std::string& agent, int seen) const;
  void open_round(bool after_failure, const std::string& why);
  void close_round(RdzvClock::time_point now);

  RendezvousLimits limits_;
  int round_ = 1;
  Phase phase_ = Phase::kOpen;
  RdzvClock::time_point last_call_end_;
  std::map<std::string, Member> joined_;        // participants of the forming round
  std::vector<std::string> ranks_;              // running round: agent per node rank
  std::map<std::string, Member> members_;       // running round's members
  std::map<std::string, std::string> waiting_;  // agent -> address: wait for the next round
  std::map<std::string, int> last_rank_;
  int failure_rounds_ = 0;
  std::string abort_why_;
  std::string reason_;  // why the current round opened, "(...)" for the agents' log
  size_t next_order_ = 0;
};

// Serves a RoundTable on addr:port (TCP, one request per connection, authenticated with the
// rendezvous token: Note [elastic rendezvous]) from a thread of its own.
class RendezvousServer {
 public:
  // nullptr when addr:port cannot be bound (another agent serves it, or addr is not ours).
  static std::unique_ptr<RendezvousServer> try_start(const std::string& addr, int port,
                                                     const std::string& token,
                                                     RendezvousLimits limits);
  ~RendezvousServer();
  bool all_done();

 private:
  RendezvousServer(int fd, std::string token, RendezvousLimits limits);
  void serve();
  void answer(int fd, const std::string& peer);
  int fd_ = -1;
  std::string token_;
  std::mutex mu_;
  RoundTable table_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// One request to the server at addr:port; the reply line. Throws DistError when the server cannot
// be reached or answered nothing within `timeout_s`.
std::string rendezvous_request(const std::string& addr, int port, const std::string& token,
                               const std::string& request, double timeout_s);

// HMAC-SHA256 (libcrypto) of `message` under `token`, in hex.
std::string rendezvous_proof(const std::string& token, const std::string& message);

}  // namespace accel::launcher
