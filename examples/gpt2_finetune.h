// Fine-tuning a Hugging Face GPT-2 as a causal language model on a text file, then sampling from
// it: transformers' examples/pytorch/language-modeling/run_clm_no_trainer.py (the Accelerate
// version of run_clm.py), ported. The pieces the program (examples/gpt2_finetune.cc) and its
// PyTorch twin test (tests/examples/test_gpt2_finetune.cc) share:
//
//   data:      the file's lines (each keeping its "\n"), the first validation_split_percentage %
//              for validation; every line tokenized, concatenated per group of 1,000 lines (the
//              datasets map batch run_clm's group_texts sees) and cut into blocks of block_size
//              tokens, the remainder dropped; labels = input_ids.
//   loss:      GPT2LMHeadModel's: cross-entropy of logits[:, :-1] against input_ids[:, 1:], the
//              mean over every predicted token.
//   optimizer: AdamW(lr, betas 0.9 / 0.999, eps 1e-8) with weight_decay on every parameter but
//              the biases and the LayerNorm (RMSNorm) weights (transformers' Trainer grouping);
//              get_scheduler(linear | cosine | constant | constant_with_warmup, warm-up steps,
//              total optimizer steps), stepped once per optimizer step.
//   step:      under acc.accumulate(): forward, acc.backward(loss) (divided by the accumulation
//              steps there), on sync steps clip_grad_norm_(max_grad_norm) when set, then
//              optimizer / scheduler step and zero_grad (no-ops while accumulating).
#pragma once

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "accel.h"
#include "accelerate/accelerator.h"
#include "hf/hf.h"

namespace accel::examples::gpt2_ft {

// The text <-> ids of a run: the GPT-2 tokenizer of a folder (tokenizer.json, or vocab.json +
// merges.txt), or, when the folder has none, the bytes themselves as ids 0..255.
class TextTokenizer {
 public:
  static TextTokenizer bytes() { return TextTokenizer(); }
  explicit TextTokenizer(hf::GPT2Tokenizer bpe) : bpe_(std::move(bpe)) {}
  // `dir`'s tokenizer; without tokenizer files the byte fallback, and `note` (when given) says
  // so. Malformed tokenizer files are an IoError naming the file, as always.
  static TextTokenizer for_folder(const std::string& dir, std::string* note = nullptr) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path d(dir);
    const bool has = fs::exists(d / "tokenizer.json", ec) ||
                     (fs::exists(d / "vocab.json", ec) && fs::exists(d / "merges.txt", ec));
    if (has) return TextTokenizer(hf::GPT2Tokenizer::from_pretrained(dir));
    if (note)
      *note = "no tokenizer in '" + dir +
              "' (tokenizer.json, or vocab.json + merges.txt): using the bytes of the text as "
              "token ids 0-255";
    return bytes();
  }

  bool is_bytes() const { return !bpe_; }
  const hf::GPT2Tokenizer* bpe() const { return bpe_ ? &*bpe_ : nullptr; }
  int64_t vocab_size() const { return bpe_ ? bpe_->vocab_size() : 256; }
  std::optional<int64_t> eos_token_id() const { return bpe_ ? bpe_->eos_token_id() : std::nullopt; }
  std::vector<int64_t> encode(std::string_view text) const {
    if (bpe_) return bpe_->encode(text);
    std::vector<int64_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = int64_t(uint8_t(text[i]));
    return ids;
  }
  // Invalid UTF-8 (a character cut by the end of a sample) shows as U+FFFD.
  std::string decode(std::span<const int64_t> ids) const {
    if (bpe_) return bpe_->decode(ids);
    std::string s;
    for (int64_t id : ids) {
      ACCEL_CHECK(id >= 0 && id < 256, ValueError, "gpt2_finetune", "id ", id,
                  " is not a byte (the byte tokenizer has ids 0-255)");
      s.push_back(char(uint8_t(id)));
    }
    return hf::decode_utf8_replace(s);
  }

