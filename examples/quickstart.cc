// The training loop shown in README.md, verbatim: a 784-1024-10 MLP on Fashion-MNIST through the
// Accelerator. Runs as one process, or as several under `accel-run launch --num_processes N --cpu`.
#include <accel.h>
using namespace accel;

int main() {
  Accelerator acc;  // reads RANK/WORLD_SIZE/... set by accel-run; one process when unset
  auto train = data::load_mnist(data::kFashionMnistDir, {.train = true, .flatten = true});
  auto loader = std::make_shared<data::DataLoader>(
      train, data::DataLoaderOptions{.batch_size = 256, .shuffle = true});
  auto model = std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(784, 1024),
                                                std::make_shared<nn::ReLU>(),
                                                std::make_shared<nn::Linear>(1024, 10));
  auto opt = std::make_shared<optim::AdamW>(model->parameters(), optim::AdamWOptions(1e-3));
  auto [m, o, l] = acc.prepare(model, opt, loader);
  for (int epoch = 0; epoch < 3; ++epoch)
    for (auto& batch : *l) {
      Tensor loss = cross_entropy(m->forward(batch["image"]), batch["label"]);
      acc.backward(loss);
      o->step();
      o->zero_grad();
    }
  acc.save_state();
}
