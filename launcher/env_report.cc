#include "launcher/env_report.h"

#include <dlfcn.h>
#include <link.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>

#include "accel_run_version.h"
#include "core/env_contract.h"
#include "launcher/config.h"
#include "launcher/plan.h"
#include "launcher/watchdog.h"

namespace accel::launcher {
namespace {

// dlopen handle closed on scope exit. RTLD_LOCAL keeps the probed symbols out of our namespace.
class Library {
 public:
  explicit Library(const std::vector<std::string>& candidates) {
    for (const auto& c : candidates) {
      handle_ = dlopen(c.c_str(), RTLD_LAZY | RTLD_LOCAL);
      if (handle_ != nullptr) break;
      const char* e = dlerror();
      if (last_error_.empty() && e != nullptr) last_error_ = e;
    }
    if (handle_ != nullptr) {
      link_map* lm = nullptr;
      if (dlinfo(handle_, RTLD_DI_LINKMAP, &lm) == 0 && lm != nullptr && lm->l_name != nullptr)
        path_ = lm->l_name;
    }
  }
  ~Library() {
    if (handle_ != nullptr) dlclose(handle_);
  }
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;

  bool ok() const { return handle_ != nullptr; }
  const std::string& path() const { return path_; }
  template <typename Fn>
  Fn sym(const char* name) const {
    return handle_ ? reinterpret_cast<Fn>(dlsym(handle_, name)) : nullptr;
  }

