#include "launcher/rendezvous.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "launcher/util.h"

namespace accel::launcher {

// Note [elastic rendezvous]
// `accel-run launch --num_machines MIN:MAX` runs one agent per machine (the accel-run itself). The
// agent that can bind main_process_ip:main_process_port serves the rendezvous (RendezvousServer:
// a RoundTable behind a TCP port); every agent, that one included, is its client. A world is
// formed in numbered rounds (1, 2, ...), each in three phases:
//   open       agents join; once MIN have joined the round enters
//   last call  for last_call_s more (--rdzv_last_call), or until MAX have joined; then it is
//   running    (closed): the joined agents are the machines, node ranks assigned (the serving
//              agent first, then by the node rank each had in its last round, then by join
//              order), node rank 0's address is MASTER_ADDR, main_process_port + round the
//              workers' store port.
// While a round runs, every agent sends a keep-alive (`beat`) every keep_alive_s / 10 with the
// round it runs. The round ends, and round + 1 opens, when
//   - an agent's workers fail (`fail`): counted against --max_restarts; one too many aborts the
//     job on every agent;
//   - an agent is silent for keep_alive_s (--rdzv_keep_alive): lost, counted the same way;
//   - a machine asked to join while the round ran (it is told `wait` and waits) and the round has
//     room (fewer than MAX members): at the next keep-alive, not counted.
// Agents learn of the new round from the reply to their next keep-alive (`rejoin R`), stop their
// workers (SIGTERM, then SIGKILL after the grace period) and join round R; the workers of round R
// start from the last complete checkpoint (docs/launcher.md "Elastic membership").
// An agent that presents a round the job has left behind (it ran round R - 1 or earlier while
// round R runs without it, or it names a round never opened) is refused with the reason: its
// machine missed a round, and its workers' state is not the world's. Only a fresh accel-run
// (which presents no round) may join again, as a new machine.
// Requests are one line per TCP connection. The server opens with a random nonce, the client
// proves it holds the rendezvous token with HMAC-SHA256(token, "req|" nonce "|" request) and the
// server answers with HMAC(token, "rep|" nonce "|" reply) before the reply, so neither a stranger
// nor a replayed request or reply is accepted and the token never crosses the network (as the
// workers' store, Note [store authentication] in comm/store_protocol.h). The server lives in one
// agent: if that agent's machine is lost the others cannot form a new round and stop with an
// error after their request timeout (torchrun's c10d rendezvous backend has the same limit).

namespace {
std::vector<std::string> words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}
std::string n(int v) { return std::to_string(v); }
}  // namespace

std::string RoundTable::handle(const std::string& request, const std::string& addr,
                               RdzvClock::time_point now) {
  tick(now);
  const auto w = words(request);
  if (w.size() != 3 || w[1].empty()) return "refused malformed request '" + request + "'";
  const auto seen = parse_int(w[2]);
  if (!seen || *seen < 0) return "refused malformed round in '" + request + "'";
  const int r = static_cast<int>(*seen);
  if (phase_ == Phase::kAborted && w[0] != "done") return "abort " + abort_why_;
  if (w[0] == "join") return join(w[1], r, addr, now);
  if (w[0] == "poll") return poll(w[1], r);
  if (w[0] == "beat") return beat(w[1], r, now);
  if (w[0] == "fail") return fail(w[1], r, now);
  if (w[0] == "done") {
    auto it = members_.find(w[1]);
    if (phase_ == Phase::kRunning && r == round_ && it != members_.end()) it->second.done = true;
    return "ok " + n(round_);
  }
  return "refused unknown request '" + w[0] + "'";
}

// Why an agent presenting round `seen` is refused, if it is.
std::optional<std::string> RoundTable::stale(const std::string& agent, int seen) const {
  if (seen > round_)
    return "refused round " + n(seen) + " was never opened (this job is at round " + n(round_) +
           "); the agent belongs to another job or an earlier rendezvous server";
  const bool running = phase_ == Phase::kRunning;
  const bool member = running ? members_.count(agent) > 0 : joined_.count(agent) > 0;
  if (seen == 0 || seen == round_ || (!running && seen == round_ - 1) || member) return {};
  return "refused stale round " + n(seen) + ": the job is at round " + n(round_) +
         (running ? " (running without this machine)" : " (forming)") +
         "; this machine missed a round; start accel-run again to join as a new machine";
}

std::string RoundTable::join(const std::string& agent, int seen, const std::string& addr,
                             RdzvClock::time_point now) {
  if (auto why = stale(agent, seen)) return *why;
  if (phase_ == Phase::kRunning) {
    if (members_.count(agent))
      return "refused agent " + agent + " is already in round " + n(round_);
    waiting_[agent] = addr;
    return "wait " + n(round_);
  }
  if (!joined_.count(agent) && static_cast<int>(joined_.size()) >= limits_.max_machines) {
    waiting_[agent] = addr;
    return "wait " + n(round_);
  }
  Member& m = joined_[agent];
  m.addr = addr;
  m.order = next_order_++;
  if (auto it = last_rank_.find(agent); it != last_rank_.end()) m.previous_rank = it->second;
  waiting_.erase(agent);
  const int count = static_cast<int>(joined_.size());
  if (count >= limits_.max_machines) {
    close_round(now);
  } else if (count >= limits_.min_machines && phase_ == Phase::kOpen) {
    phase_ = Phase::kLastCall;
    last_call_end_ = now + std::chrono::duration_cast<RdzvClock::duration>(
                               std::chrono::duration<double>(limits_.last_call_s));
  }
  return "joined " + n(round_);
}

