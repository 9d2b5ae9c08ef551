#include "launcher/cluster.h"

#include <cstdio>

#include "core/env_contract.h"

namespace accel::launcher {
namespace {

constexpr int kDefaultPort = 29500;
// SLURM jobs that share a node must not share a store port; derive one from the job id.
constexpr int kSlurmPortSpan = 1000;
constexpr size_t kMaxExpandedHosts = 1 << 20;

[[noreturn]] void bad_nodelist(std::string_view list, const std::string& why) {
  ACCEL_THROW(launcher::ConfigError, "slurm", "cannot parse node list '", std::string(list),
              "': ", why);
}

// "01-03,07" -> 01 02 03 07 with padding kept.
std::vector<std::string> expand_bracket(std::string_view list, std::string_view group) {
  std::vector<std::string> out;
  if (group.empty()) bad_nodelist(list, "empty [] group");
  for (const auto& part : split(group, ',')) {
    size_t dash = part.find('-');
    std::string lo_s = part.substr(0, dash);
    std::string hi_s = dash == std::string::npos ? lo_s : part.substr(dash + 1);
    auto lo = parse_int(lo_s), hi = parse_int(hi_s);
    if (lo_s.empty() || hi_s.empty() || !lo || !hi || *lo < 0 || *hi < *lo ||
        lo_s.find_first_not_of("0123456789") != std::string::npos ||
        hi_s.find_first_not_of("0123456789") != std::string::npos) {
      bad_nodelist(list, "bad range '" + part + "' (expected N or N-M with N <= M)");
    }
    if (static_cast<size_t>(*hi - *lo) + out.size() > kMaxExpandedHosts)
      bad_nodelist(list, "range too large");
    const int width = static_cast<int>(lo_s.size());
    for (long long v = *lo; v <= *hi; ++v) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%0*lld", width, v);
      out.emplace_back(buf);
    }
  }
  return out;
}

std::vector<std::string> expand_host(std::string_view list, std::string_view host) {
  std::vector<std::string> acc = {""};
  size_t i = 0;
  while (i < host.size()) {
    if (host[i] == '[') {
      size_t close = host.find(']', i);
      if (close == std::string_view::npos) bad_nodelist(list, "unclosed '['");
      auto parts = expand_bracket(list, host.substr(i + 1, close - i - 1));
      if (acc.size() * parts.size() > kMaxExpandedHosts) bad_nodelist(list, "range too large");
      std::vector<std::string> next;
      next.reserve(acc.size() * parts.size());
      for (const auto& a : acc) {
        for (const auto& p : parts) next.push_back(a + p);
      }
      acc = std::move(next);
      i = close + 1;
    } else if (host[i] == ']') {
      bad_nodelist(list, "']' without '['");
    } else {
      size_t next = host.find_first_of("[]", i);
      std::string_view lit =
          host.substr(i, next == std::string_view::npos ? std::string_view::npos : next - i);
      for (auto& a : acc) a += lit;
      i += lit.size();
    }
  }
  return acc;
}

int env_int(const EnvMap& env, const std::string& key, int lo, int hi) {
  auto v = env_get(env, key);
  auto n = v ? parse_int(*v) : std::nullopt;
  ACCEL_CHECK(n && *n >= lo && *n <= hi, launcher::ConfigError, "cluster", "environment variable ",
              key, "='", v.value_or(""), "' is not an integer in [", lo, ", ", hi, "]");
  return static_cast<int>(*n);
}

std::optional<std::string> first_of(const EnvMap& env, std::initializer_list<const char*> keys,
                                    std::string* which = nullptr) {
  for (const char* k : keys) {
    if (auto v = env_get(env, k); v && !v->empty()) {
      if (which) *which = k;
      return v;
    }
  }
  return std::nullopt;
}

constexpr int kMaxTasks = 1 << 24;

ClusterEnv detect_slurm(const EnvMap& env) {
  ClusterEnv c;
  c.kind = ClusterEnv::Kind::kSlurm;
  std::string ntasks_key =
      env.count("SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS";
  const int ntasks = env_int(env, ntasks_key, 1, kMaxTasks);
  const int procid = env_int(env, "SLURM_PROCID", 0, ntasks - 1);

  std::string list_key;
  auto list =
      first_of(env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}, &list_key);
  if (list) c.nodes = expand_slurm_nodelist(*list);
  std::string nnodes_key;
  int nnodes = 0;
  if (auto n = first_of(env, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"},
                        &nnodes_key)) {
    nnodes = env_int(env, nnodes_key, 1, kMaxTasks);
  } else if (!c.nodes.empty()) {
    nnodes = static_cast<int>(c.nodes.size());
  } else {
    nnodes = 1;
  }
  if (!c.nodes.empty()) c.main_process_ip = c.nodes.front();

  if (auto p = env_get(env, env::kMasterPort)) {
    c.main_process_port = env_int(env, env::kMasterPort, 1, 65535);
  } else if (auto id = env_get(env, "SLURM_JOB_ID"); id && parse_int(*id)) {
    c.main_process_port = kDefaultPort + static_cast<int>(*parse_int(*id) % kSlurmPortSpan);
  } else {
    c.main_process_port = kDefaultPort;
  }

  std::string ip_note = c.main_process_ip ? *c.main_process_ip + " (first host of " + list_key + ")"
                                          : std::string("not set (no SLURM node list)");
  if (ntasks == nnodes) {
    // One task per node: this accel-run is machine SLURM_PROCID and spawns that machine's workers.
    c.mode = ClusterEnv::Mode::kPerMachine;
    c.num_machines = nnodes;
    c.machine_rank = procid;
    c.description = "SLURM step with one task per node: machine_rank " + std::to_string(procid) +
                    " of " + std::to_string(nnodes) + " (SLURM_PROCID, " + ntasks_key +
                    "), main_process_ip " + ip_note;
  } else {
    // One task per worker: the rank is SLURM's.
    c.mode = ClusterEnv::Mode::kPerTask;
    c.rank = procid;
    c.world_size = ntasks;
    c.num_machines = nnodes;
    c.machine_rank = env.count("SLURM_NODEID") ? env_int(env, "SLURM_NODEID", 0, nnodes - 1) : 0;
    c.local_rank = env.count("SLURM_LOCALID") ? env_int(env, "SLURM_LOCALID", 0, ntasks - 1) : 0;
    c.local_world_size = (ntasks + nnodes - 1) / nnodes;
    if (auto tpn = first_of(env, {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"})) {
      auto per_node = expand_slurm_tasks_per_node(*tpn);
      if (static_cast<size_t>(c.machine_rank) < per_node.size())
        c.local_world_size = per_node[c.machine_rank];
    }
    c.description = "SLURM step with one task per worker: rank " + std::to_string(procid) + " of " +
                    std::to_string(ntasks) + " (SLURM_PROCID, " + ntasks_key + "), local_rank " +
                    std::to_string(c.local_rank) + " (SLURM_LOCALID), main_process_ip " + ip_note;
  }
  return c;
}

ClusterEnv detect_openmpi(const EnvMap& env) {
  ClusterEnv c;
  c.kind = ClusterEnv::Kind::kOpenMpi;
  const int size = env_int(env, "OMPI_COMM_WORLD_SIZE", 1, kMaxTasks);
  const int rank = env_int(env, "OMPI_COMM_WORLD_RANK", 0, size - 1);
  const int local_size = env.count("OMPI_COMM_WORLD_LOCAL_SIZE")
                             ? env_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1, size)
                             : 1;
  const int local_rank = env.count("OMPI_COMM_WORLD_LOCAL_RANK")
                             ? env_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0, local_size - 1)
                             : 0;
  if (auto a = env_get(env, env::kMasterAddr); a && !a->empty()) c.main_process_ip = *a;
  c.main_process_port =
      env.count(env::kMasterPort) ? env_int(env, env::kMasterPort, 1, 65535) : kDefaultPort;
  if (local_size == 1) {
    c.mode = ClusterEnv::Mode::kPerMachine;
    c.num_machines = size;
    c.machine_rank = rank;
    c.description = "OpenMPI with one process per machine: machine_rank " + std::to_string(rank) +
                    " of " + std::to_string(size) + " (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE)";
  } else {
    c.mode = ClusterEnv::Mode::kPerTask;
    c.rank = rank;
    c.world_size = size;
    c.local_rank = local_rank;
    c.local_world_size = local_size;
    // Assumes the default by-slot mapping (consecutive ranks fill a machine).
    c.num_machines = (size + local_size - 1) / local_size;
    c.machine_rank = rank / local_size;
    if (!c.main_process_ip && size == local_size) c.main_process_ip = "127.0.0.1";
    c.description = "OpenMPI with one process per worker: rank " + std::to_string(rank) + " of " +
                    std::to_string(size) + ", local_rank " + std::to_string(local_rank) + " of " +
                    std::to_string(local_size) + " (OMPI_COMM_WORLD_*)";
  }
  return c;
}

}  // namespace

