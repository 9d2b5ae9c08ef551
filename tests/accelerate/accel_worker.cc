// One rank of the multi-process accelerator tests (spawned by test_accelerator_dist under the
// env contract). Prints "ok <scenario>" on success; exit code != 0 on failure.
//   accel_worker facade
//   accel_worker ddp <per-rank batch>                       final parameters, one per line
//   accel_worker ddp_mlp <per-rank batch> [zero_stage] [no|fp16|bf16]
//                                                           DDP (or ZeRO) with small buckets,
//                                                           AdamW, clipping: norms and final
//                                                           parameters
//   accel_worker zero_errors                                ZeRO prepare() refusals
//   accel_worker resume_peak <dir> save|load <stage>        load_state's allocator peak against
//                                                           training's
//   accel_worker load_model <dir> save|load <stage> [what]  Accelerator::load_model
//   accel_worker plain_backward <stage> acc|plain|scaled    loss.backward() vs acc.backward()
//   accel_worker hostile <dir> <stage> <word>...            load_state of a malformed checkpoint
//                                                           is an IoError naming every word
//   accel_worker zero_train <dir> <stage> <batch> <steps> <save_at> <resume> [mp|-] [accum]
//                     [adamw|adadelta|adagrad|rmsprop]
//                                                           DDP / ZeRO training (AdamW, decay
//                                                           and no-decay groups) with a
//                                                           checkpoint (resume: load it, then
//                                                           continue); mp "bf16" / "bf16-fp32":
//                                                           bf16 autocast and ZeRO param_dtype
//                                                           bf16 (gradients reduced in bf16 /
//                                                           fp32)
//   accel_worker matrix <stage> <per-rank batch> <accumulation> [mp]
//                                                           20 optimizer steps of an MLP with
//                                                           AdamW groups and clipping: the
//                                                           global loss of every micro-batch
//                                                           and the final parameters
//   accel_worker lbfgs <dir> <stage> full|save|resume
//                                                           LBFGS (strong_wolfe) by step(closure)
//                                                           on the whole data set: losses and
//                                                           final parameters; save after 2 of 4
//                                                           steps / resume there; under ZeRO
//                                                           prepare() refuses it by name
//   accel_worker train <dir> <steps> <save_every> <resume> [<crash_stage> <crash_rank>]
//   accel_worker mesh                                       acc.mesh() of the ACCEL_*_SIZE
//                                                           variables: "group <dim> <ranks>",
//                                                           then "prepared <what>" or "refused
//                                                           <what>: <message>" for a model, an
//                                                           optimizer and a data loader
//   accel_worker typed <dir> <stage> <per-rank batch> [ckpt 0|1]
//                                                           tests/common/typed_model.h (two
//                                                           inputs, tuple / struct results, a
//                                                           weight tied across units) through
//                                                           prepare(), opt->step(closure):
//                                                           global losses, final parameters; the
//                                                           export holds the tied weight once
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <filesystem>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "io/safetensors.h"
#include "optim/optim.h"
#include "accelerate/checkpoint.h"
#include "tests/accelerate/training.h"
#include "tests/common/typed_model.h"

using namespace accel;
using accel::test::Run;

