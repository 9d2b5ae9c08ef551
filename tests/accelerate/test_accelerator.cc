// Single-process tests of the Accelerator facade, GradScaler, autocast, trackers and
// checkpoints.
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "autograd/autocast.h"
#include "nn/linear.h"
#include "io/safetensors.h"
#include "accelerate/checkpoint.h"
#include "accelerate/tracking.h"
#include "core/warning.h"
#include "parallel/checkpoint/crc.h"
#include "tests/accelerate/training.h"
#include "tests/common/scoped_env.h"
#include "tests/common/util.h"

using namespace accel;
using accel::test::base_config;
using accel::test::Run;
namespace fs = std::filesystem;
using accel::test::fresh_dir;

namespace {

// fresh_dir's prefix: /tmp/accel-acc-test-<pid>-<tag>.
constexpr char kScratch[] = "accel-acc-test";

std::vector<double> flat_params(nn::Module& m) {
  std::vector<double> out;
  for (auto& p : m.parameters())
    for (double v : p.tolist()) out.push_back(v);
  return out;
}

}  // namespace

TEST_CASE("config: ACCEL_* variables override the struct; bad values are ValueErrors") {
  setenv("ACCEL_MIXED_PRECISION", "bf16", 1);
  setenv("ACCEL_GRADIENT_ACCUMULATION_STEPS", "4", 1);
  setenv("ACCEL_USE_CPU", "true", 1);
  setenv("ACCEL_ZERO_STAGE", "0", 1);
  AcceleratorConfig c = AcceleratorConfig().with_env();
  CHECK(c.mixed_precision == MixedPrecision::BF16);
  CHECK(c.gradient_accumulation_steps == 4);
  CHECK(c.cpu);
  setenv("ACCEL_MIXED_PRECISION", "fp8", 1);
  CHECK_THROWS_AS(AcceleratorConfig().with_env(), ValueError);
  setenv("ACCEL_MIXED_PRECISION", "no", 1);
  setenv("ACCEL_GRADIENT_ACCUMULATION_STEPS", "0", 1);
  CHECK_THROWS_AS(AcceleratorConfig().with_env(), ValueError);
  for (const char* v : {"ACCEL_MIXED_PRECISION", "ACCEL_GRADIENT_ACCUMULATION_STEPS",
                        "ACCEL_USE_CPU", "ACCEL_ZERO_STAGE"})
    unsetenv(v);
  AcceleratorConfig bad;
  bad.zero_stage = 4;
  CHECK_THROWS_AS(Accelerator{bad}, ValueError);
}

TEST_CASE("single process: facade state and identity collectives") {
  Accelerator acc(base_config(fresh_dir(kScratch, "facade")));
  CHECK(acc.num_processes() == 1);
  CHECK(acc.process_index() == 0);
  CHECK(acc.is_main_process());
  CHECK(acc.is_local_main_process());
  CHECK(acc.device() == kCPU);
  CHECK(acc.distributed_type() == DistributedType::No);
  CHECK(acc.process_group() == nullptr);
  Tensor t = tensor({1.f, 2.f, 3.f});
  CHECK(equal(acc.gather(t), t));
  CHECK(equal(acc.reduce(t, "sum"), t));
  CHECK(equal(acc.broadcast(t), t));
  CHECK(equal(acc.gather_for_metrics(t, 1), tensor({1.f, 2.f})));
  CHECK_THROWS_AS(acc.gather_for_metrics(t, 4), ValueError);
  CHECK_THROWS_AS(acc.reduce(t, "median"), ValueError);
  std::vector<int> items = {1, 2, 3, 4, 5};
  CHECK(acc.split_between_processes(items) == items);
  int calls = 0;
  acc.main_process_first([&] { ++calls; });
  CHECK(calls == 1);
  acc.wait_for_everyone();
}

