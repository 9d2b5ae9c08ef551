// accel::hf: Hugging Face text models (GPT-2, Llama-style decoders) with transformers' names,
// configs and weights, KV-cache generation, tensor-parallel plans, GPT-2's byte-level BPE
// tokenizer (docs/hf.md).
#pragma once

#include "hf/causal_lm.h"
#include "hf/config.h"
#include "hf/generation.h"
#include "hf/gpt2.h"
#include "hf/llama.h"
#include "hf/pretrained.h"
#include "hf/tokenizer.h"
