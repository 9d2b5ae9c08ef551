// mnist: pytorch/examples mnist/main.py on Fashion-MNIST: a two-convolution network with dropout,
// log_softmax + nll_loss, Adadelta (lr 1.0) and StepLR (gamma 0.7 per epoch); test loss and
// accuracy after every epoch. The model and the step are in examples/mnist.h.
//
//   build/examples/mnist [--epochs 14] [--batch-size 64] [--lr 1.0] [--gamma 0.7] [--save-model]
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "examples/common.h"
#include "examples/mnist.h"

int main(int argc, char** argv) {
  using namespace accel;
  using namespace accel::examples;
  int64_t batch_size = 64, test_batch_size = 1000, log_interval = 10;
  int epochs = 14, threads = 0;
  double lr = 1.0, gamma = 0.7;
  uint64_t seed = 1;
  bool dry_run = false, save_model = false;
  std::string data_dir = data::kFashionMnistDir;
  CLI::App app("PyTorch's MNIST example (Adadelta, StepLR) on Fashion-MNIST", "mnist");
  app.add_option("--batch-size", batch_size, "input batch size for training")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--test-batch-size", test_batch_size, "input batch size for testing")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--epochs", epochs, "number of epochs to train")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--lr", lr, "learning rate")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--gamma", gamma, "learning rate step gamma")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_flag("--dry-run", dry_run, "quickly check a single pass");
  app.add_option("--seed", seed, "random seed")->capture_default_str();
  app.add_option("--log-interval", log_interval, "how many batches to wait before logging")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_flag("--save-model", save_model, "save the model to mnist_cnn.safetensors");
  app.add_option("--threads", threads, "OpenMP threads (0: default)")->capture_default_str();
  app.add_option("--data-dir", data_dir, "Fashion-MNIST idx files")->capture_default_str();

  return run_example(app, argc, argv, [&] {
    if (threads > 0) omp_set_num_threads(threads);
    manual_seed(seed);
    data::MnistOptions mo;
    mo.channel = true;  // (N, 1, 28, 28) in [0, 1]
    auto load = [&](bool train) {
      mo.train = train;
      auto raw = data::load_mnist(data_dir, mo);
      return std::make_shared<data::TensorDataset>(
          std::vector<Tensor>{mnist::normalize(raw->tensors()[0]), raw->tensors()[1]});
    };
    data::DataLoaderOptions train_kwargs, test_kwargs;
    train_kwargs.batch_size = batch_size;
    train_kwargs.shuffle = true;
    train_kwargs.seed = seed;
    test_kwargs.batch_size = test_batch_size;
    data::DataLoader train_loader(load(true), train_kwargs);
    data::DataLoader test_loader(load(false), test_kwargs);
    const int64_t n_train = train_loader.dataset()->size();

    mnist::Net model;
    optim::AdadeltaOptions ao;
    ao.lr(lr);
    optim::Adadelta optimizer(model.parameters(), ao);
    optim::StepLR scheduler(optimizer, 1, gamma);
    for (int epoch = 1; epoch <= epochs; ++epoch) {
      train_loader.set_epoch(uint64_t(epoch));
      const auto t0 = std::chrono::steady_clock::now();
      int64_t batch_idx = 0, seen = 0;
      for (auto& batch : train_loader) {
        const double loss = mnist::train_step(model, optimizer, batch[0], batch[1]);
        seen += batch[0].size(0);
        if (batch_idx % log_interval == 0) {
          std::printf("Train Epoch: %d [%lld/%lld (%.0f%%)]\tLoss: %.6f\n", epoch,
                      static_cast<long long>(seen), static_cast<long long>(n_train),
                      100.0 * double(seen) / double(n_train), loss);
          std::fflush(stdout);
          if (dry_run) break;
        }
        ++batch_idx;
      }
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const mnist::TestResult r = mnist::test(model, test_loader);
      std::printf(
          "\nTest set: Average loss: %.4f, Accuracy: %lld/%lld (%.2f%%)  [epoch %.1fs, %.1f "
          "ms/step]\n\n",
          r.loss, static_cast<long long>(r.correct), static_cast<long long>(r.total),
          100.0 * double(r.correct) / double(r.total), secs,
          1000 * secs / double(std::max<int64_t>(batch_idx, 1)));
      std::fflush(stdout);
      scheduler.step();
      if (dry_run) break;
    }
    if (save_model) model.save("mnist_cnn.safetensors");
    return 0;
  });
}