TEST_CASE("GradScaler: skips on inf/NaN, backs off, grows after growth_interval") {
  dist::GradScalerOptions o;
  o.init_scale = 1024;
  o.growth_interval = 2;
  dist::GradScaler s(o);
  Tensor p = ones({3}).requires_grad_();
  s.scale_loss(p.sum()).backward();
  CHECK(p.grad().tolist() == std::vector<double>{1024, 1024, 1024});
  s.unscale_({p});
  CHECK(p.grad().tolist() == std::vector<double>{1, 1, 1});
  s.unscale_({p});  // idempotent within a step
  CHECK(p.grad().tolist() == std::vector<double>{1, 1, 1});
  CHECK_FALSE(s.found_inf());
  s.update();
  CHECK(s.scale() == 1024);
  p.zero_grad();
  s.scale_loss(p.sum()).backward();
  s.unscale_({p});
  s.update();
  CHECK(s.scale() == 2048);  // two good steps
  p.grad().fill_(std::numeric_limits<float>::infinity());
  s.unscale_({p});
  CHECK(s.found_inf());
  s.update();
  CHECK(s.scale() == 1024);
  CHECK(s.growth_tracker() == 0);
  p.grad().fill_(std::numeric_limits<float>::quiet_NaN());
  s.unscale_({p});
  CHECK(s.found_inf());
  dist::GradScaler r;
  r.load_state_dict(s.state_dict());
  CHECK(r.scale() == s.scale());
}

TEST_CASE("fp16: an injected inf skips the optimizer and scheduler step, halves the scale") {
  AcceleratorConfig c = base_config(fresh_dir(kScratch, "fp16"));
  c.mixed_precision = MixedPrecision::FP16;
  // Autocast rounds the gradients of the linear layers to fp16: at the default 2^16 the scaled
  // ones overflow (a genuine skip); 2^10 keeps the normal steps finite.
  c.scaler.init_scale = 1024;
  Accelerator acc(c);
  Run run(acc, 8, false, 0.0);
  const double scale0 = acc.scaler().scale();
  auto it = run.loader->begin();
  // A normal step first: it steps.
  run.step(acc, *it);
  CHECK_FALSE(acc.optimizer_step_was_skipped());
  CHECK(acc.optimizer_steps() == 1);
  ++it;
  std::vector<double> before = flat_params(*run.model);
  const int64_t sched_epoch = run.sched->scheduler().last_epoch();
  {
    auto scope = acc.accumulate();
    Tensor loss = mse_loss(run.model->forward((*it)[0]), (*it)[1]);
    acc.backward(loss);
    run.model->w1.grad().narrow(0, 0, 1).fill_(std::numeric_limits<float>::infinity());
    CHECK_FALSE(run.opt->step());
    run.sched->step();
    run.opt->zero_grad();
  }
  CHECK(acc.optimizer_step_was_skipped());
  CHECK(acc.optimizer_steps() == 1);
  CHECK(flat_params(*run.model) == before);
  CHECK(run.sched->scheduler().last_epoch() == sched_epoch);
  CHECK(acc.scaler().scale() == scale0 / 2);
  ++it;
  run.step(acc, *it);
  CHECK_FALSE(acc.optimizer_step_was_skipped());
  CHECK(acc.optimizer_steps() == 2);
}

TEST_CASE("accumulation: k micro-batches equal one big batch") {
  const int k = 4;
  AcceleratorConfig c = base_config(fresh_dir(kScratch, "accum"));
  c.gradient_accumulation_steps = k;
  Accelerator acc(c);
  Run small(acc, 5, false, 0.0);
  int syncs = 0;
  int64_t n = 0;
  for (auto& b : *small.loader) {
    if (n++ == k) break;
    small.step(acc, b);
    syncs += acc.sync_gradients();
  }
  CHECK(syncs == 1);
  CHECK(acc.optimizer_steps() == 1);

  Accelerator ref(base_config(fresh_dir(kScratch, "accum-ref")));
  Run big(ref, 5 * k, false, 0.0);
  big.step(ref, *big.loader->begin());
  auto a = flat_params(*small.model), b = flat_params(*big.model);
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-6));
  // Not trivially equal to the initial weights.
  CHECK(a != flat_params(*std::make_shared<test::TinyNet>(7, 0.0)));
}