 private:
  void* handle_ = nullptr;
  std::string path_;
  std::string last_error_;
};

// Sonames first (ld.so.conf, LD_LIBRARY_PATH), then the usual CUDA install directories.
std::vector<std::string> candidates(const std::vector<std::string>& sonames) {
  std::vector<std::string> out = sonames;
  std::vector<std::string> dirs;
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"}) {
    if (const char* v = std::getenv(var); v && *v) dirs.push_back(std::string(v) + "/lib64");
  }
  dirs.push_back("/usr/local/cuda/lib64");
  dirs.push_back("/usr/local/cuda/lib");
  for (const auto& d : dirs) {
    for (const auto& s : sonames) out.push_back(d + "/" + s);
  }
  return out;
}

std::string dotted(int major, int minor, int patch) {
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

LibraryProbe not_found(const std::string& name, const std::string& what) {
  LibraryProbe p;
  p.name = name;
  p.note = "not found (" + what + ")";
  return p;
}

LibraryProbe probe_onednn() {
  Library lib(candidates({"libdnnl.so.3", "libdnnl.so.2", "libdnnl.so"}));
  if (!lib.ok()) return not_found("oneDNN", "libdnnl.so");
  struct DnnlVersion {
    int major, minor, patch;
    const char* hash;
    unsigned cpu_runtime, gpu_runtime;
  };
  LibraryProbe p{"oneDNN", true, "", lib.path(), ""};
  if (auto fn = lib.sym<const DnnlVersion* (*)()>("dnnl_version")) {
    const DnnlVersion* v = fn();
    p.version = dotted(v->major, v->minor, v->patch);
    if (v->hash != nullptr && *v->hash && std::string(v->hash) != "N/A")
      p.note = std::string("git ") + v->hash;
  } else {
    p.note = "dnnl_version not exported";
  }
  return p;
}

std::vector<LibraryProbe> probe_cuda_runtime() {
  std::vector<LibraryProbe> out;
  Library lib(
      candidates({"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"}));
  if (!lib.ok()) {
    out.push_back(not_found("CUDA runtime", "libcudart.so"));
    return out;
  }
  LibraryProbe p{"CUDA runtime", true, "", lib.path(), ""};
  using IntFn = int (*)(int*);
  auto err_str = lib.sym<const char* (*)(int)>("cudaGetErrorString");
  int v = 0;
  if (auto fn = lib.sym<IntFn>("cudaRuntimeGetVersion"); fn && fn(&v) == 0) {
    p.version = std::to_string(v / 1000) + "." +
                std::to_string((v % 1000) / 10);  // 1000 * major + 10 * minor
  }
  int drv = 0;
  if (auto fn = lib.sym<IntFn>("cudaDriverGetVersion"); fn && fn(&drv) == 0) {
    p.note = drv > 0 ? "driver supports CUDA " + std::to_string(drv / 1000) + "." +
                           std::to_string((drv % 1000) / 10)
                     : "no CUDA driver";
  }
  int count = 0;
  if (auto fn = lib.sym<IntFn>("cudaGetDeviceCount")) {
    int rc = fn(&count);
    std::string devs = rc == 0 ? std::to_string(count) + " device(s)"
                               : std::string("no devices: ") +
                                     (err_str ? err_str(rc) : "error " + std::to_string(rc));
    p.note += (p.note.empty() ? "" : "; ") + devs;
  }
  out.push_back(p);
  return out;
}

LibraryProbe probe_cublas() {
  Library lib(
      candidates({"libcublas.so", "libcublas.so.13", "libcublas.so.12", "libcublas.so.11"}));
  if (!lib.ok()) return not_found("cuBLAS", "libcublas.so");
  LibraryProbe p{"cuBLAS", true, "", lib.path(), ""};
  // libraryPropertyType: MAJOR_VERSION = 0, MINOR_VERSION = 1, PATCH_LEVEL = 2.
  if (auto fn = lib.sym<int (*)(int, int*)>("cublasGetProperty")) {
    int ma = 0, mi = 0, pa = 0;
    if (fn(0, &ma) == 0 && fn(1, &mi) == 0 && fn(2, &pa) == 0) p.version = dotted(ma, mi, pa);
  }
  return p;
}

LibraryProbe probe_cudnn() {
  Library lib(candidates({"libcudnn.so", "libcudnn.so.9", "libcudnn.so.8"}));
  if (!lib.ok()) return not_found("cuDNN", "libcudnn.so");
  LibraryProbe p{"cuDNN", true, "", lib.path(), ""};
  if (auto fn = lib.sym<size_t (*)()>("cudnnGetVersion")) {
    const size_t v = fn();
    // cuDNN 9 encodes major*10000 + minor*100 + patch; cuDNN 8 and older major*1000 + minor*100 +
    // patch.
    if (v >= 90000)
      p.version = dotted(static_cast<int>(v / 10000), static_cast<int>((v % 10000) / 100),
                         static_cast<int>(v % 100));
    else
      p.version = dotted(static_cast<int>(v / 1000), static_cast<int>((v % 1000) / 100),
                         static_cast<int>(v % 100));
  }
  return p;
}

LibraryProbe probe_nccl() {
  Library lib(candidates({"libnccl.so.2", "libnccl.so"}));
  if (!lib.ok()) return not_found("NCCL", "libnccl.so");
  LibraryProbe p{"NCCL", true, "", lib.path(), ""};
  if (auto fn = lib.sym<int (*)(int*)>("ncclGetVersion")) {
    int v = 0;
    if (fn(&v) == 0) {
      // NCCL >= 2.9 encodes major*10000 + minor*100 + patch; older major*1000 + minor*100 + patch.
      if (v >= 20900)
        p.version = dotted(v / 10000, (v % 10000) / 100, v % 100);
      else
        p.version = dotted(v / 1000, (v % 1000) / 100, v % 100);
    }
  }
  return p;
}

LibraryProbe probe_gloo() {
  Library lib({"libgloo.so", "/usr/lib/libgloo.so", "/usr/local/lib/libgloo.so"});
  if (!lib.ok()) return not_found("Gloo", "libgloo.so");
  return {"Gloo", true, "", lib.path(), "no version API"};
}

struct NvmlResult {
  bool loaded = false;
  bool ok = false;
  std::string path, driver, cuda, error;
  std::vector<GpuInfo> gpus;
};

NvmlResult query_nvml() {
  NvmlResult r;
  Library lib({"libnvidia-ml.so.1", "libnvidia-ml.so"});
  if (!lib.ok()) return r;
  r.loaded = true;
  r.path = lib.path();
  using Device = void*;
  struct Memory {
    unsigned long long total, free, used;
  };
  auto init = lib.sym<int (*)()>("nvmlInit_v2");
  auto shutdown = lib.sym<int (*)()>("nvmlShutdown");
  auto count_fn = lib.sym<int (*)(unsigned*)>("nvmlDeviceGetCount_v2");
  auto handle_fn = lib.sym<int (*)(unsigned, Device*)>("nvmlDeviceGetHandleByIndex_v2");
  auto name_fn = lib.sym<int (*)(Device, char*, unsigned)>("nvmlDeviceGetName");
  auto mem_fn = lib.sym<int (*)(Device, Memory*)>("nvmlDeviceGetMemoryInfo");
  auto drv_fn = lib.sym<int (*)(char*, unsigned)>("nvmlSystemGetDriverVersion");
  auto cuda_fn = lib.sym<int (*)(int*)>("nvmlSystemGetCudaDriverVersion");
  auto err_fn = lib.sym<const char* (*)(int)>("nvmlErrorString");
  if (!init || !shutdown || !count_fn || !handle_fn) {
    r.error = "missing NVML symbols";
    return r;
  }
  if (int rc = init(); rc != 0) {
    r.error = std::string("nvmlInit failed: ") + (err_fn ? err_fn(rc) : std::to_string(rc));
    return r;
  }
  char buf[256];
  if (drv_fn && drv_fn(buf, sizeof(buf)) == 0) r.driver = buf;
  int cv = 0;
  if (cuda_fn && cuda_fn(&cv) == 0)
    r.cuda = std::to_string(cv / 1000) + "." + std::to_string((cv % 1000) / 10);
  unsigned n = 0;
  if (count_fn(&n) == 0) {
    for (unsigned i = 0; i < n; ++i) {
      Device d = nullptr;
      if (handle_fn(i, &d) != 0) continue;
      GpuInfo g;
      g.index = static_cast<int>(i);
      if (name_fn && name_fn(d, buf, sizeof(buf)) == 0) g.name = buf;
      Memory m{};
      if (mem_fn && mem_fn(d, &m) == 0) g.memory_bytes = m.total;
      r.gpus.push_back(g);
    }
  }
  r.ok = true;
  shutdown();
  return r;
}

bool in_path(const std::string& prog) {
  const char* path = std::getenv("PATH");
  if (!path) return false;
  for (const auto& d : split(path, ':')) {
    if (!d.empty() && access((d + "/" + prog).c_str(), X_OK) == 0) return true;
  }
  return false;
}

std::vector<GpuInfo> query_nvidia_smi(std::string* driver) {
  std::vector<GpuInfo> out;
  FILE* f = popen(
      "nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader,nounits "
      "2>/dev/null",
      "r");
  if (!f) return out;
  char line[512];
  while (fgets(line, sizeof(line), f)) {
    auto parts = split(line, ',');
    if (parts.size() < 4) continue;
    GpuInfo g;
    g.index = static_cast<int>(parse_int(parts[0]).value_or(static_cast<long long>(out.size())));
    g.name = trim(parts[1]);
    g.memory_bytes = static_cast<unsigned long long>(parse_int(parts[2]).value_or(0)) << 20;  // MiB
    *driver = trim(parts[3]);
    out.push_back(g);
  }
  pclose(f);
  return out;
}

std::string human_bytes(unsigned long long b) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f GiB", static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

}  // namespace

std::vector<LibraryProbe> probe_libraries() {
  std::vector<LibraryProbe> out;
  out.push_back(probe_onednn());
  for (auto& p : probe_cuda_runtime()) out.push_back(p);
  out.push_back(probe_cublas());
  out.push_back(probe_cudnn());
  out.push_back(probe_nccl());
  out.push_back(probe_gloo());
  return out;
}

DeviceReport probe_devices() {
  DeviceReport r;
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  std::set<std::string> flags;
  while (std::getline(cpuinfo, line)) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = trim(line.substr(0, colon)), val = trim(line.substr(colon + 1));
    if (key == "model name" && r.cpu_model.empty()) r.cpu_model = val;
    if (key == "flags" && flags.empty()) {
      std::istringstream is(val);
      std::string f;
      while (is >> f) flags.insert(f);
    }
  }
  for (const char* f : {"sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni",
                        "amx_bf16", "amx_tile"}) {
    if (flags.count(f)) r.cpu_features.emplace_back(f);
  }
  if (r.cpu_model.empty()) r.cpu_model = "unknown";
  r.cpus_online = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  r.cpus_usable = usable_cpu_count();
  std::ifstream meminfo("/proc/meminfo");
  while (std::getline(meminfo, line)) {
    if (line.rfind("MemTotal:", 0) == 0) {
      std::istringstream is(line.substr(9));
      is >> r.memory_kib;
      break;
    }
  }

