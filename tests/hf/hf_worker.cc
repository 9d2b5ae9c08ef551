// One rank of tests/hf/test_hf_dist.cc: a Hugging Face model from a fixture directory
// (tests/hf/fixtures) under the Accelerator with the strategy of the ACCEL_* variables
// (ACCEL_TP_SIZE with hf::tp_plan_for, ACCEL_ZERO_STAGE), prepared first and loaded with
// acc.load_model(dir) (ZeRO-3 ranks read their shards only, tp ranks their part), in float64.
//   hf_worker <model dir> <input_ids file> <out file>
// <input_ids file>: a safetensors file holding "input_ids" (B, T) int64. Rank 0 writes <out>
// (safetensors): "logits" (B, T, V) of input_ids, "greedy" (8 new tokens, KV cache), "sampled"
// (6 new tokens, seed 5, top-k 20, top-p 0.9), "losses" (2): the language-model loss of two
// AdamW steps on input_ids (every rank the same batch, so each strategy computes the 1-process
// steps), "logits_after" after them. Prints "ok hf" on success.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <memory>
#include <string>

#include "accelerate/accelerator.h"
#include "io/safetensors.h"
#include "autograd/ops.h"
#include "optim/adam.h"
#include "hf/hf.h"
#include "tests/common/util.h"
#include "tests/common/worker_check.h"

using namespace accel;

namespace {

int run(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: hf_worker <model dir> <input_ids file> <out file>\n";
    return 2;
  }
  const std::string dir = argv[1], out = argv[3];
  const Tensor ids = nn::load_safetensors(argv[2]).at("input_ids");

  Generator init(1);  // the same initial values on every rank (then overwritten by the load)
  std::shared_ptr<hf::CausalLM> model;
  {
    // Nothing allocated before prepare under ZeRO-3 (each rank then holds 1/N) and in one
    // process (load_model allocates it); DDP and tensor parallelism split or broadcast the
    // initial values, so they need them.
    const char* stage = std::getenv("ACCEL_ZERO_STAGE");
    const bool deferred =
        std::getenv("WORLD_SIZE") == nullptr || (stage != nullptr && std::string(stage) == "3");
    std::optional<nn::DeferredInit> guard;
    if (deferred) guard.emplace();
    model = hf::from_config(dir, &init);
  }
  model->to(kFloat64);
  AcceleratorConfig cfg;
  cfg.cpu = true;
  cfg.project_dir = "/tmp";
  cfg.log_with = {};
  cfg.tp_plan = hf::tp_plan_for(*model);  // used when ACCEL_TP_SIZE > 1
  Accelerator acc(cfg);
  test::g_rank = acc.process_index();
  auto opt = std::make_shared<optim::AdamW>(model->parameters(), optim::AdamWFields{.lr = 1e-2});
  auto [m, o] = acc.prepare(model, std::static_pointer_cast<optim::Optimizer>(opt));
  acc.load_model(*m, dir);
  m->eval();

  nn::TensorDict result;
  {
    NoGradGuard ng;
    result["logits"] = (*m)(ids).contiguous();
  }
  result["greedy"] = hf::generate(*m, ids, {.max_new_tokens = 8});
  result["sampled"] = hf::generate(
      *m, ids, {.max_new_tokens = 6, .do_sample = true, .top_k = 20, .top_p = 0.9, .seed = 5});
  // Fine-tuning: next-token loss over the batch, two AdamW steps.
  const int64_t T = ids.size(1), V = m->vocab_size();
  const Tensor x = ids.narrow(1, 0, T - 1).contiguous(), y = ids.narrow(1, 1, T - 1).contiguous();
  std::vector<double> losses;
  for (int step = 0; step < 2; ++step) {
    const Tensor logits = (*m)(x);
    const Tensor loss = cross_entropy(logits.reshape({-1, V}), y.reshape({-1}));
    acc.backward(loss);
    o->step();
    o->zero_grad();
    losses.push_back(loss.item<double>());
  }
  result["losses"] = tensor(losses, {2});
  {
    NoGradGuard ng;
    result["logits_after"] = (*m)(ids).contiguous();
  }
  // A tensor-parallel rank holds its part of each split projection.
  if (acc.mesh().size("tp") > 1) {
    const std::string w = m->model_type() == "gpt2" ? "transformer.h.0.attn.c_attn.weight"
                                                    : "model.layers.0.self_attn.k_proj.weight";
    const Shape want = m->model_type() == "gpt2" ? Shape{32, 48} : Shape{8, 32};
    WCHECK(m->parameter(w).sizes() == want, w << " is " << m->parameter(w).shape_str());
    // hf's own save / load would treat those parts as whole tensors: refused, naming the way.
    const std::string tmp = "/tmp/accel-hf-tp-" + std::to_string(::getpid());
    auto refusal = [](const auto& f) -> std::string {
      try {
        f();
      } catch (const ValueError& e) {
        return e.what();
      }
      return "(no ValueError)";
    };
    for (const std::string& msg : {refusal([&] { hf::save_pretrained(*m, tmp); }),
                                   refusal([&] { hf::load_weights(*m, dir); })})
      WCHECK(test::contains(msg, "split by tensor parallelism") &&
                 test::contains(msg, "the Accelerator's"),
             "hf save / load of a tp-split model: " << msg);
    WCHECK(!std::filesystem::exists(tmp), "the refused save wrote nothing");
  }
  if (acc.is_main_process()) nn::save_safetensors(out, result);
  acc.wait_for_everyone();
  if (test::g_failures == 0) std::cout << "ok hf" << std::endl;
  return test::g_failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cout << "rank " << test::g_rank << " error: " << e.what() << std::endl;
    return 1;
  }
}
