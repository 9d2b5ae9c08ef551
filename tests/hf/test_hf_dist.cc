// Hugging Face models under the Accelerator (tests/hf/hf_worker ranks, spawned under the env
// contract): prepared, then loaded from the fixture directories with acc.load_model (a single
// file for GPT-2, a sharded set with its index for Llama) under 2-rank tensor parallelism
// (gpt2_tp_plan: Conv1D c_attn colwise with chunks 3, c_proj rowwise along their transposed
// dims; llama_tp_plan with one kv head per rank) and 2-rank ZeRO-3: the logits equal the PyTorch
// reference to 1e-10 and the 1-process run, greedy and seeded sampled tokens equal, and two AdamW
// fine-tuning steps give the 1-process losses and logits.
#include <doctest/doctest.h>

#include <map>
#include <string>

#include "tests/common/spawn.h"
#include "tests/common/worker_check.h"
#include "tests/hf/common.h"

using namespace accel;
using namespace std::chrono_literals;
using accel::test::check_ok;
using accel::test::hf_expected;
using accel::test::hf_fixture;
using accel::test::max_abs_diff;
using accel::test::run_world;
using accel::test::same_tokens;

namespace {

// The worker's results for `model` on `world` ranks with `env`.
nn::TensorDict run(const std::string& model, int world, std::map<std::string, std::string> env,
                   const std::string& tag) {
  const std::string dir = accel::test::hf_scratch(model + "-" + tag);
  nn::save_safetensors(dir + "/ids.safetensors",
                       {{"input_ids", hf_expected(model + ".input_ids")}});
  env["ACCEL_ZERO_STAGE"] = env.count("ACCEL_ZERO_STAGE") ? env["ACCEL_ZERO_STAGE"] : "0";
  const auto res = run_world(
      accel::test::helper_path("hf_worker"),
      {hf_fixture(model), dir + "/ids.safetensors", dir + "/out.safetensors"}, world, env, 180s);
  check_ok(res, "hf");
  nn::TensorDict out;
  if (res[0].code == 0) out = nn::load_safetensors(dir + "/out.safetensors");
  std::filesystem::remove_all(dir);
  return out;
}

void compare(const std::string& model, const nn::TensorDict& one, const nn::TensorDict& got) {
  REQUIRE(got.count("logits"));
  CHECK(max_abs_diff(got.at("logits"), hf_expected(model + ".logits")) < 1e-10);
  CHECK(max_abs_diff(got.at("logits"), one.at("logits")) < 1e-12);
  CHECK(same_tokens(got.at("greedy"), hf_expected(model + ".greedy")));
  CHECK(same_tokens(got.at("sampled"), one.at("sampled")));
  CHECK(max_abs_diff(got.at("losses"), one.at("losses")) < 1e-10);
  CHECK(max_abs_diff(got.at("logits_after"), one.at("logits_after")) < 1e-9);
}

}  // namespace

TEST_CASE("GPT-2 and a sharded Llama: 2-rank tensor parallel and ZeRO-3 equal one process") {
  for (const std::string model : {"gpt2", "llama"}) {
    CAPTURE(model);
    const nn::TensorDict one = run(model, 1, {}, "one");
    REQUIRE(one.count("logits"));
    CHECK(max_abs_diff(one.at("logits"), hf_expected(model + ".logits")) < 1e-10);
    CHECK(same_tokens(one.at("greedy"), hf_expected(model + ".greedy")));
    // Training moved the model: the steps are not a no-op.
    CHECK(max_abs_diff(one.at("logits_after"), one.at("logits")) > 1e-3);
    {
      INFO("tensor parallel, tp 2");
      compare(model, one, run(model, 2, {{"ACCEL_TP_SIZE", "2"}}, "tp"));
    }
    {
      INFO("ZeRO-3, 2 ranks");
      compare(model, one, run(model, 2, {{"ACCEL_ZERO_STAGE", "3"}}, "zero3"));
    }
  }
}