 private:
  TextTokenizer() = default;
  std::optional<hf::GPT2Tokenizer> bpe_;
};

// datasets' "text" loader: one example per line, each keeping its "\n" (keep_linebreaks, the
// default) or not.
inline std::vector<std::string> split_lines(const std::string& text, bool keep_linebreaks = true) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    const bool nl = end != std::string::npos;
    if (!nl) end = text.size();
    lines.push_back(text.substr(start, end - start + (nl && keep_linebreaks ? 1 : 0)));
    start = end + 1;
  }
  return lines;
}

// datasets' split "train[:p%]" (validation) and "train[p%:]" (training): the first
// round(n * p / 100) lines, and the rest.
inline std::pair<std::vector<std::string>, std::vector<std::string>> split_validation(
    const std::vector<std::string>& lines, double percent) {
  const size_t k =
      std::min(lines.size(), size_t(std::llround(double(lines.size()) * percent / 100)));
  return {std::vector<std::string>(lines.begin() + int64_t(k), lines.end()),
          std::vector<std::string>(lines.begin(), lines.begin() + int64_t(k))};
}

// run_clm's tokenize_function + group_texts: each line's ids, concatenated per group of
// `group_lines` lines (the datasets map batch), cut into blocks of block_size, the remainder of
// each group dropped -> (blocks, block_size) int64.
inline Tensor group_texts(const TextTokenizer& tok, const std::vector<std::string>& lines,
                          int64_t block_size, size_t group_lines = 1000) {
  ACCEL_CHECK(block_size >= 2, ValueError, "gpt2_finetune", "block_size must be >= 2, got ",
              block_size);
  std::vector<int64_t> blocks, group;
  for (size_t g = 0; g < lines.size(); g += group_lines) {
    group.clear();
    for (size_t i = g; i < std::min(lines.size(), g + group_lines); ++i) {
      const std::vector<int64_t> ids = tok.encode(lines[i]);
      group.insert(group.end(), ids.begin(), ids.end());
    }
    const size_t keep = group.size() / size_t(block_size) * size_t(block_size);
    blocks.insert(blocks.end(), group.begin(), group.begin() + int64_t(keep));
  }
  const int64_t n = int64_t(blocks.size()) / block_size;
  return tensor(blocks, {n, block_size}, TensorOptions(kInt64));
}

// GPT2LMHeadModel's loss with labels = input_ids: logits (B, T, V), input_ids (B, T) -> the mean
// cross-entropy of each position's prediction of the next token.
inline Tensor clm_loss(const Tensor& logits, const Tensor& input_ids) {
  const int64_t T = input_ids.size(1), V = logits.size(-1);
  const Tensor shift_logits = logits.narrow(1, 0, T - 1).reshape({-1, V});
  const Tensor shift_labels = input_ids.narrow(1, 1, T - 1).reshape({-1});
  return cross_entropy(shift_logits, shift_labels);
}

// AdamW with transformers' Trainer grouping: weight decay on every parameter except the biases
// and the weights of LayerNorm / RMSNorm modules. (run_clm_no_trainer.py's name list
// ["bias", "layer_norm.weight"] misses GPT-2's ln_1 / ln_2 / ln_f; the grouping by module type
// is what Trainer does, and what was meant.)
inline std::shared_ptr<optim::AdamW> make_optimizer(hf::CausalLM& model, double lr,
                                                    double weight_decay) {
  std::set<const void*> no_decay;
  for (const auto& [name, m] : model.named_modules()) {
    const bool norm = dynamic_cast<nn::LayerNorm*>(m) || dynamic_cast<hf::LlamaRMSNorm*>(m);
    for (const auto& [pname, p] : m->named_parameters(/*recurse=*/false))
      if (norm || pname == "bias") no_decay.insert(p.impl());
  }
  optim::ParamGroup decay{.params = {}, .lr = std::nullopt, .weight_decay = weight_decay};
  optim::ParamGroup keep{.params = {}, .lr = std::nullopt, .weight_decay = 0.0};
  for (const Tensor& p : model.parameters())
    (no_decay.count(p.impl()) ? keep : decay).params.push_back(p);
  return std::make_shared<optim::AdamW>(std::vector<optim::ParamGroup>{decay, keep},
                                        optim::AdamWFields{.lr = lr, .weight_decay = weight_decay});
}

