// Worker for the subgroup tests (test_subgroups.cc): `subgroup_worker <scenario>`, one process per
// rank under the env contract, a world of 4. Exit 0 = passed on this rank ("ok <scenario>"
// printed), 1 = a check failed, 2 = unexpected exception. Knobs: DIST_TIMEOUT_MS (the world's
// timeout), DIST_VICTIM / DIST_HOW (fault), DIST_HOSTS (2: ranks 0,1 and 2,3 on two "hosts").
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/gloo/process_group_gloo.h"
#include "comm/heartbeat.h"
#include "comm/process_group.h"
#include "core/tensor.h"
#include "tests/common/worker_check.h"
#include "tests/common/util.h"

using namespace accel;
using namespace accel::dist;
using Clock = std::chrono::steady_clock;
using accel::test::contains;
using accel::test::g_failures;
using accel::test::g_rank;

namespace {

int env_int(const char* name, int def) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : def;
}

// World rank w's value at index i: distinct per rank and index, exact in float64.
double val(int w, int64_t i) { return double((w * 7 + i * 3) % 11) - 5 + 0.25 * w; }

Tensor make(int w, int64_t n, int64_t offset = 0) {
  Tensor t = empty({n}, TensorOptions(kFloat64));
  auto* p = static_cast<double*>(t.data_ptr());
  for (int64_t i = 0; i < n; ++i) p[i] = val(w, offset + i);
  return t;
}
double at(const Tensor& t, int64_t i) { return static_cast<const double*>(t.data_ptr())[i]; }

double fold(const std::vector<int>& members, int64_t i, ReduceOp op) {
  double acc = val(members[0], i);
  for (size_t k = 1; k < members.size(); ++k) {
    double v = val(members[k], i);
    acc = op == ReduceOp::Max ? std::max(acc, v) : op == ReduceOp::Min ? std::min(acc, v) : acc + v;
  }
  return op == ReduceOp::Avg ? acc / double(members.size()) : acc;
}

std::string str(const std::vector<int>& v) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
  os << ']';
  return os.str();
}

// Checks that `t` holds want(i) for every i; reports the first difference.
void expect_values(const char* what, const std::string& group, const Tensor& t,
                   const std::function<double(int64_t)>& want) {
  for (int64_t i = 0; i < t.numel(); ++i)
    if (std::abs(at(t, i) - want(i)) > 1e-12) {
      WCHECK(false,
             what << " on " << group << " i=" << i << " got " << at(t, i) << " want " << want(i));
      return;
    }
}

// Every collective on `g` (members: its world ranks), checked; `reverse` runs them in the
// opposite order with other sizes, so the two subgroups' sequences differ.
void run_collectives(ProcessGroup& g, bool reverse) {
  const std::vector<int> m = g.world_ranks();
  const int me = m[size_t(g.rank())], gs = g.size();
  const std::string name = g.group_name();
  const int64_t n = reverse ? 7 : 5;
  std::vector<std::function<void()>> steps;
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min})
    steps.push_back([&, op] {
      Tensor t = make(me, n);
      g.all_reduce(t, op);
      expect_values("all_reduce", name, t, [&](int64_t i) { return fold(m, i, op); });
    });
  steps.push_back([&] {  // large: shared memory or Gloo's ring, not the control plane
    Tensor t = make(me, 100003);
    g.all_reduce(t);
    expect_values("large all_reduce", name, t,
                  [&](int64_t i) { return fold(m, i, ReduceOp::Sum); });
  });
  steps.push_back([&] {  // root: a rank of the group (the last one), not a world rank
    Tensor t = make(me, n);
    g.broadcast(t, gs - 1);
    expect_values("broadcast", name, t, [&](int64_t i) { return val(m[size_t(gs - 1)], i); });
  });
  steps.push_back([&] {
    Tensor out = empty({n * gs}, TensorOptions(kFloat64));
    g.all_gather(out, make(me, n));
    expect_values("all_gather", name, out, [&](int64_t i) { return val(m[size_t(i / n)], i % n); });
  });
  steps.push_back([&] {
    Tensor out = empty({n}, TensorOptions(kFloat64));
    g.reduce_scatter(out, make(me, n * gs));
    expect_values("reduce_scatter", name, out,
                  [&](int64_t j) { return fold(m, int64_t(g.rank()) * n + j, ReduceOp::Sum); });
  });
  steps.push_back([&] { g.barrier(); });
  steps.push_back([&] {  // group rank 0 -> the last group rank, tag 5
    if (gs < 2) return;
    if (g.rank() == 0) g.send(make(me, n), gs - 1, 5);
    if (g.rank() == gs - 1) {
      Tensor t = empty({n}, TensorOptions(kFloat64));
      g.recv(t, 0, 5);
      expect_values("send/recv", name, t, [&](int64_t i) { return val(m[0], i); });
    }
  });
  if (reverse) std::reverse(steps.begin(), steps.end());
  for (auto& s : steps) s();
}

