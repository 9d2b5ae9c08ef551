// Multi-process bench workloads (zero-memory, zero-checkpoint, tp-memory): the parent starts N
// fresh copies of build/bench/workloads as the ranks of a world (Gloo on loopback, the
// RANK / WORLD_SIZE contract, 1 OpenMP thread per rank when N > 1); each rank writes one line of
// key=value fields to <dir>/rank<r>.txt, which the parent reads back.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace accel::bench {

using Fields = std::map<std::string, std::string>;

// "k=v k=v ..." -> fields.
Fields parse_fields(const std::string& line);
// The number under `key`; ValueError naming `op`, `who` and the key when missing or malformed.
double number(const Fields& f, const std::string& key, const std::string& who, const char* op);
// The count in environment variable `name` (0 to 1,000,000), `fallback` when unset or empty;
// ValueError naming `op` and the variable otherwise (what the ranks read their settings from).
int env_count(const char* name, int fallback, const char* op);

// Starts `world` ranks running `workloads <workload>` with `env` set (and out_env = the folder
// their result files go to), waits for them (the first failing rank, or timeout_s, takes the
// others down, so nothing waits on a dead peer) and returns each rank's fields. DistError naming
// `what` (e.g. "stage 3 world 4") and the failure; the ranks' stderr is the parent's.
std::vector<Fields> run_ranks(const char* workload, int world,
                              const std::map<std::string, std::string>& env, const char* out_env,
                              int timeout_s, const std::string& what);

// In a forked rank before exec: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR
// (loopback), MASTER_PORT and OMP_NUM_THREADS=1 (the ranks share the cores).
void set_rank_env(int rank, int world, int port);

// A field of /proc/self/status in kB (VmRSS, VmHWM).
double proc_status_kb(const char* key);
inline double mib(double bytes) { return bytes / (1024.0 * 1024.0); }
inline double kb_to_mib(double kb) { return kb / 1024.0; }

}  // namespace accel::bench