std::vector<std::string> expand_slurm_nodelist(std::string_view list) {
  std::vector<std::string> out;
  size_t depth = 0, start = 0;
  auto flush = [&](size_t end) {
    std::string host = trim(list.substr(start, end - start));
    if (host.empty()) bad_nodelist(list, "empty host name");
    for (auto& h : expand_host(list, host)) out.push_back(std::move(h));
  };
  if (trim(list).empty()) bad_nodelist(list, "empty list");
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i] == '[') {
      if (depth++ != 0) bad_nodelist(list, "nested '['");
    } else if (list[i] == ']') {
      if (depth-- == 0) bad_nodelist(list, "']' without '['");
    } else if (list[i] == ',' && depth == 0) {
      flush(i);
      start = i + 1;
    }
  }
  if (depth != 0) bad_nodelist(list, "unclosed '['");
  flush(list.size());
  return out;
}

std::vector<int> expand_slurm_tasks_per_node(std::string_view spec) {
  std::vector<int> out;
  for (const auto& part : split(spec, ',')) {
    std::string p = trim(part);
    size_t paren = p.find('(');
    auto parsed = parse_int(p.substr(0, paren));
    long long count = parsed.value_or(-1);
    long long repeat = 1;
    if (paren != std::string::npos) {
      auto r = p.size() >= paren + 4 && p[paren + 1] == 'x' && p.back() == ')'
                   ? parse_int(p.substr(paren + 2, p.size() - paren - 3))
                   : std::nullopt;
      repeat = r.value_or(-1);
    }
    ACCEL_CHECK(count >= 0 && repeat >= 1 && repeat <= kMaxTasks, launcher::ConfigError, "slurm",
                "cannot parse tasks per node '", std::string(spec),
                "' (expected a list like 2(x3),1)");
    for (long long r = 0; r < repeat; ++r) out.push_back(static_cast<int>(count));
  }
  return out;
}

const char* cluster_kind_name(ClusterEnv::Kind k) {
  switch (k) {
    case ClusterEnv::Kind::kSlurm: return "SLURM";
    case ClusterEnv::Kind::kOpenMpi: return "OpenMPI";
    default: return "none";
  }
}

ClusterEnv detect_cluster(const EnvMap& env) {
  if (env.count("SLURM_PROCID") &&
      (env.count("SLURM_NTASKS") || env.count("SLURM_STEP_NUM_TASKS"))) {
    return detect_slurm(env);
  }
  if (env.count("OMPI_COMM_WORLD_SIZE") && env.count("OMPI_COMM_WORLD_RANK"))
    return detect_openmpi(env);
  return ClusterEnv{};
}

}  // namespace accel::launcher
