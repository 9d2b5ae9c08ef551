// The process environment contract (core/env_contract.h) seen from both sides: accel-run's worker
// environment holds only contract names (all the always-set ones), and the library, given that
// environment, reads back the plan accel-run made.
#include <doctest/doctest.h>

#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <string>

#include "core/env_contract.h"
#include "accelerate/accelerator.h"
#include "comm/env.h"
#include "launcher/plan.h"
#include "tests/common/scoped_env.h"

namespace al = accel::launcher;
namespace env = accel::env;
using accel::test::ScopedEnv;

namespace {

// Two plans that between them set every variable accel-run can set from its plan.
al::LaunchPlan cpu_plan() {
  al::LaunchConfig cfg;
  cfg.num_processes = 4;
  cfg.set("zero_config.zero_stage", "3");
  cfg.set("fsdp_config.fsdp_wrap", "min_params");
  cfg.set("fsdp_config.fsdp_min_params", "5000");
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
  al::set_setting_flag(f, "--mixed_precision", "bf16");
  al::set_setting_flag(f, "--zero_stage", "3");
  al::set_setting_flag(f, "--strategy", "fsdp");
  al::set_setting_flag(f, "--gradient_accumulation_steps", "4");
  al::set_setting_flag(f, "--param_dtype", "bf16");
  al::set_setting_flag(f, "--reduce_dtype", "fp32");
  al::set_setting_flag(f, "--fsdp_wrap_classes", "Block,Layer");
  al::set_setting_flag(f, "--fsdp_reshard_after_forward", "false");
  al::set_setting_flag(f, "--fsdp_prefetch", "false");
  al::set_setting_flag(f, "--fsdp_activation_checkpointing", "true");
  f.rendezvous_token = std::string(32, 'k');
  al::LaunchPlan p = al::resolve_plan(cfg, f, {}, 2);
  al::resolve_rendezvous_token(p, f, {});
  return p;
}

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
  for (const char* name :
       {env::kRendezvousToken, env::kOmpNumThreads, env::kCudaVisibleDevices, env::kMixedPrecision,
        env::kUseCpu, env::kZeroStage, env::kGradientAccumulationSteps, env::kStrategy,
        env::kParamDtype, env::kReduceDtype, env::kFsdpWrap, env::kFsdpWrapClasses,
        env::kFsdpMinParams, env::kFsdpReshardAfterForward, env::kFsdpPrefetch,
        env::kFsdpActivationCheckpointing}) {
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
  CHECK(c.zero_stage == 3);
  CHECK(c.gradient_accumulation_steps == 4);
  CHECK(c.strategy == "fsdp");
  CHECK_FALSE(c.cpu);
  // param dtype and reduce dtype reach ZeRO 1-2 and ZeRO-3 alike; the fsdp options reach fsdp.
  CHECK(c.zero.param_dtype == std::optional<accel::DType>(accel::kBFloat16));
  CHECK(c.fsdp.param_dtype == std::optional<accel::DType>(accel::kBFloat16));
  CHECK(c.zero.reduce_in_fp32);
  CHECK(c.fsdp.reduce_in_fp32);
  CHECK(c.fsdp.wrap == accel::dist::FsdpOptions::Wrap::Classes);
  CHECK(c.fsdp.classes == std::vector<std::string>{"Block", "Layer"});
  CHECK_FALSE(c.fsdp.reshard_after_forward);
  CHECK_FALSE(c.fsdp.prefetch);
  CHECK(c.fsdp.activation_checkpointing);
  const al::LaunchPlan q = cpu_plan();
  ScopedEnv min(al::worker_env(q, 0, 0));
  const accel::AcceleratorConfig m = accel::AcceleratorConfig().with_env();
  CHECK(m.fsdp.wrap == accel::dist::FsdpOptions::Wrap::MinParams);
  CHECK(m.fsdp.min_params == 5000);
}

TEST_CASE("env contract: with_env reads each ZeRO variable alone, and only when it is set") {
  using Wrap = accel::dist::FsdpOptions::Wrap;
  using Config = accel::AcceleratorConfig;
  // A program's own choices, each different from what the variable below sets.
  Config base;
  base.zero_stage = 3;  // where every ZeRO variable applies
  base.fsdp.wrap = Wrap::Classes;
  base.fsdp.classes = {"Mine"};
  base.fsdp.min_params = 7;
  base.fsdp.param_dtype = accel::kFloat16;
  base.zero.param_dtype = accel::kFloat16;
  base.fsdp.activation_checkpointing = true;
  {
    // Unset: the program's config stands.
    const Config c = base.with_env();
    CHECK(c.fsdp.wrap == Wrap::Classes);
    CHECK(c.fsdp.classes == std::vector<std::string>{"Mine"});
    CHECK(c.fsdp.param_dtype == std::optional<accel::DType>(accel::kFloat16));
  }
  struct Case {
    const char* name;
    const char* value;
    std::function<bool(const Config&)> took;
    bool from_fp32_reduce = false;  // start from a config that reduces in fp32
  };
  const std::vector<Case> cases = {
      {env::kParamDtype, "fp32",
       [](const Config& c) { return !c.fsdp.param_dtype && !c.zero.param_dtype; }},
      {env::kParamDtype, "BF16",
       [](const Config& c) {
         return c.fsdp.param_dtype == accel::kBFloat16 && c.zero.param_dtype == accel::kBFloat16;
       }},
      {env::kReduceDtype, "fp32",
       [](const Config& c) { return c.fsdp.reduce_in_fp32 && c.zero.reduce_in_fp32; }},
      {env::kReduceDtype, "param",
       [](const Config& c) { return !c.fsdp.reduce_in_fp32 && !c.zero.reduce_in_fp32; }, true},
      {env::kFsdpWrap, "entries", [](const Config& c) { return c.fsdp.wrap == Wrap::Entries; }},
      {env::kFsdpWrap, "none", [](const Config& c) { return c.fsdp.wrap == Wrap::None; }},
      {env::kFsdpWrap, "min_params",
       [](const Config& c) { return c.fsdp.wrap == Wrap::MinParams; }},
      {env::kFsdpWrapClasses, "A, B_2",
       [](const Config& c) {
         return c.fsdp.classes == std::vector<std::string>{"A", "B_2"};
       }},
      {env::kFsdpMinParams, "123456789012",
       [](const Config& c) { return c.fsdp.min_params == 123456789012LL; }},
      {env::kFsdpReshardAfterForward, "false",
       [](const Config& c) { return !c.fsdp.reshard_after_forward; }},
      {env::kFsdpPrefetch, "0", [](const Config& c) { return !c.fsdp.prefetch; }},
      {env::kFsdpActivationCheckpointing, "false",
       [](const Config& c) { return !c.fsdp.activation_checkpointing; }},
  };
  for (const auto& tc : cases) {
    CAPTURE(tc.name);
    CAPTURE(tc.value);
    ScopedEnv scoped(al::EnvMap{{tc.name, tc.value}});
    Config from = base;
    if (tc.from_fp32_reduce) from.fsdp.reduce_in_fp32 = from.zero.reduce_in_fp32 = true;
    const Config c = from.with_env();
    CHECK(tc.took(c));
    CHECK(!tc.took(from));  // the case tests a change
  }
  // Malformed: a ValueError naming the variable and the value.
  const std::vector<std::pair<const char*, const char*>> bad = {
      {env::kParamDtype, "fp8"},
      {env::kReduceDtype, "bf16"},
      {env::kFsdpWrap, "layers"},
      {env::kFsdpWrapClasses, "A,,B"},
      {env::kFsdpMinParams, "0"},
      {env::kFsdpMinParams, "12x"},
      {env::kFsdpReshardAfterForward, "maybe"},
      {env::kFsdpPrefetch, "2"},
      {env::kFsdpActivationCheckpointing, "on-ish"},
  };
  for (const auto& [name, value] : bad) {
    CAPTURE(name);
    ScopedEnv scoped(al::EnvMap{{name, value}});
    std::string msg;
    try {
      (void)base.with_env();
    } catch (const accel::ValueError& e) {
      msg = e.what();
    }
    CHECK(msg.find(std::string(name) + "='" + value + "'") != std::string::npos);
  }
  // Issue 22, item 14: a variable this run would not use is refused, not ignored.
  const std::vector<std::tuple<const char*, const char*, int>> unused = {
      {env::kFsdpWrap, "none", 2},
      {env::kFsdpActivationCheckpointing, "true", 0},
      {env::kParamDtype, "bf16", 0},
      {env::kReduceDtype, "fp32", 0},
  };
  for (const auto& [name, value, stage] : unused) {
    CAPTURE(name);
    ScopedEnv scoped(al::EnvMap{{name, value}});
    Config c = base;
    c.zero_stage = stage;
    std::string msg;
    try {
      (void)c.with_env();
    } catch (const accel::ValueError& e) {
      msg = e.what();
    }
    CHECK(msg.find(std::string(name) + "=" + value) != std::string::npos);
    CHECK(msg.find("zero_stage " + std::to_string(stage)) != std::string::npos);
  }
  {
    ScopedEnv scoped(al::EnvMap{{env::kParamDtype, "fp32"}});  // no conversion: fine anywhere
    Config c = base;
    c.zero_stage = 0;
    CHECK_NOTHROW((void)c.with_env());
  }
}

// Note [who wins: launcher or program] (launcher/config.h): a setting the user gave accel-run (a
// flag or a key of the config file) is exported and overrides the program's AcceleratorConfig;
// one the user did not give is not exported, and the program's own choice stands, as with
// Accelerate. (accel-run used to export its defaults, mixed precision "no", ZeRO stage 0 and one
// accumulation step, and so overrode every program.)
TEST_CASE("env contract: the program's AcceleratorConfig wins unless the user set accel-run's") {
  accel::AcceleratorConfig mine;
  mine.mixed_precision = accel::MixedPrecision::BF16;
  mine.zero_stage = 2;
  mine.gradient_accumulation_steps = 4;
  al::LaunchConfig file;
  file.num_processes = 2;
  auto env_of_plan = [](const al::LaunchConfig& c, const al::LaunchFlags& f) {
    al::LaunchPlan p = al::resolve_plan(c, f, {}, 0);
    p.master_port = 1234;  // what launch picks
    return al::worker_env(p, 0, 0);
  };
  {
    const al::EnvMap e = env_of_plan(file, {});
    for (const char* name :
         {env::kMixedPrecision, env::kZeroStage, env::kGradientAccumulationSteps, env::kStrategy}) {
      CAPTURE(name);
      CHECK(e.count(name) == 0);
    }
    ScopedEnv scoped(e);
    const accel::AcceleratorConfig c = mine.with_env();
    CHECK(c.mixed_precision == accel::MixedPrecision::BF16);
    CHECK(c.zero_stage == 2);
    CHECK(c.gradient_accumulation_steps == 4);
  }
  {  // flags win
    al::LaunchFlags f;
    al::set_setting_flag(f, "--mixed_precision", "no");
    al::set_setting_flag(f, "--zero_stage", "1");
    al::set_setting_flag(f, "--gradient_accumulation_steps", "2");
    ScopedEnv scoped(env_of_plan(file, f));
    const accel::AcceleratorConfig c = mine.with_env();
    CHECK(c.mixed_precision == accel::MixedPrecision::No);
    CHECK(c.zero_stage == 1);
    CHECK(c.gradient_accumulation_steps == 2);
  }
  {  // the config file wins too, key by key
    const al::LaunchConfig yaml = al::parse_config(
        "num_processes: 2\nmixed_precision: fp16\nzero_config:\n  zero_stage: 0\n", "t.yaml");
    ScopedEnv scoped(env_of_plan(yaml, {}));
    const accel::AcceleratorConfig c = mine.with_env();
    CHECK(c.mixed_precision == accel::MixedPrecision::FP16);
    CHECK(c.zero_stage == 0);
    CHECK(c.gradient_accumulation_steps == 4);  // not in the file: the program's
  }
}
