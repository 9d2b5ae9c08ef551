// A small deterministic data-parallel training run for the multi-host test
// (tests/comm/multihost_test.sh): an MLP on synthetic data through DDP, one shard of each batch
// per rank. Rank 0 prints the loss of every step ("step K loss X", X the mean over ranks), so a
// 1-host and a 2-host run of the same world size can be compared line by line.
//   mh_train [--steps N] [--step_sleep_ms M] [--timeout_ms T (init and collective timeout)]
//            [--hidden H (32)]
// Exit 0 on success; a DistError (a lost peer, ...) is printed and exits 3.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "autograd/ops.h"
#include "optim/sgd.h"
#include "core/generator.h"
#include "core/tensor.h"
#include "parallel/ddp.h"
#include "comm/process_group.h"

using namespace accel;
using namespace accel::dist;

namespace {

constexpr int64_t kIn = 16, kClasses = 4, kBatchPerRank = 8;

struct Mlp : nn::Module {
  std::shared_ptr<nn::Linear> fc1, fc2;
  explicit Mlp(int64_t hidden) {
    Generator gen(11);
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(kIn, hidden, true, &gen));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(hidden, kClasses, true, &gen));
  }
  Tensor forward(const Tensor& x) override { return fc2->forward(relu(fc1->forward(x))); }
};

int arg_int(int argc, char** argv, const char* name, int def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  return def;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = arg_int(argc, argv, "--steps", 10);
  const int sleep_ms = arg_int(argc, argv, "--step_sleep_ms", 0);
  const int timeout_ms = arg_int(argc, argv, "--timeout_ms", 0);
  // 32: 676 parameters, whose gradients travel over the control channel (at most 16 KiB);
  // 1024 and more: Gloo's ring (the lossy-link test).
  const int hidden = arg_int(argc, argv, "--hidden", 32);
  try {
    InitOptions io;
    if (timeout_ms > 0) io.timeout = std::chrono::milliseconds(timeout_ms);
    auto pg = init_process_group(io);
    const int rank = pg->rank(), world = pg->size();
    auto net = std::make_shared<Mlp>(hidden);
    DistributedDataParallel ddp(net);
    optim::SGDOptions so;
    so.lr(0.05);
    so.momentum(0.9);
    optim::SGD opt(net->parameters(), so);
    for (int s = 0; s < steps; ++s) {
      // The global batch of step s, the same on every rank; this rank takes its shard.
      Generator gen(uint64_t(1000 + s));
      const int64_t total = kBatchPerRank * world;
      Tensor x = randn({total, kIn}, TensorOptions(kFloat32), &gen);
      Tensor y = randint(0, kClasses, {total}, TensorOptions(kInt64), &gen);
      Tensor xs = x.narrow(0, rank * kBatchPerRank, kBatchPerRank).contiguous();
      Tensor ys = y.narrow(0, rank * kBatchPerRank, kBatchPerRank).contiguous();
      Tensor loss = cross_entropy(ddp.forward(xs), ys);
      ddp.backward(loss);
      opt.step();
      opt.zero_grad();
      Tensor l = full({1}, loss.item(), TensorOptions(kFloat32));
      pg->all_reduce(l, ReduceOp::Avg);
      if (rank == 0) {
        char line[64];
        std::snprintf(line, sizeof(line), "step %d loss %.7f", s, l.item());
        std::cout << line << std::endl;
      }
      if (sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    }
    pg->barrier();
    if (rank == 0) std::cout << "done " << steps << " steps on " << world << " ranks" << std::endl;
    destroy_process_group();
  } catch (const DistError& e) {
    std::cout << "mh_train: " << e.what() << std::endl;
    return 3;
  }
  return 0;
}