namespace {

#define EXPECT(cond)                                                              \
  do {                                                                            \
    if (!(cond)) {                                                                \
      std::fprintf(stderr, "rank check failed: %s (line %d)\n", #cond, __LINE__); \
      std::exit(2);                                                               \
    }                                                                             \
  } while (0)

AcceleratorConfig config_from_env(const std::string& dir) {
  AcceleratorConfig c;
  c.project_dir = dir;
  if (const char* t = std::getenv("DIST_TIMEOUT_MS"))
    c.timeout = std::chrono::milliseconds(std::atoi(t));
  return c;
}

int facade() {
  Accelerator acc(config_from_env("/tmp"));
  const int w = acc.num_processes(), r = acc.process_index();
  EXPECT(w == 2 || w == 3);
  EXPECT(acc.distributed_type() == DistributedType::MultiCPU);
  EXPECT(acc.is_main_process() == (r == 0));
  // gather: rank r contributes r+1 rows of value r.
  Tensor mine = full({r + 1, 2}, double(r));
  Tensor g = acc.gather(mine);
  EXPECT(g.size(0) == w * (w + 1) / 2 && g.size(1) == 2);
  int64_t row = 0;
  for (int q = 0; q < w; ++q)
    for (int k = 0; k <= q; ++k, ++row) EXPECT(g[row].tolist()[0] == q);
  // reduce / broadcast / pad.
  EXPECT(acc.reduce(scalar_tensor(double(r + 1)), "sum").item<double>() == w * (w + 1) / 2);
  EXPECT(acc.reduce(scalar_tensor(double(r)), "max").item<double>() == w - 1);
  EXPECT(acc.broadcast(scalar_tensor(double(r + 10)), w - 1).item<double>() == w - 1 + 10);
  Tensor padded = acc.pad_across_processes(full({r + 1}, 1.0), 0, -1.0);
  EXPECT(padded.size(0) == w && padded.sum().item<double>() == (r + 1) - (w - r - 1));
  // gather_for_metrics over a sharded loader: exactly the N samples, none twice.
  for (int64_t n : {10, 11, 7}) {
    data::DataLoaderOptions lo;
    lo.batch_size = 3;
    auto idx = arange(n, TensorOptions(kFloat32)).reshape({n, 1});
    auto loader = acc.prepare_data_loader(std::make_shared<data::DataLoader>(
        std::make_shared<data::TensorDataset>(std::vector<Tensor>{idx}), lo));
    std::vector<double> seen;
    for (auto& b : *loader) {
      Tensor all = acc.gather_for_metrics(b[0], b);
      for (double v : all.tolist()) seen.push_back(v);
    }
    std::sort(seen.begin(), seen.end());
    EXPECT(int64_t(seen.size()) == n);
    for (int64_t i = 0; i < n; ++i) EXPECT(seen[size_t(i)] == double(i));
  }
  std::vector<int> items = {0, 1, 2, 3, 4};
  auto part = acc.split_between_processes(items);
  auto sizes = acc.gather(scalar_tensor(double(part.size())));
  EXPECT(sizes.sum().item<double>() == 5);
  // main_process_first: the main process has finished before the others start.
  std::string flag = "/tmp/accel-acc-mpf-" + std::string(std::getenv("MASTER_PORT"));
  acc.main_process_first([&] {
    if (acc.is_main_process()) {
      std::FILE* f = std::fopen(flag.c_str(), "w");
      std::fclose(f);
    } else {
      std::FILE* f = std::fopen(flag.c_str(), "r");
      EXPECT(f != nullptr);
      std::fclose(f);
    }
  });
  acc.wait_for_everyone();
  if (acc.is_main_process()) std::remove(flag.c_str());
  acc.print("printed once");
  std::cout << "ok facade" << std::endl;
  return 0;
}

// One epoch of training, accumulation 2, sharded loader; prints the final parameters.
int ddp(int64_t batch) {
  AcceleratorConfig c = config_from_env("/tmp");
  c.gradient_accumulation_steps = 2;
  Accelerator acc(c);
  Run run(acc, batch, false, 0.0, 48);
  for (auto& b : *run.loader) run.step(acc, b);
  for (auto& p : run.model->parameters())
    for (double v : p.tolist()) std::printf("param %.9g\n", v);
  std::cout << "ok ddp" << std::endl;
  return 0;
}

// Two epochs of a 3-layer MLP through the facade: accumulation 2, 512-byte DDP buckets (several
// per model, parameters cut across none: buckets hold whole parameters), AdamW, gradient
// clipping. Prints the clip norm of every optimizer step and the final parameters.
// The whole parameters in model order (under ZeRO-3 they exist only through get_state_dict).
void print_params(Accelerator& acc, const nn::Module& model) {
  const io::TensorDict full = acc.get_state_dict(model);
  for (auto& [name, p] : model.named_parameters())
    for (double v : full.at(name).tolist()) std::printf("param %.9g\n", v);
}

std::shared_ptr<nn::Sequential> make_mlp() {
  Generator g(17);
  return std::make_shared<nn::Sequential>(
      std::make_shared<nn::Linear>(4, 32, true, &g), std::make_shared<nn::Tanh>(),
      std::make_shared<nn::Linear>(32, 16, true, &g), std::make_shared<nn::Tanh>(),
      std::make_shared<nn::Linear>(16, 1, true, &g));
}

// AdamW's standard recipe: weights decay, biases (1-D) do not, at their own lr.
std::vector<optim::ParamGroup> decay_groups(const nn::Module& m) {
  std::vector<optim::ParamGroup> g(2);
  for (auto& p : m.parameters()) g[p.dim() == 1 ? 1 : 0].params.push_back(p);
  g[0].weight_decay = 0.1;
  g[1].weight_decay = 0.0;
  g[1].lr = 2e-2;
  return g;
}

int ddp_mlp(int64_t batch, int zero_stage, const std::string& mp) {
  AcceleratorConfig c = config_from_env("/tmp");
  c.gradient_accumulation_steps = 2;
  c.ddp.bucket_cap_bytes = 512;
  c.zero_stage = zero_stage;
  c.mixed_precision = dist::parse_mixed_precision(mp);
  c.scaler.init_scale = 256;
  Accelerator acc(c);
  auto mlp = make_mlp();
  optim::AdamWOptions ao;
  ao.lr(1e-2);
  auto opt = std::make_shared<optim::AdamW>(mlp->parameters(), ao);
  data::DataLoaderOptions lo;
  lo.batch_size = batch;
  auto loader = std::make_shared<data::DataLoader>(test::make_dataset(64), lo);
  auto [model, aopt, aloader] = acc.prepare(mlp, opt, loader);
  const bool multi = acc.num_processes() > 1;
  dist::DistributedDataParallel* ddp = acc.ddp(*model);
  EXPECT((ddp != nullptr) == (multi && zero_stage == 0));
  const std::string want = !multi            ? "none"
                           : zero_stage == 0 ? "ddp"
                           : zero_stage == 3 ? "fsdp"
                                             : "zero" + std::to_string(zero_stage);
  EXPECT(acc.strategy().name() == want);
  const bool zero = multi && zero_stage > 0;
  if (ddp) EXPECT(ddp->buckets().size() >= 3);
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (auto& b : *aloader) {
      auto scope = acc.accumulate();
      Tensor loss;
      {
        auto ac = acc.autocast();
        loss = mse_loss(model->forward(b[0]), b[1]);
      }
      acc.backward(loss);
      if (acc.sync_gradients()) {
        if (ddp) EXPECT(ddp->last_stats().buckets == int(ddp->buckets().size()));
        std::printf("norm %.9g\n", acc.clip_grad_norm_(0.5));
      }
      aopt->step();
      aopt->zero_grad();
    }
  }
  EXPECT(acc.optimizer_steps() == 4);  // 64 / (2 * batch * W) windows per epoch, 2 epochs
  if (ddp)
    std::printf("buckets %zu hidden %.2f\n", ddp->buckets().size(),
                ddp->last_stats().hidden_fraction());
  if (zero) {
    dist::StrategyMemory m = acc.memory();
    std::printf("zero params %lld grads %lld optimizer %lld full %lld\n", (long long)m.param_bytes,
                (long long)m.grad_bytes, (long long)m.optimizer_bytes,
                (long long)m.full_param_bytes);
  }
  print_params(acc, *model);
  std::cout << "ok ddp_mlp" << std::endl;
  return 0;
}

// ZeRO training with AdamW + StepLR over an unshuffled loader (48 samples): the global batch
// is `batch` * W, the same samples whatever W is. Prints the global mean loss of every step
// and the final parameters.
// Prints "<prefix> <hex>" for every value of the whole state dict (fp32 master weights under
// ZeRO param_dtype), and how many of them bf16 cannot hold exactly.
void print_exact(Accelerator& acc, const nn::Module& model, const char* prefix) {
  const io::TensorDict full = acc.get_state_dict(model);
  int64_t unrounded = 0;
  for (auto& [name, p] : model.named_parameters()) {
    const Tensor& t = full.at(name);
    EXPECT(t.dtype() == kFloat32 || t.dtype() == kFloat64);
    const auto v = t.tolist(), b = t.to(kBFloat16).to(kFloat32).tolist();
    for (size_t i = 0; i < v.size(); ++i) {
      std::printf("%s %s\n", prefix, test::hex(v[i]).c_str());
      unrounded += v[i] != b[i];
    }
  }
  std::printf("%s-unrounded %lld\n", prefix, (long long)unrounded);
}

// zero_train's optimizer, with decay_groups: "adamw" (the default), "adadelta", "adagrad",
// "rmsprop" (centered, with momentum).
std::shared_ptr<optim::Optimizer> make_optimizer(const std::string& name, const nn::Module& m,
                                                 const optim::AdamWOptions& ao) {
  if (name == "adadelta")
    return std::make_shared<optim::Adadelta>(decay_groups(m), optim::AdadeltaOptions(0.5));
  if (name == "adagrad")
    return std::make_shared<optim::Adagrad>(
        decay_groups(m),
        optim::AdagradFields{.lr = 1e-2, .lr_decay = 0.01, .initial_accumulator_value = 0.1});
  if (name == "rmsprop")
    return std::make_shared<optim::RMSprop>(
        decay_groups(m), optim::RMSpropOptions(1e-3).momentum(0.5).centered(true));
  EXPECT(name == "adamw");
  return std::make_shared<optim::AdamW>(decay_groups(m), ao);
}

int zero_train(const std::string& dir, int stage, int64_t batch, int steps, int save_at,
               bool resume, const std::string& mp, int accumulation, const std::string& optimizer) {
  AcceleratorConfig c = config_from_env(dir);
  c.zero_stage = stage;
  c.gradient_accumulation_steps = accumulation;
  c.ddp.bucket_cap_bytes = 512;
  c.seed = 4;
  const bool f64 = mp == "f64";  // float64 model and data, no mixed precision
  if (!mp.empty() && !f64) {
    c.mixed_precision = dist::MixedPrecision::BF16;
    c.zero.param_dtype = kBFloat16;
    c.zero.reduce_in_fp32 = mp == "bf16-fp32";
  }
  Accelerator acc(c);
  const bool mp_zero = !mp.empty() && !f64 && acc.num_processes() > 1 && (stage == 1 || stage == 2);
  auto mlp = make_mlp();
  if (f64) mlp->to(kFloat64);
  optim::AdamWOptions ao;
  ao.lr(1e-2);
  std::shared_ptr<optim::Optimizer> opt = make_optimizer(optimizer, *mlp, ao);
  auto sched = std::make_shared<optim::StepLR>(*opt, 3, 0.5);
  data::DataLoaderOptions lo;
  lo.batch_size = batch;
  auto loader = std::make_shared<data::DataLoader>(test::make_dataset(48), lo);
  auto [model, aopt, aloader, asched] = acc.prepare(mlp, opt, loader, sched);
  int64_t numel = 0;
  for (auto& p : model->parameters()) {
    numel += p.numel();
    // ZeRO param_dtype: bf16 compute parameters from prepare() on.
    EXPECT(p.dtype() == (mp_zero ? kBFloat16 : f64 ? kFloat64 : kFloat32));
  }
  int done = 0;
  if (resume) {
    acc.load_state(dir + "/ckpt");
    done = int(acc.step());
    std::printf("resumed at %d lr %.9g\n", done, aopt->lr());
    print_exact(acc, *model, "loaded");
  }
  while (done < steps) {
    for (auto& b : *aloader) {
      auto scope = acc.accumulate();
      Tensor loss;
      {
        auto ac = acc.autocast();
        loss = f64 ? mse_loss(model->forward(b[0].to(kFloat64)), b[1].to(kFloat64))
                   : mse_loss(model->forward(b[0]), b[1]);
      }
      acc.backward(loss);
      aopt->step();
      asched->step();
      aopt->zero_grad();
      std::printf("loss %d %s\n", done,
                  test::hex(acc.reduce(loss.detach(), "mean").item<double>()).c_str());
      ++done;
      if (!resume && done == save_at) {
        acc.save_state(dir + "/ckpt");
        print_exact(acc, *model, "saved");
      }
      if (done == steps) break;
    }
  }
  for (auto& p : model->parameters())
    EXPECT(p.dtype() == (mp_zero ? kBFloat16 : f64 ? kFloat64 : kFloat32));
  if (f64) {  // every bit of the float64 parameters
    const io::TensorDict full = acc.get_state_dict(*model);
    for (auto& [name, p] : model->named_parameters())
      for (double v : full.at(name).tolist()) std::printf("p64 %a\n", v);
  }
  if (mp_zero) {
    // bf16 parameters in full, fp32 master shards and AdamW state (two slots) in 1/N slices; a
    // few elements of padding per bucket.
    const dist::StrategyMemory m = acc.memory();
    const int64_t w = acc.num_processes(), slack = 64 * w * 4;
    std::printf("zero mp params %lld optimizer %lld grads %lld full %lld\n",
                (long long)m.param_bytes, (long long)m.optimizer_bytes, (long long)m.grad_bytes,
                (long long)m.full_param_bytes);
    EXPECT(m.full_param_bytes == numel * 2);
    EXPECT(m.param_bytes >= numel * 2 + numel * 4 / w &&
           m.param_bytes <= numel * 2 + numel * 4 / w + slack);
    EXPECT(m.optimizer_bytes >= 2 * numel * 4 / w &&
           m.optimizer_bytes <= 2 * numel * 4 / w + slack);
  }
  print_params(acc, *model);
  // The consolidated export (streamed unit by unit under ZeRO-3) equals the unsharded state.
  const std::string exported = dir + "/export_w" + std::to_string(acc.num_processes()) +
                               (resume ? "_resumed" : "") + ".safetensors";
  acc.save_model(*model, exported);
  const io::TensorDict full = acc.get_state_dict(*model);
  if (acc.is_main_process()) {
    const io::TensorDict file = io::load_safetensors(exported);
    EXPECT(file.size() == full.size());
    for (auto& [name, t] : full) {
      EXPECT(file.count(name) == 1);
      EXPECT(file.at(name).sizes() == t.sizes());
      EXPECT(std::memcmp(file.at(name).contiguous().data_ptr(), t.contiguous().data_ptr(),
                         t.nbytes()) == 0);
    }
    std::cout << "export matches" << std::endl;
  }
  std::cout << "ok zero_train" << std::endl;
  return 0;
}

// A checkpoint of another model (other widths) into a prepared run: a clear error naming a
// parameter and its shapes on every rank, the run's own state untouched.
int wrong_model(const std::string& dir, int stage) {
  AcceleratorConfig c = config_from_env(dir);
  c.zero_stage = stage;
  Accelerator acc(c);
  Generator g(5);
  auto mlp = std::make_shared<nn::Sequential>(
      std::make_shared<nn::Linear>(4, 24, true, &g), std::make_shared<nn::Tanh>(),
      std::make_shared<nn::Linear>(24, 16, true, &g), std::make_shared<nn::Tanh>(),
      std::make_shared<nn::Linear>(16, 1, true, &g));
  auto opt = std::make_shared<optim::AdamW>(decay_groups(*mlp), optim::AdamWOptions{});
  auto sched = std::make_shared<optim::StepLR>(*opt, 3, 0.5);
  data::DataLoaderOptions lo;
  lo.batch_size = 4;
  auto loader = std::make_shared<data::DataLoader>(test::make_dataset(48), lo);
  auto [model, aopt, aloader, asched] = acc.prepare(mlp, opt, loader, sched);
  const io::TensorDict before = acc.get_state_dict(*model);
  bool named = false;
  try {
    acc.load_state(dir + "/ckpt");
  } catch (const Error& e) {
    const std::string m = e.what();
    named = m.find("0.weight") != std::string::npos && m.find("(24, 4)") != std::string::npos;
    if (!named) std::printf("message: %s\n", e.what());
  }
  EXPECT(named);
  const io::TensorDict after = acc.get_state_dict(*model);
  for (auto& [k, v] : before) EXPECT(after.at(k).equal(v));
  // An export the main process cannot write fails on every rank (none waits in a gather).
  bool io = false;
  try {
    acc.save_model(*model, dir + "/no/such/dir/model.safetensors");
  } catch (const IoError&) {
    io = true;
  }
  EXPECT(io);
  acc.wait_for_everyone();  // the group is still in step
  std::cout << "ok wrong_model" << std::endl;
  return 0;
}

// A hostile checkpoint (tests/accelerate/test_hostile_checkpoints.cc): load_state must throw an
// IoError whose message holds every word of `words` on every rank, and change nothing.
int hostile(const std::string& dir, int stage, const std::vector<std::string>& words) {
  AcceleratorConfig c = config_from_env(dir);
  c.zero_stage = stage;
  c.ddp.bucket_cap_bytes = 512;
  Accelerator acc(c);
  auto mlp = make_mlp();
  auto opt = std::make_shared<optim::AdamW>(decay_groups(*mlp), optim::AdamWOptions{});
  auto sched = std::make_shared<optim::StepLR>(*opt, 3, 0.5);
  data::DataLoaderOptions lo;
  lo.batch_size = 4;
  auto loader = std::make_shared<data::DataLoader>(test::make_dataset(48), lo);
  auto [model, aopt, aloader, asched] = acc.prepare(mlp, opt, loader, sched);
  const io::TensorDict before = acc.get_state_dict(*model);
  bool named = false;
  try {
    acc.load_state(dir + "/ckpt");
    std::printf("load_state did not throw\n");
  } catch (const IoError& e) {
    const std::string m = e.what();
    named = true;
    for (const std::string& w : words) named = named && m.find(w) != std::string::npos;
    std::printf("message: %s\n", e.what());
  } catch (const std::exception& e) {
    std::printf("not an IoError: %s\n", e.what());
  }
  EXPECT(named);
  const io::TensorDict after = acc.get_state_dict(*model);
  for (auto& [k, v] : before) EXPECT(after.at(k).equal(v));
  EXPECT(acc.step() == 0);
  acc.wait_for_everyone();  // the group is still in step
  std::cout << "ok hostile" << std::endl;
  return 0;
}

// Issue 22 item 12 (Note [plain backward] in accelerate/accelerator.cc): `how` "acc" runs
// acc.backward(loss), "plain" loss.backward(); float64, AdamW with decay groups, clipping, and a
// no_sync() micro-batch before each synced one. Prints every loss and every parameter bit. With
// "scaled" (gradient_accumulation_steps 2, plain backward) the first step must raise ValueError
// naming acc.backward.
int plain_backward(int stage, const std::string& how) {
  AcceleratorConfig c = config_from_env("/tmp");
  c.zero_stage = stage;
  c.ddp.bucket_cap_bytes = 512;
  const bool scaled = how == "scaled";
  if (scaled) c.gradient_accumulation_steps = 2;
  Accelerator acc(c);
  auto mlp = make_mlp();
  mlp->to(kFloat64);
  optim::AdamWOptions ao;
  ao.lr(1e-2);
  auto opt = std::make_shared<optim::AdamW>(decay_groups(*mlp), ao);
  data::DataLoaderOptions lo;
  lo.batch_size = 6 / acc.num_processes();
  auto loader = std::make_shared<data::DataLoader>(test::make_dataset(48), lo);
  auto [model, aopt, aloader] = acc.prepare(mlp, opt, loader);
  auto loss_of = [&](const data::Batch& b) {
    return mse_loss(model->forward(b[0].to(kFloat64)), b[1].to(kFloat64));
  };
  auto backward = [&](const Tensor& loss) {
    if (how == "acc") {
      acc.backward(loss);
    } else {
      loss.backward();
    }
  };
  int micro = 0;
  for (auto& b : *aloader) {
    Tensor loss = loss_of(b);
    if (scaled) {
      auto scope = acc.accumulate();
      backward(loss);
      if (!acc.sync_gradients()) continue;
      bool named = false;
      try {
        aopt->step();
      } catch (const ValueError& e) {
        named = std::string(e.what()).find("acc.backward(loss)") != std::string::npos &&
                std::string(e.what()).find("gradient_accumulation_steps = 2") != std::string::npos;
        std::printf("message: %s\n", e.what());
      }
      EXPECT(named);
      break;
    }
    if (micro++ % 2 == 0) {
      auto ns = acc.no_sync();  // accumulates locally, synced with the next micro-batch
      backward(loss);
      continue;
    }
    backward(loss);
    std::printf("norm %a\n", acc.clip_grad_norm_(0.5));
    aopt->step();
    aopt->zero_grad();
    std::printf("loss %a\n", acc.reduce(loss.detach(), "mean").item<double>());
  }
  if (!scaled) {
    EXPECT(acc.optimizer_steps() == 4);
    const io::TensorDict full = acc.get_state_dict(*model);
    for (auto& [name, p] : model->named_parameters())
      for (double v : full.at(name).tolist()) std::printf("p64 %a\n", v);
  }
  std::cout << "ok plain_backward" << std::endl;
  return 0;
}

// The wider MLP of the memory tests: 64 -> 512 -> 512 -> 64 (328k parameters), so that the
// parameter and optimizer bytes dominate the allocator's figures.
std::shared_ptr<nn::Sequential> make_wide_mlp(uint64_t seed) {
  Generator g(seed);
  return std::make_shared<nn::Sequential>(
      std::make_shared<nn::Linear>(64, 512, true, &g), std::make_shared<nn::Tanh>(),
      std::make_shared<nn::Linear>(512, 512, true, &g), std::make_shared<nn::Tanh>(),
      std::make_shared<nn::Linear>(512, 64, true, &g));
}

// Issue 22, item 16: resuming must not need more memory than training. `phase` "save": train 3
// steps of the wide MLP and save_state into <dir>/ckpt; "load": a fresh run loads it (another
// world size re-shards), then trains 3 steps. Prints the CPU allocator's peak bytes in use
// during load_state and over the last 2 training steps ("load_peak", "train_peak": allocator
// bytes are deterministic, RSS is not) and checks load_peak <= 1.10 x train_peak; and that the
// load grew the allocator by no more than what this rank keeps of the parameters and of the
// optimizer state (one copy of each: what it read), in the allocator's size classes (up to 1/4
// above the bytes: Note [CPU caching allocator]), plus a bounded transient.
int resume_peak(const std::string& dir, const std::string& phase, int stage) {
  AcceleratorConfig c = config_from_env(dir);
  c.zero_stage = stage;
  Accelerator acc(c);
  auto mlp = make_wide_mlp(phase == "save" ? 1 : 2);
  optim::AdamWOptions ao;
  ao.lr(1e-3);
  auto opt = std::make_shared<optim::AdamW>(mlp->parameters(), ao);
  data::DataLoaderOptions lo;
  lo.batch_size = 16;
  Generator g(9);
  Tensor x = randn({480, 64}, {}, &g), y = randn({480, 64}, {}, &g);
  auto loader = std::make_shared<data::DataLoader>(
      std::make_shared<data::TensorDataset>(std::vector<Tensor>{x, y}), lo);
  auto [model, aopt, aloader] = acc.prepare(mlp, opt, loader);
  Allocator* a = get_allocator(kCPU);
  int64_t load_peak = 0;
  if (phase == "load") {
    a->reset_peak_stats();
    const int64_t before = int64_t(a->stats().bytes_in_use);
    acc.load_state(dir + "/ckpt");
    load_peak = int64_t(a->stats().peak_bytes_in_use);
    const dist::StrategyMemory m = acc.memory();
    const int64_t kept = m.param_bytes + m.optimizer_bytes;
    std::printf("load grew %lld bytes; this rank keeps %lld of parameters and optimizer state\n",
                (long long)(load_peak - before), (long long)kept);
    EXPECT(load_peak - before <= kept * 5 / 4 + (512 << 10));
  }
  int done = 0;
  for (auto& b : *aloader) {
    if (done == 1) a->reset_peak_stats();
    acc.backward(mse_loss(model->forward(b[0]), b[1]));
    aopt->step();
    aopt->zero_grad();
    if (++done == 3) break;
  }
  const int64_t train_peak = int64_t(a->stats().peak_bytes_in_use);
  if (phase == "save") {
    acc.save_state(dir + "/ckpt");
  } else {
    std::printf("load_peak %lld train_peak %lld ratio %.3f\n", (long long)load_peak,
                (long long)train_peak, double(load_peak) / double(train_peak));
    EXPECT(load_peak <= train_peak * 11 / 10);
  }
  std::cout << "ok resume_peak" << std::endl;
  return 0;
}

// Issue 22, item 17: Accelerator::load_model. `phase` "save": 2 ranks of ZeRO-3 train 2 steps
// of the wide MLP and save_model <dir>/model.safetensors, which rank 0 also writes as a sharded
// set (model-0000k-of-00002.safetensors + model.safetensors.index.json, as transformers does, in
// <dir>/sharded) and in float64 (<dir>/model_f64.safetensors). "load": a run of another seed at
// `stage` loads `what` (file, index, dir, f64; mp: the file into bf16 compute parameters, whose
// fp32 masters must hold it) and must hold exactly the saved values; the
// allocator may not grow by more than the conversion buffer during the load.
int load_model_case(const std::string& dir, const std::string& phase, int stage,
                    const std::string& what) {
  AcceleratorConfig c = config_from_env(dir);
  c.zero_stage = stage;
  const bool mp = what == "mp";  // bf16 compute parameters over fp32 masters (ZeRO param_dtype)
  if (mp) {
    c.mixed_precision = dist::MixedPrecision::BF16;
    c.zero.param_dtype = c.fsdp.param_dtype = kBFloat16;
  }
  Accelerator acc(c);
  auto mlp = make_wide_mlp(phase == "save" ? 1 : 3);
  auto opt = std::make_shared<optim::AdamW>(mlp->parameters(), optim::AdamWOptions{});
  auto [model, aopt] = acc.prepare(mlp, opt);
  const std::string file = dir + "/model.safetensors";
  if (phase == "save") {
    EXPECT(acc.strategy().name() == "fsdp");
    Generator g(4);
    for (int s = 0; s < 2; ++s) {
      acc.backward(mse_loss(model->forward(randn({8, 64}, {}, &g)), randn({8, 64}, {}, &g)));
      aopt->step();
      aopt->zero_grad();
    }
    acc.save_model(*model, file);
    if (acc.is_main_process()) {
      const io::TensorDict full = io::load_safetensors(file);
      std::filesystem::create_directories(dir + "/sharded");
      io::TensorDict parts[2];
      std::string index = "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {";
      size_t i = 0;
      for (auto& [name, t] : full) {
        const int part = int(i * 2 / full.size());
        parts[part][name] = t;
        index += std::string(i ? ", " : "") + "\"" + name + "\": \"model-0000" +
                 std::to_string(part + 1) + "-of-00002.safetensors\"";
        ++i;
      }
      for (int p = 0; p < 2; ++p)
        io::save_safetensors(
            dir + "/sharded/model-0000" + std::to_string(p + 1) + "-of-00002.safetensors",
            parts[p]);
      std::ofstream(dir + "/sharded/model.safetensors.index.json") << index << "}}";
      io::TensorDict f64;
      for (auto& [name, t] : full) f64[name] = t.to(kFloat64);
      io::save_safetensors(dir + "/model_f64.safetensors", f64);
    }
    acc.wait_for_everyone();
    std::cout << "ok load_model" << std::endl;
    return 0;
  }
  const std::string path = what == "file" || mp ? file
                           : what == "index"    ? dir + "/sharded/model.safetensors.index.json"
                           : what == "dir"      ? dir + "/sharded"
                                                : dir + "/model_f64.safetensors";
  Allocator* a = get_allocator(kCPU);
  a->reset_peak_stats();
  const int64_t before = int64_t(a->stats().bytes_in_use);
  const nn::LoadResult r = acc.load_model(*model, path);
  const int64_t grew = int64_t(a->stats().peak_bytes_in_use) - before;
  EXPECT(r.missing_keys.empty() && r.unexpected_keys.empty());
  // Straight into the model's tensors: at most the bounded conversion buffer (f64 -> f32).
  std::printf("load_model grew %lld bytes\n", (long long)grew);
  EXPECT(grew <= int64_t(io::kSafetensorsReadChunkBytes) + (64 << 10));
  const io::TensorDict want = io::load_safetensors(file);
  const io::TensorDict got = acc.get_state_dict(*model);
  EXPECT(got.size() == want.size());
  for (auto& [name, t] : want) EXPECT(got.count(name) && got.at(name).equal(t));
  // The loaded weights train on (every rank holds the same model).
  {
    Tensor loss;
    {
      auto ac = acc.autocast();
      loss = mse_loss(model->forward(ones({4, 64})), zeros({4, 64}));
    }
    acc.backward(loss);
    aopt->step();
  }
  // A file of another model: every rank refuses, names the problem, changes nothing.
  const std::string other = dir + "/other_w" + std::to_string(acc.num_processes()) + ".safetensors";
  if (acc.is_main_process()) {
    io::TensorDict d = want;
    d.erase("4.bias");
    d["extra"] = zeros({3});
    d["0.weight"] = zeros({512, 65});
    io::save_safetensors(other, d);
  }
  acc.wait_for_everyone();
  const io::TensorDict before_bad = acc.get_state_dict(*model);
  bool named = false;
  try {
    acc.load_model(*model, other);
  } catch (const ValueError& e) {
    const std::string m = e.what();
    named = m.find("missing keys (1): 4.bias") != std::string::npos &&
            m.find("unexpected keys (1): extra") != std::string::npos &&
            m.find("0.weight: file (512, 65), model (512, 64)") != std::string::npos;
    if (!named) std::printf("message: %s\n", e.what());
  }
  EXPECT(named);
  const io::TensorDict after_bad = acc.get_state_dict(*model);
  for (auto& [k, v] : before_bad) EXPECT(after_bad.at(k).equal(v));
  // Not strict: what both have loads; the rest is reported.
  if (acc.is_main_process()) {
    io::TensorDict d = want;
    d.erase("4.bias");
    d["extra"] = zeros({3});
    io::save_safetensors(other, d);
  }
  acc.wait_for_everyone();
  const nn::LoadResult loose = acc.load_model(*model, other, /*strict=*/false);
  EXPECT(loose.missing_keys == std::vector<std::string>{"4.bias"});
  EXPECT(loose.unexpected_keys == std::vector<std::string>{"extra"});
  std::cout << "ok load_model" << std::endl;
  return 0;
}

// ZeRO's prepare() refuses what it cannot shard, with a ValueError on every rank.
struct OwnSGD : optim::SGD {
  using optim::SGD::SGD;
};

int zero_errors() {
  AcceleratorConfig c = config_from_env("/tmp");
  c.zero_stage = 2;
  Accelerator acc(c);
  auto mlp = acc.prepare_model(make_mlp());
  auto params = mlp->parameters();
  auto expect_value_error = [&](std::shared_ptr<optim::Optimizer> o, const char* words) {
    try {
      acc.prepare_optimizer(std::move(o));
    } catch (const ValueError& e) {
      EXPECT(std::string(e.what()).find(words) != std::string::npos);
      return;
    }
    EXPECT(!"prepare_optimizer did not throw");
  };
  // An optimizer type that cannot be rebuilt over the shards is refused by name.
  expect_value_error(std::make_shared<OwnSGD>(params), "OwnSGD");
  // A valid one still works afterwards (nothing collective ran for the refused one), with any
  // number of param groups.
  std::vector<optim::ParamGroup> groups(2);
  groups[0].params.assign(params.begin(), params.begin() + 2);
  groups[1].params.assign(params.begin() + 2, params.end());
  groups[1].weight_decay = 0.0;
  auto ok = acc.prepare_optimizer(std::make_shared<optim::AdamW>(groups));
  EXPECT(ok->stepping_optimizer().num_param_groups() == 2);
  EXPECT(&ok->stepping_optimizer() != &ok->optimizer());
  EXPECT(acc.strategy().name() == "zero2");
  std::cout << "ok zero_errors" << std::endl;
  return 0;
}

// LBFGS through prepare() and step(closure): float64 MLP, the whole data set (48 samples) as one
// global batch, 4 steps; `phase` "full" runs them, "save" also saves after 2, "resume" loads that
// and runs the last 2. Prints each step's loss and every parameter bit. Under ZeRO (2+ ranks)
// prepare_optimizer must refuse LBFGS by name.
int lbfgs(const std::string& dir, int stage, const std::string& phase) {
  AcceleratorConfig c = config_from_env(dir);
  c.zero_stage = stage;
  Accelerator acc(c);
  auto mlp = make_mlp();
  mlp->to(kFloat64);
  optim::LBFGSOptions o;
  o.max_iter(5);
  o.history_size(4);
  o.line_search_fn("strong_wolfe");
  auto opt = std::make_shared<optim::LBFGS>(mlp->parameters(), o);
  if (stage > 0 && acc.num_processes() > 1) {
    acc.prepare_model(mlp);
    try {
      acc.prepare_optimizer(opt);
    } catch (const ValueError& e) {
      std::printf("message: %s\n", e.what());
      EXPECT(std::string(e.what()).find("LBFGS") != std::string::npos &&
             std::string(e.what()).find("cannot be sharded") != std::string::npos);
      std::cout << "ok lbfgs" << std::endl;
      return 0;
    }
    EXPECT(!"prepare_optimizer accepted LBFGS under ZeRO");
  }
  data::DataLoaderOptions lo;
  lo.batch_size = 48 / acc.num_processes();
  auto loader = std::make_shared<data::DataLoader>(test::make_dataset(48), lo);
  auto [model, aopt, aloader] = acc.prepare(mlp, opt, loader);
  Tensor x, y;
  for (auto& b : *aloader) {
    x = b[0].to(kFloat64);
    y = b[1].to(kFloat64);
    break;
  }
  int calls = 0;
  auto closure = [&] {
    ++calls;
    aopt->zero_grad();
    Tensor loss = mse_loss(model->forward(x), y);
    acc.backward(loss);
    return loss;
  };
  int done = 0;
  if (phase == "resume") {
    acc.load_state(dir + "/ckpt");
    done = int(acc.optimizer_steps());
    EXPECT(done == 2);
  }
  for (; done < 4; ++done) {
    const Tensor loss = aopt->step(closure);
    std::printf("loss %d %a\n", done, loss.item<double>());
    if (phase == "save" && done == 1) acc.save_state(dir + "/ckpt");
  }
  EXPECT(calls > 4);  // the line search re-evaluates
  const io::TensorDict full = acc.get_state_dict(*model);
  for (auto& [name, p] : model->named_parameters())
    for (double v : full.at(name).tolist()) std::printf("p64 %a\n", v);
  std::cout << "ok lbfgs" << std::endl;
  return 0;
}

// The test matrix of Note [strategy seam]: 20 optimizer steps (20 * accumulation micro-batches)
// over an unshuffled loader whose global micro-batch is batch * W; AdamW with decay / no-decay
// groups at different lrs, clipping on every sync step. Prints the global mean loss of every
// micro-batch and the final parameters.
int matrix(int stage, int64_t batch, int accumulation, const std::string& mp) {
  AcceleratorConfig c = config_from_env("/tmp");
  c.zero_stage = stage;
  c.gradient_accumulation_steps = accumulation;
  c.ddp.bucket_cap_bytes = 512;
  if (!mp.empty()) {  // as in zero_train; "fp16": fp16 parameters, autocast and loss scaling
    const bool fp16 = mp == "fp16";
    c.mixed_precision = fp16 ? dist::MixedPrecision::FP16 : dist::MixedPrecision::BF16;
    c.zero.param_dtype = fp16 ? kFloat16 : kBFloat16;
    c.zero.reduce_in_fp32 = mp == "bf16-fp32";
    c.scaler.init_scale = 256;
  }
  Accelerator acc(c);
  auto mlp = make_mlp();
  optim::AdamWOptions ao;
  ao.lr(1e-2);
  auto opt = std::make_shared<optim::AdamW>(decay_groups(*mlp), ao);
  data::DataLoaderOptions lo;
  lo.batch_size = batch;
  auto loader = std::make_shared<data::DataLoader>(test::make_dataset(240), lo);
  auto [model, aopt, aloader] = acc.prepare(mlp, opt, loader);
  const int micro = 20 * accumulation;
  int done = 0;
  while (done < micro) {
    for (auto& b : *aloader) {
      auto scope = acc.accumulate();
      Tensor loss;
      {
        auto ac = acc.autocast();
        loss = mse_loss(model->forward(b[0]), b[1]);
      }
      acc.backward(loss);
      if (acc.sync_gradients()) std::printf("norm %.9g\n", acc.clip_grad_norm_(0.5));
      aopt->step();
      aopt->zero_grad();
      std::printf("loss %.9g\n", acc.reduce(loss.detach(), "mean").item<double>());
      if (++done == micro) break;
    }
  }
  EXPECT(acc.optimizer_steps() >= 20);
  print_params(acc, *model);
  std::cout << "ok matrix" << std::endl;
  return 0;
}

int train(const std::string& dir, int steps, int save_every, bool resume,
          const std::string& crash_stage, int crash_rank) {
  AcceleratorConfig c = config_from_env(dir);
  c.gradient_accumulation_steps = 2;
  c.seed = 3;
  c.total_limit = 3;
  Accelerator acc(c);
  Run run(acc, 4);
  int saves = 0;
  if (!crash_stage.empty())
    dist::set_checkpoint_hook([&](const std::string& stage) {
      if (saves == 1 && stage == crash_stage && acc.process_index() == crash_rank) raise(SIGKILL);
    });
  int done = 0;
  if (resume) {
    std::string path = acc.load_state();
    done = int(acc.step());
    std::printf("loaded %s step %d\n", path.c_str(), done);
  }
  while (done < steps) {
    for (auto& b : *run.loader) {
      double loss = run.step(acc, b);
      std::printf("loss %d %d %s\n", acc.process_index(), done, test::hex(loss).c_str());
      ++done;
      if (save_every > 0 && done % save_every == 0) {
        acc.save_state();
        ++saves;
      }
      if (done == steps) break;
    }
  }
  std::fflush(stdout);
  std::cout << "ok train" << std::endl;
  return 0;
}

// Note [module calls], Note [tied parameters]: the typed model under every strategy. Two epochs
// of 48 unshuffled samples, accumulation 2, AdamW; each micro-batch through the prepared
// optimizer's step(closure). Prints the global loss of every micro-batch and the parameters.
int typed(const std::string& dir, int stage, int64_t batch, bool ckpt_units) {
  AcceleratorConfig c = config_from_env(dir);
  c.zero_stage = stage;
  c.gradient_accumulation_steps = 2;
  c.ddp.bucket_cap_bytes = 512;
  c.fsdp.activation_checkpointing = ckpt_units;
  Accelerator acc(c);
  auto net = std::make_shared<test::TypedNet>();
  optim::AdamWOptions ao;
  ao.lr(1e-2);
  auto opt = std::make_shared<optim::AdamW>(net->parameters(), ao);
  Generator g(41);
  Tensor x = randn({48, test::kTypedIn}, {}, &g);
  Tensor y = randint(0, test::kTypedClasses, {48}, TensorOptions(kInt64), &g);
  data::DataLoaderOptions lo;
  lo.batch_size = batch;
  auto loader = std::make_shared<data::DataLoader>(
      std::make_shared<data::TensorDataset>(std::vector<Tensor>{x, y}), lo);
  auto [model, aopt, aloader] = acc.prepare(net, opt, loader);
  if (acc.num_processes() > 1)
    EXPECT(acc.strategy().name() == (stage == 3   ? "fsdp"
                                     : stage == 0 ? "ddp"
                                                  : "zero" + std::to_string(stage)));
  for (int epoch = 0; epoch < 2; ++epoch)
    for (auto& b : *aloader) {
      auto scope = acc.accumulate();
      Tensor loss = aopt->step([&] {
        Tensor l = test::typed_loss((*model)(b[0]), b[1]);
        acc.backward(l);
        return l;
      });
      aopt->zero_grad();
      std::printf("loss %.9g\n", acc.reduce(loss.detach(), "mean").item<double>());
    }
  EXPECT(acc.optimizer_steps() == 2 * 48 / (2 * batch * acc.num_processes()));
  auto b0 = model->blocks->at<test::PairBlock>(0), b1 = model->blocks->at<test::PairBlock>(1);
  EXPECT(b0->fc->weight.is_same(b1->fc->weight));
  print_params(acc, *model);
  // The export: the tied weight once, its other name in the metadata; it loads into both uses.
  const std::string path = dir + "/typed_w" + std::to_string(acc.num_processes()) + ".safetensors";
  acc.save_model(*model, path);
  const io::TensorDict full = acc.get_state_dict(*model);
  EXPECT(full.count("blocks.1.fc.weight") &&
         full.at("blocks.1.fc.weight").equal(full.at("blocks.0.fc.weight")));
  if (acc.is_main_process()) {
    io::Metadata md;
    (void)io::load_safetensors(path, &md);
    EXPECT(md.count("blocks.1.fc.weight") && md.at("blocks.1.fc.weight") == "blocks.0.fc.weight");
    auto fresh = std::make_shared<test::TypedNet>(false);
    fresh->load(path);
    for (auto& [name, t] : full) EXPECT(fresh->state_dict().at(name).equal(t));
  }
  // A checkpoint round trip: one more step changes the model, load_state brings back the saved
  // values into both uses of the tied weight.
  const std::string ckpt = dir + "/typed_ckpt_w" + std::to_string(acc.num_processes()) + "_s" +
                           std::to_string(stage) + (ckpt_units ? "c" : "");
  acc.save_state(ckpt);
  for (auto& b : *aloader) {
    for (int k = 0; k < 2; ++k) {
      auto scope = acc.accumulate();
      acc.backward(test::typed_loss((*model)(b[0]), b[1]));
      aopt->step();
      aopt->zero_grad();
    }
    break;
  }
  EXPECT(!acc.get_state_dict(*model).at("stem.weight").equal(full.at("stem.weight")));
  acc.load_state(ckpt);
  const io::TensorDict back = acc.get_state_dict(*model);
  for (auto& [name, t] : full) EXPECT(back.at(name).equal(t));
  EXPECT(b0->fc->weight.is_same(b1->fc->weight));
  std::cout << "ok typed" << std::endl;
  return 0;
}

// Note [mesh support] in accelerate/accelerator_mesh.cc, seen from a rank.
int mesh() {
  Accelerator acc(config_from_env("/tmp"));
  const dist::DeviceMesh& m = acc.mesh();
  std::cout << "mesh " << m.describe() << std::endl;
  for (const char* dim : {"dp_replicate", "dp_shard", "tp", "dp"}) {
    std::cout << "group " << dim;
    for (int r : m.group_ranks(dim)) std::cout << " " << r;
    std::cout << std::endl;
    // Note [accelerator mesh groups]: the process group of the dimension, by its world ranks.
    const dist::ProcessGroupPtr& g = m.group(dim);
    std::cout << "pg " << dim << " rank " << g->rank() << " of";
    for (int r : g->world_ranks()) std::cout << " " << r;
    std::cout << std::endl;
  }
  // Every group works: an all-reduce of ones counts its ranks.
  for (const char* dim : {"dp_replicate", "dp_shard", "tp", "dp"}) {
    Tensor one = ones({1});
    m.group(dim)->all_reduce(one);
    std::cout << "sum " << dim << " " << one.item<float>() << std::endl;
  }
  auto model = std::make_shared<nn::Linear>(2, 2);
  auto attempt = [](const char* what, const std::function<void()>& fn) {
    try {
      fn();
      std::cout << "prepared " << what << std::endl;
    } catch (const ValueError& e) {
      std::cout << "refused " << what << ": " << e.what() << std::endl;
    }
  };
  attempt("model", [&] { acc.prepare_model(model); });
  attempt("optimizer", [&] {
    acc.prepare_optimizer(
        std::make_shared<optim::SGD>(model->parameters(), optim::SGDOptions(0.1)));
  });
  attempt("loader", [&] {
    acc.prepare_data_loader(std::make_shared<data::DataLoader>(
        std::make_shared<data::TensorDataset>(std::vector<Tensor>{zeros({4, 2})}),
        data::DataLoaderOptions{}));
  });
  // Note [process data shard] in data/sampler.h: a loader built from RANK / WORLD_SIZE, and one
  // given the mesh's dp coordinate explicitly.
  auto rows = std::make_shared<data::TensorDataset>(std::vector<Tensor>{zeros({8, 2})});
  for (const bool explicit_shard : {false, true}) {
    const char* what = explicit_shard ? "explicit loader" : "unprepared loader";
    try {
      data::DataLoaderOptions o;
      o.batch_size = 2;
      if (explicit_shard) {
        o.rank = m.coordinate("dp");
        o.world_size = m.size("dp");
      }
      data::DataLoader loader(rows, o);
      int64_t n = 0;
      for (const data::Batch& b : loader) n += b.indices.size() > 0;
      std::cout << "iterated " << what << " " << n << std::endl;
    } catch (const ValueError& e) {
      std::cout << "refused " << what << ": " << e.what() << std::endl;
    }
  }
  std::cout << "ok mesh" << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "facade") return facade();
    if (mode == "ddp" && argc > 2) return ddp(std::atoll(argv[2]));
    if (mode == "ddp_mlp" && argc > 2)
      return ddp_mlp(std::atoll(argv[2]), argc > 3 ? std::atoi(argv[3]) : 0,
                     argc > 4 ? argv[4] : "no");
    if (mode == "zero_errors") return zero_errors();
    if (mode == "mesh") return mesh();
    if (mode == "resume_peak" && argc > 4) return resume_peak(argv[2], argv[3], std::atoi(argv[4]));
    if (mode == "load_model" && argc > 4)
      return load_model_case(argv[2], argv[3], std::atoi(argv[4]), argc > 5 ? argv[5] : "file");
    if (mode == "plain_backward" && argc > 3) return plain_backward(std::atoi(argv[2]), argv[3]);
    if (mode == "hostile" && argc > 3)
      return hostile(argv[2], std::atoi(argv[3]), std::vector<std::string>(argv + 4, argv + argc));
    if (mode == "wrong_model" && argc > 3) return wrong_model(argv[2], std::atoi(argv[3]));
    if (mode == "zero_train" && argc > 7)
      return zero_train(argv[2], std::atoi(argv[3]), std::atoll(argv[4]), std::atoi(argv[5]),
                        std::atoi(argv[6]), std::atoi(argv[7]) != 0,
                        argc > 8 && std::strcmp(argv[8], "-") != 0 ? argv[8] : "",
                        argc > 9 ? std::atoi(argv[9]) : 1, argc > 10 ? argv[10] : "adamw");
    if (mode == "lbfgs" && argc > 4) return lbfgs(argv[2], std::atoi(argv[3]), argv[4]);
    if (mode == "typed" && argc > 4)
      return typed(argv[2], std::atoi(argv[3]), std::atoll(argv[4]),
                   argc > 5 && std::atoi(argv[5]) != 0);
    if (mode == "matrix" && argc > 4)
      return matrix(std::atoi(argv[2]), std::atoll(argv[3]), std::atoi(argv[4]),
                    argc > 5 ? argv[5] : "");
    if (mode == "train" && argc > 5)
      return train(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]) != 0,
                   argc > 7 ? argv[6] : "", argc > 7 ? std::atoi(argv[7]) : -1);
    std::fprintf(stderr,
                 "usage: accel_worker facade|ddp B|train DIR STEPS EVERY RESUME [STAGE RANK]\n");
    return 64;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", e.what());
    return 3;
  }
}
