// accel-estimate-memory (run as `accel-run estimate-memory`): Accelerate's `accelerate
// estimate-memory` for accel's strategies. Usage and semantics: docs/launcher.md,
// "accel-run estimate-memory"; the arithmetic: accelerate/memory_estimate.h.
//
//   accel-run estimate-memory gpt2 --num_processes 8 --dtypes f32,bf16
//   accel-run estimate-memory path/to/model.safetensors.index.json --tp_size 2 --json
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "accelerate/memory_estimate.h"
#include "core/error.h"

namespace est = accel::estimate;

namespace {

struct Args {
  std::string model;
  std::vector<std::string> dtypes{"f32", "bf16"};
  std::vector<std::string> strategies{"ddp", "zero1", "zero2", "zero3"};
  std::string optimizer = "adamw";
  int num_processes = 8;
  std::optional<int> dp_replicate_size, dp_shard_size, tp_size, cp_size;
  int64_t batch_size = 1;
  int64_t sequence_length = 0;
  bool json = false;
};

struct Row {
  est::Precision precision;
  est::Strategy strategy;
  est::Estimate e;
};

std::string mesh_text(const accel::MeshSizes& m) {
  return std::to_string(m.dp_replicate) + " x " + std::to_string(m.dp_shard) + " x " +
         std::to_string(m.cp) + " x " + std::to_string(m.tp);
}

// A Markdown table with columns padded to their widest cell.
void print_table(std::ostream& os, const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size(); ++c) {
      if (width.size() <= c) width.push_back(0);
      width[c] = std::max(width[c], r[c].size());
    }
  auto line = [&](const std::vector<std::string>& r) {
    os << "|";
    for (size_t c = 0; c < r.size(); ++c) {
      os << " " << r[c] << std::string(width[c] - r[c].size(), ' ') << " |";
    }
    os << "\n";
  };
  line(rows[0]);
  os << "|";
  for (size_t c = 0; c < width.size(); ++c) os << std::string(width[c] + 2, '-') << "|";
  os << "\n";
  for (size_t i = 1; i < rows.size(); ++i) line(rows[i]);
}

std::string optimizer_title(est::Optimizer o) {
  switch (o) {
    case est::Optimizer::AdamW: return "AdamW";
    case est::Optimizer::Adam: return "Adam";
    case est::Optimizer::SgdMomentum: return "SGD with momentum";
    case est::Optimizer::Sgd: break;
  }
  return "SGD";
}

// What is estimated: the model, the setup shared by every row, and the rows.
struct Plan {
  est::ModelSpec model;
  est::Setup base;
  std::vector<est::Precision> precisions;
  std::vector<Row> rows;
};

Plan make_plan(const Args& a) {
  Plan plan;
  est::ModelSpec& model = plan.model;
  // A path that exists (or looks like one) is a file; anything else a built-in name.
  std::error_code ec;
  const bool file = std::filesystem::exists(a.model, ec) ||
                    a.model.find('/') != std::string::npos ||
                    a.model.find(".safetensors") != std::string::npos ||
                    a.model.find(".json") != std::string::npos;
  model = file ? est::model_from_safetensors(a.model) : est::builtin_model(a.model);
  ACCEL_CHECK(model.parameters() > 0, ValueError, "estimate_memory", "'", a.model,
              "' holds no floating-point tensor to train");
  const std::optional<est::Optimizer> opt = est::parse_optimizer(a.optimizer);
  ACCEL_CHECK(opt.has_value(), ValueError, "estimate_memory",
              "--optimizer: expected "
              "adamw, adam, sgd_momentum or sgd, got '",
              a.optimizer, "'");
  ACCEL_CHECK(a.num_processes >= 1, ValueError, "estimate_memory",
              "--num_processes must be >= 1, got ", a.num_processes);

  est::Setup& base = plan.base;
  base.optimizer = *opt;
  base.world = a.num_processes;
  base.mesh.dp_replicate_size = a.dp_replicate_size;
  base.mesh.dp_shard_size = a.dp_shard_size;
  base.mesh.tp_size = a.tp_size;
  base.mesh.cp_size = a.cp_size;
  base.batch = a.batch_size;
  base.sequence = a.sequence_length;

  std::vector<est::Precision>& precisions = plan.precisions;
  for (const std::string& d : a.dtypes) {
    const auto p = est::parse_precision(d);
    ACCEL_CHECK(p.has_value(), ValueError, "estimate_memory",
                "--dtypes: expected f32, bf16, f16 or f64, got '", d, "'");
    precisions.push_back(*p);
  }
  std::vector<est::Strategy> strategies;
  for (const std::string& s : a.strategies) {
    const auto p = est::parse_strategy(s);
    ACCEL_CHECK(p.has_value(), ValueError, "estimate_memory",
                "--strategies: expected ddp, zero1, zero2, zero3 (fsdp), got '", s, "'");
    strategies.push_back(*p);
  }
  // The mesh fits the world or nothing is estimated (Note [mesh sizes]); every strategy composes
  // with tp (Note [apply order] in parallel/parallelize.h).
  std::string why;
  const std::optional<accel::MeshSizes> mesh = accel::infer_mesh_sizes(base.mesh, base.world, &why);
  ACCEL_CHECK(mesh.has_value(), ValueError, "estimate_memory",
              "the parallelism sizes (--dp_replicate_size, --dp_shard_size, --cp_size, --tp_size) "
              "do not fit ",
              base.world, " processes: ", why);
  std::vector<Row>& rows = plan.rows;
  for (est::Strategy s : strategies) {
    for (est::Precision p : precisions) {
      est::Setup setup = base;
      setup.precision = p;
      setup.strategy = s;
      rows.push_back({p, s, est::estimate(model, setup)});
    }
  }
  std::stable_sort(rows.begin(), rows.end(), [&](const Row& x, const Row& y) {
    auto at = [&](est::Precision p) {
      return std::find(precisions.begin(), precisions.end(), p) - precisions.begin();
    };
    return at(x.precision) < at(y.precision);
  });
  ACCEL_CHECK(!rows.empty(), ValueError, "estimate_memory",
              "no strategy and precision to estimate");
  return plan;
}

