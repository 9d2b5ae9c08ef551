// One rank of tests/accelerate/test_deferred_init.cc (issue 37 item 3, Note [deferred regions] in
// parallel/materialize.cc): a GPT (examples/models.h, 2 layers of d_model 128: the blocks hold 97 %
// of the parameters) built from manual_seed(5), eagerly or under nn::DeferredInit, made float64
// unless f32, prepared through the Accelerator on the mesh of the ACCEL_* variables (tp plan
// models::gpt_tp_plan) and trained <steps> AdamW steps on fixed batches (the ranks of a tp group
// take the same rows), so every mesh computes one process's steps.
//   deferred_worker <out> <steps> [deferred] [f32] [export <file>] [seed-by-dp]
// deferred: built under nn::DeferredInit (one process: nn::materialize before prepare);
// export: save_model(<file>) right after prepare (the initial values); seed-by-dp: each dp index
// seeds differently (manual_seed(5 + dp index): the tp peers agree, the ZeRO-3 shards do not).
// Rank 0 writes <out>: "peak <max over ranks of the CPU allocator's peak bytes in use during
// prepare, above what it held before> <the full model's parameter bytes>", "loss <step> <v>"
// (%.17g), then "param <name> <numel>" and the final full values (%.17g), one per line.
// Prints "ok deferred_worker"; exit code 3 with the error's text on failure.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include "accelerate/accelerator.h"
#include "core/generator.h"
#include "core/storage.h"
#include "examples/models.h"
#include "optim/adam.h"

using namespace accel;

namespace {

constexpr int64_t kBatch = 4, kContext = 16;

int run(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: deferred_worker <out> <steps> [deferred] [f32] [export <file>] "
                 "[seed-by-dp]\n";
    return 2;
  }
  const std::string out_path = argv[1];
  const int steps = std::atoi(argv[2]);
  bool deferred = false, f32 = false, seed_by_dp = false;
  std::string export_path;
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "deferred") {
      deferred = true;
    } else if (a == "f32") {
      f32 = true;
    } else if (a == "seed-by-dp") {
      seed_by_dp = true;
    } else if (a == "export" && i + 1 < argc) {
      export_path = argv[++i];
    } else {
      std::cerr << "deferred_worker: unexpected argument '" << a << "'\n";
      return 2;
    }
  }
  AcceleratorConfig cfg;
  cfg.cpu = true;
  cfg.project_dir = "/tmp";
  cfg.log_with = {};
  cfg.tp_plan = models::gpt_tp_plan();
  Accelerator acc(cfg);
  const int dp = acc.mesh().size("dp"), dp_rank = acc.mesh().coordinate("dp");
  ACCEL_CHECK(kBatch % dp == 0, ValueError, "deferred_worker", "dp ", dp, " does not divide ",
              kBatch);

  models::GptConfig c;
  c.vocab = 32;
  c.context = kContext;
  c.layers = 2;
  c.heads = 4;
  c.d_model = 128;
  manual_seed(seed_by_dp ? uint64_t(5 + dp_rank) : 5);
  std::shared_ptr<models::Gpt> model;
  if (deferred) {
    nn::DeferredInit d;
    model = std::make_shared<models::Gpt>(c);
  } else {
    model = std::make_shared<models::Gpt>(c);
  }
  if (!f32) model->to(kFloat64);
  int64_t model_bytes = 0;
  for (const Tensor& p : model->parameters())
    model_bytes += p.numel() * int64_t(dtype_size(p.dtype()));
  if (deferred && acc.num_processes() == 1) nn::materialize(*model);

  Allocator* alloc = get_allocator(kCPU);
  alloc->reset_peak_stats();
  const size_t before = alloc->stats().bytes_in_use;
  optim::AdamWOptions ao;
  ao.lr(1e-2);
  ao.weight_decay(0.01);
  auto opt = std::make_shared<optim::AdamW>(model->parameters(), ao);
  auto [m, o] = acc.prepare(model, std::static_pointer_cast<optim::Optimizer>(opt));
  const Tensor peak = acc.reduce(
      full({1}, double(alloc->stats().peak_bytes_in_use - before), TensorOptions(kFloat64)), "max");
  if (!export_path.empty()) acc.save_model(*m, export_path);

  std::ofstream out;
  if (acc.is_main_process()) out.open(out_path);
  char line[96];
  if (acc.is_main_process()) out << "peak " << int64_t(peak.item()) << " " << model_bytes << "\n";
  const int64_t per_rank = kBatch / dp;
  for (int s = 0; s < steps; ++s) {
    Generator data(uint64_t(100 + s));
    const Tensor tokens = randint(0, c.vocab, {kBatch, kContext + 1}, TensorOptions(kInt64), &data);
    const Tensor rows = tokens.narrow(0, dp_rank * per_rank, per_rank);
    const Tensor x = rows.narrow(1, 0, kContext).contiguous();
    const Tensor y = rows.narrow(1, 1, kContext).contiguous();
    const Tensor loss = models::lm_loss(m->forward(x), y);
    acc.backward(loss);
    o->step();
    o->zero_grad();
    const Tensor mean = acc.reduce(full({1}, loss.item(), TensorOptions(kFloat64)), "mean");
    if (acc.is_main_process()) {
      std::snprintf(line, sizeof line, "loss %d %.17g\n", s, mean.item());
      out << line;
    }
  }
  const io::TensorDict state = acc.get_state_dict(*m);
  if (acc.is_main_process()) {
    for (const auto& [name, t] : state) {
      const Tensor v = t.to(kFloat64).contiguous().reshape({-1});
      out << "param " << name << " " << v.numel() << "\n";
      const double* p = v.data<double>();
      for (int64_t i = 0; i < v.numel(); ++i) {
        std::snprintf(line, sizeof line, "%.17g\n", p[i]);
        out << line;
      }
    }
    out.close();
    ACCEL_CHECK(out.good(), IoError, "deferred_worker", "could not write ", out_path);
  }
  acc.wait_for_everyone();
  std::cout << "ok deferred_worker" << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cout << "deferred_worker: " << e.what() << std::endl;
    return 3;
  }
}
