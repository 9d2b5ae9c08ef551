// gpt2_finetune: transformers' run_clm_no_trainer.py (examples/pytorch/language-modeling), ported:
// fine-tunes a Hugging Face causal language model (GPT-2; a Llama folder works too) on a text
// file through the Accelerator, evaluates perplexity after every epoch, saves a Hugging Face
// folder (config.json + model.safetensors, + the tokenizer's files), then samples from a prompt
// with hf::generate. The data, loss, optimizer, schedule and step: examples/gpt2_finetune.h.
//
//   build/examples/gpt2_finetune --model_name_or_path gpt2/ --train_file text.txt
//       [--per_device_train_batch_size 8] [--learning_rate 5e-5] [--num_train_epochs 3]
//       [--max_train_steps N] [--gradient_accumulation_steps 1] [--num_warmup_steps 0]
//       [--lr_scheduler_type linear] [--block_size N] [--output_dir out/]
//       [--prompt TEXT --max_new_tokens 50 --do_sample --temperature 1 --top_k 50 --top_p 1]
//   build/examples/gpt2_finetune --model_type gpt2 --config_overrides n_embd=64,n_layer=2,...
//       --output_dir tiny/                     # a new random model (no --train_file: no training)
//   build/launcher/accel-run launch --num_processes 2 --cpu build/examples/gpt2_finetune ...
//
// Without --train_file nothing is trained: the model is sampled from (and saved with
// --output_dir).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/file_io.h"
#include "examples/common.h"
#include "examples/gpt2_finetune.h"

