// One rank of tests/accelerate/test_legacy_load.cc: make_legacy_fixture's model and optimizer
// (tests/parallel/fixtures/legacy/make_legacy_fixture.cc: a tiny float64 GPT, AdamW with two param
// groups, a 1 KiB bucket cap, gpt_tp_plan) prepared on the mesh of the ACCEL_* variables, then
//   legacy_worker <ckpt> <out> <steps>
// load_state(<ckpt>) (a format-1 fixture), save_state(<out>/resaved) (format 2: what was loaded,
// under global names, for the test to compare bit for bit), then <steps> more micro-batches of
// make_legacy_fixture's data (seed 100 + k for micro-batch k, counted on from the loaded step);
// rank 0 writes "loss <k> <value>" (the world mean, %.17g) to <out>/losses.txt.
// Prints "ok legacy_worker"; exit code != 0 on failure (3: an error, printed, "IoError: " first for
// one).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include "accelerate/accelerator.h"
#include "core/generator.h"
#include "examples/models.h"
#include "optim/adam.h"
#include "tests/parallel/legacy_model.h"

using namespace accel;

namespace {

constexpr int64_t kBatch = 4, kContext = accel::test::kLegacyContext,
                  kVocab = accel::test::kLegacyVocab;
constexpr size_t kBucketCapBytes = 1024;  // make_legacy_fixture's

int run(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: legacy_worker <ckpt> <out> <steps>\n";
    return 2;
  }
  const std::string ckpt = argv[1], out_dir = argv[2];
  const int steps = std::atoi(argv[3]);
  AcceleratorConfig cfg;
  cfg.cpu = true;
  cfg.project_dir = "/tmp";
  cfg.log_with = {};
  cfg.ddp.bucket_cap_bytes = kBucketCapBytes;
  cfg.tp_plan = models::gpt_tp_plan({});
  Accelerator acc(cfg);
  const int dp = acc.mesh().size("dp"), dp_rank = acc.mesh().coordinate("dp");

  auto model = accel::test::legacy_model();
  auto opt = accel::test::legacy_optimizer(*model);
  auto [m, o] = acc.prepare(model, std::static_pointer_cast<optim::Optimizer>(opt));

  acc.load_state(ckpt);
  acc.save_state(out_dir + "/resaved");
  std::ofstream out;
  if (acc.is_main_process()) out.open(out_dir + "/losses.txt");
  const int first = int(acc.step());
  for (int s = first; s < first + steps; ++s) {
    auto scope = acc.accumulate();
    Generator data(uint64_t(100 + s));
    const Tensor tokens = randint(0, kVocab, {kBatch, kContext + 1}, TensorOptions(kInt64), &data);
    const int64_t per = kBatch / dp;
    const Tensor mine = tokens.narrow(0, dp_rank * per, per);
    const Tensor x = mine.narrow(1, 0, kContext).contiguous();
    const Tensor y = mine.narrow(1, 1, kContext).contiguous();
    const Tensor loss = models::lm_loss(m->forward(x), y);
    acc.backward(loss);
    if (acc.sync_gradients()) acc.clip_grad_norm_(0.5);
    o->step();
    o->zero_grad();
    // tp peers hold the same loss: the world mean is the dp mean.
    const Tensor mean = acc.reduce(full({1}, loss.item(), TensorOptions(kFloat64)), "mean");
    if (acc.is_main_process()) {
      char line[64];
      std::snprintf(line, sizeof line, "loss %d %.17g\n", s, mean.item());
      out << line;
    }
  }
  if (acc.is_main_process()) {
    out.close();
    ACCEL_CHECK(out.good(), IoError, "legacy_worker", "could not write ", out_dir, "/losses.txt");
  }
  acc.wait_for_everyone();
  std::cout << "ok legacy_worker" << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const IoError& e) {  // the hostile-checkpoint tests want this kind
    std::cout << "legacy_worker: IoError: " << e.what() << std::endl;
    return 3;
  } catch (const std::exception& e) {
    std::cout << "legacy_worker: " << e.what() << std::endl;
    return 3;
  }
}