  NvmlResult nv = query_nvml();
  if (nv.ok) {
    r.gpu_source = "NVML (" + nv.path + ")";
    r.gpus = nv.gpus;
    r.driver_version = nv.driver + (nv.cuda.empty() ? "" : ", CUDA " + nv.cuda);
  } else if (in_path("nvidia-smi")) {
    r.gpus = query_nvidia_smi(&r.driver_version);
    r.gpu_source = "nvidia-smi";
    if (nv.loaded) r.gpu_note = nv.error;
  } else {
    r.gpu_source = "none";
    r.gpu_note =
        nv.loaded ? nv.error : "no NVIDIA driver library (libnvidia-ml.so.1) and no nvidia-smi";
  }
  return r;
}

int detect_gpu_count() {
  NvmlResult nv = query_nvml();
  if (nv.ok) return static_cast<int>(nv.gpus.size());
  return count_gpu_device_nodes();
}

namespace {

// The config file and what a launch without flags would do with it.
void print_config_section(std::ostream& os, const std::string& config_path,
                          bool config_path_explicit, const EnvMap& env) {
  os << "\nConfig\n";
  os << "  file: " << config_path;
  LaunchConfig cfg;
  bool have = std::filesystem::exists(config_path);
  bool ok = true;
  if (!have) {
    os << (config_path_explicit
               ? " (does not exist)"
               : " (not written yet: `accel-run config` or `accel-run config default`)")
       << "; defaults in effect\n";
  } else {
    os << "\n";
    try {
      cfg = load_config(config_path);
    } catch (const Error& e) {
      os << "  error: " << e.what() << "\n";
      ok = false;
    }
  }
  if (ok) {
    std::istringstream yaml(config_to_yaml(cfg));
    std::string l;
    while (std::getline(yaml, l)) {
      if (!l.empty() && l[0] != '#') os << "    " << l << "\n";
    }
    try {
      LaunchPlan p = resolve_plan(cfg, LaunchFlags{}, env, count_gpu_device_nodes(),
                                  have ? config_path : std::string());
      os << "  launch without flags: " << p.world_size << " process(es) (" << p.distributed_type
         << "), " << p.num_local_workers << " on this machine (machine_rank " << p.machine_rank
         << " of " << p.num_machines << "), MASTER_ADDR=" << p.master_addr << " MASTER_PORT="
         << (p.port_auto ? std::string("<free port picked at launch>")
                         : std::to_string(p.master_port))
         << "\n";
      for (const auto& n : p.notes) os << "  note: " << n << "\n";
      const bool exported = env.count(env::kRendezvousToken) != 0;
      resolve_rendezvous_token(p, LaunchFlags{}, env);
      os << "  rendezvous token: "
         << (exported ? "ACCEL_RENDEZVOUS_TOKEN (exported)" : "a fresh one per launch") << "\n";
    } catch (const Error& e) {
      os << "  launch without flags would fail: " << e.what() << "\n";
    }
  }
}

// The contract's variables (and SLURM's, OpenMPI's, NCCL's, Gloo's) this process has.
void print_environment(std::ostream& os, const EnvMap& env) {
  os << "\nEnvironment\n";
  bool any = false;
  for (const auto& [k, v] : env) {
    static const char* kPrefixes[] = {"RANK",
                                      "WORLD_SIZE",
                                      "LOCAL_RANK",
                                      "LOCAL_WORLD_SIZE",
                                      "MASTER_ADDR",
                                      "MASTER_PORT",
                                      "CUDA_VISIBLE_DEVICES",
                                      "OMP_NUM_THREADS",
                                      "ACCEL_",
                                      "SLURM_PROCID",
                                      "SLURM_NTASKS",
                                      "SLURM_NODEID",
                                      "SLURM_JOB_NODELIST",
                                      "SLURM_NNODES",
                                      "SLURM_LOCALID",
                                      "OMPI_COMM_WORLD_",
                                      "NCCL_",
                                      "GLOO_"};
    bool match = false;
    for (const char* p : kPrefixes) {
      const std::string ps(p);
      bool prefix = ps.back() == '_';
      if (prefix ? k.rfind(ps, 0) == 0 : k == ps) match = true;
    }
    if (!match) continue;
    // A secret: reports get pasted into bug trackers.
    if (k == env::kRendezvousToken) {
      os << "  " << k << "=<set, " << v.size() << " characters>\n";
      any = true;
      continue;
    }
    os << "  " << k << "=" << v << "\n";
    any = true;
  }
  if (!any)
    os << "  (none of RANK, WORLD_SIZE, MASTER_*, CUDA_VISIBLE_DEVICES, OMP_NUM_THREADS, ACCEL_*, "
          "SLURM_*, OMPI_* set)\n";
}

}  // namespace

