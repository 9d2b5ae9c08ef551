// An out-of-tree training program, built by tests/install/test_install.sh against the installed
// tree only (pkg-config and CMake's find_package): a 8-32-1 MLP fitted to y = sin(x w) on
// synthetic data with AdamW. Exits 0 when the loss after the steps is below half the first one.
#include <accel.h>

#include <cstdio>

using namespace accel;

int main() {
  manual_seed(7);
  const Tensor x = randn({256, 8});                // (N, 8)
  const Tensor y = sin(matmul(x, randn({8, 1})));  // (N, 1)
  auto model = std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(8, 32),
                                                std::make_shared<nn::Tanh>(),
                                                std::make_shared<nn::Linear>(32, 1));
  optim::AdamW opt(model->parameters());
  double first = 0, last = 0;
  constexpr int kSteps = 60;
  for (int step = 0; step < kSteps; ++step) {
    opt.zero_grad();
    Tensor loss = mse_loss(model->forward(x), y);
    loss.backward();
    opt.step();
    last = loss.item();
    if (step == 0) first = last;
  }
  std::printf("train_mlp: mse %.4f -> %.4f after %d AdamW steps\n", first, last, kSteps);
  if (!(last < 0.5 * first)) {
    std::fprintf(stderr, "train_mlp: the loss did not halve\n");
    return 1;
  }
  return 0;
}
