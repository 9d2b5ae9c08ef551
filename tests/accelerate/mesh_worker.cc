// One rank of the mesh-training tests (tests/accelerate/test_mesh_training.cc): a small GPT
// (examples/models.h) trained in float64 through the Accelerator on the mesh and strategy of the
// ACCEL_* variables (ACCEL_DP_REPLICATE_SIZE, ACCEL_DP_SHARD_SIZE, ACCEL_TP_SIZE, ACCEL_CP_SIZE,
// ACCEL_PP_SIZE, ACCEL_ZERO_STAGE, ACCEL_GRADIENT_ACCUMULATION_STEPS,
// ACCEL_FSDP_ACTIVATION_CHECKPOINTING), AdamW with weight decay and gradient clipping, a fixed
// global batch that each data-parallel rank takes its share of (the ranks of a tp group take the
// same one), so every mesh, one process included, computes the same steps.
//   mesh_worker <out> <steps> [import <file>] [load <dir>] [save <step> <dir>] [export <file>]
//               [sp] [f32] [dropout] [ln_f-replicate] [loader] [tied] [uneven] [deferred]
// import: load_model(file) after prepare; load: load_state(dir), then train until <steps>
// optimizer steps in all; save: also save_state(dir) after optimizer step <step> (then go on);
// export: save_model(file) at the end; sp: sequence parallel in the tp plan (models::gpt_tp_plan,
// used when ACCEL_TP_SIZE > 1); f32: a float32 model (for 16-bit compute parameters); dropout:
// GPT-2's dropouts at 0.1 (GptConfig::dropout), the default generator seeded with
// set_seed(11, device_specific) (the dp index: a tp group alike, and one process's seed at dp 1);
// ln_f-replicate: the plan styles ln_f replicate() instead of sequence() (wrong under sp: Note
// [replicated gradient check]);
// loader: the batches come from a prepared, shuffled DataLoader over kSequences fixed sequences
// with split_batches (the global batch is kBatch at every dp size: kSequences / kBatch steps an
// epoch), whose position save_state / load_state carry, instead of a fresh random batch per step.
// tied: the head's weight is the token embedding's (not with tp: the plan cuts them differently).
// uneven: vocabulary 31, 5 heads, d_model 40 (MLP 160): sizes tp 2, 3 and 4 do not all divide
// (Note [uneven tp shards] in parallel/tensor_parallel.cc; tp 4 leaves a rank without heads).
// deferred: the model is built under nn::DeferredInit from the default generator (manual_seed 5)
// and made float64 before it has values; prepare materialises it (one process: nn::materialize
// first). Rank 0 also writes "peak <bytes during prepare> <full model bytes>".
// no-cp-plan: AcceleratorConfig::cp_plan left empty (refused at ACCEL_CP_SIZE > 1).
// pipeline <gpipe|1f1b|interleaved> <microbatches> <chunks per rank>: AcceleratorConfig::pipeline
// (used at ACCEL_PP_SIZE > 1); split <layer>[,<layer>...]: its split points.
// Every micro-step is Accelerator::forward_backward (a pipeline step under pp); autocast: inside
// acc.autocast() (ACCEL_MIXED_PRECISION's dtype; with f32, a float32 model).
// loadall <tag>=<dir>[,<tag>=<dir>...]: instead of one run, for each checkpoint in turn
// load_state(dir) and train until <steps>, writing <out>.<tag> as <out> is written (the
// checkpoint matrix: tests/accelerate/test_checkpoint_matrix.cc).
// Rank 0
// writes <out>:
//   "loss <step> <value>"        the global mean loss of every step trained here (%.17g)
//   "param <name> <numel>", then the values of the final full parameter, one per line (%.17g)
// Prints "ok mesh_train" on success; exit code != 0 on failure.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "accelerate/accelerator.h"
#include "optim/adam.h"
#include "core/generator.h"
#include "core/storage.h"
#include "examples/models.h"

using namespace accel;

