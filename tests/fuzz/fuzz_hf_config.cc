// Fuzz target: a Hugging Face config.json as hf::from_config reads it (hf/config.h): the JSON
// parser, the model_type check and the GPT-2 / Llama field readers and checks, on arbitrary
// bytes. IoError (not a JSON object) and ValueError (a key of the wrong type, an unsupported
// setting, sizes that do not divide) are the documented failures; a config that passes must hold
// what the models divide by, and survive to_json -> from_json unchanged.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "hf/config.h"

namespace {

template <typename C>
void round_trip(const C& c) {
  const nlohmann::json once = c.to_json();
  if (C::from_json(once, "<fuzz>").to_json() != once) std::abort();
}

void check(const std::string& text) {
  const nlohmann::json j = accel::hf::parse_config(text, "<fuzz>");
  const std::string type = accel::hf::model_type_of(j, "<fuzz>");
  if (type == "gpt2") {
    const auto c = accel::hf::GPT2Config::from_json(j, "<fuzz>");
    if (c.n_head < 1 || c.n_embd % c.n_head != 0 || c.inner_dim() < 1) std::abort();
    round_trip(c);
  } else if (type == "llama") {
    const auto c = accel::hf::LlamaConfig::from_json(j, "<fuzz>");
    if (c.kv_heads() < 1 || c.num_attention_heads % c.kv_heads() != 0) std::abort();
    if (c.head_size() < 2 || c.head_size() % 2 != 0) std::abort();
    round_trip(c);
  } else {
    std::abort();  // model_type_of accepts these two only
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    check(std::string(reinterpret_cast<const char*>(data), size));
  } catch (const accel::IoError&) {
  } catch (const accel::ValueError&) {
  }
  return 0;
}
