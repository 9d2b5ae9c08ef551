// One rank of the multi-process accelerator tests (spawned by test_accelerator_dist under the
// env contract). Prints "ok <scenario>" on success; exit code != 0 on failure.
//   accel_worker facade
//   accel_worker ddp <per-rank batch>                       final parameters, one per line
//   accel_worker train <dir> <steps> <save_every> <resume> [<crash_stage> <crash_rank>]
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "dist/checkpoint.h"
#include "tests/accelerator/common.h"

using namespace accel;
using accel::test::Run;

namespace {

#define EXPECT(cond)                                                                  \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "rank check failed: %s (line %d)\n", #cond, __LINE__);      \
      std::exit(2);                                                                   \
    }                                                                                 \
  } while (0)

AcceleratorConfig config_from_env(const std::string& dir) {
  AcceleratorConfig c;
  c.project_dir = dir;
  if (const char* t = std::getenv("DIST_TIMEOUT_MS")) c.timeout = std::chrono::milliseconds(std::atoi(t));
  return c;
}

int facade() {
  Accelerator acc(config_from_env("/tmp"));
  const int w = acc.num_processes(), r = acc.process_index();
  EXPECT(w == 2 || w == 3);
  EXPECT(acc.distributed_type() == DistributedType::MultiCPU);
  EXPECT(acc.is_main_process() == (r == 0));
  // gather: rank r contributes r+1 rows of value r.
  Tensor mine = full({r + 1, 2}, double(r));
  Tensor g = acc.gather(mine);
  EXPECT(g.size(0) == w * (w + 1) / 2 && g.size(1) == 2);
  int64_t row = 0;
  for (int q = 0; q < w; ++q)
    for (int k = 0; k <= q; ++k, ++row) EXPECT(g[row].tolist()[0] == q);
  // reduce / broadcast / pad.
  EXPECT(acc.reduce(scalar_tensor(double(r + 1)), "sum").item<double>() == w * (w + 1) / 2);
  EXPECT(acc.reduce(scalar_tensor(double(r)), "max").item<double>() == w - 1);
  EXPECT(acc.broadcast(scalar_tensor(double(r + 10)), w - 1).item<double>() == w - 1 + 10);
  Tensor padded = acc.pad_across_processes(full({r + 1}, 1.0), 0, -1.0);
  EXPECT(padded.size(0) == w && padded.sum().item<double>() == (r + 1) - (w - r - 1));
  // gather_for_metrics over a sharded loader: exactly the N samples, none twice.
  for (int64_t n : {10, 11, 7}) {
    data::DataLoaderOptions lo;
    lo.batch_size = 3;
    auto idx = arange(n, TensorOptions(kFloat32)).reshape({n, 1});
    auto loader = acc.prepare_data_loader(std::make_shared<data::DataLoader>(
        std::make_shared<data::TensorDataset>(std::vector<Tensor>{idx}), lo));
    std::vector<double> seen;
    for (auto& b : *loader) {
      Tensor all = acc.gather_for_metrics(b[0], b);
      for (double v : all.tolist()) seen.push_back(v);
    }
    std::sort(seen.begin(), seen.end());
    EXPECT(int64_t(seen.size()) == n);
    for (int64_t i = 0; i < n; ++i) EXPECT(seen[size_t(i)] == double(i));
  }
  std::vector<int> items = {0, 1, 2, 3, 4};
  auto part = acc.split_between_processes(items);
  auto sizes = acc.gather(scalar_tensor(double(part.size())));
  EXPECT(sizes.sum().item<double>() == 5);
  // main_process_first: the main process has finished before the others start.
  std::string flag = "/tmp/accel-acc-mpf-" + std::string(std::getenv("MASTER_PORT"));
  acc.main_process_first([&] {
    if (acc.is_main_process()) {
      std::FILE* f = std::fopen(flag.c_str(), "w");
      std::fclose(f);
    } else {
      std::FILE* f = std::fopen(flag.c_str(), "r");
      EXPECT(f != nullptr);
      std::fclose(f);
    }
  });
  acc.wait_for_everyone();
  if (acc.is_main_process()) std::remove(flag.c_str());
  acc.print("printed once");
  std::cout << "ok facade" << std::endl;
  return 0;
}

// One epoch of training, accumulation 2, sharded loader; prints the final parameters.
int ddp(int64_t batch) {
  AcceleratorConfig c = config_from_env("/tmp");
  c.gradient_accumulation_steps = 2;
  Accelerator acc(c);
  Run run(acc, batch, false, 0.0, 48);
  for (auto& b : *run.loader) run.step(acc, b);
  for (auto& p : run.model->parameters())
    for (double v : p.tolist()) std::printf("param %.9g\n", v);
  std::cout << "ok ddp" << std::endl;
  return 0;
}

int train(const std::string& dir, int steps, int save_every, bool resume, const std::string& crash_stage,
          int crash_rank) {
  AcceleratorConfig c = config_from_env(dir);
  c.gradient_accumulation_steps = 2;
  c.seed = 3;
  c.total_limit = 3;
  Accelerator acc(c);
  Run run(acc, 4);
  int saves = 0;
  if (!crash_stage.empty())
    dist::set_checkpoint_hook([&](const std::string& stage) {
      if (saves == 1 && stage == crash_stage && acc.process_index() == crash_rank) raise(SIGKILL);
    });
  int done = 0;
  if (resume) {
    std::string path = acc.load_state();
    done = int(acc.step());
    std::printf("loaded %s step %d\n", path.c_str(), done);
  }
  while (done < steps) {
    for (auto& b : *run.loader) {
      double loss = run.step(acc, b);
      std::printf("loss %d %d %s\n", acc.process_index(), done, test::hex(loss).c_str());
      ++done;
      if (save_every > 0 && done % save_every == 0) {
        acc.save_state();
        ++saves;
      }
      if (done == steps) break;
    }
  }
  std::fflush(stdout);
  std::cout << "ok train" << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "facade") return facade();
    if (mode == "ddp" && argc > 2) return ddp(std::atoll(argv[2]));
    if (mode == "train" && argc > 5)
      return train(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]) != 0,
                   argc > 7 ? argv[6] : "", argc > 7 ? std::atoi(argv[7]) : -1);
    std::fprintf(stderr, "usage: accel_worker facade|ddp B|train DIR STEPS EVERY RESUME [STAGE RANK]\n");
    return 64;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", e.what());
    return 3;
  }
}