void print_json(const Args& a, const Plan& plan) {
  const est::ModelSpec& model = plan.model;
  const est::TensorSpec* largest = model.largest();
  {
    nlohmann::ordered_json j;
    j["model"] = model.name;
    j["parameters"] = model.parameters();
    j["stored_dtype"] = model.stored_dtype;
    j["largest_tensor"] = {{"name", largest->name}, {"numel", largest->numel()}};
    if (model.arch) {
      const est::Transformer& t = *model.arch;
      j["architecture"] = {{"kind", t.kind == est::Transformer::Kind::Gpt ? "gpt" : "llama"},
                           {"layers", t.layers},
                           {"hidden", t.hidden},
                           {"heads", t.heads},
                           {"kv_heads", t.kv_heads},
                           {"intermediate", t.intermediate},
                           {"vocab", t.vocab}};
    } else {
      j["architecture"] = nullptr;
    }
    j["optimizer"] = std::string(est::optimizer_name(plan.base.optimizer));
    j["num_processes"] = a.num_processes;
    j["batch_size"] = a.batch_size;
    j["tokens_per_rank"] = plan.rows.front().e.tokens;
    j["rows"] = nlohmann::ordered_json::array();
    for (const Row& r : plan.rows) {
      const est::Estimate& e = r.e;
      j["rows"].push_back({{"dtype", std::string(est::precision_name(r.precision))},
                           {"strategy", std::string(est::strategy_name(r.strategy))},
                           {"dp_replicate", e.mesh.dp_replicate},
                           {"dp_shard", e.mesh.dp_shard},
                           {"cp", e.mesh.cp},
                           {"tp", e.mesh.tp},
                           {"param_bytes", e.params},
                           {"master_bytes", e.master},
                           {"grad_bytes", e.grads},
                           {"optimizer_bytes", e.optimizer},
                           {"state_bytes", e.state()},
                           {"transient_bytes", e.transient},
                           {"activation_bytes_per_token", e.activations_per_token},
                           {"activation_bytes", e.activations},
                           {"activation_bytes_checkpointed", e.activations_checkpointed},
                           {"peak_bytes", e.peak()},
                           {"peak_bytes_checkpointed", e.peak_checkpointed()}});
    }
    std::cout << j.dump(2) << "\n";
  }
}

