// The elastic agent: one per machine under `accel-run launch --num_machines MIN:MAX`; joins the
// numbered rendezvous rounds (launcher/rendezvous.h) and runs this machine's workers for each
// (launcher/supervisor.h). See Note [elastic rendezvous] in launcher/rendezvous.cc.
#pragma once

#include "launcher/plan.h"
#include "launcher/rendezvous.h"
#include "launcher/supervisor.h"

namespace accel::launcher {

struct ElasticOptions {
  MachineCount machines;
  double last_call_s = 3.0;         // --rdzv_last_call
  double keep_alive_s = 10.0;       // --rdzv_keep_alive
  double request_timeout_s = 60.0;  // a rendezvous server silent this long stops the agent
};

// Runs rounds until the workers of a round all succeed (0), the job aborts (--max_restarts used
// up: the failing worker's exit code, or 1), the agent is refused (1) or accel-run is signalled
// (128 + signal). `plan` is resolved for MIN machines; its machine rank, world and master address
// are replaced by each round's.
int run_elastic(LaunchPlan& plan, const EnvMap& base_env, SuperviseOptions opts,
                const ElasticOptions& eo);

}  // namespace accel::launcher
