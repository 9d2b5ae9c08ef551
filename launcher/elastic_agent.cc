#include "launcher/elastic_agent.h"

#include <unistd.h>

#include <iostream>
#include <mutex>
#include <sstream>
#include <thread>

#include "launcher/util.h"

namespace accel::launcher {

namespace {

std::vector<std::string> words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// The rest of a reply after its first `n` words ("rejoin 3 (why ...)" -> "(why ...)").
std::string rest(const std::string& s, size_t n) {
  size_t pos = 0;
  for (size_t i = 0; i < n && pos != std::string::npos; ++i) {
    pos = s.find_first_not_of(' ', pos);
    pos = pos == std::string::npos ? pos : s.find(' ', pos);
  }
  return pos == std::string::npos ? std::string() : trim(s.substr(pos));
}

class Agent {
 public:
  Agent(LaunchPlan& plan, const EnvMap& env, SuperviseOptions opts, const ElasticOptions& eo)
      : plan_(plan), env_(env), opts_(std::move(opts)), eo_(eo) {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    id_ = std::string(host) + "-" + std::to_string(getpid()) + "-" + random_hex(4);
    port_ = plan_.master_port;
    addr_ = plan_.master_addr;
  }

  int run();

 private:
  void log(const std::string& line) { std::cerr << "accel-run: " + line + "\n" << std::flush; }
  std::string ask(const std::string& verb, int round) {
    return rendezvous_request(addr_, port_, plan_.rendezvous_token,
                              verb + " " + id_ + " " + std::to_string(round),
                              eo_.request_timeout_s);
  }
  // Joins until a round starts with this machine; nullopt when refused or aborted (rc_ set).
  std::optional<RoundAssignment> form_round();
  int run_round(const RoundAssignment& a);
  void linger(bool success);