std::string RoundTable::poll(const std::string& agent, int seen) {
  if (phase_ == Phase::kRunning && members_.count(agent)) {
    const auto pos = std::find(ranks_.begin(), ranks_.end(), agent) - ranks_.begin();
    return "go " + n(round_) + " " + n(static_cast<int>(pos)) + " " +
           n(static_cast<int>(ranks_.size())) + " " + members_.at(ranks_[0]).addr;
  }
  if (joined_.count(agent)) return "pending " + n(round_);
  if (waiting_.count(agent)) {
    if (phase_ != Phase::kRunning) return "rejoin " + n(round_) + " " + reason_;
    return "wait " + n(round_);
  }
  if (auto why = stale(agent, seen)) return *why;
  return phase_ == Phase::kRunning ? "wait " + n(round_) : "rejoin " + n(round_) + " " + reason_;
}

std::string RoundTable::beat(const std::string& agent, int seen, RdzvClock::time_point now) {
  if (phase_ == Phase::kRunning && seen == round_ && members_.count(agent)) {
    members_[agent].last_beat = now;
    if (!waiting_.empty() && static_cast<int>(members_.size()) < limits_.max_machines) {
      open_round(false, n(static_cast<int>(waiting_.size())) + " machine(s) asked to join");
      return "rejoin " + n(round_) + " " + reason_;
    }
    return "ok " + n(round_);
  }
  if (phase_ != Phase::kRunning && seen == round_ - 1) return "rejoin " + n(round_) + " " + reason_;
  if (auto why = stale(agent, seen)) return *why;
  return "refused agent " + agent + " is not in round " + n(round_);
}

std::string RoundTable::fail(const std::string& agent, int seen, RdzvClock::time_point now) {
  (void)now;
  if (phase_ == Phase::kRunning && seen == round_ && members_.count(agent)) {
    open_round(true, "the workers of machine " +
                         n(static_cast<int>(std::find(ranks_.begin(), ranks_.end(), agent) -
                                            ranks_.begin())) +
                         " failed");
    if (phase_ == Phase::kAborted) return "abort " + abort_why_;
    return "rejoin " + n(round_) + " " + reason_;
  }
  if (phase_ != Phase::kRunning && seen == round_ - 1) return "rejoin " + n(round_) + " " + reason_;
  if (auto why = stale(agent, seen)) return *why;
  return "refused agent " + agent + " is not in round " + n(round_);
}

void RoundTable::tick(RdzvClock::time_point now) {
  if (phase_ == Phase::kLastCall && now >= last_call_end_) close_round(now);
  if (phase_ != Phase::kRunning) return;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const Member& m = members_.at(ranks_[i]);
    const double silent = std::chrono::duration<double>(now - m.last_beat).count();
    if (!m.done && silent > limits_.keep_alive_s) {
      char secs[32];
      std::snprintf(secs, sizeof(secs), "%.1f", silent);
      open_round(true, "machine " + n(static_cast<int>(i)) + " (" + m.addr +
                           ") was lost: no keep-alive for " + secs + " s");
      return;
    }
  }
}

bool RoundTable::all_done() const {
  if (phase_ != Phase::kRunning) return phase_ == Phase::kAborted;
  return std::all_of(members_.begin(), members_.end(), [](const auto& m) { return m.second.done; });
}

void RoundTable::open_round(bool after_failure, const std::string& why) {
  if (after_failure && ++failure_rounds_ > limits_.max_restarts) {
    phase_ = Phase::kAborted;
    abort_why_ = why + " in round " + n(round_) + ", and --max_restarts " +
                 n(limits_.max_restarts) + " rounds after failures have been used";
    return;
  }
  for (size_t i = 0; i < ranks_.size(); ++i) last_rank_[ranks_[i]] = static_cast<int>(i);
  reason_ =
      "(" + why + " in round " + n(round_) +
      (after_failure ? ", restart " + n(failure_rounds_) + " of " + n(limits_.max_restarts) : "") +
      ")";
  ++round_;
  phase_ = Phase::kOpen;
  joined_.clear();
  members_.clear();
  ranks_.clear();
  next_order_ = 0;
}

void RoundTable::close_round(RdzvClock::time_point now) {
  ranks_.clear();
  for (const auto& [agent, m] : joined_) ranks_.push_back(agent);
  auto key = [&](const std::string& a) {
    const Member& m = joined_.at(a);
    return std::make_tuple(m.addr == limits_.host_addr ? 0 : 1, m.previous_rank, m.order);
  };
  std::sort(ranks_.begin(), ranks_.end(),
            [&](const std::string& a, const std::string& b) { return key(a) < key(b); });
  members_ = std::move(joined_);
  joined_.clear();
  for (auto& [agent, m] : members_) m.last_beat = now;
  phase_ = Phase::kRunning;
}

}  // namespace accel::launcher
