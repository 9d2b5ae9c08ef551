// char_gpt: the `gpt` workload of WORKLOADS.md (byte-level GPT, 875,264 parameters, batch 32
// windows of 128 bytes, AdamW) trained on the fortunes text through the Accelerator, then a
// held-out loss and a sampled text.
//
//   build/examples/char_gpt [--steps 2000] [--checkpoint gpt.safetensors]
//   build/examples/char_gpt --eval-only --checkpoint gpt.safetensors [--prompt "Q: "]
//   build/launcher/accel-run launch --num_processes 2 --cpu build/examples/char_gpt
//
// Data: the corpus (every fortunes file in sorted name order, as bytes) is split once: the last
// kHeldOutFraction of the bytes are held out for evaluation, training windows start at every
// byte offset of the rest and are drawn in shuffled order.
//
// Schedule: --schedule constant is the bench workload (lr 3e-4 throughout); the default,
// warmup-cosine, warms up linearly over --warmup steps to --lr and decays to 10 % of it at the
// last step (see docs/examples.md for what each reaches).
#include <algorithm>
#include <cmath>
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

constexpr double kHeldOutFraction = 0.05;
constexpr int64_t kDefaultBatch = 32;
constexpr double kMinLrRatio = 0.1;  // cosine decays to this fraction of --lr

struct GptArgs {
  std::string schedule = "warmup-cosine";
  int64_t warmup = 100;
  double grad_clip = 1.0;  // 0: off
  int64_t sample_bytes = 400;
  double temperature = 0.8;
  std::string prompt = "\n";
  int64_t eval_batches = 0;  // 0: every held-out window
};

// Mean loss per byte over the held-out windows (each window once, whatever the process count).
double held_out_loss(Accelerator& acc, models::Gpt& model, data::DataLoader& loader,
                     int64_t max_batches) {
  NoGradGuard ng;
  model.eval();
  double sum_loss = 0;
  int64_t windows = 0, seen = 0;
  for (auto& b : loader) {
    if (max_batches > 0 && seen++ >= max_batches) break;
    const Tensor x = b[0].to(acc.device()), y = b[1].to(acc.device());
    const Tensor logits = model.forward(x);  // (b, T, V)
    // Per-window mean loss (b), so padded rows can be dropped before averaging.
    const Tensor per_byte = cross_entropy(logits.reshape({-1, logits.size(-1)}), y.reshape({-1}),
                                          -100, Reduction::None);
    const Tensor per_window = mean(per_byte.reshape({x.size(0), x.size(1)}), {1}).to(kFloat64);
    const Tensor all = acc.gather_for_metrics(per_window, b);
    sum_loss += sum(all).item();
    windows += all.numel();
  }
  if (max_batches > 0) loader.seek(loader.epoch(), 0);  // left early: restart next time
  model.train();
  return windows ? sum_loss / double(windows) : 0;
}

// Samples `n` bytes after `prompt` with softmax(logits / temperature); printable ASCII and
// newlines are kept, other bytes are shown as '?'.
std::string sample_text(models::Gpt& model, const std::string& prompt, int64_t n,
                        double temperature, uint64_t seed) {
  NoGradGuard ng;
  model.eval();
  Generator gen(seed);
  std::vector<int64_t> ctx(prompt.begin(), prompt.end());
  for (auto& c : ctx) c = int64_t(uint8_t(c));
  if (ctx.empty()) ctx.push_back('\n');
  std::string out;
  const int64_t T = model.config.context;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = std::min<int64_t>(T, int64_t(ctx.size()));
    Tensor x = empty({1, t}, kInt64);
    std::copy(ctx.end() - t, ctx.end(), x.data<int64_t>());
    const Tensor last = model.forward(x).select(0, 0).select(0, t - 1);  // (V)
    const std::vector<double> p = softmax(div(last, temperature), -1).tolist();
    double u = gen.next_double(), acc = 0;
    int64_t next = int64_t(p.size()) - 1;
    for (size_t k = 0; k < p.size(); ++k) {
      acc += p[k];
      if (u < acc) {
        next = int64_t(k);
        break;
      }
    }
    ctx.push_back(next);
    const bool printable = next == '\n' || next == '\t' || (next >= 32 && next < 127);
    out.push_back(printable ? char(next) : '?');
  }
  model.train();
  return out;
}