TEST_CASE("accumulation: the last batch of the epoch forces a sync step") {
  AcceleratorConfig c = base_config(fresh_dir(kScratch, "accum-end"));
  c.gradient_accumulation_steps = 3;
  Accelerator acc(c);
  Run run(acc, 10, false, 0.0);  // 40 samples: 4 batches, windows of 3 -> syncs at 3 and 4
  std::vector<int> syncs;
  for (auto& b : *run.loader) {
    run.step(acc, b);
    syncs.push_back(acc.sync_gradients());
  }
  CHECK(syncs == std::vector<int>{0, 0, 1, 1});
}

TEST_CASE("autocast: thread-local scope, bf16 conversion on CPU, float32 passes elsewhere") {
  CHECK_FALSE(autocast_enabled());
  Tensor x = tensor({1.0f + 1.0f / 1024, 3.14159f});
  CHECK(equal(autocast_cast(x), x));
  {
    AutocastGuard g(true, kBFloat16);
    CHECK(autocast_enabled());
    // Converted, not rounded-and-kept-float32 as before 2026-12 (Note [autocast on CPU]).
    Tensor r = autocast_cast(x);
    CHECK(r.dtype() == kBFloat16);
    CHECK(r.tolist()[0] == double(float(BFloat16(1.0f + 1.0f / 1024))));
    CHECK(r.tolist()[1] == double(float(BFloat16(3.14159f))));
    CHECK(r.tolist()[1] != x.tolist()[1]);
    {
      AutocastGuard h(false);
      CHECK_FALSE(autocast_enabled());
    }
    CHECK(autocast_enabled());
    Tensor d = tensor(std::vector<double>{1.1}, {1});
    CHECK(equal(autocast_cast(d), d));  // float64 untouched
  }
  CHECK_FALSE(autocast_enabled());
  CHECK_THROWS_AS(AutocastGuard(true, kFloat32), DTypeError);
  // Differentiable: the gradient flows through the round trip.
  Tensor w = tensor({0.3f, 0.7f}).requires_grad_();
  {
    AutocastGuard g(true, kFloat16);
    sum(autocast_cast(w)).backward();
  }
  CHECK(w.grad().tolist() == std::vector<double>{1, 1});
}

TEST_CASE("trackers: JSONL lines on the main process, TensorBoard records with valid CRCs") {
  const std::string dir = fresh_dir(kScratch, "track");
  AcceleratorConfig c = base_config(dir);
  c.log_with = {"jsonl", "tensorboard"};
  {
    Accelerator acc(c);
    acc.init_trackers("run1", {{"lr", "0.05"}});
    acc.log({{"loss", 0.5}, {"acc", 0.25}}, 3);
    acc.log({{"loss", 0.125}}, 4);
    acc.end_training();
  }
  std::ifstream f(dir + "/run1/metrics.jsonl");
  std::vector<std::string> lines;
  for (std::string l; std::getline(f, l);) lines.push_back(l);
  REQUIRE(lines.size() == 3);
  CHECK(lines[0] == R"({"config":{"lr":"0.05"}})");
  CHECK(lines[1] == R"({"acc":0.25,"loss":0.5,"step":3})");
  CHECK(lines[2] == R"({"loss":0.125,"step":4})");
  // crc32c check value of the Castagnoli polynomial.
  CHECK(dist::crc32c("123456789", 9) == 0xE3069283u);
  std::string tb;
  for (auto& e : fs::directory_iterator(dir + "/run1"))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) tb = e.path().string();
  REQUIRE(!tb.empty());
  std::string bytes = dist::read_file(tb);
  size_t pos = 0;
  int records = 0;
  while (pos + 12 <= bytes.size()) {
    uint64_t len;
    uint32_t len_crc, data_crc;
    std::memcpy(&len, bytes.data() + pos, 8);
    std::memcpy(&len_crc, bytes.data() + pos + 8, 4);
    CHECK(len_crc == dist::masked_crc32c(bytes.data() + pos, 8));
    REQUIRE(pos + 12 + len + 4 <= bytes.size());
    std::memcpy(&data_crc, bytes.data() + pos + 12 + len, 4);
    CHECK(data_crc == dist::masked_crc32c(bytes.data() + pos + 12, len));
    pos += 12 + len + 4;
    ++records;
  }
  CHECK(pos == bytes.size());
  CHECK(records == 3);  // file_version + two scalar events
  CHECK(bytes.find("brain.Event:2") != std::string::npos);
  CHECK_THROWS_AS(dist::make_tracker("wandb", dir), ValueError);
}