namespace {

constexpr int64_t kBatch = 8, kContext = 16, kVocab = 32, kSequences = 64, kUnevenVocab = 31;

models::GptConfig config() {
  models::GptConfig c;
  c.vocab = kVocab;
  c.context = kContext;
  c.layers = 2;
  c.heads = 4;
  c.d_model = 32;
  return c;
}

int run(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: mesh_worker <out> <steps> [import <file>] [load <dir>] "
                 "[save <step> <dir>] [export <file>] [sp] [f32] [dropout] [ln_f-replicate] "
                 "[loader] [tied]\n";
    return 2;
  }
  const std::string out_path = argv[1];
  const int steps = std::atoi(argv[2]);
  std::string load_dir, save_dir, export_path, import_path, load_all;
  int save_at = -1;
  bool sequence_parallel = false, f32 = false, with_dropout = false, ln_f_replicate = false,
       use_loader = false, tied = false, uneven = false, deferred = false, no_cp_plan = false;
  dist::PipelinePlan pipeline;
  bool autocast = false;
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "loadall" && i + 1 < argc) {
      load_all = argv[++i];
    } else if (a == "load" && i + 1 < argc) {
      load_dir = argv[++i];
    } else if (a == "save" && i + 2 < argc) {
      save_at = std::atoi(argv[++i]);
      save_dir = argv[++i];
    } else if (a == "export" && i + 1 < argc) {
      export_path = argv[++i];
    } else if (a == "import" && i + 1 < argc) {
      import_path = argv[++i];
    } else if (a == "sp") {
      sequence_parallel = true;
    } else if (a == "f32") {
      f32 = true;
    } else if (a == "dropout") {
      with_dropout = true;
    } else if (a == "ln_f-replicate") {
      ln_f_replicate = true;
    } else if (a == "loader") {
      use_loader = true;
    } else if (a == "tied") {
      tied = true;
    } else if (a == "uneven") {
      uneven = true;
    } else if (a == "deferred") {
      deferred = true;
    } else if (a == "autocast") {
      autocast = true;
    } else if (a == "no-cp-plan") {
      no_cp_plan = true;
    } else if (a == "pipeline" && i + 3 < argc) {
      const std::string kind = argv[++i];
      pipeline.schedule = kind == "gpipe"  ? dist::PipelineScheduleKind::GPipe
                          : kind == "1f1b" ? dist::PipelineScheduleKind::OneFOneB
                                           : dist::PipelineScheduleKind::Interleaved1F1B;
      pipeline.microbatches = std::atoi(argv[++i]);
      pipeline.chunks = std::atoi(argv[++i]);
    } else if (a == "split" && i + 1 < argc) {
      std::string rest = argv[++i];
      while (!rest.empty()) {
        const size_t comma = rest.find(',');
        pipeline.split.push_back(rest.substr(0, comma));
        rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
      }
    } else {
      std::cerr << "mesh_worker: unexpected argument '" << a << "'\n";
      return 2;
    }
  }

  AcceleratorConfig cfg;
  cfg.cpu = true;
  cfg.project_dir = "/tmp";
  cfg.log_with = {};
  cfg.split_batches = use_loader;
  // Used only when ACCEL_TP_SIZE > 1: Megatron's layout of examples/models.h's Gpt.
  cfg.tp_plan = models::gpt_tp_plan({.sequence_parallel = sequence_parallel});
  // Used only when ACCEL_CP_SIZE > 1: ring attention in every block, global positions.
  if (!no_cp_plan) cfg.cp_plan = models::gpt_cp_plan();
  // Used only when ACCEL_PP_SIZE > 1: the layers cut evenly (or at `split`), this schedule.
  cfg.pipeline = pipeline;
  if (ln_f_replicate)
    for (auto& [pattern, style] : cfg.tp_plan)
      if (pattern == "ln_f") style = dist::replicate();
  Accelerator acc(cfg);
  const dist::DeviceMesh& mesh = acc.mesh();
  const int dp = mesh.size("dp"), dp_rank = mesh.coordinate("dp");
  // The ranks of a cp group read the same rows and keep their tokens of each (a prepared loader
  // does it itself).
  const dist::SequenceSplit seq = dist::sequence_split(mesh);
  ACCEL_CHECK(kBatch % dp == 0, ValueError, "mesh_worker", "dp ", dp, " does not divide ", kBatch);

  if (with_dropout) acc.set_seed(11, /*device_specific=*/true);
  Generator gen(5);
  models::GptConfig c = config();
  if (with_dropout) c.dropout = 0.1;
  if (uneven) {
    c.vocab = kUnevenVocab;
    c.heads = 5;
    c.d_model = 40;
  }
  std::shared_ptr<models::Gpt> model;
  if (deferred) {
    c.layers = 24;  // blocks many enough that one of them is small beside the model
    manual_seed(5);
    nn::DeferredInit d;
    model = std::make_shared<models::Gpt>(c);
  } else {
    model = std::make_shared<models::Gpt>(c, &gen);
  }
  if (tied) model->head->weight = model->head->set_parameter("weight", model->tok->weight);
  if (!f32) model->to(kFloat64);
  int64_t model_bytes = 0;
  for (const Tensor& p : model->parameters())
    model_bytes += p.numel() * int64_t(dtype_size(p.dtype()));
  if (deferred && acc.num_processes() == 1) nn::materialize(*model);
  Allocator* alloc = get_allocator(kCPU);
  alloc->reset_peak_stats();
  const size_t before = alloc->stats().bytes_in_use;
  optim::AdamWOptions ao;
  ao.lr(1e-2);
  ao.weight_decay(0.01);
  auto opt = std::make_shared<optim::AdamW>(model->parameters(), ao);
  auto [m, o] = acc.prepare(model, std::static_pointer_cast<optim::Optimizer>(opt));
  // The most this rank held at once while preparing, above what it held before (Part of issue
  // 37's "only local shards are ever materialised").
  const Tensor peak = acc.reduce(
      full({1}, double(alloc->stats().peak_bytes_in_use - before), TensorOptions(kFloat64)), "max");
  std::shared_ptr<data::DataLoader> loader;
  if (use_loader) {
    Generator g(99);
    const Tensor seqs = randint(0, c.vocab, {kSequences, kContext + 1}, TensorOptions(kInt64), &g);
    // Inputs and targets as two fields: under cp the loader cuts both along the sequence.
    const Tensor xs = seqs.narrow(1, 0, kContext).contiguous();
    const Tensor ys = seqs.narrow(1, 1, kContext).contiguous();
    data::DataLoaderOptions lo;
    lo.batch_size = kBatch;
    lo.shuffle = true;
    lo.seed = 3;
    loader = acc.prepare_data_loader(std::make_shared<data::DataLoader>(
        std::make_shared<data::TensorDataset>(std::vector<Tensor>{xs, ys}), lo));
  }
  data::DataLoader::Iterator batch;  // the loader's current batch
  bool started = false;

  if (!import_path.empty()) acc.load_model(*m, import_path);
  char line[96];
  const int64_t per_rank = kBatch / dp;
  // Trains from optimizer step `first` to `steps`, writing `path` on rank 0.
  auto train = [&](int first, const std::string& path) {
    std::ofstream out;
    if (acc.is_main_process()) out.open(path);
    if (deferred && acc.is_main_process())
      out << "peak " << int64_t(peak.item()) << " " << model_bytes << "\n";
    started = false;
    for (int s = first; s < steps; ++s) {
      Tensor mine, mine_y;  // (rows, T + 1) tokens; with the loader (rows, T) inputs and targets
      if (loader) {
        // A new epoch when the last one ended (or at the start: begin() resumes mid-epoch).
        if (!started || batch == loader->end()) batch = loader->begin();
        started = true;
        mine = (*batch)[0];
        mine_y = (*batch)[1];
        ACCEL_CHECK(mine.size(0) == per_rank, ValueError, "mesh_worker", "loader batch of ",
                    mine.size(0), " rows, expected ", per_rank);
      } else {
        Generator data(uint64_t(100 + s));
        const Tensor tokens =
            randint(0, c.vocab, {kBatch, kContext + 1}, TensorOptions(kInt64), &data);
        mine = tokens.narrow(0, dp_rank * per_rank, per_rank);
      }
      // ACCEL_GRADIENT_ACCUMULATION_STEPS = k: the rank's rows in k micro-batches, one optimizer
      // step (the same data, so the same step as without accumulation).
      const int k = acc.gradient_accumulation_steps();
      ACCEL_CHECK(per_rank % k == 0, ValueError, "mesh_worker", k, " micro-batches of ", per_rank);
      double local = 0;
      for (int micro = 0; micro < k; ++micro) {
        auto scope = acc.accumulate();
        const int64_t r0 = micro * (per_rank / k), nr = per_rank / k;
        Tensor x, y;
        if (loader) {
          x = mine.narrow(0, r0, nr);
          y = mine_y.narrow(0, r0, nr);
        } else {
          const Tensor rows = mine.narrow(0, r0, nr);
          x = dist::cp_shard_sequence(rows.narrow(1, 0, kContext), 1, seq.rank, seq.size);
          y = dist::cp_shard_sequence(rows.narrow(1, 1, kContext), 1, seq.rank, seq.size);
        }
        x = x.contiguous();
        y = y.contiguous();
        // On every mesh; under pp the stages run as a pipeline and the loss is the batch's.
        Tensor loss;
        if (autocast) {
          auto ac = acc.autocast();  // ACCEL_MIXED_PRECISION's
          loss = acc.forward_backward(*m, x, y, models::lm_loss);
        } else {
          loss = acc.forward_backward(*m, x, y, models::lm_loss);
        }
        if (acc.sync_gradients()) acc.clip_grad_norm_(0.5);
        o->step();
        o->zero_grad();
        local += loss.item() / k;
      }
      // The mean over data-parallel ranks: every rank of the world reduces, the tp ranks of one
      // dp index hold the same loss, so the world mean is the dp mean; the cp ranks hold the
      // losses of equally many tokens, so their mean is the whole sequences'.
      const Tensor mean = acc.reduce(full({1}, local, TensorOptions(kFloat64)), "mean");
      if (acc.is_main_process()) {
        std::snprintf(line, sizeof line, "loss %d %.17g\n", s, mean.item());
        out << line;
      }
      if (s + 1 == save_at) acc.save_state(save_dir);
      if (loader) ++batch;  // after the save: the batch just trained counts as consumed
    }
    if (!export_path.empty()) acc.save_model(*m, export_path);
    const io::TensorDict full = acc.get_state_dict(*m);
    if (acc.is_main_process()) {
      for (const auto& [name, t] : full) {
        const Tensor v = t.to(kFloat64).contiguous().reshape({-1});
        out << "param " << name << " " << v.numel() << "\n";
        const double* p = v.data<double>();
        for (int64_t i = 0; i < v.numel(); ++i) {
          std::snprintf(line, sizeof line, "%.17g\n", p[i]);
          out << line;
        }
      }
      out.close();
      ACCEL_CHECK(out.good(), IoError, "mesh_worker", "could not write ", path);
    }
  };
  if (!load_all.empty()) {
    std::string rest = load_all;
    while (!rest.empty()) {
      const size_t comma = rest.find(',');
      const std::string item = rest.substr(0, comma);
      rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
      const size_t eq = item.find('=');
      ACCEL_CHECK(eq != std::string::npos, ValueError, "mesh_worker", "loadall item '", item,
                  "' is not <tag>=<dir>");
      acc.load_state(item.substr(eq + 1));
      train(int(acc.optimizer_steps()), out_path + "." + item.substr(0, eq));
    }
  } else {
    int first = 0;
    if (!load_dir.empty()) {
      acc.load_state(load_dir);
      first = int(acc.optimizer_steps());
    }
    train(first, out_path);
  }
  acc.wait_for_everyone();
  std::cout << "ok mesh_train" << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cout << "mesh_worker: " << e.what() << std::endl;
    return 3;
  }
}