void print_tables(const Args& a, const Plan& plan) {
  const est::ModelSpec& model = plan.model;
  const est::TensorSpec* largest = model.largest();
  const est::Optimizer opt = plan.base.optimizer;
  std::ostringstream os;
  os << "Memory for training `" << model.name << "`: " << est::human_count(model.parameters())
     << " parameters";
  if (!model.stored_dtype.empty()) os << " (stored as " << model.stored_dtype << ")";
  os << ", largest tensor " << largest->name << " (" << est::human_count(largest->numel())
     << ")\n\n";
  // Accelerate's table: the model at each dtype, and training it in one process.
  std::vector<std::vector<std::string>> t1 = {
      {"dtype", "largest tensor", "total size",
       "training with " + optimizer_title(opt) + " (1 process, without activations)"}};
  for (est::Precision p : plan.precisions) {
    est::Setup one = plan.base;
    one.world = 1;
    one.mesh = {};
    one.precision = p;
    const est::Estimate e = est::estimate(model, one);
    const int64_t w = p == est::Precision::F64 ? 8 : p == est::Precision::F32 ? 4 : 2;
    t1.push_back({std::string(est::precision_name(p)), est::human_bytes(largest->numel() * w),
                  est::human_bytes(model.parameters() * w), est::human_bytes(e.state())});
  }
  print_table(os, t1);
  os << "\nPer rank with " << a.num_processes << " process" << (a.num_processes > 1 ? "es" : "")
     << ", " << optimizer_title(opt);
  if (model.arch) {
    os << ", activations of " << a.batch_size << " x " << plan.rows.front().e.tokens / a.batch_size
       << " tokens per rank";
  } else {
    os << " (layout not recognised: no activation estimate)";
  }
  os << ":\n\n";
  std::vector<std::vector<std::string>> t2 = {
      {"dtype", "strategy", "mesh (replicate x shard x cp x tp)", "parameters", "gradients",
       "optimizer", "state", "activations", "with checkpointing", "peak"}};
  for (const Row& r : plan.rows) {
    const est::Estimate& e = r.e;
    std::string params = est::human_bytes(e.params);
    if (e.master) params += " + " + est::human_bytes(e.master) + " fp32 master";
    t2.push_back({std::string(est::precision_name(r.precision)),
                  std::string(est::strategy_name(r.strategy)), mesh_text(e.mesh), params,
                  est::human_bytes(e.grads), est::human_bytes(e.optimizer),
                  est::human_bytes(e.state()), model.arch ? est::human_bytes(e.activations) : "-",
                  model.arch ? est::human_bytes(e.activations_checkpointed) : "-",
                  est::human_bytes(model.arch ? e.peak() : e.state() + e.transient)});
  }
  print_table(os, t2);
  os << "\nstate = parameters + gradients + optimizer, held between steps; peak adds the "
        "activations and what a step holds for a moment (unreduced gradients, gathered ZeRO-3 "
        "layers). bf16 / f16: autocast under ddp, param_dtype with fp32 masters under ZeRO "
        "(docs/launcher.md).\n";
  std::cout << os.str();
}

int run(const Args& a) {
  const Plan plan = make_plan(a);
  if (a.json) {
    print_json(a, plan);
  } else {
    print_tables(a, plan);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "accel-run estimate-memory: the memory per rank of training a model with accel's "
      "strategies (Accelerate's estimate-memory)"};
  Args a;
  app.add_option("model", a.model,
                 "a .safetensors file, a model.safetensors.index.json, a folder holding either, "
                 "a built-in model (gpt2, gpt2-medium, gpt2-large, gpt2-xl, llama-7b, llama-13b, "
                 "llama-70b) or shapes (gpt:layers=12,hidden=768,heads=12,vocab=50257)")
      ->required();
  app.add_option("--dtypes", a.dtypes, "f32, bf16, f16, f64 (default: f32 bf16)")->delimiter(',');
  app.add_option("--strategies", a.strategies, "ddp, zero1, zero2, zero3 (default: all four)")
      ->delimiter(',');
  app.add_option("--optimizer", a.optimizer, "adamw (default), adam, sgd_momentum, sgd");
  app.add_option("--num_processes,--num-processes", a.num_processes,
                 "processes in total (default 8)");
  auto size = [&](const char* names, std::optional<int>& target, const char* help) {
    app.add_option_function<int>(
        names, [&target](const int& v) { target = v; }, help);
  };
  size("--dp_replicate_size,--dp-replicate-size", a.dp_replicate_size, "model replicas (HSDP)");
  size("--dp_shard_size,--dp-shard-size", a.dp_shard_size, "ranks one ZeRO shard group spans");
  size("--tp_size,--tp-size", a.tp_size, "tensor-parallel ranks per layer");
  size("--cp_size,--cp-size", a.cp_size, "context-parallel ranks per sequence");
  app.add_option("--batch_size,--batch-size", a.batch_size, "sequences per rank (default 1)");
  app.add_option("--sequence_length,--sequence-length", a.sequence_length,
                 "tokens per sequence (default: the model's context, else 1024)");
  app.add_flag("--json", a.json, "print JSON instead of tables");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::cerr << "accel-run estimate-memory: error: " << e.what() << "\n";
    return 1;
  }
}
