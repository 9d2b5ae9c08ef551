// The cross-device runner over the op table: every case's forward and backward (the gradients of
// every floating input) on every non-CPU device present, per dtype, against the CPU result, with
// the case's tolerances; and the kernel coverage checks of Note [kernel coverage]:
//   (a) per device present (the CPU included): every stub with a kernel registered for that device
//       is reached by some case run on it;
//   (b) static (no GPU needed): every stub registered for CUDA is reached by the cases on the CPU
//       (same stub names), so a CUDA kernel cannot ship without a case.
// On the CPU every float32/float16/bfloat16 run is also compared with the float64 run on the same
// rounded inputs (the case's tolerance for that dtype, scaled by kCpuDtypeSlack), so a CPU kernel
// wrong for one dtype fails here on any machine.
// Output: one line per (case, device, dtype) failure with max abs/rel error, then a summary.
// Usage: op_cross_device [--list] [--self] [--exclude SUBSTRING]... [SUBSTRING]
//   SUBSTRING keeps only matching cases (and skips the coverage checks); --exclude drops matching
//   cases but keeps the coverage checks (the meson test ops_table_coverage_fails uses it to show
//   that a kernel without a case fails); --self compares the CPU against itself through the
//   device path (the runner's own test where no GPU is present).
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/dispatch.h"
#include "op_table.h"
#ifdef ACCEL_WITH_CUDA  // cuda_deps define it
#include "kernels/cuda/device.h"
#endif

using namespace accel;
using namespace accel::optable;

namespace {

// Stubs that no case can reach on the CPU, with why (Note [kernel coverage]).
const std::map<std::string, std::string> kCpuExempt = {
    {"cross_device_copy_stub",
     "copies between devices: reached by every input upload of the cross-device run, and by "
     "tests/kernels/cuda_vs_cpu.cc's copy tests"},
};

std::string dev_name(Device d) {
  std::ostringstream os;
  os << d;
  return os.str();
}

struct Ref {
  bool ok = false;
  bool f32_reference = false;  // Note [16-bit references]
  RunResult r;
};

int g_failures = 0;

// The CPU dtype check compares a rounded-dtype result with a float64 one: the dtype's own
// rounding of the output plus that of intermediates, hence a margin over the device tolerance
// (which compares two results of the same dtype).
constexpr double kCpuDtypeSlack = 4;

void fail(const OpCase& c, const std::string& dev, DType dt, const std::string& what) {
  ++g_failures;
  std::printf("FAIL %s [%s %s]: %s\n", c.name().c_str(), dev.c_str(),
              std::string(dtype_name(dt)).c_str(), what.c_str());
}

std::string errors(const char* what, const Compare& cmp) {
  std::ostringstream os;
  os << what << ": max abs error " << cmp.max_abs << ", max rel error " << cmp.max_rel;
  if (!cmp.why.empty()) os << " (" << cmp.why << ")";
  return os.str();
}

// Compares a device run with the CPU reference; returns whether everything matched.
bool check(const OpCase& c, const std::string& dev, DType dt, const RunResult& got,
           const Ref& ref) {
  const bool float_out = is_floating(ref.r.out.dtype());
  const Tol tol = float_out ? c.tol.for_dtype(dt) : Tol{0, 0};
  bool ok = true;
  const Compare fwd = compare(got.out, ref.r.out, tol);
  if (!fwd.ok) {
    fail(c, dev, dt, errors("forward", fwd));
    ok = false;
  }
  if (got.grads.size() != ref.r.grads.size()) {
    fail(c, dev, dt,
         "backward: " + std::to_string(got.grads.size()) + " gradients vs " +
             std::to_string(ref.r.grads.size()) + " on the CPU");
    return false;
  }
  for (size_t i = 0; i < got.grads.size(); ++i) {
    const Compare g =
        compare(got.grads[i], ref.r.grads[i], c.tol.scaled(c.grad_scale_of(i)).for_dtype(dt));
    if (!g.ok) {
      fail(c, dev, dt, errors(("grad of input " + std::to_string(i)).c_str(), g));
      ok = false;
    }
  }
  return ok;
}

std::set<std::string> reached_on(const StubCallRecorder& rec, DeviceType t) {
  std::set<std::string> s;
  for (const auto& [stub, dt] : rec.calls())
    if (dt == t) s.insert(stub);
  return s;
}

// (a): every stub registered for `t` reached; returns the number covered.
int check_coverage(DeviceType t, const std::set<std::string>& reached, const std::string& dev) {
  int covered = 0;
  for (const KernelRegistration& k : registered_kernels()) {
    if (k.device != t) continue;
    if (reached.count(k.stub)) {
      ++covered;
    } else if (!(t == DeviceType::CPU && kCpuExempt.count(k.stub))) {
      ++g_failures;
      std::printf(
          "FAIL coverage: %s has a %s kernel that no op case reaches (add a case in tests/ops/)\n",
          k.stub.c_str(), dev.c_str());
    }
  }
  return covered;
}

}  // namespace

int main(int argc, char** argv) {
  std::string filter;
  std::vector<std::string> excludes;
  bool list = false, self = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--list") == 0)
      list = true;
    else if (std::strcmp(argv[i], "--self") == 0)
      self = true;
    else if (std::strcmp(argv[i], "--exclude") == 0 && i + 1 < argc)
      excludes.push_back(argv[++i]);
    else
      filter = argv[i];
  }
  auto selected = [&](const OpCase& c) {
    if (!filter.empty() && c.name().find(filter) == std::string::npos) return false;
    for (const std::string& e : excludes)
      if (c.name().find(e) != std::string::npos) return false;
    return true;
  };
  const std::vector<OpCase>& cases = op_cases();
  if (list) {
    for (const OpCase& c : cases) std::printf("%s\n", c.name().c_str());
    return 0;
  }

  std::vector<Device> devices;  // non-CPU devices present
  std::string no_device_reason = "built without CUDA";
  if (self) devices.push_back(kCPU);
