// One rank of tests/accelerate/test_checkpoint_rng.cc (Note [generator state in checkpoints] in
// accelerate/accelerator_state.cc): a float64 MLP with dropout 0.3 trained through the Accelerator
// (DDP, Adam), every rank on the whole batch of each step, so that with the ranks' generators
// alike every rank draws the one-process masks and every world size trains as one process does.
//   rng_worker <dir> <steps> <alike|specific> [save <at>] [load]
// alike: set_seed(11) on every rank; specific: set_seed(11, device_specific) (seed + rank).
// save <at>: save_state(<dir>/ckpt) after optimizer step <at> (then go on); load: load_state
// (<dir>/ckpt) first, then train until <steps> optimizer steps in all.
// Prints on rank 0 "loss <step> <value %.17g>" (the mean over ranks) per step trained; on every
// rank "rng saved <rank> <hash>" just before the save and "rng loaded <rank> <hash>" just after
// the load (a hash of the default generator's state). Ends with "ok rng_train".
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>

#include "accelerate/accelerator.h"
#include "autograd/ops.h"
#include "core/generator.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "optim/adam.h"

using namespace accel;

namespace {

constexpr int64_t kBatch = 12, kIn = 8, kHidden = 32, kOut = 4;

void print_rng(const Accelerator& acc, const char* when) {
  uint64_t h = 14695981039346656037ull;  // FNV-1a 64: the same in every build (fixtures)
  for (unsigned char c : default_generator().state()) h = (h ^ c) * 1099511628211ull;
  std::printf("rng %s %d %016llx\n", when, acc.process_index(), (unsigned long long)h);
  std::fflush(stdout);
}

int run(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: rng_worker <dir> <steps> <alike|specific> [save <at>] [load]\n";
    return 2;
  }
  const std::string dir = argv[1], seeds = argv[3];
  const int steps = std::atoi(argv[2]);
  int save_at = -1;
  bool load = false;
  for (int i = 4; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "save" && i + 1 < argc) {
      save_at = std::atoi(argv[++i]);
    } else if (a == "load") {
      load = true;
    } else {
      std::cerr << "rng_worker: unexpected argument '" << a << "'\n";
      return 2;
    }
  }
  ACCEL_CHECK(seeds == "alike" || seeds == "specific", ValueError, "rng_worker", "seeds '", seeds,
              "'");
  AcceleratorConfig cfg;
  cfg.cpu = true;
  cfg.project_dir = dir;
  cfg.log_with = {};
  Accelerator acc(cfg);
  acc.set_seed(11, seeds == "specific");
  Generator init(17);
  auto model = std::make_shared<nn::Sequential>(
      std::make_shared<nn::Linear>(kIn, kHidden, true, &init), std::make_shared<nn::Tanh>(),
      std::make_shared<nn::Dropout>(0.3), std::make_shared<nn::Linear>(kHidden, kOut, true, &init));
  model->to(kFloat64);
  optim::AdamOptions ao;
  ao.lr(1e-2);
  auto opt = std::make_shared<optim::Adam>(model->parameters(), ao);
  auto [m, o] = acc.prepare(model, std::static_pointer_cast<optim::Optimizer>(opt));
  int first = 0;
  const std::string ckpt = dir + "/ckpt";
  if (load) {
    acc.load_state(ckpt);
    first = int(acc.optimizer_steps());
    print_rng(acc, "loaded");
  }
  for (int s = first; s < steps; ++s) {
    Generator data(uint64_t(100 + s));
    const TensorOptions f64(kFloat64);
    const Tensor x = randn({kBatch, kIn}, f64, &data), y = randn({kBatch, kOut}, f64, &data);
    const Tensor loss = mse_loss(m->forward(x), y);
    acc.backward(loss);
    o->step();
    o->zero_grad();
    const Tensor mean = acc.reduce(full({1}, loss.item(), f64), "mean");
    if (acc.is_main_process()) std::printf("loss %d %.17g\n", s, mean.item());
    if (s + 1 == save_at) {
      print_rng(acc, "saved");
      acc.save_state(ckpt);
    }
  }
  acc.wait_for_everyone();
  std::cout << "ok rng_train" << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cout << "rng_worker: " << e.what() << std::endl;
    return 3;
  }
}