namespace {
// Trains `steps` micro-batches (k = 2 accumulation, shuffled loader over epochs, dropout);
// returns the losses. With save_at >= 0 saves after that many steps.
std::vector<double> train(Accelerator& acc, Run& run, int steps, int save_at = -1) {
  std::vector<double> losses;
  while (int(losses.size()) < steps) {
    for (auto& b : *run.loader) {
      losses.push_back(run.step(acc, b));
      if (int(losses.size()) == save_at) acc.save_state();
      if (int(losses.size()) == steps) break;
    }
  }
  return losses;
}
}  // namespace

TEST_CASE("checkpoint: save, fresh process objects, load, continue: bit-identical losses") {
  const std::string dir = fresh_dir(kScratch, "resume");
  AcceleratorConfig c = base_config(dir);
  c.gradient_accumulation_steps = 2;
  c.mixed_precision = MixedPrecision::FP16;  // the scaler state is part of the checkpoint
  c.seed = 11;
  std::vector<double> full;
  {
    Accelerator acc(c);
    Run run(acc, 6);
    full = train(acc, run, 17, 9);
  }
  manual_seed(999);  // a resumed run must not depend on the generator it starts with
  std::vector<double> resumed;
  {
    Accelerator acc(c);
    Run run(acc, 6);
    acc.load_state();
    CHECK(acc.step() == 9);
    resumed = train(acc, run, 17 - 9);
  }
  REQUIRE(resumed.size() == 8);
  for (size_t i = 0; i < resumed.size(); ++i) {
    CAPTURE(i);
    CHECK(test::hex(resumed[i]) == test::hex(full[9 + i]));
  }
  CHECK(dist::read_latest(dir + "/checkpoints").value() == "checkpoint_0");
}

TEST_CASE("checkpoint: total_limit rotation, latest pointer, incomplete dirs are refused") {
  const std::string dir = fresh_dir(kScratch, "rotate");
  AcceleratorConfig c = base_config(dir);
  c.total_limit = 2;
  Accelerator acc(c);
  Run run(acc, 8, false, 0.0);
  for (int i = 0; i < 4; ++i) {
    run.step(acc, *run.loader->begin());
    acc.save_state();
  }
  auto list = dist::list_checkpoints(dir + "/checkpoints");
  REQUIRE(list.size() == 2);
  CHECK(fs::path(list[0]).filename() == "checkpoint_2");
  CHECK(fs::path(list[1]).filename() == "checkpoint_3");
  CHECK(dist::read_latest(dir + "/checkpoints").value() == "checkpoint_3");
  CHECK(acc.load_state() == dir + "/checkpoints/checkpoint_3");
  // A directory without state.json (an interrupted copy) is not a checkpoint.
  fs::create_directories(dir + "/partial");
  CHECK_THROWS_AS(acc.load_state(dir + "/partial"), IoError);
  // Explicit directories work too, and a mismatched set of objects is an error.
  acc.save_state(dir + "/manual");
  CHECK(fs::exists(dir + "/manual/index.json"));
  CHECK(dist::read_latest(dir).value() == "manual");
  Accelerator other(base_config(fresh_dir(kScratch, "rotate-other")));
  CHECK_THROWS_AS(other.load_state(dir + "/manual"), ValueError);
}

