// The process environment contract (core/env_contract.h) seen from both sides: accel-run's worker
// environment holds only contract names (all the always-set ones), and the library, given that
// environment, reads back the plan accel-run made.
#include <doctest/doctest.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "core/env_contract.h"
#include "dist/accelerator.h"
#include "dist/env.h"
#include "launcher/plan.h"

namespace al = accel::launcher;
namespace env = accel::env;

namespace {

// Two plans that between them set every variable accel-run can set from its plan.
al::LaunchPlan cpu_plan() {
  al::LaunchConfig cfg;
  cfg.num_processes = 4;
  al::LaunchPlan p = al::resolve_plan(cfg, {}, {}, 0);
  p.master_port = 1234;
  return p;
}

al::LaunchPlan gpu_plan() {
  al::LaunchConfig cfg;
  al::LaunchFlags f;
  f.num_processes = 6;
  f.num_machines = 3;
  f.machine_rank = 1;
  f.main_process_ip = "10.0.0.1";
  f.main_process_port = 4321;
  f.gpu_ids = "0,1";
  f.mixed_precision = "bf16";
  f.zero_stage = 2;
  f.gradient_accumulation_steps = 4;
  f.rendezvous_token = std::string(32, 'k');
  al::LaunchPlan p = al::resolve_plan(cfg, f, {}, 2);
  al::resolve_rendezvous_token(p, f, {});
  return p;
}

// Sets the variables for its lifetime, restoring what was there before.
class ScopedEnv {
 public:
  explicit ScopedEnv(const al::EnvMap& vars) {
    for (const auto& [k, v] : vars) {
      const char* old = std::getenv(k.c_str());
      saved_[k] = old ? std::optional<std::string>(old) : std::nullopt;
      setenv(k.c_str(), v.c_str(), 1);
    }
  }
  ~ScopedEnv() {
    for (const auto& [k, v] : saved_) {
      if (v) {
        setenv(k.c_str(), v->c_str(), 1);
      } else {
        unsetenv(k.c_str());
      }
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

}  // namespace

TEST_CASE("env contract: accel-run's worker environment is made of contract names") {
  std::set<std::string> set_somewhere;
  for (const al::LaunchPlan& p : {cpu_plan(), gpu_plan()}) {
    for (int i = 0; i < p.num_local_workers; ++i) {
      const al::EnvMap e = al::worker_env(p, i, 1);
      for (const auto& [k, v] : e) {
        CAPTURE(k);
        const env::EnvVar* c = env::find(k);
        REQUIRE_MESSAGE(c != nullptr, "accel-run sets a variable missing from core/env_contract.h");
        CHECK_MESSAGE(c->set_by != env::SetBy::kUser, "the contract says only the user sets it");
        set_somewhere.insert(k);
      }
      for (const env::EnvVar& c : env::kContract) {
        CAPTURE(c.name);
        if (c.set_by == env::SetBy::kLauncherAlways) CHECK(e.count(c.name) == 1);
      }
    }
  }
  // The plans above reach the optional ones worker_env can set.
  for (const char* name : {env::kRendezvousToken, env::kOmpNumThreads, env::kCudaVisibleDevices}) {
    CAPTURE(name);
    CHECK(set_somewhere.count(name) == 1);
  }
}

TEST_CASE("env contract: the library reads back what accel-run set") {
  const al::LaunchPlan p = gpu_plan();
  REQUIRE(p.num_local_workers == 2);
  const al::EnvMap e = al::worker_env(p, 1, 0);
  ScopedEnv scoped(e);
  const accel::dist::DistEnv d = accel::dist::read_dist_env();
  CHECK(d.distributed);
  CHECK(d.rank == p.first_rank + 1);
  CHECK(d.rank == 3);
  CHECK(d.world_size == 6);
  CHECK(d.local_rank == 1);
  CHECK(d.local_world_size == 2);
  CHECK(d.master_addr == "10.0.0.1");
  CHECK(d.master_port == 4321);
  CHECK(d.token == std::string(32, 'k'));
  const accel::AcceleratorConfig c = accel::AcceleratorConfig().with_env();
  CHECK(c.mixed_precision == accel::MixedPrecision::BF16);
  CHECK(c.zero_stage == 2);
  CHECK(c.gradient_accumulation_steps == 4);
  CHECK_FALSE(c.cpu);
}
