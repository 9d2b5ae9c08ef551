// Process subgroups: new_group (as torch.distributed.new_group) and ProcessGroup::split (as
// MPI_Comm_split). The backends form the groups (form_subgroup); this file agrees on who is in
// which group.
//
// Note [subgroups]
// A subgroup is a full process group of its own, made by the parent group's backend: its own
// store prefix (under the parent's: "<parent>/sub<N>.<first member>", N counting the new_group
// and split calls made on the parent, so keys never collide between groups or between repeated
// creations), its own sequence numbers and fingerprint history, its own heartbeat, control
// plane, Gloo connections and, when its ranks share a host, its own shared-memory segment. So it
// has every guarantee the world group has: a fingerprint mismatch raises on every member, a
// member that dies, stops or never enters a collective becomes a DistError on the others within
// the heartbeat or collective timeout. Its errors name it: "world/sub0[0,2]" (the parent's name,
// the call's number, the members' world ranks in group order) and which world rank each of its
// ranks is (ProcessGroup::group_context).
//
// Before any group forms, every rank of the parent meets in the store (Note [subgroup
// rendezvous]): the call must be the same everywhere (new_group's list; a split against a
// new_group, or a rank one call ahead, is caught there), and a rank that never arrives is named
// after the parent's timeout. This runs over the store, not the parent's collectives, so that it
// works for every backend (an NCCL parent would need device tensors) and does not take a
// sequence number from the parent. It costs a few store requests per rank, plus one per member
// of its own color for split; the keys stay in the store until the job ends.
#include <algorithm>
#include <chrono>
#include <functional>
#include <numeric>
#include <sstream>
#include <thread>

#include "comm/process_group.h"
#include "core/error.h"

