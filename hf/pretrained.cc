// Model directories: from_config, from_pretrained, load_weights, save_pretrained
// (hf/pretrained.h).
#include "hf/pretrained.h"

#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <vector>

#include "io/safetensors.h"
#include "core/error.h"
#include "core/file_io.h"
#include "hf/config.h"
#include "hf/gpt2.h"
#include "hf/llama.h"
#include "nn/load_report.h"
#include "parallel/tensor_parallel.h"

namespace accel::hf {

namespace {

constexpr const char* kLoad = "hf.load_weights";

bool starts_with(const std::string& s, const std::string& p) {
  return s.compare(0, p.size(), p) == 0;
}

}  // namespace

std::shared_ptr<CausalLM> from_config(const nlohmann::json& config, Generator* gen) {
  const std::string type = model_type_of(config);
  if (type == "gpt2") return std::make_shared<GPT2LMHeadModel>(GPT2Config::from_json(config), gen);
  return std::make_shared<LlamaForCausalLM>(LlamaConfig::from_json(config), gen);
}

std::shared_ptr<CausalLM> from_config(const std::string& path, Generator* gen) {
  const nlohmann::json j = read_config(path);
  const std::string type = model_type_of(j, "'" + path + "'");
  if (type == "gpt2")
    return std::make_shared<GPT2LMHeadModel>(GPT2Config::from_json(j, "'" + path + "'"), gen);
  return std::make_shared<LlamaForCausalLM>(LlamaConfig::from_json(j, "'" + path + "'"), gen);
}

// A tensor-parallel rank holds its parts of the split parameters: reading a file of full tensors
// into them, or writing them as if they were whole, is wrong without a word. The Accelerator's
// load_model / save_model know the cut (dist::tp_shards).
namespace {

void check_not_tp_split(const CausalLM& model, const char* op, const char* instead) {
  const auto shards = dist::tp_shards(const_cast<CausalLM&>(model));
  ACCEL_CHECK(shards.empty(), ValueError, op, "the ", model.type_name(),
              " is split by tensor parallelism (", shards.size(), " parameters, e.g. '",
              shards.begin()->first, "' holds this rank's part only): ", instead);
}

}  // namespace

// Note [hf checkpoint names]
// transformers loads a checkpoint by name with three allowances that load_weights keeps: (1) a
// file of the base model alone names its tensors without base_model_prefix ("h.0.ln_1.weight"
// for GPT2LMHeadModel's "transformer.h.0.ln_1.weight": GPT-2's original files), detected as no
// file name carrying the prefix; (2) a tied parameter is loaded once, from whichever of its
// names the file holds (save_pretrained drops lm_head.weight when it is tied); (3) names the
// model declares ignorable (GPT-2's attn.bias causal-mask buffers) are skipped.
nn::LoadResult load_weights(CausalLM& model, const std::string& path, bool strict) {
  ACCEL_CHECK(model.sharded().empty(), ValueError, kLoad, "the ", model.type_name(),
              " is sharded by an engine (", model.sharded(),
              "): load it with the Accelerator's load_model(model, path)");
  check_not_tp_split(model, kLoad, "load it with the Accelerator's load_model(model, path)");
  const nn::SafetensorsCheckpoint src(path);
  const std::vector<std::string> file_names = src.names();
  const std::string prefix = model.base_model_prefix() + ".";
  bool any_prefixed = false;
  for (const std::string& n : file_names) any_prefixed = any_prefixed || starts_with(n, prefix);
  const nn::TensorDict own = model.state_handles();
  auto in_file = [&](const std::string& name) {  // Note [hf checkpoint names] (1)
    return !any_prefixed && starts_with(name, prefix) ? name.substr(prefix.size()) : name;
  };
  // Tied names share one tensor (state_handles() gives each name its own detached handle of the
  // same storage): the group is loaded from the first name the file holds (2).
  using Key = std::pair<const void*, int64_t>;
  auto key = [](const Tensor& t) { return Key(t.storage().get(), t.offset()); };
  std::map<Key, std::string> source;  // tensor -> file name to read it from
  for (const auto& [name, t] : own)
    if (src.contains(in_file(name)) && !source.count(key(t))) source[key(t)] = in_file(name);
  nn::LoadResult r;
  std::vector<std::string> mismatched;
  std::set<std::string> used;
  for (const auto& [name, t] : own) {
    const std::string f = in_file(name);
    if (src.contains(f)) {
      used.insert(f);
      if (src.info(f).shape != t.sizes())
        mismatched.push_back(name + ": file " + shape_str(src.info(f).shape) + ", model " +
                             shape_str(t.sizes()));
    } else if (!source.count(key(t))) {
      r.missing_keys.push_back(name);
    }
  }
  for (const std::string& n : file_names)
    if (!used.count(n) && !model.ignored_on_load(n)) r.unexpected_keys.push_back(n);
  if (!mismatched.empty() || (strict && (!r.missing_keys.empty() || !r.unexpected_keys.empty()))) {
    ACCEL_THROW(ValueError, kLoad, "'", src.path(), "' does not fit ", model.type_name(),
                nn::load_report(r, mismatched, strict),
                strict ? " (strict = false loads the names both have)" : "");
  }
  NoGradGuard ng;
  std::set<Key> done;
  for (const auto& [name, t] : own) {
    auto it = source.find(key(t));
    if (it == source.end() || !done.insert(key(t)).second) continue;
    if (nn::is_deferred(t)) t.storage()->materialize();
    src.read_range(it->second, 0, t.numel(), t);
  }
  return r;
}

std::shared_ptr<CausalLM> from_pretrained(const std::string& dir,
                                          const PretrainedOptions& options) {
  const nlohmann::json config = read_config(dir);
  std::shared_ptr<CausalLM> model;
  {
    nn::DeferredInit deferred;  // shapes only: the weights come from the files
    model = from_config(config);
  }
  model->to(options.device, options.dtype);
  load_weights(*model, dir, options.strict);
  nn::materialize(*model);  // non-strict: what the files lacked gets its initial values
  model->eval();
  return model;
}

void save_pretrained(const CausalLM& model, const std::string& dir) {
  namespace fs = std::filesystem;
  ACCEL_CHECK(model.sharded().empty(), ValueError, "hf.save_pretrained", "the ", model.type_name(),
              " is sharded by an engine (", model.sharded(),
              "): save it with the Accelerator's save_model(model, path)");
  check_not_tp_split(model, "hf.save_pretrained",
                     "save it with the Accelerator's save_model(model, path)");
  std::error_code ec;
  fs::create_directories(dir, ec);
  ACCEL_CHECK(!ec, IoError, "hf.save_pretrained", "cannot create '", dir, "': ", ec.message());
  // transformers drops the tied names (lm_head.weight) from the file; keep the first name.
  nn::TensorDict state = model.state_dict();
  for (const auto& [alias, first] : model.tied_aliases()) state.erase(alias);
  nn::save_safetensors((fs::path(dir) / "model.safetensors").string(), state, {{"format", "pt"}});
  file_io::write_file_atomic((fs::path(dir) / "config.json").string(),
                             model.config_json().dump(2) + "\n", "hf.save_pretrained");
}

dist::TpPlan tp_plan_for(const CausalLM& model) {
  if (model.model_type() == "gpt2") return gpt2_tp_plan();
  ACCEL_CHECK(model.model_type() == "llama", ValueError, "hf.tp_plan_for", "no tp plan for ",
              model.type_name(), " (model_type ", model.model_type(), ")");
  return llama_tp_plan();
}

}  // namespace accel::hf