ProcessGroupGloo* as_gloo(const ProcessGroupPtr& g) {
  return dynamic_cast<ProcessGroupGloo*>(g.get());
}

// The identity of a subgroup this rank is in.
void expect_group(const ProcessGroupPtr& g, const std::string& name, const std::vector<int>& ranks,
                  int world_rank) {
  WCHECK(g != nullptr, "no group for a member of " << name);
  if (!g) return;
  WCHECK(g->group_name() == name, "group name " << g->group_name() << ", want " << name);
  WCHECK(g->world_ranks() == ranks, name << ": world ranks " << str(g->world_ranks()));
  WCHECK(g->size() == int(ranks.size()), name << ": size " << g->size());
  const int want = int(std::find(ranks.begin(), ranks.end(), world_rank) - ranks.begin());
  WCHECK(g->rank() == want, name << ": rank " << g->rank() << ", want " << want);
  WCHECK(g->is_subgroup(), name << ": not a subgroup");
}

// ---------------- scenarios ----------------

// new_group({0,2}) and new_group({1,3}): identity, options inherited from the world, every
// collective on both groups at once (different sequences), then interleaved with the world.
void scenario_new_group(ProcessGroup& world) {
  const int r = world.rank();
  ProcessGroupPtr a = new_group({0, 2});
  ProcessGroupPtr b = new_group({1, 3});
  ProcessGroupPtr mine = r % 2 == 0 ? a : b;
  WCHECK((r % 2 == 0 ? b : a) == nullptr, "a non-member got a group");
  expect_group(mine, r % 2 == 0 ? "world/sub0[0,2]" : "world/sub1[1,3]",
               r % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3}, r);
  if (!mine) return;
  WCHECK(mine->timeout() == world.timeout(),
         "timeout " << mine->timeout().count() << " ms, world's " << world.timeout().count());
  auto* wg = dynamic_cast<ProcessGroupGloo*>(&world);
  auto* sg = as_gloo(mine);
  WCHECK(sg && sg->heartbeat() && wg && wg->heartbeat() &&
             sg->heartbeat()->timeout() == wg->heartbeat()->timeout(),
         "the subgroup's heartbeat differs from the world's");
  if (std::getenv("DIST_EXPECT_SHM"))
    WCHECK(sg && int(sg->uses_shm()) == env_int("DIST_EXPECT_SHM", 1),
           "shared memory " << (sg && sg->uses_shm()));
  // The two groups run different collectives at the same time.
  run_collectives(*mine, r % 2 == 1);
  // Interleaved with the world: each step followed by a world all-reduce, and an async subgroup
  // all-reduce in flight across a world one.
  for (int k = 0; k < 3; ++k) {
    Tensor s = make(r, 1001);
    WorkPtr w = mine->all_reduce_async(s, ReduceOp::Max);
    Tensor t = make(r, 33);
    world.all_reduce(t);
    expect_values("world all_reduce", "world", t, [&](int64_t i) {
      return fold({0, 1, 2, 3}, i, ReduceOp::Sum);
    });
    w->wait();
    expect_values("async all_reduce", mine->group_name(), s,
                  [&](int64_t i) { return fold(mine->world_ranks(), i, ReduceOp::Max); });
  }
  // Sequence numbers are the group's own (9 collectives in run_collectives, 3 here; send/recv
  // take none): the world's did not move them.
  WCHECK(mine->next_seq() == 9 + 3, "subgroup seq " << mine->next_seq());
  // A timeout given to new_group is the subgroup's.
  ProcessGroupOptions o;
  o.timeout = std::chrono::milliseconds(12345);
  ProcessGroupPtr c = new_group({3, 1}, o);
  if (r == 1 || r == 3) {
    expect_group(c, "world/sub2[3,1]", {3, 1}, r);
    WCHECK(c && c->timeout().count() == 12345, "new_group's timeout not applied");
    if (c) run_collectives(*c, false);
  } else {
    WCHECK(c == nullptr, "a non-member got a group");
  }
}