// A loader prepared after it moved on (load_state_dict, or batches skipped) keeps its global
// position, not its batch index (Note [global loader position] in data/sampler.cc): built for
// rank 0 of 2 (global batch 8), 2 batches in = sample 16; prepared in one process (global batch
// 4) it goes on at its batch 4, where it seeked to batch 2 (sample 8) before.
TEST_CASE("prepare keeps the caller's loader position as a global sample") {
  Accelerator acc(base_config(fresh_dir(kScratch, "prepare-position")));
  data::DataLoaderOptions lo;
  lo.batch_size = 4;
  lo.shuffle = true;
  lo.seed = 3;
  lo.rank = 0;
  lo.world_size = 2;
  auto mine = std::make_shared<data::DataLoader>(test::make_dataset(), lo);
  mine->seek(0, 2);
  auto prepared = acc.prepare_data_loader(mine);
  CHECK(prepared->batch_sampler().global_batch_size() == 4);
  CHECK(prepared->epoch() == 0);
  CHECK(prepared->batches_consumed() == 4);
  const std::vector<int64_t> order = data::RandomSampler(40, 3).epoch_indices(0);
  CHECK((*prepared->begin()).indices ==
        std::vector<int64_t>(order.begin() + 16, order.begin() + 20));
}

// load_state resumes the loader's global position (the index's "loaders"): a position that
// is not a whole global batch of this run rounds down and says once how many samples repeat; a
// position of a loader that would read another order is refused by name and changes nothing.
TEST_CASE("load_state: loader position rounds down with one warning; a mismatch is refused") {
  // Edits the position in the index (a liar who knows the format: index_crc32 recomputed).
  const std::string dir = fresh_dir(kScratch, "loader-position");
  Accelerator acc(base_config(dir));
  Run run(acc, 8, true, 0.0);  // 40 samples, global batch 8
  auto it = run.loader->begin();
  run.step(acc, *it);
  run.step(acc, *++it);
  const std::string ckpt = acc.save_state();
  const std::string file = ckpt + "/index.json";
  auto write_position = [&](const data::StateDict& pos) {
    nlohmann::json j = nlohmann::json::parse(test::read_file(file));
    j["loaders"][0] = nlohmann::json::parse(data::state_to_json(pos));
    j.erase("index_crc32");
    j["index_crc32"] = dist::ckpt::text_crc(j.dump());
    test::write_file(file, j.dump());
  };
  const data::StateDict saved =
      data::state_from_json(nlohmann::json::parse(test::read_file(file)).at("loaders")[0].dump());
  CHECK(saved.at("samples") == "16");
  data::StateDict edited = saved;
  edited["samples"] = "20";
  write_position(edited);
  std::vector<std::string> said;
  const WarningHandler previous =
      set_warning_handler([&](const std::string& line) { said.push_back(line); });
  reset_warnings_shown();
  acc.load_state(ckpt);
  CHECK(run.loader->batches_consumed() == 2);
  REQUIRE(said.size() == 1);
  CHECK(said[0].find("[load_state] the data loader was saved at sample 20 of epoch 0, not a "
                     "multiple of this loader's global batch 8: it resumes at 16, so 4 samples "
                     "are read twice") != std::string::npos);
  set_warning_handler(previous);
  edited = saved;
  edited["drop_last"] = "1";
  write_position(edited);
  run.loader->seek(1, 3);
  const int64_t step = acc.step();
  CHECK_THROWS_WITH_AS(acc.load_state(ckpt), doctest::Contains("drop_last = 1, this loader has 0"),
                       ValueError);
  CHECK(run.loader->epoch() == 1);
  CHECK(run.loader->batches_consumed() == 3);
  CHECK(acc.step() == step);
}

