// Shared pieces of the accelerator tests: a tiny regression model whose forward draws from the
// default generator (dropout), a fixed dataset, and one training run through the facade.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "nn/module.h"
#include "autograd/ops.h"
#include "optim/lr_scheduler.h"
#include "optim/sgd.h"
#include "core/generator.h"
#include "data/dataloader.h"
#include "accelerate/accelerator.h"
#include "tests/common/util.h"

namespace accel::test {

// A facade configuration that ignores the environment and checkpoints under `dir`.
inline AcceleratorConfig base_config(const std::string& dir) {
  AcceleratorConfig c;
  c.project_dir = dir;
  c.read_env = false;
  return c;
}

// x: (B, 4) -> (B, 1); two layers with dropout so a resumed run also needs the RNG state.
struct TinyNet : nn::Module {
  Tensor w1, b1, w2, b2;
  double p_drop;
  explicit TinyNet(uint64_t seed = 7, double p = 0.1) : p_drop(p) {
    Generator g(seed);
    w1 = register_parameter("w1", mul(randn({8, 4}, {}, &g), 0.5));
    b1 = register_parameter("b1", zeros({8}));
    w2 = register_parameter("w2", mul(randn({1, 8}, {}, &g), 0.5));
    b2 = register_parameter("b2", zeros({1}));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = tanh(linear(x, w1, b1));
    if (p_drop > 0) h = dropout(h, p_drop, is_training());
    return linear(h, w2, b2);
  }
};

inline data::DatasetPtr make_dataset(int64_t n = 40) {
  Generator g(123);
  Tensor x = randn({n, 4}, {}, &g);
  Tensor y = sum(mul(x, tensor({0.5f, -1.0f, 2.0f, 0.25f})), {1}, true);
  return std::make_shared<data::TensorDataset>(std::vector<Tensor>{x, y});
}

inline std::string hex(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%a", v);
  return buf;
}

// All the objects of one training run, prepared.
struct Run {
  std::shared_ptr<TinyNet> model;
  std::shared_ptr<AcceleratedOptimizer> opt;
  std::shared_ptr<data::DataLoader> loader;
  std::shared_ptr<AcceleratedScheduler> sched;

  Run(Accelerator& acc, int64_t batch, bool shuffle = true, double p_drop = 0.1, int64_t n = 40) {
    auto m = std::make_shared<TinyNet>(7, p_drop);
    optim::SGDOptions so;
    so.lr(0.05);
    so.momentum(0.9);
    auto o = std::make_shared<optim::SGD>(m->parameters(), so);
    data::DataLoaderOptions lo;
    lo.batch_size = batch;
    lo.shuffle = shuffle;
    lo.seed = 5;
    auto l = std::make_shared<data::DataLoader>(make_dataset(n), lo);
    auto s = std::make_shared<optim::StepLR>(*o, 3, 0.5);
    std::tie(model, opt, loader, sched) = acc.prepare(m, o, l, s);
  }

  // One micro-batch step; returns the (unscaled) loss.
  double step(Accelerator& acc, const data::Batch& b) {
    auto scope = acc.accumulate();
    Tensor loss;
    {
      auto ac = acc.autocast();
      loss = mse_loss(model->forward(b[0]), b[1]);
    }
    acc.backward(loss);
    opt->step();
    sched->step();
    opt->zero_grad();
    return loss.item<double>();
  }
};

}  // namespace accel::test