// split: by rank % 2, by rank / 2 with reversed keys, a color < 0, a split of a subgroup.
void scenario_split(ProcessGroup& world) {
  const int r = world.rank();
  ProcessGroupPtr s1 = world.split(r % 2, r);
  const std::vector<int> m1 = r % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3};
  expect_group(s1, "world/sub0" + str(m1), m1, r);
  ProcessGroupPtr s2 = world.split(r / 2, -r);  // keys reverse the order: {1,0} and {3,2}
  const std::vector<int> m2 = r / 2 == 0 ? std::vector<int>{1, 0} : std::vector<int>{3, 2};
  expect_group(s2, "world/sub1" + str(m2), m2, r);
  if (s1) run_collectives(*s1, r % 2 == 1);
  if (s2) run_collectives(*s2, r / 2 == 1);
  ProcessGroupPtr s3 = world.split(r == 3 ? -1 : 7, 0);  // equal keys: world order
  if (r == 3) {
    WCHECK(s3 == nullptr, "color -1 got a group");
  } else {
    expect_group(s3, "world/sub2[0,1,2]", {0, 1, 2}, r);
    if (!s3) return;
    run_collectives(*s3, false);
    // A split of a subgroup: ranks of s3 0,2 (world 0,2) and 1 (world 1).
    ProcessGroupPtr s4 = s3->split(s3->rank() % 2, 0);
    const std::vector<int> m4 = r == 1 ? std::vector<int>{1} : std::vector<int>{0, 2};
    expect_group(s4, "world/sub2[0,1,2]/sub0" + str(m4), m4, r);
    if (s4) run_collectives(*s4, false);
  }
  world.barrier();
}

// A member of {0,2} never enters a collective: the other raises within the short timeout set on
// the group, naming the group and its world ranks; {1,3} and the world are unaffected. The groups
// form (and {1,3} runs) under the world's timeout: only the collective that must fail gets the
// short one, so a loaded machine cannot fail the healthy steps.
void scenario_skip(ProcessGroup& world) {
  const int r = world.rank();
  ProcessGroupPtr a = new_group({0, 2});
  ProcessGroupPtr b = new_group({1, 3});
  if (a) a->set_timeout(std::chrono::milliseconds(2000));
  Tensor t = make(r, 8);
  if (r == 0) {
    std::string msg;
    try {
      a->all_reduce(t);
    } catch (const DistError& e) {
      msg = e.what();
    }
    std::cout << "rank 0 skip: " << msg << std::endl;
    WCHECK(contains(msg, "[all_reduce]") && contains(msg, "world/sub0[0,2]") &&
               contains(msg, "are world ranks 0,2") && contains(msg, "timeout 2000 ms"),
           "the error does not name the op, group and world ranks: " << msg);
  } else if (r == 2) {
    std::this_thread::sleep_for(std::chrono::milliseconds(3000));  // skips it
  } else {
    ProcessGroupPtr g = b;
    for (int k = 0; k < 5; ++k) {
      Tensor u = make(r, 8);
      g->all_reduce(u);
      expect_values("all_reduce", g->group_name(), u, [&](int64_t i) {
        return fold({1, 3}, i, ReduceOp::Sum);
      });
    }
  }
  world.barrier();
  Tensor w = make(r, 4);
  world.all_reduce(w);
  expect_values("world after", "world", w, [&](int64_t i) {
    return fold({0, 1, 2, 3}, i, ReduceOp::Sum);
  });
}

