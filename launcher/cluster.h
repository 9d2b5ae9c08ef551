// What an outer launcher (SLURM's srun, OpenMPI's mpirun) tells accel-run through the
// environment. See docs/launcher.md "SLURM and OpenMPI" for the two modes.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/util.h"

namespace accel::launcher {

// Expands a SLURM host list: "node[01-03,07],gpu5" -> node01 node02 node03 node07 gpu5.
// Several bracket groups in one name expand as a product ("r[1-2]n[1-2]" -> r1n1 r1n2 r2n1 r2n2);
// zero padding of the lower bound is kept. Throws ConfigError on malformed input.
std::vector<std::string> expand_slurm_nodelist(std::string_view list);

// "2(x3),1" -> 2 2 2 1 (SLURM_TASKS_PER_NODE). Throws ConfigError on malformed input.
std::vector<int> expand_slurm_tasks_per_node(std::string_view spec);

struct ClusterEnv {
  enum class Kind { kNone, kSlurm, kOpenMpi };
  Kind kind = Kind::kNone;
  // kPerMachine: one accel-run per machine; it spawns that machine's workers.
  // kPerTask: the outer launcher already started one accel-run per worker; each spawns exactly one
  // worker whose rank the outer launcher chose.
  enum class Mode { kPerMachine, kPerTask };
  Mode mode = Mode::kPerMachine;
  int num_machines = 1;
  int machine_rank = 0;
  // kPerTask only.
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::optional<std::string> main_process_ip;  // first host of the node list (SLURM)
  std::optional<int> main_process_port;        // MASTER_PORT when exported, else derived (SLURM)
  std::vector<std::string> nodes;
  std::string description;  // one line for the launch log, naming the variables used
};

const char* cluster_kind_name(ClusterEnv::Kind k);

// Reads SLURM_* (an srun step: SLURM_PROCID and SLURM_NTASKS set) or OMPI_COMM_WORLD_*.
// Returns kind kNone when neither is present. Throws ConfigError on inconsistent values.
ClusterEnv detect_cluster(const EnvMap& env);

}  // namespace accel::launcher
