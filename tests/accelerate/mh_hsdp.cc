// The training program of the hybrid-sharding multi-host test
// (tests/accelerate/multihost_hsdp_test.sh): an MLP trained through the Accelerator under ZeRO-3 on
// the mesh accel-run passes (--dp_replicate_size / --dp_shard_size), in float64 on synthetic data,
// each data-parallel rank taking its shard of a fixed global batch of 16 (so every mesh, one
// process included, trains on the same data). Rank 0 prints, one per line:
//   "mesh <describe()>"
//   "params <trainable elements> <bytes>"
//   "step K loss X"                    X the mean over the data-parallel ranks
//   "weights <sum of |w|> <sum of w^2>" of the final full model
//   "done"
// so that a 2-host run can be compared with a 1-host run line by line, and the test can relate
// the bytes on the link to the model's size.
//   mh_hsdp [--steps N (8)] [--hidden H (256)]
// Exit 0 on success, 3 on an accel::Error (printed).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>

#include "accelerate/accelerator.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "autograd/ops.h"
#include "optim/adam.h"
#include "core/generator.h"
#include "core/tensor.h"

using namespace accel;

namespace {

constexpr int64_t kIn = 32, kClasses = 8, kGlobalBatch = 16;  // dp must divide it

int arg_int(int argc, char** argv, const char* name, int def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  return def;
}

// Three units (every Sequential entry with parameters is one): kIn -> H -> H -> kClasses.
std::shared_ptr<nn::Sequential> make_model(int64_t hidden) {
  Generator gen(7);
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Linear>(kIn, hidden, true, &gen));
  m->push_back(std::make_shared<nn::Tanh>());
  m->push_back(std::make_shared<nn::Linear>(hidden, hidden, true, &gen));
  m->push_back(std::make_shared<nn::Tanh>());
  m->push_back(std::make_shared<nn::Linear>(hidden, kClasses, true, &gen));
  m->to(kFloat64);
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = arg_int(argc, argv, "--steps", 8);
  const int hidden = arg_int(argc, argv, "--hidden", 256);
  try {
    AcceleratorConfig cfg;
    cfg.cpu = true;
    cfg.zero_stage = 3;  // accel-run's --zero_stage overrides it
    Accelerator acc(cfg);
    const dist::DeviceMesh& mesh = acc.mesh();
    const int dp = mesh.size("dp"), dp_rank = mesh.coordinate("dp");
    ACCEL_CHECK(kGlobalBatch % dp == 0, ValueError, "mh_hsdp", "dp size ", dp,
                " does not divide the global batch ", kGlobalBatch);
    auto model = make_model(hidden);
    int64_t numel = 0;
    for (const Tensor& p : model->parameters()) numel += p.numel();
    optim::AdamWOptions ao;
    ao.lr(1e-3);
    auto opt = std::make_shared<optim::AdamW>(model->parameters(), ao);
    auto [m, o] = acc.prepare(model, std::static_pointer_cast<optim::Optimizer>(opt));
    if (acc.is_main_process()) {
      std::cout << "mesh " << mesh.describe() << "\n"
                << "params " << numel << " " << numel * 8 << std::endl;
    }
    for (int s = 0; s < steps; ++s) {
      // The global batch of step s, the same on every rank; this data-parallel rank takes its
      // shard (the ranks of one tp group would take the same one).
      Generator gen(uint64_t(1000 + s));
      const int64_t per_rank = kGlobalBatch / dp;
      Tensor x = randn({kGlobalBatch, kIn}, TensorOptions(kFloat64), &gen);
      Tensor y = randint(0, kClasses, {kGlobalBatch}, TensorOptions(kInt64), &gen);
      Tensor xs = x.narrow(0, dp_rank * per_rank, per_rank).contiguous();
      Tensor ys = y.narrow(0, dp_rank * per_rank, per_rank).contiguous();
      Tensor loss = cross_entropy(m->forward(xs), ys);
      acc.backward(loss);
      o->step();
      o->zero_grad();
      const Tensor mean = acc.reduce(loss.detach().reshape({1}), "mean");
      if (acc.is_main_process()) {
        char line[80];
        std::snprintf(line, sizeof(line), "step %d loss %.15e", s, mean.item());
        std::cout << line << std::endl;
      }
    }
    const io::TensorDict full = acc.get_state_dict(*m);
    double abs_sum = 0, sq_sum = 0;
    for (const auto& [name, t] : full) {
      abs_sum += abs(t).sum().item();
      sq_sum += (t * t).sum().item();
    }
    if (acc.is_main_process()) {
      char line[96];
      std::snprintf(line, sizeof(line), "weights %.15e %.15e", abs_sum, sq_sum);
      std::cout << line << "\ndone" << std::endl;
    }
    acc.wait_for_everyone();
  } catch (const Error& e) {
    std::cout << "mh_hsdp: " << e.what() << std::endl;
    return 3;
  }
  return 0;
}
