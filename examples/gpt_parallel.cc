// gpt_parallel: the byte-level GPT of char_gpt (875,264 parameters) trained on the fortunes text
// on a device mesh given on the command line: tensor parallelism (Megatron's layout:
// models::gpt_tp_plan, optionally with sequence parallelism and the vocabulary-parallel loss)
// composed with context parallelism (each sequence split over the cp ranks, ring attention:
// models::gpt_cp_plan), pipeline parallelism (the layers cut into stages, microbatches under
// GPipe / 1F1B / interleaved 1F1B: Accelerator::forward_backward) and data parallelism (DDP, or
// ZeRO-3 over dp_shard, replicated over dp_replicate).
//
//   build/launcher/accel-run launch --num_processes 4 --cpu build/examples/gpt_parallel
//       --tp 2 --zero-stage 3 --steps 200            # (one line) tp 2 x shard 2 (2-D)
//   ... --num_processes 4 ... --tp 4 --sequence-parallel --loss-parallel
//   ... --num_processes 4 ... --dp-replicate 2 --zero-stage 3   # HSDP 2 x 2, no tp
//   ... --num_processes 4 ... --cp 2 --tp 2                     # cp 2 x tp 2
//   ... --num_processes 4 ... --pp 2 --microbatches 4 --zero-stage 3   # pp 2 x shard 2
//
// The mesh's sizes may come from accel-run instead (--tp_size, --cp_size, --pp_size,
// --dp_replicate_size, --dp_shard_size, --zero_stage): those override these flags.
// docs/parallelism.md says how to choose a mesh. Prints the mesh, what one rank holds, the loss
// every 20 steps, ms per step.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "accel.h"
#include "data/data.h"
#include "accelerate/accelerator.h"
#include "examples/common.h"
#include "examples/models.h"

