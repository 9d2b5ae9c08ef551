// accel-merge-weights (run as `accel-run merge-weights`): Accelerate's `accelerate merge-weights`
// for accel checkpoints of any mesh, and the reverse split. Usage and semantics: docs/launcher.md,
// "accel-run merge-weights"; the library: accelerate/merge_weights.h (Note [merge-weights]).
//
//   accel-run merge-weights ckpt/checkpoint_3 merged/model.safetensors
//   accel-run merge-weights ckpt merged --max_shard_size 5GB          # through ckpt/latest
//   accel-run merge-weights --split merged/model.safetensors sharded --max_shard_size 2GB
#include <CLI/CLI.hpp>
#include <iostream>
#include <string>

#include "accelerate/merge_weights.h"

namespace {

struct Args {
  std::string input, output, max_shard_size;
  size_t model = 0;
  bool split = false;
};

int run(const Args& a) {
  namespace merge = accel::merge;
  const uint64_t cap = a.max_shard_size.empty() ? 0 : merge::parse_size(a.max_shard_size);
  const merge::Written w = a.split ? merge::split_weights(a.input, a.output, cap)
                                   : merge::merge_weights(a.input, a.output, {cap, a.model});
  std::cout << "wrote " << w.tensors << " tensors (" << w.total_bytes << " bytes) to '" << w.path
            << "'";
  if (w.files.size() > 1 || w.indexed)
    std::cout << ": " << (w.files.size() - (w.indexed ? 1 : 0)) << " files and "
              << merge::kIndexFile;
  std::cout << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "accel-run merge-weights: the model of an accel checkpoint (saved on any mesh) as one "
      "safetensors file or a sharded set with model.safetensors.index.json; --split: one file "
      "as a sharded set"};
  Args a;
  app.add_option("input", a.input,
                 "a checkpoint folder (or a folder whose `latest` names one); with --split, a "
                 ".safetensors file")
      ->required();
  app.add_option("output", a.output,
                 "a .safetensors file, or a folder (missing, empty, or an earlier output)")
      ->required();
  app.add_option("--max_shard_size,--max-shard-size", a.max_shard_size,
                 "shards of at most this many bytes (5GB, 500MiB, 1000000) with an index");
  app.add_option("--model", a.model, "which prepared model of the checkpoint (default 0)");
  app.add_flag("--split", a.split, "split one .safetensors file into shards (needs the cap)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::cerr << "accel-run merge-weights: error: " << e.what() << "\n";
    return 1;
  }
}