// transformers' get_scheduler for the types run_clm_no_trainer offers (the restarts and
// polynomial ones aside), in optimizer steps.
inline std::shared_ptr<optim::LRScheduler> make_scheduler(optim::Optimizer& opt,
                                                          const std::string& type, int64_t warmup,
                                                          int64_t total) {
  if (type == "linear")
    return std::make_shared<optim::WarmupDecayLR>(opt, warmup, total, optim::Decay::Linear);
  if (type == "cosine")
    return std::make_shared<optim::WarmupDecayLR>(opt, warmup, total, optim::Decay::Cosine);
  if (type == "constant") return std::make_shared<optim::ConstantLR>(opt, 1.0, 0);
  ACCEL_CHECK(type == "constant_with_warmup", ValueError, "gpt2_finetune",
              "unknown lr_scheduler_type '", type,
              "' (linear, cosine, constant, constant_with_warmup)");
  return std::make_shared<optim::LambdaLR>(opt, [warmup](int64_t step) {
    return step < warmup ? double(step) / double(std::max<int64_t>(1, warmup)) : 1.0;
  });
}

// One micro-batch of the training loop: input_ids (B, T) -> its loss (before the division by
// the accumulation steps) and, on a sync step with max_grad_norm > 0, the gradient norm before
// clipping (NaN otherwise). The optimizer steps on sync steps only (AcceleratedOptimizer).
struct MicroStep {
  double loss;
  double grad_norm;
};
inline MicroStep train_micro_step(Accelerator& acc, hf::CausalLM& model, AcceleratedOptimizer& opt,
                                  AcceleratedScheduler& sched, const Tensor& input_ids,
                                  double max_grad_norm) {
  auto scope = acc.accumulate();
  Tensor loss;
  {
    auto ac = acc.autocast();
    loss = clm_loss(model(input_ids), input_ids);
  }
  acc.backward(loss);
  double norm = std::nan("");
  if (acc.sync_gradients() && max_grad_norm > 0) norm = acc.clip_grad_norm_(max_grad_norm);
  opt.step();
  sched.step();
  opt.zero_grad();
  return {loss.item<double>(), norm};
}

// run_clm_no_trainer's evaluation: each batch's mean loss counted once per example (rows that
// even_batches repeated dropped), averaged over the validation set. Returns to training mode.
inline double evaluate(Accelerator& acc, hf::CausalLM& model, data::DataLoader& loader) {
  model.eval();
  double sum_loss = 0;
  int64_t count = 0;
  {
    NoGradGuard ng;
    for (auto& b : loader) {
      const Tensor ids = b[0];
      const double l = clm_loss(model(ids), ids).to(kFloat64).item<double>();
      const Tensor per_row = full({ids.size(0)}, l, TensorOptions(kFloat64, ids.device()));
      const Tensor all = acc.gather_for_metrics(per_row, b);
      sum_loss += sum(all).item<double>();
      count += all.numel();
    }
  }
  model.train();
  return count ? sum_loss / double(count) : std::nan("");
}

// The prompt's ids (an empty prompt starts from <|endoftext|>, as GPT-2's unconditional samples;
// with the byte tokenizer from "\n").
inline std::vector<int64_t> prompt_ids(const TextTokenizer& tok, const std::string& prompt) {
  std::vector<int64_t> ids = tok.encode(prompt);
  if (ids.empty()) ids.push_back(tok.eos_token_id().value_or('\n'));
  return ids;
}

}  // namespace accel::examples::gpt2_ft