// The victim (a member of {1,3}) stops or exits while {1,3} is in a collective: the other member
// raises through the heartbeat, naming the group and the victim's world rank, while {0,2} goes on
// working.
void scenario_fault(ProcessGroup& world) {
  const int r = world.rank();
  const int victim = env_int("DIST_VICTIM", 3);
  const std::string how = std::getenv("DIST_HOW") ? std::getenv("DIST_HOW") : "stop";
  ProcessGroupPtr a = new_group({0, 2});
  ProcessGroupPtr b = new_group({1, 3});
  ProcessGroupPtr mine = r % 2 == 0 ? a : b;
  for (int k = 0; k < 3; ++k) {
    Tensor t = make(r, 100);
    mine->all_reduce(t);
  }
  if (r == victim) {
    std::cout << "rank " << r << " faulting by " << how << std::endl;
    if (how == "stop") raise(SIGSTOP);
    std::_Exit(4);
  }
  if (r % 2 == victim % 2) {
    auto t0 = Clock::now();
    std::string msg;
    try {
      Tensor t = make(r, 100);
      mine->all_reduce(t);
    } catch (const DistError& e) {
      msg = e.what();
    }
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
    std::cout << "rank " << r << " detected after " << ms << " ms: " << msg << std::endl;
    const std::string name = "world/sub1[1,3]";
    WCHECK(contains(msg, "[all_reduce]") && contains(msg, name) &&
               contains(msg, "are world ranks 1,3"),
           "the error does not name the op, the group and its world ranks: " << msg);
    // Only the heartbeat can see a stopped process before the 60 s timeout; it names the
    // victim's world rank.
    if (how == "stop")
      WCHECK(contains(msg, "sent no heartbeat") &&
                 contains(msg, "is world rank " + std::to_string(victim)),
             "not the heartbeat's detection, naming the world rank: " << msg);
    // An exited victim is seen first by whichever path looks first (the shared-memory
    // all-reduce's process check, or the heartbeat's closed port): both name its world rank, and
    // the group rank beside it labelled as such.
    const std::string world_rank = "world rank " + std::to_string(victim);
    WCHECK(contains(msg, world_rank + " (rank 1 of group " + name + ")") ||
               contains(msg, "whose rank 1 is " + world_rank),
           "the victim is not named by its world rank: " << msg);
    return;
  }
  // The other group: wait until the world has noticed the fault (its heartbeat), then work.
  auto* wg = dynamic_cast<ProcessGroupGloo*>(&world);
  const auto until = Clock::now() + std::chrono::seconds(60);
  while (wg && wg->failure_message().empty() && Clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  WCHECK(wg && !wg->failure_message().empty(), "the world group never noticed the fault");
  for (int k = 0; k < 5; ++k) {
    Tensor t = make(r, 1000);
    mine->all_reduce(t);
    expect_values("all_reduce after the fault", mine->group_name(), t, [&](int64_t i) {
      return fold({0, 2}, i, ReduceOp::Sum);
    });
  }
}

// The victim stops before new_group: the others raise through the world's heartbeat, long
// before the 60 s timeout, naming the world's failure.
void scenario_create_fault(ProcessGroup& world) {
  const int r = world.rank();
  const int victim = env_int("DIST_VICTIM", 3);
  world.barrier();
  if (r == victim) {
    std::cout << "rank " << r << " stopping before new_group" << std::endl;
    raise(SIGSTOP);
    std::_Exit(4);
  }
  std::string msg;
  try {
    new_group({0, 1});
  } catch (const DistError& e) {
    msg = e.what();
  }
  std::cout << "rank " << r << " create fault: " << msg << std::endl;
  WCHECK(contains(msg, "[new_group]") && contains(msg, "the group failed while its ranks met") &&
             contains(msg, "sent no heartbeat"),
         "new_group did not raise the world's heartbeat failure: " << msg);
}

// Bad rank lists and mismatched calls: a clear error on every rank, never a hang; the world and
// later new_group calls still work.
void scenario_bad_lists(ProcessGroup& world) {
  const int r = world.rank();
  auto expect = [&](const char* what, const std::function<void()>& fn, bool value_error,
                    const std::vector<std::string>& needles) {
    std::string msg;
    bool right_type = false;
    try {
      fn();
    } catch (const ValueError& e) {
      msg = e.what();
      right_type = value_error;
    } catch (const DistError& e) {
      msg = e.what();
      right_type = !value_error;
    }
    std::cout << "rank " << r << " " << what << ": " << msg << std::endl;
    WCHECK(!msg.empty(), what << ": no error");
    WCHECK(right_type, what << ": wrong error type: " << msg);
    for (auto& n : needles) WCHECK(contains(msg, n), what << ": '" << n << "' missing in: " << msg);
  };
  // Whichever rank arrives first sets the reference; both lists are named either way.
  expect("differ",
         [&] {
           new_group(r == 3 ? std::vector<int>{0, 3} : std::vector<int>{0, 2});
         },
         false, {"[new_group]", "calls differ", "new_group([0,2])", "new_group([0,3])"});
  expect("range",
         [&] {
           new_group({0, 4});
         },
         true, {"[new_group]", "rank 4", "[0,4]", "outside the world of 4 ranks"});
  expect("negative", [&] { new_group({-1, 2}); }, true, {"[new_group]", "rank -1"});
  expect("duplicate",
         [&] {
           new_group({1, 2, 1});
         },
         true, {"[new_group]", "rank 1 appears twice in [1,2,1]"});
  expect("split vs new_group",
         [&] {
           if (r == 0)
             world.split(0, 0);
           else
             new_group({0, 1});
         },
         false, {"split(color, key)", "new_group([0,1])"});
  // Still usable: the numbering stayed in step on every rank.
  ProcessGroupPtr g = new_group({0, 1, 2, 3});
  expect_group(g, "world/sub5[0,1,2,3]", {0, 1, 2, 3}, r);
  if (g) run_collectives(*g, false);
  // A rank that never calls new_group: the others raise after the world's timeout, naming it.
  const auto saved = world.timeout();
  if (r != 3) {
    world.set_timeout(std::chrono::milliseconds(2000));
    expect("absent",
           [&] {
             new_group({0, 1});
           },
           false, {"[new_group]", "rank(s) 3 did not call new_group within 2000 ms"});
    world.set_timeout(saved);
  }
  world.barrier();
}

int count_dir(const char* path) {
  DIR* d = opendir(path);
  if (!d) return -1;
  int n = 0;
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

// Create and destroy subgroups many times: no thread or file descriptor is left behind.
void scenario_cycles(ProcessGroup& world) {
  const int r = world.rank();
  auto cycle = [&] {
    ProcessGroupPtr a = new_group({0, 2});
    ProcessGroupPtr b = new_group({1, 3});
    ProcessGroupPtr s = world.split(r / 2, 0);
    for (const ProcessGroupPtr& g : {a, b, s}) {
      if (!g) continue;
      Tensor t = make(r, 64);
      g->all_reduce(t);
      expect_values("all_reduce", g->group_name(), t,
                    [&](int64_t i) { return fold(g->world_ranks(), i, ReduceOp::Sum); });
    }
  };
  cycle();  // warm-up: whatever is made once per process
  world.barrier();
  const int fds0 = count_dir("/proc/self/fd"), threads0 = count_dir("/proc/self/task");
  const int cycles = env_int("DIST_CYCLES", 10);
  for (int c = 0; c < cycles; ++c) cycle();
  world.barrier();
  // Peers' farewells and closes may still be in flight: give them a moment.
  int fds = 0, threads = 0;
  for (int k = 0; k < 100; ++k) {
    fds = count_dir("/proc/self/fd");
    threads = count_dir("/proc/self/task");
    if (fds <= fds0 && threads <= threads0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::cout << "rank " << r << " fds " << fds0 << " -> " << fds << ", threads " << threads0
            << " -> " << threads << " after " << cycles << " cycles" << std::endl;
  WCHECK(fds <= fds0, "file descriptors leaked: " << fds0 << " -> " << fds);
  WCHECK(threads <= threads0, "threads leaked: " << threads0 << " -> " << threads);
}

// Two "hosts" (DIST_HOSTS=2: ranks 0,1 and 2,3): the world cannot use shared memory, a subgroup
// inside one host does (unless ACCEL_DIST_SHM=0), one across hosts does not.
void scenario_hosts(ProcessGroup& world) {
  const int r = world.rank();
  const bool shm_on = env_int("ACCEL_DIST_SHM", 1) == 1;
  auto* wg = dynamic_cast<ProcessGroupGloo*>(&world);
  WCHECK(wg && !wg->uses_shm(), "the world uses shared memory across hosts");
  ProcessGroupPtr h0 = new_group({0, 1});
  ProcessGroupPtr h1 = new_group({2, 3});
  ProcessGroupPtr across = new_group({1, 2});
  ProcessGroupPtr same = r < 2 ? h0 : h1;
  WCHECK(as_gloo(same) && as_gloo(same)->uses_shm() == shm_on,
         "same-host subgroup shared memory " << (as_gloo(same) && as_gloo(same)->uses_shm()));
  if (across)
    WCHECK(as_gloo(across) && !as_gloo(across)->uses_shm(), "cross-host subgroup uses shm");
  run_collectives(*same, r >= 2);
  if (across) run_collectives(*across, false);
  world.barrier();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: subgroup_worker <scenario>\n";
    return 2;
  }
  const std::string scenario = argv[1];
  try {
    if (env_int("DIST_HOSTS", 1) == 2) {
      const int rank = env_int("RANK", 0);
      setenv("LOCAL_RANK", std::to_string(rank % 2).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", "2", 1);
      setenv("ACCEL_SHM_HOST_KEY", rank < 2 ? "host-a" : "host-b", 1);
    }
    InitOptions io;
    io.timeout = std::chrono::milliseconds(env_int("DIST_TIMEOUT_MS", 30000));
    auto world = init_process_group(io);
    g_rank = world->rank();
    if (world->size() != 4) {
      std::cout << "these scenarios need a world of 4" << std::endl;
      return 2;
    }
    const bool fault = scenario == "fault" || scenario == "create_fault";
    if (scenario == "new_group") {
      scenario_new_group(*world);
    } else if (scenario == "split") {
      scenario_split(*world);
    } else if (scenario == "skip") {
      scenario_skip(*world);
    } else if (scenario == "fault") {
      scenario_fault(*world);
    } else if (scenario == "create_fault") {
      scenario_create_fault(*world);
    } else if (scenario == "bad_lists") {
      scenario_bad_lists(*world);
    } else if (scenario == "cycles") {
      scenario_cycles(*world);
    } else if (scenario == "hosts") {
      scenario_hosts(*world);
    } else {
      std::cerr << "unknown scenario " << scenario << "\n";
      return 2;
    }
    if (g_failures == 0) std::cout << "rank " << g_rank << " ok " << scenario << std::endl;
    if (!fault) world->barrier();
    world.reset();
    destroy_process_group();
  } catch (const std::exception& e) {
    std::cout << "rank " << g_rank << " unexpected exception: " << e.what() << std::endl;
    return 2;
  }
  return g_failures == 0 ? 0 : 1;
}