#ifdef ACCEL_WITH_CUDA  // cuda_deps define it
  if (!self && cuda::is_available())
    devices.push_back(Device::cuda(0));
  else if (!self)
    no_device_reason = cuda::unavailable_reason();
#endif

  // ---- the CPU pass: references for every (case, dtype), coverage of the CPU kernels ----
  std::vector<std::vector<Ref>> refs(cases.size());
  int runs = 0, cpu_unsupported = 0, n_cases = 0, cpu_dtype_checked = 0, cpu_dtype_failures = 0;
  std::set<std::string> cpu_reached;
  {
    StubCallRecorder rec;
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      const OpCase& c = cases[ci];
      if (!selected(c)) continue;
      ++n_cases;
      refs[ci].resize(c.dtypes.size());
      for (size_t di = 0; di < c.dtypes.size(); ++di) {
        const DType dt = c.dtypes[di];
        Ref& ref = refs[ci][di];
        try {
          Maker m(dt, kCPU, case_seed(c));
          ref.r = run_case(c, m, true);
          ref.ok = true;
          ++runs;
        } catch (const DTypeError& e) {
          // Note [16-bit references]: a CPU kernel without this 16-bit dtype; the reference is the
          // same rounded inputs computed in float32.
          ++cpu_unsupported;
          if (dt == kFloat16 || dt == kBFloat16) {
            try {
              Maker m(dt, kCPU, case_seed(c), kFloat32);
              ref.r = run_case(c, m, true);
              ref.ok = ref.f32_reference = true;
            } catch (const std::exception& e2) {
              fail(c, "cpu", dt, std::string("float32 reference threw: ") + e2.what());
            }
          } else {
            fail(c, "cpu", dt, std::string("threw: ") + e.what());
          }
        } catch (const std::exception& e) {
          fail(c, "cpu", dt, std::string("threw: ") + e.what());
        }
        // The CPU dtype check: the same rounded inputs computed in float64.
        if (ref.ok && !ref.f32_reference && is_floating(dt) && dt != kFloat64) {
          try {
            Maker m(dt, kCPU, case_seed(c), kFloat64);
            Ref wide;
            wide.r = run_case(c, m, true);
            OpCase loose = c;
            loose.tol = c.tol.scaled(kCpuDtypeSlack);
            if (!check(loose, "cpu vs f64", dt, ref.r, wide)) ++cpu_dtype_failures;
            ++cpu_dtype_checked;
          } catch (const std::exception& e) {
            fail(c, "cpu f64", dt, std::string("threw: ") + e.what());
          }
        }
      }
    }
    cpu_reached = reached_on(rec, DeviceType::CPU);
  }
  int cpu_covered = 0, static_covered = 0, static_total = 0;
  if (filter.empty()) {
    cpu_covered = check_coverage(DeviceType::CPU, cpu_reached, "cpu");
    if (!excludes.empty()) std::printf("coverage checked without the excluded cases\n");
    // (b) static: every CUDA-registered stub reached by the cases on the CPU.
    for (const KernelRegistration& k : registered_kernels()) {
      if (k.device != DeviceType::CUDA) continue;
      ++static_total;
      if (cpu_reached.count(k.stub) || kCpuExempt.count(k.stub)) {
        ++static_covered;
      } else {
        ++g_failures;
        std::printf(
            "FAIL coverage: %s has a CUDA kernel but no op case reaches the stub on the CPU\n",
            k.stub.c_str());
      }
    }
  }

  // ---- every non-CPU device against the CPU references ----
  int compared = 0, skipped_cpu_only = 0;
  for (Device d : devices) {
    const std::string dev = dev_name(d);
    StubCallRecorder rec;
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      const OpCase& c = cases[ci];
      if (refs[ci].empty()) continue;
      if (!c.cpu_only.empty()) {
        ++skipped_cpu_only;
        continue;
      }
      for (size_t di = 0; di < c.dtypes.size(); ++di) {
        const Ref& ref = refs[ci][di];
        if (!ref.ok) continue;
        const DType dt = c.dtypes[di];
        try {
          Maker m(dt, d, case_seed(c));
          const RunResult got = run_case(c, m, true);
          check(c, dev, dt, got, ref);
          ++compared;
        } catch (const std::exception& e) {
          fail(c, dev, dt, std::string("threw: ") + e.what());
        }
      }
    }
    if (filter.empty()) {
      const int covered = check_coverage(d.type, reached_on(rec, d.type), dev);
      std::printf("%s: %d registered kernels reached by the cases\n", dev.c_str(), covered);
    }
  }

  std::set<std::string> ops;
  for (const OpCase& c : cases) ops.insert(c.op);
  if (self) std::printf("--self: the CPU compared with itself through the device path\n");
  if (devices.empty())
    std::printf("no CUDA device: cross-device comparison skipped, CPU coverage checked (%s)\n",
                no_device_reason.c_str());
  std::printf(
      "op_cross_device: %d cases (%zu ops), %d CPU runs (%d with a dtype the CPU kernel lacks), "
      "%d CPU dtype checks against float64 (%d failed), %d device comparisons, %d cpu-only "
      "case runs skipped; coverage: %d CPU kernels, %d/%d CUDA stubs reached on the CPU; %d "
      "failures\n",
      n_cases, ops.size(), runs, cpu_unsupported, cpu_dtype_checked, cpu_dtype_failures, compared,
      skipped_cpu_only, cpu_covered, static_covered, static_total, g_failures);
  return g_failures == 0 ? 0 : 1;
}