namespace accel::dist {

namespace {

// "0,2,5"; long lists keep their first and last 8 ranks ("0,1,...,63 (64 ranks)").
std::string format_ranks(const std::vector<int>& ranks) {
  std::ostringstream os;
  const size_t n = ranks.size();
  const bool cut = n > 16;
  for (size_t i = 0; i < n; ++i) {
    if (cut && i == 8) {
      os << ",...";
      i = n - 8;
    }
    if (i) os << ',';
    os << ranks[i];
  }
  if (cut) os << " (" << n << " ranks)";
  return os.str();
}

// Every rank: what a call is compared by.
std::string join_ranks(const std::vector<int>& ranks) {
  std::ostringstream os;
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? "," : "") << ranks[i];
  return os.str();
}

// Empty when `ranks` is a valid group of a world of `world` ranks, else what is wrong with it.
std::string check_rank_list(const std::vector<int>& ranks, int world) {
  std::vector<int> seen(size_t(std::max(world, 0)), 0);
  for (int r : ranks) {
    if (r < 0 || r >= world)
      return "rank " + std::to_string(r) + " in [" + format_ranks(ranks) +
             "] is outside the world of " + std::to_string(world) + " ranks [0, " +
             std::to_string(world) + ")";
    if (seen[size_t(r)]++)
      return "rank " + std::to_string(r) + " appears twice in [" + format_ranks(ranks) + "]";
  }
  return {};
}

// Whether "done" is set. The store lives in rank 0's process: when it goes away meanwhile, that
// is most often because rank 0 saw the group fail (its heartbeat lost a rank) and ended, before
// this rank's heartbeat said so. The group's failure is the cause to report, so this waits for it
// (up to the group's timeout, at most 30 s) before blaming the store.
bool done(Store& st, ProcessGroup& parent, const char* op, const std::string& who) {
  try {
    return st.check({"done"});
  } catch (const DistError& lost) {
    const auto until = std::chrono::steady_clock::now() +
                       std::min<Milliseconds>(parent.timeout(), std::chrono::seconds(30));
    std::string failed = parent.failure_message();
    while (failed.empty() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      failed = parent.failure_message();
    }
    ACCEL_CHECK(failed.empty(), DistError, op, who,
                ": the group failed while its ranks met: ", failed,
                " (and the store went away: ", lost.what(), ")");
    ACCEL_THROW(DistError, op, who, ": the store was lost while the ranks met: ", lost.what());
  }
}

// Note [subgroup rendezvous]
// Every rank of `parent` posts its call under "subgroups/<N>/" in the parent's store and waits
// until all have: the first call text to arrive becomes the reference ("call", compare_set), a
// rank whose call differs adds itself to "bad/<k>", `before_arrival` runs (split registers its
// color there), then the rank marks itself arrived ("arr/<rank>", the "arrived" counter); the
// last to arrive sets "done". Everything a rank reads afterwards was written before some
// arrival, hence before "done". Returns that store (split reads its color's members from it).
// Throws DistError on every rank when the calls differ (naming them), on the waiting ranks when
// some never arrive within the parent's timeout (naming them), and as soon as the parent
// group fails meanwhile (its heartbeat lost a rank).
std::shared_ptr<Store> subgroup_rendezvous(ProcessGroup& parent, uint64_t number,
                                           const std::string& call, const char* op,
                                           const std::function<void(Store&)>& before_arrival) {
  std::shared_ptr<Store> base = parent.group_store();
  ACCEL_CHECK(base != nullptr, DistError, op, "the ", parent.backend(), " group",
              parent.group_context(), " has no store: it cannot make subgroups");
  auto st = std::make_shared<PrefixStore>("subgroups/" + std::to_string(number), base);
  const Milliseconds timeout = parent.timeout();
  st->set_timeout(timeout);
  const int rank = parent.rank(), size = parent.size();
  const std::string who = "rank " + std::to_string(rank) + " of " + std::to_string(size) +
                          parent.group_context() + ", call #" + std::to_string(number);
  if (st->compare_set("call", "", call) != call) {
    const int64_t k = st->add("nbad", 1);
    st->set("bad/" + std::to_string(k), "rank " + std::to_string(rank) + " called " + call);
  }
  if (before_arrival) before_arrival(*st);
  st->set("arr/" + std::to_string(rank), "1");
  if (st->add("arrived", 1) == size) st->set("done", "1");
  // Polled rather than one long wait, so that a rank lost meanwhile (the parent's heartbeat
  // marks it failed) ends the wait at once instead of at the timeout.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(1);
  while (!done(*st, parent, op, who)) {
    const std::string failed = parent.failure_message();
    ACCEL_CHECK(failed.empty(), DistError, op, who,
                ": the group failed while its ranks met: ", failed);
    if (std::chrono::steady_clock::now() >= deadline) {
      std::vector<int> absent;
      for (int r = 0; r < size; ++r)
        if (!st->check({"arr/" + std::to_string(r)})) absent.push_back(r);
      ACCEL_THROW(DistError, op, who, ": ",
                  absent.empty() ? std::string("the other ranks did not all arrive")
                                 : "rank(s) " + format_ranks(absent) + " did not call " + op,
                  " within ", timeout.count(), " ms (every rank of the group must make the same ",
                  "new_group / split calls in the same order)");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
  const int64_t nbad = st->add("nbad", 0);
  if (nbad > 0) {
    std::string differ;
    for (int64_t k = 1; k <= nbad; ++k) differ += "; " + st->get("bad/" + std::to_string(k));
    ACCEL_THROW(DistError, op, who, ": the ranks' calls differ: the first rank to arrive called ",
                st->get("call"), differ,
                " (every rank must make the same new_group / split calls, with the same rank "
                "list, in the same order)");
  }
  return st;
}

// The label of a subgroup of `parent`: "world/sub3[0,2]".
std::string subgroup_label(const ProcessGroup& parent, const std::string& user_name,
                           uint64_t number, const std::vector<int>& world_ranks) {
  return parent.group_name() + "/" +
         (user_name.empty() ? "sub" + std::to_string(number) : user_name) + "[" +
         format_ranks(world_ranks) + "]";
}

}  // namespace

// ---------------- ProcessGroup: identity ----------------

void ProcessGroup::set_identity(const ProcessGroupOptions& options,
                                const std::string& default_name) {
  subgroup_ = !options.world_ranks.empty();
  group_name_ = !options.label.empty() ? options.label : default_name;
  if (subgroup_) {
    ACCEL_CHECK(int(options.world_ranks.size()) == size_, DistError, "init", "a subgroup of ",
                size_, " ranks was given ", options.world_ranks.size(), " world ranks");
    world_ranks_ = options.world_ranks;
  }
}

std::string ProcessGroup::group_context() const {
  if (!subgroup_) return {};
  std::string ranks = size_ == 1
                          ? "its rank 0 is world rank "
                          : "its ranks 0.." + std::to_string(size_ - 1) + " are world ranks ";
  return " of group " + group_name_ + " (" + ranks + format_ranks(world_ranks_) + ")";
}

ProcessGroupPtr ProcessGroup::form_subgroup(const std::vector<int>&, const std::string&,
                                            ProcessGroupOptions) {
  ACCEL_THROW(DistError, "new_group", "the ", backend(), " backend cannot make subgroups");
}

ProcessGroupOptions inherit_options(const ProcessGroupOptions& parent, Milliseconds parent_timeout,
                                    const ProcessGroupOptions& user) {
  const ProcessGroupOptions d;
  ProcessGroupOptions o = user;
  if (user.timeout == d.timeout) o.timeout = parent_timeout;
  o.init_deadline = {};
  if (user.fingerprint_every == d.fingerprint_every) o.fingerprint_every = parent.fingerprint_every;
  if (user.hostname == d.hostname) o.hostname = parent.hostname;
  if (user.heartbeat_timeout == d.heartbeat_timeout) o.heartbeat_timeout = parent.heartbeat_timeout;
  if (user.heartbeat_interval == d.heartbeat_interval)
    o.heartbeat_interval = parent.heartbeat_interval;
  if (user.gloo_segment_bytes == d.gloo_segment_bytes)
    o.gloo_segment_bytes = parent.gloo_segment_bytes;
  if (user.shm_slot_bytes == d.shm_slot_bytes) o.shm_slot_bytes = parent.shm_slot_bytes;
  // Shared memory when neither the user nor the parent's configuration turned it off; the
  // segment's own setup then checks that every member is on this host (ShmAllReduce::create).
  o.shm = user.shm && user.shm_subgroups && parent.shm_subgroups;
  o.shm_subgroups = o.shm;
  return o;
}

// ---------------- split ----------------

ProcessGroupPtr ProcessGroup::split(int color, int key) {
  const uint64_t number = take_subgroup_number();
  std::vector<int> members;  // ranks of this group, in the new group's order
  if (size_ == 1) {
    if (color >= 0) members.push_back(0);
  } else {
    const std::string cprefix = "color" + std::to_string(color) + "/";
    auto st = subgroup_rendezvous(*this, number, "split(color, key)", "split", [&](Store& s) {
      if (color < 0) return;
      const int64_t k = s.add(cprefix + "n", 1);
      s.set(cprefix + std::to_string(k), std::to_string(rank_) + " " + std::to_string(key));
    });
    if (color < 0) return nullptr;
    const int64_t n = st->add(cprefix + "n", 0);
    std::vector<std::pair<int, int>> by_key;  // (key, rank)
    for (int64_t k = 1; k <= n; ++k) {
      std::istringstream is(st->get(cprefix + std::to_string(k)));
      int r = -1, kk = 0;
      is >> r >> kk;
      ACCEL_CHECK(r >= 0 && r < size_, DistError, "split", "malformed entry for color ", color,
                  " in the store");
      by_key.emplace_back(kk, r);
    }
    std::sort(by_key.begin(), by_key.end());
    for (auto& [k, r] : by_key) members.push_back(r);
  }
  if (members.empty()) return nullptr;
  ProcessGroupOptions o;
  for (int m : members) o.world_ranks.push_back(world_ranks_[size_t(m)]);
  o.label = subgroup_label(*this, "", number, o.world_ranks);
  return form_subgroup(members, "sub" + std::to_string(number) + "." + std::to_string(members[0]),
                       std::move(o));
}

// ---------------- new_group ----------------

ProcessGroupPtr new_group(const std::vector<int>& ranks, ProcessGroupOptions options) {
  ProcessGroupPtr world = default_group();
  const int n = world->size();
  std::vector<int> list = ranks;
  if (list.empty()) {
    list.resize(size_t(n));
    std::iota(list.begin(), list.end(), 0);
  }
  const std::string problem = check_rank_list(list, n);
  const uint64_t number = world->take_subgroup_number();
  // The list is compared before it is judged (empty as every rank): ranks that disagree learn
  // that first.
  if (n > 1)
    subgroup_rendezvous(*world, number, "new_group([" + join_ranks(list) + "])", "new_group", {});
  ACCEL_CHECK(problem.empty(), ValueError, "new_group", problem, " (new_group takes world ranks)");
  if (std::find(list.begin(), list.end(), world->rank()) == list.end()) return nullptr;
  options.world_ranks.clear();
  for (int r : list) options.world_ranks.push_back(world->world_ranks()[size_t(r)]);
  options.label = subgroup_label(*world, options.name, number, options.world_ranks);
  return world->form_subgroup(list, "sub" + std::to_string(number) + "." + std::to_string(list[0]),
                              std::move(options));
}

}  // namespace accel::dist