void print_env_report(std::ostream& os, const std::string& config_path, bool config_path_explicit,
                      const EnvMap& env) {
  utsname u{};
  uname(&u);
  os << "accel-run " << ACCEL_VERSION << " (accel " << ACCEL_VERSION << ")\n";
  os << "  compiler: " << __VERSION__ << ", C++ " << __cplusplus << "\n";
  os << "  system: " << u.sysname << " " << u.release << " " << u.machine << ", host " << u.nodename
     << "\n";

  DeviceReport d = probe_devices();
  os << "\nDevices\n";
  os << "  CPU: " << d.cpu_model << ", " << d.cpus_online << " logical CPUs online, "
     << d.cpus_usable << " usable by this process\n";
  os << "  CPU features:";
  for (const auto& f : d.cpu_features) os << " " << f;
  os << (d.cpu_features.empty() ? " none of interest\n" : "\n");
  os << "  memory: " << human_bytes(static_cast<unsigned long long>(d.memory_kib) * 1024ULL)
     << "\n";
  os << "  GPUs (" << d.gpu_source << "): " << d.gpus.size() << "\n";
  for (const auto& g : d.gpus) {
    os << "    [" << g.index << "] " << g.name << ", " << human_bytes(g.memory_bytes) << "\n";
  }
  if (!d.driver_version.empty()) os << "  NVIDIA driver: " << d.driver_version << "\n";
  if (!d.gpu_note.empty()) os << "  note: " << d.gpu_note << "\n";

  os << "\nLibraries\n";
  for (const auto& p : probe_libraries()) {
    os << "  " << p.name << ": ";
    if (!p.found) {
      os << p.note << "\n";
      continue;
    }
    os << (p.version.empty() ? "found, version unknown" : p.version);
    if (!p.note.empty()) os << " (" << p.note << ")";
    if (!p.path.empty()) os << " [" << p.path << "]";
    os << "\n";
  }

  print_config_section(os, config_path, config_path_explicit, env);
  os << "\nProcess cleanup\n";
  if (env_get(env, env::kRunCgroup).value_or("1") == "0") {
    os << "  job cgroup: off (ACCEL_RUN_CGROUP=0)";
  } else {
    std::string why_not;
    const std::string probe =
        create_job_cgroup("accel-run-probe-" + std::to_string(getpid()), &why_not);
    if (!probe.empty()) {
      rmdir(probe.c_str());
      os << "  job cgroup: available (created under "
         << std::filesystem::path(probe).parent_path().string() << ")";
    } else {
      os << "  job cgroup: not available (" << why_not << ")";
    }
  }
  os << "; the watchdog also finds leftovers by their process group and ACCEL_LAUNCH_ID\n";

  print_environment(os, env);
}

}  // namespace accel::launcher
