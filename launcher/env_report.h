// `accel-run env`: what this machine offers. Every GPU library is probed with dlopen at run time,
// so accel-run needs none of them to start and reports a missing one as "not found".
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "launcher/util.h"

namespace accel::launcher {

struct LibraryProbe {
  std::string name;  // "oneDNN", "CUDA runtime", ...
  bool found = false;
  std::string version;  // "2.6.0"; empty when found but the query failed
  std::string path;     // the file dlopen resolved
  std::string note;     // extra detail or the reason it was not found
};

// oneDNN, CUDA runtime (+ driver API version and device count), cuBLAS, cuDNN, NCCL, NVML, Gloo.
std::vector<LibraryProbe> probe_libraries();

struct GpuInfo {
  int index = 0;
  std::string name;
  unsigned long long memory_bytes = 0;
};

struct DeviceReport {
  std::string cpu_model;
  int cpus_online = 0;
  int cpus_usable = 0;
  long long memory_kib = 0;
  std::vector<std::string> cpu_features;  // the interesting subset of /proc/cpuinfo flags
  std::vector<GpuInfo> gpus;
  std::string gpu_source;  // "NVML", "nvidia-smi" or "none"
  std::string driver_version;
  std::string gpu_note;
};

DeviceReport probe_devices();

// GPUs visible on this machine: NVML if present, else the /dev/nvidiaN count.
int detect_gpu_count();

// The whole report: versions, devices, libraries, config file, launch plan, relevant variables.
void print_env_report(std::ostream& os, const std::string& config_path, bool config_path_explicit,
                      const EnvMap& env);

}  // namespace accel::launcher