int run(const examples::Args& args, const GptArgs& g) {
  examples::finish_args(args);
  Accelerator acc(examples::accelerator_config(args));
  const std::string dir = args.data_dir.empty() ? data::kFortunesDir : args.data_dir;
  const int64_t batch = args.batch_size > 0 ? args.batch_size : kDefaultBatch;
  const double lr = args.lr > 0 ? args.lr : (g.schedule == "constant" ? 3e-4 : 1e-3);

  std::vector<uint8_t> corpus = data::read_fortunes_corpus(dir);
  const models::GptConfig cfg;
  const int64_t T = cfg.context;
  const int64_t held = std::max<int64_t>(T + 1, int64_t(double(corpus.size()) * kHeldOutFraction));
  ACCEL_CHECK(int64_t(corpus.size()) > held + T + 1, ValueError, "char_gpt", "the corpus in ", dir,
              " has only ", corpus.size(), " bytes");
  std::vector<uint8_t> val_bytes(corpus.end() - held, corpus.end());
  corpus.resize(corpus.size() - size_t(held));
  auto train_tokens =
      data::TokenFile::from_bytes(std::move(corpus), data::TokenType::UInt8, "train");
  auto val_tokens =
      data::TokenFile::from_bytes(std::move(val_bytes), data::TokenType::UInt8, "held-out");

  auto model = std::make_shared<models::Gpt>(cfg);  // asserts the 875,264 parameters
  data::DataLoaderOptions vo;
  vo.batch_size = 64;
  auto val_loader = acc.prepare_data_loader(std::make_shared<data::DataLoader>(
      std::make_shared<data::TokenWindowDataset>(val_tokens, T), vo));  // non-overlapping windows

  acc.print("char_gpt: ", model->num_parameters(), " parameters, ", train_tokens->size(),
            " training bytes, ", val_tokens->size(), " held-out bytes, ", acc.num_processes(),
            " process(es) x ", omp_get_max_threads(), " thread(s)");

  if (args.eval_only) {
    model->load(args.checkpoint);
    model = acc.prepare_model(model);
    const double vl = held_out_loss(acc, *model, *val_loader, g.eval_batches);
    char line[160];
    std::snprintf(line, sizeof line, "eval %s: held-out loss %.4f nats/byte",
                  args.checkpoint.c_str(), vl);
    acc.print(line);
    if (acc.is_main_process())
      acc.print("sample:\n", g.prompt,
                sample_text(*model, g.prompt, g.sample_bytes, g.temperature, args.seed));
    return 0;
  }

  data::DataLoaderOptions lo;
  lo.batch_size = batch;
  lo.shuffle = true;
  lo.drop_last = true;
  lo.seed = args.seed;
  auto train_loader = std::make_shared<data::DataLoader>(
      std::make_shared<data::TokenWindowDataset>(train_tokens, T, /*stride=*/1), lo);
  optim::AdamWOptions ao;  // betas 0.9/0.999, eps 1e-8, weight decay 0.01
  ao.lr(lr);
  auto opt = std::make_shared<optim::AdamW>(model->parameters(), ao);
  const int64_t warmup = std::min(g.warmup, args.steps);  // a short run warms up throughout
  std::shared_ptr<optim::LRScheduler> sched;
  if (g.schedule == "constant")
    sched = std::make_shared<optim::ConstantLR>(*opt, 1.0, 0);
  else
    sched = std::make_shared<optim::WarmupDecayLR>(*opt, warmup, args.steps, optim::Decay::Cosine,
                                                   kMinLrRatio);
  auto [m, o, loader, s] = acc.prepare(model, opt, train_loader, sched);

  const std::string schedule_text =
      g.schedule == "constant" ? "constant"
                               : "warm-up " + std::to_string(warmup) + " steps + cosine to " +
                                     std::to_string(int(kMinLrRatio * 100)) + " %";
  acc.print("training ", args.steps, " steps, global batch ", batch, " x ", T, " bytes, AdamW lr ",
            lr, ", schedule ", schedule_text, ", grad clip ", g.grad_clip);
  examples::Progress progress(acc, "train", args.steps);
  examples::RunningLoss running(10), tail(50);
  int64_t step = 0;
  double last_window = 0;
  while (step < args.steps) {
    for (auto& b : *loader) {
      auto scope = acc.accumulate();
      Tensor loss;
      {
        auto ac = acc.autocast();
        loss = models::lm_loss(m->forward(b[0].to(acc.device())), b[1].to(acc.device()));
      }
      acc.backward(loss);
      if (g.grad_clip > 0) acc.clip_grad_norm_(g.grad_clip);
      const double used_lr = o->lr();
      o->step();
      s->step();
      o->zero_grad();
      ++step;
      const double l = loss.item();
      running.add(acc, l, step == args.steps);
      // The quality figure: mean training loss over the last 50 steps (a single step's loss
      // moves by about +-0.1 from batch to batch).
      if (args.steps - step < 50 && tail.add(acc, l, step == args.steps))
        last_window = tail.value();
      progress.update(step, running.value(l), used_lr);
      if (step == args.steps) break;
    }
  }
  char line[200];
  std::snprintf(
      line, sizeof line,
      "final training loss %.4f nats/byte (mean of the last %lld steps), %.1fs, %.1f ms/step",
      last_window, static_cast<long long>(std::min<int64_t>(50, args.steps)), progress.elapsed(),
      1e3 * progress.elapsed() / double(args.steps));
  acc.print(line);
  const double vl = held_out_loss(acc, *m, *val_loader, g.eval_batches);
  std::snprintf(line, sizeof line, "held-out loss %.4f nats/byte", vl);
  acc.print(line);
  // Every rank samples (the same text, same seed): under zero_stage 3 each block's forward
  // gathers its parameters from all ranks, so a forward on the main process alone would wait.
  const std::string sample = sample_text(*m, g.prompt, g.sample_bytes, g.temperature, args.seed);
  acc.print("sample:\n", g.prompt, sample);
  if (!args.checkpoint.empty()) {
    acc.save_model(*m, args.checkpoint);  // collective; streams unit by unit under ZeRO-3
    acc.print("saved ", args.checkpoint);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  examples::Args args;
  GptArgs g;
  CLI::App app(
      "Byte-level GPT (875,264 parameters) on the fortunes text, trained through "
      "accel::Accelerator",
      "char_gpt");
  examples::add_common_options(app, args, /*epochs=*/false);
  app.add_option("--schedule", g.schedule,
                 "constant (the bench workload: lr 3e-4) or warmup-cosine (default lr 1e-3)")
      ->capture_default_str()
      ->check(CLI::IsMember({"constant", "warmup-cosine"}));
  app.add_option("--warmup", g.warmup, "linear warm-up steps of warmup-cosine")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--grad-clip", g.grad_clip, "clip the gradient norm to this (0: off)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--sample-bytes", g.sample_bytes, "bytes to sample after training")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--temperature", g.temperature, "sampling temperature")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--prompt", g.prompt, "text the sample continues")->capture_default_str();
  app.add_option("--eval-batches", g.eval_batches,
                 "held-out batches of 64 windows to evaluate (0: all)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  return examples::run_example(app, argc, argv, [&] { return run(args, g); });
}
