// fashion_mlp: the `mlp` workload of WORKLOADS.md (784-1024-1024-10, ReLU, AdamW lr 1e-3,
// batch 256) trained on Fashion-MNIST through the Accelerator; test accuracy after every epoch.
//
//   build/examples/fashion_mlp [--epochs 3] [--checkpoint mlp.safetensors]
//   build/examples/fashion_mlp --eval-only --checkpoint mlp.safetensors
//   build/launcher/accel-run launch --num_processes 2 --cpu build/examples/fashion_mlp
#include "examples/classifier.h"
#include "examples/models.h"

int main(int argc, char** argv) {
  using namespace accel;
  examples::Args args;
  CLI::App app("Fashion-MNIST MLP (784-1024-1024-10) trained through accel::Accelerator",
               "fashion_mlp");
  examples::ClassifierArgs cargs;
  examples::add_common_options(app, args, /*epochs=*/true);
  examples::add_classifier_options(app, cargs);
  const examples::ClassifierSpec spec{"fashion_mlp", 256, 1e-3, /*flatten=*/true};
  return examples::run_example(
      app, argc, argv, [&] { return examples::train_classifier<models::Mlp>(spec, args, cargs); });
}
