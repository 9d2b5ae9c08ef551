// Building Hugging Face text models from a model directory, as transformers' AutoModelForCausalLM
// does, without network access (docs/hf.md):
//
//   auto model = hf::from_pretrained("weights/", {.dtype = kFloat64});  // config.json + weights
//   Tensor logits = (*model)(input_ids);                                  // (B, T, vocab)
//
// A model directory holds config.json and model.safetensors, or a sharded set
// model-0000N-of-0000M.safetensors with model.safetensors.index.json (transformers' index:
// {"weight_map": {"<tensor>": "<file>"}}). Under the Accelerator build the model with
// from_config (under nn::DeferredInit to allocate nothing), prepare it, then load with
// acc.load_model(*model, dir): ZeRO-3 ranks read only their shards, tensor-parallel ranks their
// part (gpt2_tp_plan / llama_tp_plan, or tp_plan_for below).
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "core/device.h"
#include "core/dtype.h"
#include "core/generator.h"
#include "hf/causal_lm.h"
#include "parallel/tensor_parallel.h"

namespace accel::hf {

// The model a config describes (model_type gpt2 -> GPT2LMHeadModel, llama -> LlamaForCausalLM),
// initialised as transformers' _init_weights from `gen` (the default generator when null), in
// float32 on the CPU (transformers' from_config). `path` is a config.json or a directory holding
// one. ValueError naming the config for an unknown model_type or an unsupported setting.
std::shared_ptr<CausalLM> from_config(const nlohmann::json& config, Generator* gen = nullptr);
std::shared_ptr<CausalLM> from_config(const std::string& path, Generator* gen = nullptr);

struct PretrainedOptions {
  DType dtype = kFloat32;  // transformers' default torch_dtype (float32 whatever the file holds)
  Device device = Device(kCPU);
  bool strict = true;  // missing or unexpected tensors are an error
};

// from_config(dir) built without initialising anything (nn::DeferredInit), placed on
// options.device in options.dtype, its weights loaded by load_weights, in eval mode (as
// transformers' from_pretrained). Non-strict: the tensors the files lack are initialised.
std::shared_ptr<CausalLM> from_pretrained(const std::string& dir,
                                          const PretrainedOptions& options = {});

// Loads the weights of a safetensors file, a sharded set's index or a directory holding either
// into `model` (not one an engine shards: use acc.load_model then), reading each tensor straight
// into the model's (converting dtype). Names are transformers' names as the model has them; as
// transformers does, a checkpoint of the base model alone (GPT-2's original files: "h.0.attn..."
// for "transformer.h.0.attn...") loads through base_model_prefix(), a tied lm_head.weight may be
// absent, and names ignored_on_load() (attn.bias buffers) are skipped. Everything is checked
// before anything is read: a shape mismatch always, and with strict missing or unexpected
// tensors, is a ValueError listing every problem, e.g. "[hf.load_weights] 'w/model.safetensors'
// does not fit GPT2LMHeadModel; missing keys (1): transformer.h.1.mlp.c_fc.bias; shape mismatch
// (1): transformer.wte.weight: file (98, 32), model (97, 32)". Returns what non-strict left out.
nn::LoadResult load_weights(CausalLM& model, const std::string& path, bool strict = true);

// Writes config.json and model.safetensors into `dir` (created if needed) as transformers'
// save_pretrained does: the config's keys (unknown ones kept), the state dict with a tied
// lm_head.weight written once (its alias recorded in the metadata, which transformers ignores),
// metadata {"format": "pt"}. A model sharded by an engine: use acc.save_model instead.
void save_pretrained(const CausalLM& model, const std::string& dir);

// gpt2_tp_plan() or llama_tp_plan() by the model's type.
dist::TpPlan tp_plan_for(const CausalLM& model);

}  // namespace accel::hf