TEST_CASE("device placement: prepared loaders hand out batches on acc.device(); off switch") {
  for (bool placement : {true, false}) {
    CAPTURE(placement);
    AcceleratorConfig c = base_config(fresh_dir(kScratch, "placement"));
    c.cpu = true;
    c.device_placement = placement;
    Accelerator acc(c);
    data::DataLoaderOptions lo;
    lo.batch_size = 8;
    lo.shuffle = true;
    lo.seed = 3;
    lo.num_workers = 1;
    auto plain = std::make_shared<data::DataLoader>(test::make_dataset(), lo);
    auto prepared =
        acc.prepare_data_loader(std::make_shared<data::DataLoader>(test::make_dataset(), lo));
    CHECK(prepared->options().device.has_value() == placement);
    if (placement) CHECK(*prepared->options().device == acc.device());
    std::vector<std::vector<double>> want, got;
    for (auto& b : *plain) want.push_back(b[0].tolist());
    for (auto& b : *prepared) {
      CHECK(b[0].device() == acc.device());
      CHECK(b[1].device() == acc.device());
      got.push_back(b[0].tolist());
    }
    CHECK(got == want);  // placement changes where, never what
  }
}

TEST_CASE("device placement on CUDA: README's loop runs as written") {
  AcceleratorConfig c = base_config(fresh_dir(kScratch, "placement-cuda"));
  Accelerator acc(c);
  if (!acc.device().is_cuda()) {
    MESSAGE("skipped: no CUDA device");
    return;
  }
  test::Run run(acc, 8, true, 0.0);
  CHECK(run.model->w1.device() == acc.device());
  CHECK(run.loader->options().pin_memory);
  int64_t steps = 0;
  for (auto& b : *run.loader) {
    CHECK(b[0].device() == acc.device());
    CHECK(std::isfinite(run.step(acc, b)));  // would throw a DeviceError on CPU batches
    ++steps;
  }
  CHECK(steps == run.loader->size());
}

TEST_CASE(
    "one process: ZeRO options that change the computation run the strategy on a group of 1") {
  // Note [one process under ZeRO]: bf16 compute parameters (stages 1-2 and 3) and per-unit
  // activation checkpointing (stage 3) apply at world size 1 as at N; other ZeRO options need no
  // strategy there.
  for (int stage : {0, 1, 2, 3}) {
    CAPTURE(stage);
    AcceleratorConfig plain = base_config(fresh_dir(kScratch, "zero1-plain"));
    plain.zero_stage = stage;
    Accelerator a(plain);
    CHECK(a.strategy().name() == "none");
  }
  for (int stage : {1, 2}) {
    CAPTURE(stage);
    AcceleratorConfig c = base_config(fresh_dir(kScratch, "zero1-bf16"));
    c.zero_stage = stage;
    c.mixed_precision = MixedPrecision::BF16;
    c.zero.param_dtype = kBFloat16;
    Accelerator acc(c);
    CHECK(acc.strategy().name() != "none");
    Run run(acc, 8, false, 0.0);
    CHECK(run.model->w1.dtype() == kBFloat16);  // the compute parameters
    int steps = 0;
    for (auto& b : *run.loader) {
      CHECK(std::isfinite(run.step(acc, b)));
      ++steps;
    }
    CHECK(steps == 5);
    // The fp32 masters: values a bf16 parameter cannot hold.
    const io::TensorDict sd = acc.get_state_dict(*run.model);
    const Tensor w1 = sd.at("w1");
    CHECK(w1.dtype() == kFloat32);
    CHECK_FALSE(equal(w1, w1.to(kBFloat16).to(kFloat32)));
    CHECK(equal(w1.to(kBFloat16), run.model->w1));
  }
  AcceleratorConfig c = base_config(fresh_dir(kScratch, "zero1-fsdp"));
  c.zero_stage = 3;
  c.fsdp.activation_checkpointing = true;
  Accelerator acc(c);
  CHECK(acc.strategy().name() == "fsdp");
}