  LaunchPlan& plan_;
  const EnvMap& env_;
  SuperviseOptions opts_;
  ElasticOptions eo_;
  std::unique_ptr<RendezvousServer> server_;
  std::string id_, addr_;
  int port_ = 0;
  int seen_ = 0;  // the last round this agent was told of
  int rc_ = 1;
  int failed_rc_ = 0;  // the last failing worker's exit code (for an abort)
};

std::optional<RoundAssignment> Agent::form_round() {
  bool said_wait = false;
  std::string reply = ask("join", seen_);
  while (true) {
    const auto w = words(reply);
    const std::string verb = w.empty() ? "" : w[0];
    const int round = w.size() > 1 ? static_cast<int>(parse_int(w[1]).value_or(0)) : 0;
    if (verb == "refused" || verb == "abort" || w.size() < 2) {
      log((verb == "abort" ? "the job stops: " : "the rendezvous refused this machine: ") +
          rest(reply, 1));
      rc_ = verb == "abort" && failed_rc_ != 0 ? failed_rc_ : 1;
      return std::nullopt;
    }
    if (verb == "go" && w.size() == 5) {
      RoundAssignment a;
      a.round = round;
      a.node_rank = static_cast<int>(parse_int(w[2]).value_or(0));
      a.num_machines = static_cast<int>(parse_int(w[3]).value_or(1));
      a.master_addr = w[4];
      seen_ = round;
      return a;
    }
    if (verb == "rejoin") {
      seen_ = round - 1;
      reply = ask("join", seen_);
      continue;
    }
    if (verb == "wait" && !said_wait) {
      log("round " + std::to_string(round) +
          " is running (or full); this machine waits for round " + std::to_string(round + 1));
      said_wait = true;
    }
    if (verb == "joined" && round != seen_) {
      log("joined rendezvous round " + std::to_string(round) + " (" +
          std::to_string(eo_.machines.min) + ":" + std::to_string(eo_.machines.max) + " machines)");
      seen_ = round;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    reply = ask("poll", seen_);
  }
}

int Agent::run_round(const RoundAssignment& a) {
  const int local = plan_.local_world_size;
  plan_.num_machines = a.num_machines;
  plan_.machine_rank = a.node_rank;
  plan_.world_size = a.num_machines * local;
  plan_.first_rank = a.node_rank * local;
  plan_.master_addr = a.master_addr;
  plan_.master_port = port_ + a.round;
  if (plan_.world_size > 1 && plan_.distributed_type == "NO")
    plan_.distributed_type =
        plan_.use_cpu || count_gpu_device_nodes() == 0 ? "MULTI_CPU" : "MULTI_GPU";
  log("round " + std::to_string(a.round) + ": this machine is node rank " +
      std::to_string(a.node_rank) + " of " + std::to_string(a.num_machines) + ", world size " +
      std::to_string(plan_.world_size) +
      (local == 1 ? " (rank " + std::to_string(plan_.first_rank)
                  : " (ranks " + std::to_string(plan_.first_rank) + "-" +
                        std::to_string(plan_.first_rank + local - 1)) +
      "), MASTER_ADDR=" + plan_.master_addr + " MASTER_PORT=" + std::to_string(plan_.master_port));

  // Keep-alives from a thread of their own, so that a long round still answers; the reply that
  // opens a new round stops the workers through should_stop.
  std::atomic<bool> stop{false}, done{false};
  std::mutex mu;
  std::string news;  // the reply that stopped the round
  std::thread beat([&] {
    const auto every = std::chrono::duration<double>(std::max(0.05, eo_.keep_alive_s / 10));
    while (!done) {
      std::string reply;
      try {
        reply = ask("beat", a.round);
      } catch (const std::exception& e) {
        reply = std::string("refused ") + e.what();
      }
      if (reply.rfind("ok ", 0) != 0) {
        std::lock_guard<std::mutex> lock(mu);
        news = reply;
        stop = true;
        return;
      }
      for (auto t = RdzvClock::now() + std::chrono::duration_cast<RdzvClock::duration>(every);
           !done && RdzvClock::now() < t;)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  SuperviseOptions o = opts_;
  bool interrupted = false;
  o.should_stop = [&] { return stop.load(); };
  o.restart_offset = a.round - 1;
  o.local_restarts = false;
  o.interrupted = &interrupted;
  int rc = 0;
  try {
    rc = supervise(plan_, env_, o);
  } catch (...) {
    done = true;  // the keep-alive thread must end before it is destroyed
    beat.join();
    throw;
  }
  done = true;
  beat.join();
  if (interrupted) return rc;
  if (rc == kSuperviseStopped) {
    const auto w = words(news);
    const std::string verb = w.empty() ? "" : w[0];
    if (verb == "rejoin") {
      log("round " + std::to_string(a.round) + " ends: rendezvous round " + w[1] + " opens " +
          rest(news, 2));
      return kSuperviseStopped;
    }
    log((verb == "abort" ? "the job stops: " : "the rendezvous refused this machine: ") +
        rest(news, 1) + "; its workers were stopped");
    rc_ = verb != "abort" || failed_rc_ == 0 ? 1 : failed_rc_;
    return rc_;
  }
  if (rc == 0) {
    ask("done", a.round);
    return 0;
  }
  failed_rc_ = rc;
  const std::string reply = ask("fail", a.round);
  if (reply.rfind("rejoin", 0) == 0) {
    log("round " + std::to_string(a.round) + " failed; rendezvous round " + rest(reply, 1) +
        " opens");
    return kSuperviseStopped;
  }
  log((reply.rfind("abort", 0) == 0 ? "the job stops: " : "the rendezvous refused this machine: ") +
      rest(reply, 1));
  return reply.rfind("abort", 0) == 0 ? rc : 1;
}

// The serving agent stays a while before it exits, so that the others' last requests are answered:
// after success until every member has said done (or was lost), after an abort long enough for
// every agent's next keep-alive to hear it.
void Agent::linger(bool success) {
  const double wait_s = success ? eo_.keep_alive_s * 2 : eo_.keep_alive_s / 5 + 1.0;
  const auto until = RdzvClock::now() + std::chrono::duration_cast<RdzvClock::duration>(
                                            std::chrono::duration<double>(wait_s));
  while ((!success || !server_->all_done()) && RdzvClock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

int Agent::run() {
  RendezvousLimits limits;
  limits.min_machines = eo_.machines.min;
  limits.max_machines = eo_.machines.max;
  limits.last_call_s = eo_.last_call_s;
  limits.keep_alive_s = eo_.keep_alive_s;
  limits.max_restarts = plan_.config.max_restarts;
  server_ = RendezvousServer::try_start(addr_, port_, plan_.rendezvous_token, limits);
  log(std::string("elastic agent ") + id_ + (server_ ? ": serving" : ": joining") +
      " the rendezvous at " + addr_ + ":" + std::to_string(port_) + " (" +
      std::to_string(eo_.machines.min) + ":" + std::to_string(eo_.machines.max) + " machines, " +
      std::to_string(plan_.local_world_size) + " worker(s) per machine)");
  while (true) {
    auto a = form_round();
    const int rc = a ? run_round(*a) : rc_;
    if (a && rc == kSuperviseStopped) continue;
    if (server_) linger(rc == 0);
    return rc;
  }
}

}  // namespace

int run_elastic(LaunchPlan& plan, const EnvMap& base_env, SuperviseOptions opts,
                const ElasticOptions& eo) {
  Agent agent(plan, base_env, std::move(opts), eo);
  return agent.run();
}

}  // namespace accel::launcher
