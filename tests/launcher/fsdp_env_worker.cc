// Worker for the accel-run -> ACCEL_* -> Accelerator -> strategy path (test_launcher, "launch:
// ZeRO-3 options reach the strategy"): an Accelerator built from the environment accel-run set,
// one training step of a small model, then one line per rank with what the strategy holds:
//   rank=<r> strategy=<name> full=<bytes> gathered=<bytes> loss=<first loss>
// `gathered` is the root unit between steps (parameters of no unit, in the compute dtype), so it
// shows the wrap policy, min_params and param_dtype the worker got. Exit 0, or 1 on an error.
#include <cstdio>
#include <exception>
#include <memory>

#include "nn/container.h"
#include "nn/linear.h"
#include "autograd/ops.h"
#include "optim/adam.h"
#include "core/generator.h"
#include "accelerate/accelerator.h"

using namespace accel;

namespace {

// Entries of 288, 1056 and 264 parameters in a ModuleList, a 36-parameter head outside it.
struct Net : nn::Module {
  std::shared_ptr<nn::ModuleList> blocks;
  std::shared_ptr<nn::Linear> head;
  Net() {
    Generator gen(3);
    blocks = register_module("blocks", std::make_shared<nn::ModuleList>());
    blocks->push_back(std::make_shared<nn::Linear>(8, 32, true, &gen));
    blocks->push_back(std::make_shared<nn::Linear>(32, 32, true, &gen));
    blocks->push_back(std::make_shared<nn::Linear>(32, 8, true, &gen));
    head = register_module("head", std::make_shared<nn::Linear>(8, 4, true, &gen));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = x;
    for (const auto& b : *blocks) h = relu(b->forward(h));
    return head->forward(h);
  }
};

}  // namespace

int main() {
  try {
    AcceleratorConfig cfg;
    cfg.log_with = {};
    Accelerator acc(cfg);
    auto net = std::make_shared<Net>();
    auto opt = std::make_shared<optim::Adam>(net->parameters());
    auto [model, aopt] = acc.prepare(net, opt);
    Generator gen(uint64_t(10 + acc.process_index()));
    const Tensor x = randn({4, 8}, TensorOptions(kFloat32), &gen);
    const Tensor y = randint(0, 4, {4}, TensorOptions(kInt64), &gen);
    Tensor loss;
    {
      auto ac = acc.autocast();  // with --mixed_precision: the root's inputs in the compute dtype
      loss = cross_entropy(model->forward(x), y);
    }
    acc.backward(loss);
    aopt->step();
    aopt->zero_grad();
    const dist::StrategyMemory m = acc.memory();
    std::printf("rank=%d strategy=%s full=%lld gathered=%lld loss=%.4f\n", acc.process_index(),
                std::string(acc.strategy().name()).c_str(),
                static_cast<long long>(m.full_param_bytes),
                static_cast<long long>(m.gathered_param_bytes), loss.to(kFloat32).item<double>());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdp_env_worker: %s\n", e.what());
    return 1;
  }
}