namespace {
// embed (5, 3) and a head (5 <- 3) whose weight is the embedding's when tied.
struct TiedLm : nn::Module {
  std::shared_ptr<nn::Embedding> embed;
  std::shared_ptr<nn::Linear> head;
  explicit TiedLm(bool tie) {
    embed = register_module("embed", std::make_shared<nn::Embedding>(5, 3));
    head = register_module("head", std::make_shared<nn::Linear>(3, 5, /*bias=*/false));
    if (tie) head->weight = head->set_parameter("weight", embed->weight);
  }
  Tensor forward(const Tensor& idx) override { return head->forward(embed->forward(idx)); }
};
}  // namespace

// Tied weights through Accelerator::load_model: a file that keeps the tensor once (our alias
// metadata, or transformers' habit of dropping the tied name without a record, under either
// name) loads into a tied model and into an untied one, prepared or not.
TEST_CASE("load_model: tied weights load from files that hold them once, under either name") {
  const std::string dir = fresh_dir(kScratch, "load-model-tied");
  fs::create_directories(dir);
  Tensor w = arange(15, TensorOptions(kFloat32)).reshape({5, 3});
  auto tied_source = std::make_shared<TiedLm>(true);
  {
    NoGradGuard ng;
    tied_source->embed->weight.copy_(w);
  }
  tied_source->save(dir + "/alias.safetensors");  // embed.weight once, head.weight -> embed.weight
  io::save_safetensors(dir + "/embed_only.safetensors", {{"embed.weight", w}});
  io::save_safetensors(dir + "/head_only.safetensors", {{"head.weight", w}});
  for (std::string file : {"alias", "embed_only", "head_only"}) {
    for (bool tie : {true, false}) {
      for (bool prepared : {false, true}) {
        CAPTURE(file);
        CAPTURE(tie);
        CAPTURE(prepared);
        Accelerator acc(base_config(fresh_dir(kScratch, "load-model-tied-acc")));
        std::shared_ptr<nn::Module> model = std::make_shared<TiedLm>(tie);
        if (prepared) model = acc.prepare_model(model);
        const std::string path = dir + "/" + file + ".safetensors";
        auto& m = static_cast<TiedLm&>(*model);
        if (!tie && file != "alias") {
          // An untied model needs both names; the file holds one (and no alias record).
          CHECK_THROWS_AS(acc.load_model(*model, path), ValueError);
          continue;
        }
        const nn::LoadResult r = acc.load_model(*model, path);
        CHECK(r.missing_keys.empty());
        CHECK(r.unexpected_keys.empty());
        CHECK(equal(m.embed->weight, w));
        CHECK(equal(m.head->weight, w));
      }
    }
  }
  fs::remove_all(dir);
}

