// vae: pytorch/examples vae/main.py on Fashion-MNIST: a 784-400-20 variational auto-encoder
// trained with Adam (lr 1e-3) on BCE + KL divergence; after every epoch the test loss, a grid of
// 8 test images over their reconstructions (results/reconstruction_<epoch>.png) and 64 images
// decoded from z ~ N(0, 1) (results/sample_<epoch>.png). The model and step: examples/vae.h.
//
//   build/examples/vae [--epochs 10] [--batch-size 128] [--seed 1] [--results DIR]
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "examples/common.h"
#include "examples/vae.h"

int main(int argc, char** argv) {
  using namespace accel;
  using namespace accel::examples;
  int64_t batch_size = 128, log_interval = 10;
  int epochs = 10, threads = 0;
  uint64_t seed = 1;
  std::string data_dir = data::kFashionMnistDir, results = "results";
  CLI::App app("PyTorch's VAE example on Fashion-MNIST", "vae");
  app.add_option("--batch-size", batch_size, "input batch size for training")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--epochs", epochs, "number of epochs to train")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--seed", seed, "random seed")->capture_default_str();
  app.add_option("--log-interval", log_interval, "how many batches to wait before logging")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--results", results, "directory of the image grids")->capture_default_str();
  app.add_option("--threads", threads, "OpenMP threads (0: default)")->capture_default_str();
  app.add_option("--data-dir", data_dir, "Fashion-MNIST idx files")->capture_default_str();

  return run_example(app, argc, argv, [&] {
    if (threads > 0) omp_set_num_threads(threads);
    manual_seed(seed);
    std::filesystem::create_directories(results);
    data::MnistOptions mo;
    mo.channel = true;  // (N, 1, 28, 28) in [0, 1]: transforms.ToTensor()
    mo.train = true;
    data::DataLoaderOptions train_kwargs, test_kwargs;
    train_kwargs.batch_size = test_kwargs.batch_size = batch_size;
    train_kwargs.shuffle = true;
    train_kwargs.seed = seed;
    data::DataLoader train_loader(data::load_mnist(data_dir, mo), train_kwargs);
    mo.train = false;
    data::DataLoader test_loader(data::load_mnist(data_dir, mo), test_kwargs);
    const int64_t n_train = train_loader.dataset()->size(), n_test = test_loader.dataset()->size();

    vae::VAE model;
    optim::Adam optimizer(model.parameters(), optim::AdamOptions{});  // lr 1e-3

    for (int epoch = 1; epoch <= epochs; ++epoch) {
      // train(epoch)
      model.train();
      train_loader.set_epoch(uint64_t(epoch));
      double train_loss = 0;
      int64_t batch_idx = 0;
      const auto t0 = std::chrono::steady_clock::now();
      for (auto& batch : train_loader) {
        const Tensor& data = batch[0];
        const double loss = vae::train_step(model, optimizer, data);
        train_loss += loss;
        if (batch_idx % log_interval == 0) {
          std::printf(
              "Train Epoch: %d [%lld/%lld (%.0f%%)]\tLoss: %.6f\n", epoch,
              static_cast<long long>(batch_idx * data.size(0)), static_cast<long long>(n_train),
              100.0 * double(batch_idx) / double(train_loader.size()), loss / double(data.size(0)));
          std::fflush(stdout);
        }
        ++batch_idx;
      }
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("====> Epoch: %d Average loss: %.4f  [%.1fs, %.2f ms/step]\n", epoch,
                  train_loss / double(n_train), secs, 1000 * secs / double(batch_idx));

      // test(epoch)
      model.eval();
      double test_loss = 0;
      {
        NoGradGuard ng;
        int64_t i = 0;
        for (auto& batch : test_loader) {
          const Tensor& data = batch[0];
          auto [recon_batch, mu, logvar] = model.forward3(data);
          test_loss += vae::loss_function(recon_batch, data, mu, logvar).item();
          if (i++ == 0) {
            const int64_t n = std::min<int64_t>(data.size(0), 8);
            const Tensor comparison =
                cat({data.narrow(0, 0, n), recon_batch.view({-1, 1, 28, 28}).narrow(0, 0, n)});
            accel::data::save_image(
                comparison, results + "/reconstruction_" + std::to_string(epoch) + ".png", n);
          }
        }
        std::printf("====> Test set loss: %.4f\n", test_loss / double(n_test));
        const Tensor sample = model.decode(randn({64, 20}));
        accel::data::save_image(sample.view({64, 1, 28, 28}),
                                results + "/sample_" + std::to_string(epoch) + ".png");
      }
      std::fflush(stdout);
    }
    return 0;
  });
}