namespace {

using namespace accel;
using namespace accel::examples;
namespace ft = accel::examples::gpt2_ft;

struct Options {
  std::string train_file, validation_file, model_name_or_path, config_name, tokenizer_name;
  std::string model_type, config_overrides, output_dir, lr_scheduler_type = "linear";
  std::string torch_dtype = "float32";
  double validation_split_percentage = 5;
  int64_t per_device_train_batch_size = 8, per_device_eval_batch_size = 8;
  double learning_rate = 5e-5, weight_decay = 0, max_grad_norm = 0;
  int64_t num_train_epochs = 3, max_train_steps = 0, gradient_accumulation_steps = 1;
  int64_t num_warmup_steps = 0, block_size = 0, max_train_samples = 0, max_eval_samples = 0;
  bool no_keep_linebreaks = false;
  uint64_t seed = 42;
  int64_t logging_steps = 10;
  int threads = 0;
  // Sampling (transformers' generate()).
  std::string prompt;
  int64_t max_new_tokens = 50, top_k = 50;
  bool do_sample = false;
  double temperature = 1.0, top_p = 1.0;
};

// run_clm's --config_overrides "n_embd=10,resid_pdrop=0.2,scale_attn_weights=false": each value
// read as an integer, a number, true / false / null, or else a string.
void apply_overrides(nlohmann::json& config, const std::string& overrides) {
  size_t start = 0;
  while (start < overrides.size()) {
    size_t end = overrides.find(',', start);
    if (end == std::string::npos) end = overrides.size();
    const std::string item = overrides.substr(start, end - start);
    start = end + 1;
    const size_t eq = item.find('=');
    ACCEL_CHECK(eq != std::string::npos && eq > 0, ValueError, "gpt2_finetune",
                "--config_overrides: expected key=value, got '", item, "'");
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    nlohmann::json v = nlohmann::json::parse(value, nullptr, /*allow_exceptions=*/false);
    if (v.is_discarded() || v.is_object() || v.is_array()) v = value;
    config[key] = v;
  }
}

DType dtype_of(const std::string& name) {
  if (name == "float64") return kFloat64;
  if (name == "bfloat16") return kBFloat16;
  return kFloat32;
}

// The config's eos_token_id (one id or a list; none when absent or null): generation stops there.
std::vector<int64_t> eos_ids(const nlohmann::json& config) {
  std::vector<int64_t> out;
  if (!config.contains("eos_token_id")) return out;
  const nlohmann::json& e = config["eos_token_id"];
  if (e.is_number_integer()) out.push_back(e.get<int64_t>());
  if (e.is_array())
    for (const auto& v : e)
      if (v.is_number_integer()) out.push_back(v.get<int64_t>());
  return out;
}

std::string config_source(const Options& o) {
  return !o.config_name.empty() ? o.config_name : o.model_name_or_path;
}

int run(const Options& o) {
  if (o.threads > 0) omp_set_num_threads(o.threads);
  ACCEL_CHECK(!o.model_name_or_path.empty() || !o.config_name.empty() || !o.model_type.empty(),
              ValueError, "gpt2_finetune",
              "give --model_name_or_path (a Hugging Face folder), --config_name (a config.json "
              "to train from scratch) or --model_type gpt2");
  ACCEL_CHECK(o.config_overrides.empty() || config_source(o).empty(), ValueError, "gpt2_finetune",
              "--config_overrides can only be used when training from scratch (--model_type)");
  // The config, and where the model's weights come from.
  nlohmann::json config;
  if (!config_source(o).empty()) {
    config = hf::read_config(config_source(o));
  } else {
    config = {{"model_type", o.model_type}};
    if (o.model_type == "gpt2") config["architectures"] = {"GPT2LMHeadModel"};
    if (o.model_type == "llama") config["architectures"] = {"LlamaForCausalLM"};
    apply_overrides(config, o.config_overrides);
  }
  const std::string model_type = hf::model_type_of(config, "the config");

  AcceleratorConfig ac;
  ac.seed = o.seed;
  ac.gradient_accumulation_steps = int(o.gradient_accumulation_steps);
  ac.log_with = {};
  ac.tp_plan = model_type == "gpt2" ? hf::gpt2_tp_plan() : hf::llama_tp_plan();
  Accelerator acc(ac);

  // The tokenizer: --tokenizer_name, else the model's (or config's) folder, else bytes.
  std::string tok_dir = o.tokenizer_name;
  if (tok_dir.empty() && !o.model_name_or_path.empty()) tok_dir = o.model_name_or_path;
  if (tok_dir.empty() && std::filesystem::is_directory(o.config_name)) tok_dir = o.config_name;
  std::string note = "no --tokenizer_name: using the bytes of the text as token ids 0-255";
  const ft::TextTokenizer tok =
      tok_dir.empty() ? ft::TextTokenizer::bytes() : ft::TextTokenizer::for_folder(tok_dir, &note);
  if (tok.is_bytes()) acc.print("gpt2_finetune: ", note);

  // The model. Under ZeRO-3 it is built without memory and each rank loads its shards after
  // prepare(); otherwise loaded (or initialised from the seed) first.
  const bool zero3 = acc.config().zero_stage == 3;
  const bool pretrained = !o.model_name_or_path.empty();
  const DType dtype = dtype_of(o.torch_dtype);
  std::shared_ptr<hf::CausalLM> model;
  Generator init(o.seed);
  if (pretrained && !zero3) {
    model = hf::from_pretrained(o.model_name_or_path, {.dtype = dtype});
    model->train();
  } else {
    std::optional<nn::DeferredInit> deferred;
    if (zero3 && pretrained) deferred.emplace();
    model = hf::from_config(config, &init);
    model->to(dtype);
  }
  ACCEL_CHECK(tok.vocab_size() <= model->vocab_size(), ValueError, "gpt2_finetune",
              "the tokenizer has ", tok.vocab_size(), " tokens but the model's vocab_size is ",
              model->vocab_size(),
              " (resizing the embeddings is not supported: use a model with a larger vocabulary)");
  acc.print("gpt2_finetune: ", model->type_name(), " (", model_type, "), ", model->num_parameters(),
            " parameters, ", o.torch_dtype,
            pretrained ? ", from " + o.model_name_or_path : ", new (random) weights", "; ",
            acc.num_processes(), " process(es) x ", omp_get_max_threads(), " thread(s)");

  const int64_t n_positions = model->max_positions().value_or(1024);
  int64_t block_size = o.block_size > 0 ? o.block_size : std::min<int64_t>(1024, n_positions);
  if (block_size > n_positions) {
    acc.print("The block_size passed (", block_size,
              ") is larger than the maximum length for the model (", n_positions,
              "). Using block_size=", n_positions, ".");
    block_size = n_positions;
  }

  auto opt = ft::make_optimizer(*model, o.learning_rate, o.weight_decay);
  if (o.train_file.empty()) {
    model = acc.prepare_model(model);
    if (zero3 && pretrained) acc.load_model(*model, o.model_name_or_path);
  } else {
    const auto read = [](const std::string& path) {
      return file_io::read_file(path, "gpt2_finetune", file_io::kNoSizeCap);
    };
    const bool keep = !o.no_keep_linebreaks;
    std::vector<std::string> train_lines = ft::split_lines(read(o.train_file), keep), val_lines;
    if (!o.validation_file.empty())
      val_lines = ft::split_lines(read(o.validation_file), keep);
    else
      std::tie(train_lines, val_lines) =
          ft::split_validation(train_lines, o.validation_split_percentage);
    Tensor train_blocks = ft::group_texts(tok, train_lines, block_size);
    Tensor val_blocks = ft::group_texts(tok, val_lines, block_size);
    if (o.max_train_samples > 0 && train_blocks.size(0) > o.max_train_samples)
      train_blocks = train_blocks.narrow(0, 0, o.max_train_samples);
    if (o.max_eval_samples > 0 && val_blocks.size(0) > o.max_eval_samples)
      val_blocks = val_blocks.narrow(0, 0, o.max_eval_samples);
    ACCEL_CHECK(train_blocks.size(0) > 0, ValueError, "gpt2_finetune", "'", o.train_file,
                "' has fewer than block_size = ", block_size, " tokens for training");

    data::DataLoaderOptions lo;
    lo.batch_size = o.per_device_train_batch_size;
    lo.shuffle = true;
    lo.seed = o.seed;
    auto train_loader = acc.prepare_data_loader(std::make_shared<data::DataLoader>(
        std::make_shared<data::TensorDataset>(std::vector<Tensor>{train_blocks}), lo));
    data::DataLoaderOptions vo;
    vo.batch_size = o.per_device_eval_batch_size;
    auto eval_loader = acc.prepare_data_loader(std::make_shared<data::DataLoader>(
        std::make_shared<data::TensorDataset>(std::vector<Tensor>{val_blocks}), vo));

    // Scheduler and math around the number of training steps (run_clm_no_trainer's).
    const int64_t accum = acc.gradient_accumulation_steps();
    const int64_t updates_per_epoch = (train_loader->size() + accum - 1) / accum;
    int64_t max_train_steps = o.max_train_steps, epochs = o.num_train_epochs;
    if (max_train_steps <= 0)
      max_train_steps = epochs * updates_per_epoch;
    else
      epochs = (max_train_steps + updates_per_epoch - 1) / updates_per_epoch;
    auto sched = ft::make_scheduler(*opt, o.lr_scheduler_type, o.num_warmup_steps, max_train_steps);
    auto [m, aopt, asched] = acc.prepare(model, opt, sched);
    model = m;
    if (zero3 && pretrained) acc.load_model(*model, o.model_name_or_path);

    acc.print("***** Running training *****");
    acc.print("  Num examples = ", train_blocks.size(0), " (blocks of ", block_size,
              " tokens; validation: ", val_blocks.size(0), ")");
    acc.print("  Num Epochs = ", epochs);
    acc.print("  Instantaneous batch size per device = ", o.per_device_train_batch_size);
    acc.print("  Total train batch size (w. parallel, distributed & accumulation) = ",
              o.per_device_train_batch_size * acc.num_processes() * accum);
    acc.print("  Gradient Accumulation steps = ", accum);
    acc.print("  Total optimization steps = ", max_train_steps);
    Progress progress(acc, "train", max_train_steps, std::max<int64_t>(1, o.logging_steps));
    RunningLoss running(std::max<int64_t>(1, o.logging_steps) * accum);
    int64_t completed_steps = 0;
    double step_loss = 0;
    for (int64_t epoch = 0; epoch < epochs && completed_steps < max_train_steps; ++epoch) {
      model->train();
      for (auto& batch : *train_loader) {
        const double used_lr = aopt->lr();
        const double l =
            ft::train_micro_step(acc, *model, *aopt, *asched, batch[0], o.max_grad_norm).loss;
        step_loss += l / double(accum);
        running.add(acc, l);
        if (acc.sync_gradients()) {
          ++completed_steps;
          progress.update(completed_steps, running.value(step_loss), used_lr);
          step_loss = 0;
        }
        if (completed_steps >= max_train_steps) break;
      }
      const double eval_loss = ft::evaluate(acc, *model, *eval_loader);
      char line[160];
      std::snprintf(line, sizeof line, "epoch %lld: perplexity: %.4f eval_loss: %.4f",
                    static_cast<long long>(epoch), std::exp(eval_loss), eval_loss);
      acc.print(line);
    }
    char line[160];
    std::snprintf(line, sizeof line, "trained %lld steps in %.1f s, %.1f ms/step",
                  static_cast<long long>(completed_steps), progress.elapsed(),
                  1e3 * progress.elapsed() / double(std::max<int64_t>(1, completed_steps)));
    acc.print(line);
  }

  if (!o.output_dir.empty()) {
    acc.wait_for_everyone();
    // Sharded by ZeRO-3 or split by tensor parallelism: the Accelerator gathers the full tensors
    // (ZeRO-3 unit by unit) and the main process writes them; hf::save_pretrained would write
    // this rank's parts.
    if (!model->sharded().empty() || !dist::tp_shards(*model).empty()) {
      std::filesystem::create_directories(o.output_dir);
      acc.save_model(*model, o.output_dir + "/model.safetensors");
      if (acc.is_main_process())
        file_io::write_file_atomic(o.output_dir + "/config.json",
                                   model->config_json().dump(2) + "\n", "gpt2_finetune");
    } else if (acc.is_main_process()) {
      hf::save_pretrained(*model, o.output_dir);
    }
    if (acc.is_main_process() && tok.bpe()) tok.bpe()->save_pretrained(o.output_dir, n_positions);
    acc.wait_for_everyone();
    acc.print("saved ", o.output_dir, " (config.json, model.safetensors",
              tok.bpe() ? ", tokenizer files)" : "; byte tokenizer: no tokenizer files)");
  }

  if (o.max_new_tokens > 0) {
    // Every rank generates (the same tokens, same seed): under ZeRO-3 and tensor parallelism
    // each forward is collective.
    model->eval();
    const std::vector<int64_t> ids = ft::prompt_ids(tok, o.prompt);
    const Tensor input = tensor(ids, {1, int64_t(ids.size())}, TensorOptions(kInt64));
    hf::GenerationConfig g;
    g.max_new_tokens = o.max_new_tokens;
    g.do_sample = o.do_sample;
    g.temperature = o.temperature;
    g.top_k = o.top_k;
    g.top_p = o.top_p;
    g.seed = o.seed;
    g.eos_token_id = eos_ids(model->config_json());
    const auto t0 = std::chrono::steady_clock::now();
    const Tensor out = hf::generate(*model, input.to(acc.device()), g).cpu();
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::vector<int64_t> all(out.data<int64_t>(), out.data<int64_t>() + out.numel());
    const std::vector<int64_t> fresh(all.begin() + int64_t(ids.size()), all.end());
    char line[160];
    std::snprintf(line, sizeof line, "sample (%s, %lld new tokens, %.1f ms/token):",
                  o.do_sample ? "sampling" : "greedy", static_cast<long long>(fresh.size()),
                  1e3 * secs / double(std::max<size_t>(1, fresh.size())));
    acc.print(line);
    acc.print(o.prompt, tok.decode(fresh));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app(
      "Fine-tune a Hugging Face GPT-2 as a causal language model on a text file "
      "(transformers' run_clm_no_trainer.py), then sample from it",
      "gpt2_finetune");
  app.add_option("--train_file", o.train_file, "a text file: one example per line");
  app.add_option("--validation_file", o.validation_file, "a text file for validation");
  app.add_option("--validation_split_percentage", o.validation_split_percentage,
                 "the percentage of the train lines used for validation when there is no "
                 "--validation_file (the first lines)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 100.0));
  app.add_option("--model_name_or_path", o.model_name_or_path,
                 "a Hugging Face model folder (config.json + model.safetensors or a sharded "
                 "index)");
  app.add_option("--config_name", o.config_name,
                 "a config.json (or a folder holding one) to train a new model from");
  app.add_option("--tokenizer_name", o.tokenizer_name,
                 "a folder with tokenizer.json or vocab.json + merges.txt (default: the model's)");
  app.add_option("--model_type", o.model_type, "train a new model of this type from scratch")
      ->check(CLI::IsMember({"gpt2", "llama"}));
  app.add_option("--config_overrides", o.config_overrides,
                 "with --model_type: config values, e.g. n_embd=64,n_layer=2,vocab_size=512");
  app.add_option("--torch_dtype", o.torch_dtype, "the model's dtype")
      ->capture_default_str()
      ->check(CLI::IsMember({"float32", "float64", "bfloat16"}));
  app.add_option("--per_device_train_batch_size", o.per_device_train_batch_size,
                 "batch size (per process) for training")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--per_device_eval_batch_size", o.per_device_eval_batch_size,
                 "batch size (per process) for evaluation")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--learning_rate", o.learning_rate, "initial learning rate (after warm-up)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--weight_decay", o.weight_decay, "weight decay (not on biases and LayerNorms)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--num_train_epochs", o.num_train_epochs, "training epochs")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max_train_steps", o.max_train_steps,
                 "optimizer steps; overrides --num_train_epochs (0: from the epochs)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--gradient_accumulation_steps", o.gradient_accumulation_steps,
                 "micro-batches per optimizer step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--lr_scheduler_type", o.lr_scheduler_type, "the learning-rate schedule")
      ->capture_default_str()
      ->check(CLI::IsMember({"linear", "cosine", "constant", "constant_with_warmup"}));
  app.add_option("--num_warmup_steps", o.num_warmup_steps, "linear warm-up steps")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max_grad_norm", o.max_grad_norm, "clip the gradient norm (0: off)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--block_size", o.block_size,
                 "tokens per training example (0: the model's n_positions, at most 1024)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max_train_samples", o.max_train_samples, "use only the first N blocks")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max_eval_samples", o.max_eval_samples, "evaluate only the first N blocks")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--no_keep_linebreaks", o.no_keep_linebreaks, "drop the lines' \\n");
  app.add_option("--output_dir", o.output_dir, "where to save the model as a Hugging Face folder");
  app.add_option("--seed", o.seed, "initialisation, shuffling and sampling")->capture_default_str();
  app.add_option("--logging_steps", o.logging_steps, "print a progress line every N steps")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--threads", o.threads, "OpenMP threads per process (0: default)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--prompt", o.prompt, "the text the sample continues (empty: <|endoftext|>)");
  app.add_option("--max_new_tokens", o.max_new_tokens, "tokens to generate (0: no sample)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--do_sample", o.do_sample, "sample (default: greedy)");
  app.add_option("--temperature", o.temperature, "sampling temperature")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--top_k", o.top_k, "keep the k most likely tokens (0: all)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--top_p", o.top_p, "keep the smallest set of tokens of this mass")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  return run_example(app, argc, argv, [&] { return run(o); });
}
