// The training program of the elastic membership test (tests/launcher/elastic_test.sh): a small
// float64 MLP trained with DDP on a fixed shuffled dataset at a fixed global (effective) batch,
// whatever the world size, with an automatic checkpoint every few steps; at start it resumes from
// the last complete checkpoint under <dir>/checkpoints (Accelerator::load_state("")), at any world
// size: DDP's state is replicated, and the loader position is global (it resumes at the same
// sample when the global batch divides it, Note [Loader position] in data/dataloader.h).
//
// The global batch G is kept by the per-rank batch and the accumulation (data::split_global_batch):
// the largest per-rank batch b <= --max_per_rank with accumulation a such that world * b * a = G.
// Rank 0 prints, one per line:
//   "elastic world W: per-rank batch b x accumulation a x world W = global batch G"
//   "resumed at step K from <checkpoint>" (after a load)
//   "step K loss X"   X: the mean loss over the G samples of optimizer step K (%.17g)
//   "done"
//   elastic_train <dir> [--steps N (24)] [--global_batch G (12)] [--max_per_rank B (G)]
//                 [--save_every K (2)] [--step_ms MS (0)]
// Exit 0 on success, 3 on an accel::Error (printed).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include "accelerate/accelerator.h"
#include "autograd/ops.h"
#include "core/generator.h"
#include "core/tensor.h"
#include "data/batch_split.h"
#include "data/dataloader.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "optim/sgd.h"

using namespace accel;

namespace {

constexpr int64_t kIn = 8, kHidden = 16, kSamples = 96;

int arg_int(int argc, char** argv, const char* name, int def) {
  for (int i = 2; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  return def;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: elastic_train <dir> [--steps N] [--global_batch G] [--max_per_rank B] "
                 "[--save_every K] [--step_ms MS]\n";
    return 2;
  }
  const std::string dir = argv[1];
  const int steps = arg_int(argc, argv, "--steps", 24);
  const int global = arg_int(argc, argv, "--global_batch", 12);
  const int max_per_rank = arg_int(argc, argv, "--max_per_rank", global);
  const int save_every = arg_int(argc, argv, "--save_every", 2);
  const int step_ms = arg_int(argc, argv, "--step_ms", 0);
  try {
    AcceleratorConfig cfg;
    cfg.cpu = true;
    cfg.project_dir = dir;
    cfg.log_with = {};
    cfg.total_limit = 3;
    cfg.split_batches = true;  // the loader's batch is split over the ranks
    // The world is the round's; the split is chosen before the Accelerator reads it.
    const int world = std::atoi(std::getenv("WORLD_SIZE") ? std::getenv("WORLD_SIZE") : "1");
    const data::BatchSplit split = data::split_global_batch(global, world, max_per_rank);
    cfg.gradient_accumulation_steps = static_cast<int>(split.accumulation);
    Accelerator acc(cfg);

    Generator gen(11);
    Tensor x = randn({kSamples, kIn}, TensorOptions(kFloat64), &gen);
    Tensor y = tanh(x.narrow(1, 0, 1) * 1.5 - x.narrow(1, 1, 1) * 0.5) + x.narrow(1, 2, 1) * 0.25;
    auto dataset = std::make_shared<data::TensorDataset>(std::vector<Tensor>{x, y});
    data::DataLoaderOptions lo;
    lo.batch_size = split.loader_batch();  // one micro-step of all ranks
    lo.shuffle = true;
    lo.seed = 5;
    auto loader = std::make_shared<data::DataLoader>(dataset, lo);

    Generator init(7);
    auto model = std::make_shared<nn::Sequential>();
    model->push_back(std::make_shared<nn::Linear>(kIn, kHidden, true, &init));
    model->push_back(std::make_shared<nn::Tanh>());
    model->push_back(std::make_shared<nn::Linear>(kHidden, 1, true, &init));
    model->to(kFloat64);
    auto opt =
        std::make_shared<optim::SGD>(model->parameters(), optim::SGDOptions(0.05).momentum(0.9));
    auto [m, o, l] = acc.prepare(model, std::static_pointer_cast<optim::Optimizer>(opt), loader);

    int done = 0;
    acc.register_for_checkpointing(
        "elastic_train",
        [&] {
          return std::map<std::string, std::string>{{"step", std::to_string(done)}};
        },
        [&](const std::map<std::string, std::string>& s) { done = std::stoi(s.at("step")); });
    if (acc.is_main_process()) {
      std::cout << "elastic world " << world << ": " << split.describe() << std::endl;
    }
    if (std::filesystem::exists(acc.checkpoints_dir() + "/latest")) {
      const std::string from = acc.load_state("");
      if (acc.is_main_process())
        std::cout << "resumed at step " << done << " from " << from << std::endl;
    }
    double window_loss = 0;
    int micro = 0;
    while (done < steps) {
      for (auto& b : *l) {
        auto scope = acc.accumulate();
        Tensor loss = mse_loss(m->forward(b[0]), b[1]);
        acc.backward(loss);
        o->step();
        o->zero_grad();
        window_loss += acc.reduce(loss.detach().reshape({1}), "mean").item<double>();
        if (++micro < split.accumulation) continue;
        micro = 0;
        if (acc.is_main_process()) {
          char line[96];
          std::snprintf(line, sizeof(line), "step %d loss %.17g", done,
                        window_loss / static_cast<double>(split.accumulation));
          std::cout << line << std::endl;
        }
        window_loss = 0;
        ++done;
        if (done % save_every == 0) acc.save_state();
        if (step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
        if (done == steps) break;
      }
    }
    acc.wait_for_everyone();
    if (acc.is_main_process()) std::cout << "done" << std::endl;
  } catch (const Error& e) {
    std::cout << "elastic_train: " << e.what() << std::endl;
    return 3;
  }
  return 0;
}
