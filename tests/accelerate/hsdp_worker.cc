// One rank of tests/accelerate/test_hsdp.cc: a small GPT (examples/models.h) trained in float64
// with AdamW through the Accelerator on the mesh the ACCEL_*_SIZE variables give (Note [mesh
// support] in accelerate/accelerator_mesh.cc), from optimizer step START to STOP.
//
//   hsdp_worker OUT STRATEGY START STOP LOAD_DIR SAVE_DIR SAVE_AT
//     STRATEGY  ddp | zero2 | fsdp (what a world of one process runs: nothing, as `ddp`)
//     LOAD_DIR  "-", or a checkpoint to resume from at step START
//     SAVE_DIR  "-", or where to save_state after optimizer step SAVE_AT
// Rank 0 prints, per micro-batch, "loss <micro-batch> <mean over the world, %a>" and, per
// optimizer step, "clip <step> <norm>"; every rank prints "rbytes <step> <bytes>" (what it sent
// on its dp_replicate group during that step) and, once, "grad_bytes <b> model_bytes <b>" (the
// strategy's gradient bytes per rank and one replica of the parameters). Rank 0 writes the whole
// state dict as OUT/final.safetensors at STOP, OUT/saved.safetensors at a save and
// OUT/loaded.safetensors after a load.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "accelerate/accelerator.h"
#include "io/safetensors.h"
#include "optim/optim.h"
#include "data/dataloader.h"
#include "examples/models.h"

using namespace accel;

namespace {

constexpr int kAccumulation = 2;
constexpr int64_t kGlobalBatch = 8;  // sequences per micro-batch, over all dp ranks

data::DatasetPtr token_dataset(const models::GptConfig& c) {
  Generator g(2024);
  const int64_t n = 64;
  Tensor seq = randint(0, c.vocab, {n, c.context + 1}, TensorOptions(kInt64), &g);
  return std::make_shared<data::TensorDataset>(std::vector<Tensor>{
      seq.narrow(1, 0, c.context).contiguous(), seq.narrow(1, 1, c.context).contiguous()});
}

void write_state(Accelerator& acc, const nn::Module& model, const std::string& path) {
  io::TensorDict sd = acc.get_state_dict(model);  // collective
  if (acc.is_main_process()) io::save_safetensors(path, sd);
}

int run(const std::string& out, const std::string& strategy, int start, int stop,
        const std::string& load, const std::string& save, int save_at) {
  AcceleratorConfig c;
  c.project_dir = out;
  c.strategy = strategy;
  c.gradient_accumulation_steps = kAccumulation;
  c.ddp.bucket_cap_bytes = 2048;  // several buckets
  c.fsdp.activation_checkpointing = std::getenv("HSDP_CHECKPOINTING") != nullptr;
  if (std::getenv("HSDP_BF16")) {  // bf16 compute parameters, float64 masters, reduced in float64
    c.fsdp.param_dtype = kBFloat16;
    c.fsdp.reduce_in_fp32 = true;
  }
  c.seed = 11;
  Accelerator acc(c);
  models::GptConfig gc;
  gc.vocab = 16;
  gc.context = 8;
  gc.layers = 2;
  gc.heads = 2;
  gc.d_model = 8;
  auto gpt = std::make_shared<models::Gpt>(gc);
  gpt->to(kFloat64);
  optim::AdamWOptions ao;
  ao.lr(3e-2);
  ao.weight_decay(0.01);
  auto opt = std::make_shared<optim::AdamW>(gpt->parameters(), ao);
  const int dp = acc.mesh().size("dp");
  data::DataLoaderOptions lo;
  lo.batch_size = kGlobalBatch / dp;
  auto loader = std::make_shared<data::DataLoader>(token_dataset(gc), lo);
  auto [model, aopt, aloader] = acc.prepare(std::static_pointer_cast<nn::Module>(gpt), opt, loader);
  const dist::ProcessGroupPtr& rep = acc.mesh().group("dp_replicate");
  if (load != "-") {
    acc.load_state(load);
    if (acc.step() != int64_t(start) * kAccumulation) {
      std::fprintf(stderr, "resumed at micro-batch %lld, expected %d\n", (long long)acc.step(),
                   start * kAccumulation);
      return 1;
    }
    write_state(acc, *model, out + "/loaded.safetensors");
  }
  int micro = start * kAccumulation;
  uint64_t sent = rep->bytes_sent();
  bool printed = false;
  while (micro < stop * kAccumulation) {
    for (auto& b : *aloader) {
      auto scope = acc.accumulate();
      Tensor loss = models::lm_loss(model->forward(b[0]), b[1]);
      acc.backward(loss);
      const bool sync = acc.sync_gradients();
      double norm = 0;
      if (sync) norm = acc.clip_grad_norm_(0.1);  // clips: its norm must be the model's
      aopt->step();
      aopt->zero_grad();
      const double l = acc.reduce(loss.detach(), "mean").item<double>();
      if (acc.is_main_process()) std::printf("loss %d %a\n", micro, l);
      ++micro;
      if (sync) {
        const int step = micro / kAccumulation;
        if (acc.is_main_process()) std::printf("clip %d %a\n", step, norm);
        std::printf("rbytes %d %llu\n", step, (unsigned long long)(rep->bytes_sent() - sent));
        if (!printed) {
          const dist::StrategyMemory m = acc.memory();
          std::printf("grad_bytes %lld model_bytes %lld\n", (long long)m.grad_bytes,
                      (long long)m.full_param_bytes);
          printed = true;
        }
        if (save != "-" && step == save_at) {
          acc.save_state(save);
          write_state(acc, *model, out + "/saved.safetensors");
        }
        sent = rep->bytes_sent();
      }
      if (micro == stop * kAccumulation) break;
    }
  }
  write_state(acc, *model, out + "/final.safetensors");
  std::printf("ok hsdp\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr, "usage: hsdp_worker OUT STRATEGY START STOP LOAD_DIR SAVE_DIR SAVE_AT\n");
    return 64;
  }
  try {
    return run(argv[1], argv[2], std::atoi(argv[3]), std::atoi(argv[4]), argv[5], argv[6],
               std::atoi(argv[7]));
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", e.what());
    return 3;
  }
}
