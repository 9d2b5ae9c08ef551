// One rank of tests/accelerate/test_memory_estimate.cc: a small GPT (examples/models.h) trained
// for two steps through the Accelerator on the CPU, and what it holds, measured, next to what
// accel::estimate (accelerate/memory_estimate.h) says:
//
//   estimate_worker STRATEGY PRECISION OPTIMIZER [CHECKPOINTING]
//     STRATEGY   ddp | zero1 | zero2 | fsdp;  PRECISION  f32 | bf16 (ZeRO param_dtype) | f64
//     OPTIMIZER  adamw | sgd_momentum;        CHECKPOINTING  1: fsdp activation checkpointing
//
// Every rank prints one line "mem rank=<r> key=value...", bytes:
//   alloc_state      the CPU allocator's bytes in use after the second optimizer step (before
//                    zero_grad) above what was in use before the model was built: what the run
//                    keeps between steps, each block rounded up to the allocator's size class
//                    (Note [CPU caching allocator] in core/storage.cc)
//   strategy_state   Accelerator::memory()'s parameters + gradients + optimizer state, and
//                    params, grads, optimizer, gathered: its parts
//   forward_saved    the allocator's bytes a forward added (what it saved for backward, the
//                    logits included), second step
//   est_*            the estimate for this rank: state, params, master, grads, optimizer,
//                    transient, activations (est_act; est_act_ckpt with checkpointing)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "accelerate/accelerator.h"
#include "accelerate/memory_estimate.h"
#include "core/storage.h"
#include "examples/models.h"
#include "optim/optim.h"

using namespace accel;

namespace {

constexpr int64_t kBatch = 2;

int run(const std::string& strategy, const std::string& precision, const std::string& optimizer,
        bool checkpointing) {
  Allocator* cpu = get_allocator(kCPU);
  auto in_use = [cpu] { return int64_t(cpu->stats().bytes_in_use); };
  AcceleratorConfig c;
  c.cpu = true;
  c.read_env = false;
  c.log_with = {};
  c.strategy = strategy;
  if (precision == "bf16") c.zero.param_dtype = c.fsdp.param_dtype = kBFloat16;
  c.fsdp.activation_checkpointing = checkpointing;
  Accelerator acc(c);

  models::GptConfig gc;
  gc.vocab = 96;
  gc.context = 32;
  gc.layers = 3;
  gc.heads = 4;
  gc.d_model = 96;
  const int64_t before = in_use();
  manual_seed(3);
  auto model = std::make_shared<models::Gpt>(gc);
  if (precision == "f64") model->to(kFloat64);
  const estimate::ModelSpec spec = estimate::model_from_module(*model, "gpt");
  std::shared_ptr<optim::Optimizer> opt;
  if (optimizer == "adamw") {
    opt = std::make_shared<optim::AdamW>(model->parameters(), optim::AdamWOptions().lr(1e-3));
  } else {
    opt = std::make_shared<optim::SGD>(model->parameters(), optim::SGDOptions(1e-2).momentum(0.9));
  }
  auto [m, o] = acc.prepare(model, opt);

  const int64_t before_inputs = in_use();
  Generator g(5 + acc.process_index());
  const Tensor tokens = randint(0, gc.vocab, {kBatch, gc.context + 1}, TensorOptions(kInt64), &g);
  const Tensor x = tokens.narrow(1, 0, gc.context).contiguous();
  const Tensor y = tokens.narrow(1, 1, gc.context).contiguous();
  const int64_t inputs = in_use() - before_inputs;
  int64_t forward_saved = 0;
  for (int step = 0; step < 2; ++step) {
    o->zero_grad();
    const int64_t start = in_use();
    const Tensor loss = models::lm_loss(m->forward(x), y);
    forward_saved = in_use() - start;
    acc.backward(loss);
    o->step();
  }
  const int64_t alloc_state = in_use() - before - inputs;
  const dist::StrategyMemory sm = acc.memory();

  estimate::Setup s;
  s.precision = *estimate::parse_precision(precision);
  s.strategy = *estimate::parse_strategy(strategy);
  s.optimizer = *estimate::parse_optimizer(optimizer);
  s.world = acc.num_processes();
  s.batch = kBatch;
  s.sequence = gc.context;
  const estimate::Estimate e = estimate::estimate(spec, s);
  std::printf(
      "mem rank=%d alloc_state=%lld strategy_state=%lld params=%lld "
      "grads=%lld optimizer=%lld gathered=%lld forward_saved=%lld est_state=%lld est_params=%lld "
      "est_master=%lld est_grads=%lld est_optimizer=%lld est_transient=%lld est_act=%lld "
      "est_act_ckpt=%lld\n",
      acc.process_index(), static_cast<long long>(alloc_state),
      static_cast<long long>(sm.param_bytes + sm.grad_bytes + sm.optimizer_bytes +
                             sm.gathered_param_bytes),
      static_cast<long long>(sm.param_bytes), static_cast<long long>(sm.grad_bytes),
      static_cast<long long>(sm.optimizer_bytes), static_cast<long long>(sm.gathered_param_bytes),
      static_cast<long long>(forward_saved), static_cast<long long>(e.state()),
      static_cast<long long>(e.params), static_cast<long long>(e.master),
      static_cast<long long>(e.grads), static_cast<long long>(e.optimizer),
      static_cast<long long>(e.transient), static_cast<long long>(e.activations),
      static_cast<long long>(e.activations_checkpointed));
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: estimate_worker STRATEGY PRECISION OPTIMIZER [CHECKPOINTING]\n");
    return 2;
  }
  try {
    return run(argv[1], argv[2], argv[3], argc > 4 && std::string(argv[4]) == "1");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "estimate_worker: %s\n", e.what());
    return 1;
  }
}
