// The process environment contract: every variable that accel-run sets for its workers or that the
// library reads, named once. launcher/ and dist/ (and the few getenv sites in data/ and kernels/)
// spell the names through these constants, so the launcher and the library cannot disagree on one.
//
// In core/ (std-only, the bottom layer) so that every layer can include it without an upward
// include; accel-run includes it and still links no tensor library (docs/layers.md).
// Cluster inputs that only the launcher reads (SLURM_*, OMPI_COMM_WORLD_*) are not part of it.
#pragma once

#include <string_view>

namespace accel::env {

// ---- set by accel-run for every worker (torchrun-compatible), read by dist::read_dist_env ----
inline constexpr const char* kRank = "RANK";                        // global rank
inline constexpr const char* kWorldSize = "WORLD_SIZE";             // number of processes
inline constexpr const char* kLocalRank = "LOCAL_RANK";             // rank on this machine
inline constexpr const char* kLocalWorldSize = "LOCAL_WORLD_SIZE";  // processes on this machine
inline constexpr const char* kGroupRank = "GROUP_RANK";             // machine rank (torchrun)
inline constexpr const char* kNodeRank = "NODE_RANK";               // machine rank (Lightning)
inline constexpr const char* kGroupWorldSize = "GROUP_WORLD_SIZE";  // number of machines
inline constexpr const char* kMasterAddr = "MASTER_ADDR";           // host of rank 0's store
inline constexpr const char* kMasterPort = "MASTER_PORT";           // port of rank 0's store
// Shared secret a store client must present (the user may export it; accel-run passes it on).
inline constexpr const char* kRendezvousToken = "ACCEL_RENDEZVOUS_TOKEN";

// ---- set by accel-run from its config, read by the Accelerator facade ----
// Those of the AcceleratorConfig (mixed precision ... ZeRO-3 options, strategy) only when the
// config file or a flag sets them: the program's own choice stands otherwise.
inline constexpr const char* kDistributedType = "ACCEL_DISTRIBUTED_TYPE";  // NO/MULTI_CPU/MULTI_GPU
inline constexpr const char* kMixedPrecision = "ACCEL_MIXED_PRECISION";    // no/fp16/bf16
inline constexpr const char* kUseCpu = "ACCEL_USE_CPU";                    // true/false
inline constexpr const char* kZeroStage = "ACCEL_ZERO_STAGE";              // 0..3
inline constexpr const char* kGradientAccumulationSteps = "ACCEL_GRADIENT_ACCUMULATION_STEPS";
// A registered strategy by name (accelerate/strategy_registry.h); set only when chosen.
inline constexpr const char* kStrategy = "ACCEL_STRATEGY";
// ZeRO mixed precision and ZeRO-3 options (AcceleratorConfig::zero / ::fsdp): set only when the
// config file or a flag chooses them, so that unset ones leave the program's own choice.
inline constexpr const char* kParamDtype = "ACCEL_PARAM_DTYPE";    // bf16/fp16/fp32
inline constexpr const char* kReduceDtype = "ACCEL_REDUCE_DTYPE";  // param/fp32
inline constexpr const char* kFsdpWrap = "ACCEL_FSDP_WRAP";  // entries/classes/min_params/none
inline constexpr const char* kFsdpWrapClasses = "ACCEL_FSDP_WRAP_CLASSES";  // Block,Layer
inline constexpr const char* kFsdpMinParams = "ACCEL_FSDP_MIN_PARAMS";      // >= 1
inline constexpr const char* kFsdpReshardAfterForward = "ACCEL_FSDP_RESHARD_AFTER_FORWARD";
inline constexpr const char* kFsdpPrefetch = "ACCEL_FSDP_PREFETCH";  // true/false
inline constexpr const char* kFsdpActivationCheckpointing = "ACCEL_FSDP_ACTIVATION_CHECKPOINTING";
// The device mesh (AcceleratorConfig::parallelism, core/parallelism.h): set only when the config
// file or a flag gives them; the ones unset are inferred (Note [mesh sizes]).
inline constexpr const char* kDpReplicateSize = "ACCEL_DP_REPLICATE_SIZE";  // >= 1
inline constexpr const char* kDpShardSize = "ACCEL_DP_SHARD_SIZE";          // >= 1
inline constexpr const char* kTpSize = "ACCEL_TP_SIZE";                     // >= 1
inline constexpr const char* kCpSize = "ACCEL_CP_SIZE";                     // >= 1
inline constexpr const char* kPpSize = "ACCEL_PP_SIZE";                     // >= 1
inline constexpr const char* kRestartCount = "ACCEL_RESTART_COUNT";  // restarts of the group so far
inline constexpr const char* kMaxRestarts = "ACCEL_MAX_RESTARTS";    // restarts allowed
// Where a failing worker writes its error record (both names, for torchelastic's tools).
inline constexpr const char* kErrorFile = "ACCEL_ERROR_FILE";
inline constexpr const char* kTorchElasticErrorFile = "TORCHELASTIC_ERROR_FILE";
// Random marker of one launch in every worker's environment (the watchdog finds leftovers by it).
inline constexpr const char* kLaunchId = "ACCEL_LAUNCH_ID";
// Set by accel-run when it decides them (kept when the user exported them).
inline constexpr const char* kOmpNumThreads = "OMP_NUM_THREADS";
inline constexpr const char* kOmpWaitPolicy = "OMP_WAIT_POLICY";
inline constexpr const char* kCudaVisibleDevices = "CUDA_VISIBLE_DEVICES";

// ---- read by accel-run only (user knobs) ----
inline constexpr const char* kConfigFile = "ACCEL_CONFIG_FILE";  // default config path
inline constexpr const char* kRunCgroup = "ACCEL_RUN_CGROUP";    // "0": no job cgroup
inline constexpr const char* kSelftest = "ACCEL_SELFTEST";       // accel-selftest binary to run
// accel-estimate-memory binary `accel-run estimate-memory` runs.
inline constexpr const char* kEstimateMemory = "ACCEL_ESTIMATE_MEMORY";
// accel-merge-weights binary `accel-run merge-weights` runs.
inline constexpr const char* kMergeWeights = "ACCEL_MERGE_WEIGHTS";

// ---- read by the library only (user knobs) ----
inline constexpr const char* kDistShm = "ACCEL_DIST_SHM";  // 0/1: shared-memory all-reduce
inline constexpr const char* kHeartbeatTimeout = "ACCEL_HEARTBEAT_TIMEOUT";   // seconds
inline constexpr const char* kGlooSegmentBytes = "ACCEL_GLOO_SEGMENT_BYTES";  // Gloo chunk size
inline constexpr const char* kShmHostKey = "ACCEL_SHM_HOST_KEY";  // override of the host key
inline constexpr const char* kShmNoPidfd = "ACCEL_SHM_NO_PIDFD";  // peer liveness without pidfd
inline constexpr const char* kCheckpointNoExchange = "ACCEL_CHECKPOINT_NO_EXCHANGE";
// "1": check tp-replicated gradients at every step, not only the first (Note [replicated gradient
// check] in parallel/replicated_check.h).
inline constexpr const char* kVerifyPlacements = "ACCEL_VERIFY_PLACEMENTS";
inline constexpr const char* kGlooHostname = "ACCEL_GLOO_HOSTNAME";     // address Gloo binds
inline constexpr const char* kSocketIfname = "ACCEL_SOCKET_IFNAME";     // interface Gloo binds
inline constexpr const char* kGlooSocketIfname = "GLOO_SOCKET_IFNAME";  // same, PyTorch's name
inline constexpr const char* kAllowTf32 = "ACCEL_ALLOW_TF32";           // CUDA matmul in TF32
inline constexpr const char* kCpuIsa = "ACCEL_CPU_ISA";  // force the CPU kernels' ISA level
inline constexpr const char* kCpuBf16Gemm = "ACCEL_CPU_BF16_GEMM";  // native | f32 bf16 GEMM route
// Multiply-adds below which a GEMM runs on one thread (Note [GEMM grain], kernels/cpu/threading.h).
inline constexpr const char* kCpuGemmGrain = "ACCEL_CPU_GEMM_GRAIN";
// "default": keep libgomp's spin-wait default; "bounded": the bounded spin always; unset or
// "adaptive": libgomp's spin while quiet, the bounded one while contended (Note [OpenMP wait
// default]).
inline constexpr const char* kCpuWait = "ACCEL_CPU_WAIT";
// "adaptive": on a busy machine the OpenMP team an op runs is chosen by measuring (Note [team
// under load]); otherwise ("fixed", the default) it is the program's.
inline constexpr const char* kCpuTeam = "ACCEL_CPU_TEAM";

// Who sets a variable in a worker's environment.
enum class SetBy : unsigned char {
  kLauncherAlways,  // accel-run sets it for every worker
  kLauncherMaybe,   // accel-run sets it when its plan asks for it (or passes the user's on)
  kUser,            // only the user (or a cluster manager) sets it
};

struct EnvVar {
  const char* name;
  SetBy set_by;
  bool library_reads;  // libaccel reads it (else only accel-run, or only foreign tools)
};

// The whole contract. tests/launcher checks that accel-run's worker environment is exactly the
// kLauncherAlways names plus some kLauncherMaybe ones.
inline constexpr EnvVar kContract[] = {
    {kRank, SetBy::kLauncherAlways, true},
    {kWorldSize, SetBy::kLauncherAlways, true},
    {kLocalRank, SetBy::kLauncherAlways, true},
    {kLocalWorldSize, SetBy::kLauncherAlways, true},
    {kGroupRank, SetBy::kLauncherAlways, false},
    {kNodeRank, SetBy::kLauncherAlways, false},
    {kGroupWorldSize, SetBy::kLauncherAlways, false},
    {kMasterAddr, SetBy::kLauncherAlways, true},
    {kMasterPort, SetBy::kLauncherAlways, true},
    {kRendezvousToken, SetBy::kLauncherMaybe, true},
    {kDistributedType, SetBy::kLauncherAlways, false},
    {kMixedPrecision, SetBy::kLauncherMaybe, true},
    {kUseCpu, SetBy::kLauncherMaybe, true},
    {kZeroStage, SetBy::kLauncherMaybe, true},
    {kGradientAccumulationSteps, SetBy::kLauncherMaybe, true},
    {kStrategy, SetBy::kLauncherMaybe, true},
    {kParamDtype, SetBy::kLauncherMaybe, true},
    {kReduceDtype, SetBy::kLauncherMaybe, true},
    {kFsdpWrap, SetBy::kLauncherMaybe, true},
    {kFsdpWrapClasses, SetBy::kLauncherMaybe, true},
    {kFsdpMinParams, SetBy::kLauncherMaybe, true},
    {kFsdpReshardAfterForward, SetBy::kLauncherMaybe, true},
    {kFsdpPrefetch, SetBy::kLauncherMaybe, true},
    {kFsdpActivationCheckpointing, SetBy::kLauncherMaybe, true},
    {kDpReplicateSize, SetBy::kLauncherMaybe, true},
    {kDpShardSize, SetBy::kLauncherMaybe, true},
    {kTpSize, SetBy::kLauncherMaybe, true},
    {kCpSize, SetBy::kLauncherMaybe, true},
    {kPpSize, SetBy::kLauncherMaybe, true},
    {kRestartCount, SetBy::kLauncherAlways, false},
    {kMaxRestarts, SetBy::kLauncherAlways, false},
    {kErrorFile, SetBy::kLauncherMaybe, false},
    {kTorchElasticErrorFile, SetBy::kLauncherMaybe, false},
    {kLaunchId, SetBy::kLauncherMaybe, false},
    {kOmpNumThreads, SetBy::kLauncherMaybe, false},
    {kOmpWaitPolicy, SetBy::kLauncherMaybe, false},
    {kCudaVisibleDevices, SetBy::kLauncherMaybe, false},
    {kConfigFile, SetBy::kUser, false},
    {kRunCgroup, SetBy::kUser, false},
    {kSelftest, SetBy::kUser, false},
    {kEstimateMemory, SetBy::kUser, false},
    {kMergeWeights, SetBy::kUser, false},
    {kDistShm, SetBy::kUser, true},
    {kHeartbeatTimeout, SetBy::kUser, true},
    {kGlooSegmentBytes, SetBy::kUser, true},
    {kShmHostKey, SetBy::kUser, true},
    {kShmNoPidfd, SetBy::kUser, true},
    {kCheckpointNoExchange, SetBy::kUser, true},
    {kGlooHostname, SetBy::kUser, true},
    {kSocketIfname, SetBy::kUser, true},
    {kGlooSocketIfname, SetBy::kUser, true},
    {kAllowTf32, SetBy::kUser, true},
    {kCpuIsa, SetBy::kUser, true},
    {kCpuBf16Gemm, SetBy::kUser, true},
    {kCpuGemmGrain, SetBy::kUser, true},
    {kCpuWait, SetBy::kUser, true},
    {kCpuTeam, SetBy::kUser, true},
};

// The contract's entry for `name`; nullptr when the name is not part of it.
constexpr const EnvVar* find(std::string_view name) {
  for (const EnvVar& v : kContract)
    if (name == v.name) return &v;
  return nullptr;
}

constexpr bool names_are_unique() {
  for (const EnvVar& v : kContract)
    if (find(v.name) != &v) return false;
  return true;
}
static_assert(names_are_unique(), "a name appears twice in env::kContract");

}  // namespace accel::env