// ReduceLROnPlateau through prepare(): step(metric) on sync steps, its state (best, bad epochs,
// cooldown) in save_state / load_state; step() without a metric and step(metric) on another
// scheduler are ValueErrors.
TEST_CASE("ReduceLROnPlateau: prepared step(metric), save_state / load_state resume its state") {
  const std::string dir = fresh_dir(kScratch, "plateau");
  auto run = [&](bool resume) {
    Accelerator acc(base_config(dir));
    Tensor p = zeros({2}).requires_grad_();
    auto opt = std::make_shared<optim::SGD>(std::vector<Tensor>{p}, optim::SGDOptions(0.1));
    optim::ReduceLROnPlateauOptions o;
    o.patience = 1;
    o.factor = 0.5;
    o.cooldown = 1;
    auto sched = acc.prepare_scheduler(std::make_shared<optim::ReduceLROnPlateau>(*opt, o));
    auto aopt = acc.prepare_optimizer(opt);
    const std::vector<double> metrics = {1.0, 0.9, 0.95, 0.96, 0.97, 0.98, 0.99, 0.8, 0.85, 0.9};
    std::vector<double> lrs;
    size_t i = 0;
    if (resume) {
      acc.load_state(dir + "/ckpt");
      i = 5;
    }
    for (; i < metrics.size(); ++i) {
      sched->step(metrics[i]);
      lrs.push_back(aopt->lr());
      if (!resume && i == 4) acc.save_state(dir + "/ckpt");
    }
    CHECK_THROWS_AS(sched->step(), ValueError);
    return lrs;
  };
  const std::vector<double> full = run(false);
  CHECK(full[3] == 0.05);  // 2 bad steps after the best 0.9: halved
  CHECK(full.back() < 0.05);
  const std::vector<double> resumed = run(true);
  CHECK(resumed == std::vector<double>(full.begin() + 5, full.end()));
  Accelerator acc(base_config(dir));
  Tensor q = zeros({2}).requires_grad_();
  optim::SGD sgd({q}, {.lr = 0.1});
  auto step_lr = acc.prepare_scheduler(std::make_shared<optim::StepLR>(sgd, 2));
  CHECK_THROWS_AS(step_lr->step(1.0), ValueError);
}

TEST_CASE("parallelism: acc.mesh() of one process; sizes that do not fit are ValueErrors") {
  const std::string dir = fresh_dir(kScratch, "mesh");
  {
    Accelerator acc(base_config(dir));
    CHECK(acc.mesh().describe() == "pp 1 x dp_replicate 1 x dp_shard 1 x cp 1 x tp 1");
    CHECK(acc.mesh().group_ranks("dp") == std::vector<int>{0});
    AcceleratorConfig ones = base_config(dir);
    ones.parallelism.dp_replicate_size = 1;
    ones.parallelism.dp_shard_size = 1;
    ones.parallelism.tp_size = 1;
    CHECK(Accelerator(ones).mesh().size("dp_shard") == 1);
  }
  // The message of the ValueError the constructor raises for `c`.
  auto refusal = [](const AcceleratorConfig& c) -> std::string {
    try {
      Accelerator acc(c);
    } catch (const ValueError& e) {
      return e.what();
    }
    return "(accepted)";
  };
  AcceleratorConfig tp = base_config(dir);
  tp.parallelism.tp_size = 2;
  const std::string m = refusal(tp);
  CHECK_MESSAGE(m.find("dp_replicate_size unset, dp_shard_size unset, cp_size unset, tp_size 2") !=
                    std::string::npos,
                m);
  CHECK_MESSAGE(m.find("do not fit 1 processes (WORLD_SIZE)") != std::string::npos, m);
  // The same sizes from the environment (what accel-run exports).
  setenv("ACCEL_DP_REPLICATE_SIZE", "2", 1);
  setenv("ACCEL_DP_SHARD_SIZE", "3", 1);
  AcceleratorConfig from_env;
  from_env.project_dir = dir;
  const AcceleratorConfig read = from_env.with_env();
  CHECK(read.parallelism.dp_replicate_size == std::optional<int>(2));
  CHECK(read.parallelism.dp_shard_size == std::optional<int>(3));
  CHECK(!read.parallelism.tp_size);
  const std::string e = refusal(from_env);
  CHECK_MESSAGE(e.find("dp_replicate_size 2, dp_shard_size 3, cp_size unset, tp_size unset") !=
                    std::string::npos,
                e);
  CHECK_MESSAGE(e.find("exceeds the world size 1") != std::string::npos, e);
  setenv("ACCEL_TP_SIZE", "0", 1);
  CHECK_THROWS_WITH_AS(from_env.with_env(), doctest::Contains("ACCEL_TP_SIZE='0'"), ValueError);
  for (const char* v : {"ACCEL_DP_REPLICATE_SIZE", "ACCEL_DP_SHARD_SIZE", "ACCEL_TP_SIZE"})
    unsetenv(v);
}