namespace {

using namespace accel;

struct MeshArgs {
  int tp = 0;            // 0: unset (accel-run's --tp_size, else 1)
  int cp = 0;            // 0: unset (accel-run's --cp_size, else 1)
  int pp = 0;            // 0: unset (accel-run's --pp_size, else 1)
  int microbatches = 1;  // per step, under pp
  std::string schedule = "1f1b";
  int dp_replicate = 0;  // 0: unset
  int zero_stage = -1;   // -1: accel-run's --zero_stage, else 0 (DDP)
  bool sequence_parallel = false;
  bool loss_parallel = false;
  double grad_clip = 1.0;
};

int run(const examples::Args& args, const MeshArgs& ma) {
  examples::finish_args(args);
  AcceleratorConfig cfg = examples::accelerator_config(args);
  if (ma.tp > 0) cfg.parallelism.tp_size = ma.tp;
  if (ma.cp > 0) cfg.parallelism.cp_size = ma.cp;
  if (ma.pp > 0) cfg.parallelism.pp_size = ma.pp;
  if (ma.dp_replicate > 0) cfg.parallelism.dp_replicate_size = ma.dp_replicate;
  if (ma.zero_stage >= 0) cfg.zero_stage = ma.zero_stage;
  cfg.tp_plan = models::gpt_tp_plan(
      {.sequence_parallel = ma.sequence_parallel, .loss_parallel = ma.loss_parallel});
  cfg.cp_plan = models::gpt_cp_plan();  // used when cp_size > 1
  // Used when pp_size > 1: the layers (embed, blocks.i, head) cut evenly into stages.
  cfg.pipeline.microbatches = ma.microbatches;
  cfg.pipeline.schedule = ma.schedule == "gpipe"  ? dist::PipelineScheduleKind::GPipe
                          : ma.schedule == "1f1b" ? dist::PipelineScheduleKind::OneFOneB
                                                  : dist::PipelineScheduleKind::Interleaved1F1B;
  cfg.pipeline.chunks = ma.schedule == "interleaved" ? 2 : 1;
  Accelerator acc(cfg);
  const dist::DeviceMesh& mesh = acc.mesh();
  const int tp = mesh.size("tp");

  const std::string dir = args.data_dir.empty() ? data::kFortunesDir : args.data_dir;
  const int64_t batch = args.batch_size > 0 ? args.batch_size : 32;  // global, split over dp
  const double lr = args.lr > 0 ? args.lr : 1e-3;
  const models::GptConfig gc;
  auto tokens =
      data::TokenFile::from_bytes(data::read_fortunes_corpus(dir), data::TokenType::UInt8, "train");
  // The same seed on every rank: every tp rank cuts its shards from the same full model.
  Generator gen(args.seed + 1);
  auto model = std::make_shared<models::Gpt>(gc, &gen);
  const int64_t params = model->num_parameters();
  optim::AdamWOptions ao;
  ao.lr(lr);
  auto opt = std::make_shared<optim::AdamW>(model->parameters(), ao);
  data::DataLoaderOptions lo;
  lo.batch_size = batch;
  lo.shuffle = true;
  lo.drop_last = true;
  lo.seed = args.seed;
  auto loader = std::make_shared<data::DataLoader>(
      std::make_shared<data::TokenWindowDataset>(tokens, gc.context, /*stride=*/1), lo);
  auto [m, o, l] = acc.prepare(model, std::static_pointer_cast<optim::Optimizer>(opt), loader);

  acc.print("gpt_parallel: mesh ", mesh.describe(), " (", acc.num_processes(),
            " processes), strategy ", acc.config().strategy,
            ma.sequence_parallel ? ", sequence parallel" : "",
            ma.loss_parallel ? ", vocabulary-parallel loss" : "", "; ", params, " parameters");
  char line[240];
  acc.print("training ", args.steps, " steps, global batch ", batch, " x ", gc.context,
            " bytes, AdamW lr ", lr, ", grad clip ", ma.grad_clip);

  examples::Progress progress(acc, "train", args.steps, 20);
  examples::RunningLoss running(20);
  int64_t step = 0;
  while (step < args.steps) {
    for (auto& b : *l) {
      const Tensor x = b[0].to(acc.device()), y = b[1].to(acc.device());
      // With the vocabulary-parallel loss the logits stay split over tp: (B, T, vocab / tp).
      // Under pp the stages run as a pipeline; the loss is the batch's on every rank.
      const Tensor loss =
          acc.forward_backward(*m, x, y, [&](const Tensor& logits, const Tensor& target) {
            return ma.loss_parallel && tp > 1
                       ? models::lm_loss_parallel(logits, target, mesh.group("tp"))
                       : models::lm_loss(logits, target);
          });
      if (ma.grad_clip > 0) acc.clip_grad_norm_(ma.grad_clip);
      const double used_lr = o->lr();
      o->step();
      o->zero_grad();
      ++step;
      const double v = loss.item();
      running.add(acc, v, step == args.steps);
      progress.update(step, running.value(v), used_lr);
      if (step == args.steps) break;
    }
  }
  std::snprintf(line, sizeof line, "final training loss %.4f nats/byte, %.1fs, %.1f ms/step",
                running.value(), progress.elapsed(), 1e3 * progress.elapsed() / double(args.steps));
  acc.print(line);
  // What this rank holds: its tp shards, of which ZeRO-3 keeps 1 / dp_shard.
  int64_t local = 0;
  for (const Tensor& p : m->parameters()) local += p.numel();
  const dist::StrategyMemory mem = acc.memory();
  std::snprintf(line, sizeof line,
                "rank 0: its pieces (tp shards, pp stage) hold %lld of the %lld parameters; it "
                "keeps %.2f MB of "
                "parameters, %.2f MB of gradients, %.2f MB of optimizer state",
                static_cast<long long>(local), static_cast<long long>(params),
                double(mem.param_bytes) / 1e6, double(mem.grad_bytes) / 1e6,
                double(mem.optimizer_bytes) / 1e6);
  acc.print(line);
  if (!args.checkpoint.empty()) {
    acc.save_model(*m, args.checkpoint);  // full tensors: loads into char_gpt --eval-only
    acc.print("saved ", args.checkpoint);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  examples::Args args;
  args.steps = 200;
  MeshArgs ma;
  CLI::App app("Byte-level GPT on the fortunes text on a device mesh (tensor x data parallel)",
               "gpt_parallel");
  examples::add_common_options(app, args, /*epochs=*/false);
  app.add_option("--tp", ma.tp, "tensor-parallel size (0: accel-run's --tp_size, else 1)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--cp", ma.cp,
                 "context-parallel size: each sequence split over cp ranks (0: accel-run's "
                 "--cp_size, else 1)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--pp", ma.pp,
                 "pipeline stages: the layers cut over pp ranks (0: accel-run's --pp_size, else 1)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--microbatches", ma.microbatches, "microbatches per step under --pp")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--schedule", ma.schedule,
                 "pipeline schedule: gpipe, 1f1b or interleaved (2 chunks per rank)")
      ->capture_default_str()
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved"}));
  app.add_option("--dp-replicate", ma.dp_replicate,
                 "replicas (HSDP with --zero-stage 3; 0: accel-run's, else 1)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--zero-stage", ma.zero_stage,
                 "0 (DDP over dp) or 3 (ZeRO-3 over dp_shard); 1-2 without --tp; -1: accel-run's")
      ->capture_default_str()
      ->check(CLI::Range(-1, 3));
  app.add_flag("--sequence-parallel", ma.sequence_parallel,
               "LayerNorms and residuals on sequence chunks (context 128 divisible by tp)");
  app.add_flag("--loss-parallel", ma.loss_parallel,
               "keep the logits split over tp: vocabulary-parallel cross-entropy");
  app.add_option("--grad-clip", ma.grad_clip, "clip the gradient norm to this (0: off)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  return examples::run_example(app, argc, argv, [&] { return run(args, ma); });
}
