// fashion_cnn: the `cnn` workload of WORKLOADS.md (two 3x3 convolutions with ReLU and 2x2
// max-pooling, then 3136-128-10; AdamW lr 1e-3, batch 128) trained on Fashion-MNIST through the
// Accelerator; test accuracy after every epoch.
//
//   build/examples/fashion_cnn [--epochs 3] [--checkpoint cnn.safetensors]
//   build/examples/fashion_cnn --eval-only --checkpoint cnn.safetensors
//   build/launcher/accel-run launch --num_processes 2 --cpu build/examples/fashion_cnn
#include "examples/classifier.h"
#include "examples/models.h"

int main(int argc, char** argv) {
  using namespace accel;
  examples::Args args;
  CLI::App app("Fashion-MNIST CNN trained through accel::Accelerator", "fashion_cnn");
  examples::ClassifierArgs cargs;
  examples::add_common_options(app, args, /*epochs=*/true);
  examples::add_classifier_options(app, cargs);
  const examples::ClassifierSpec spec{"fashion_cnn", 128, 1e-3, /*flatten=*/false};
  return examples::run_example(
      app, argc, argv, [&] { return examples::train_classifier<models::Cnn>(spec, args, cargs); });
}
