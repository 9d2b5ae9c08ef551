// transfer_learning: pytorch/examples cpp/transfer-learning (main.cpp + convert.py): torchvision's
// resnet18 read from a state-dict file (.pth written by torch.save, e.g. torchvision's download),
// fc removed and frozen, a new Linear(512, classes) head trained on an image folder (one
// subfolder per class: the original's cats and dogs) with Adam(lr 1e-3) on nll_loss(log_softmax),
// batch 4, 25 epochs, the original's lines; model.pth (the whole model, torchvision's keys) and
// model_linear.pth (the head) saved whenever the training accuracy improves. --finetune-all
// trains every parameter instead. Runs through the Accelerator (accel-run launches it data
// parallel, --batch-size being the global batch). The model and step are in
// examples/transfer_learning.h.
//
//   build/examples/transfer_learning resnet18.pth DATA_DIR [--epochs 25] [--batch-size 4]
//       [--lr 1e-3] [--image-size 224] [--test-dir DIR] [--finetune-all] [--save-dir DIR]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "examples/common.h"
#include "examples/transfer_learning.h"

int main(int argc, char** argv) {
  using namespace accel;
  using namespace accel::examples;
  namespace tl = accel::examples::transfer_learning;
  std::string model_path, data_dir, test_dir, save_dir = ".";
  int64_t epochs = 25, batch_size = 4, image_size = 224, seed = 0;
  int workers = 0, threads = 0;
  double lr = 1e-3;
  bool finetune_all = false;
  CLI::App app(
      "libtorch's transfer-learning example: a pretrained resnet18, frozen, and a new head",
      "transfer_learning");
  app.add_option("model", model_path,
                 "torchvision resnet18 state dict (.pth / .pt, a checkpoint holding 'state_dict', "
                 "or .safetensors)")
      ->required();
  app.add_option("data", data_dir, "image folder: one subfolder of images per class")->required();
  app.add_option("--epochs", epochs, "epochs (the original: 25)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--batch-size", batch_size, "global batch size (the original: 4)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--lr", lr, "Adam learning rate (the original: 1e-3)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--image-size", image_size,
                 "images are resized to this square (the original: 224)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--test-dir", test_dir,
                 "image folder to test on after every epoch (default: the training folder, as the "
                 "original)");
  app.add_flag("--finetune-all", finetune_all,
               "train every parameter (backbone in train mode) instead of the head alone");
  app.add_option("--save-dir", save_dir, "where model.pth and model_linear.pth go")
      ->capture_default_str();
  app.add_option("--workers", workers, "data loading threads")->capture_default_str();
  app.add_option("--seed", seed, "seed of the head's initialisation and the shuffling")
      ->capture_default_str();
  app.add_option("--threads", threads, "OpenMP threads per process (0: default)")
      ->capture_default_str();

  return run_example(app, argc, argv, [&] {
    if (threads > 0) omp_set_num_threads(threads);
    if (!std::filesystem::is_directory(save_dir))
      throw CLI::ValidationError("--save-dir", "'" + save_dir + "' is not a directory");
    AcceleratorConfig config;
    config.seed = uint64_t(seed);
    config.split_batches = true;
    config.log_with = {};
    Accelerator acc(config);

    // Note [transfer-learning images] in examples/transfer_learning.h
    auto dataset = std::make_shared<data::ImageFolder>(data_dir, tl::transform(image_size));
    auto test_set = test_dir.empty()
                        ? dataset
                        : std::make_shared<data::ImageFolder>(test_dir, tl::transform(image_size));
    const int64_t classes = int64_t(dataset->classes().size());
    ACCEL_CHECK(test_set->classes() == dataset->classes(), ValueError, "transfer_learning",
                test_dir, " has other classes than ", data_dir);

    const nn::TensorDict state = tl::read_state_dict(model_path);
    auto model = std::make_shared<tl::TransferNet>(tl::load_backbone(state), classes, finetune_all);
    auto optimizer =
        std::make_shared<optim::Adam>(model->trainable_parameters(), optim::AdamFields{.lr = lr});
    int64_t trainable = 0;
    for (const Tensor& p : model->trainable_parameters()) trainable += p.numel();
    std::string names;
    for (const std::string& c : dataset->classes()) names += (names.empty() ? "" : ", ") + c;
    acc.print("resnet18 from '", model_path, "', fc replaced by Linear(512, ", classes, ") for ",
              names, "; ", finetune_all ? "fine-tuning every parameter" : "backbone frozen", " (",
              trainable, " trainable parameters); ", dataset->size(), " training images");

    data::DataLoaderOptions lo;
    lo.batch_size = batch_size;
    lo.shuffle = true;  // the original's RandomSampler
    lo.seed = uint64_t(seed);
    lo.num_workers = workers;
    auto train_loader = std::make_shared<data::DataLoader>(dataset, lo);
    lo.shuffle = false;
    auto test_loader = acc.prepare_data_loader(std::make_shared<data::DataLoader>(test_set, lo));
    auto [m, opt, loader] = acc.prepare(model, optimizer, train_loader);

    double best_accuracy = 0;
    for (int64_t i = 0; i < epochs; ++i) {
      loader->set_epoch(i);
      m->train();
      const auto t0 = std::chrono::steady_clock::now();
      double loss_sum = 0, correct = 0, seen = 0, batches = 0;
      for (auto& batch : *loader) {
        auto scope = acc.accumulate();
        const tl::StepResult r =
            tl::train_step(*m, *opt, batch[0], batch[1], [&](const Tensor& l) { acc.backward(l); });
        loss_sum += r.loss;
        correct += double(r.correct);
        seen += double(batch.size());
        batches += 1;
      }
      // Every rank's sums; the loss is the mean over the epoch's batches (the original divides
      // the epoch's sum by the batches of all epochs so far and calls it MSE).
      const Tensor sums =
          acc.reduce(tensor(std::vector<double>{loss_sum, correct, seen, batches}, {4}), "sum");
      const double accuracy = sums[1].item() / sums[2].item();
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      char line[160];
      std::snprintf(line, sizeof line, "Epoch: %lld, Accuracy: %g, MSE: %g  [%.1fs, %.1f ms/step]",
                    static_cast<long long>(i), accuracy, sums[0].item() / sums[3].item(), secs,
                    1000 * secs / std::max(1.0, batches));
      acc.print(line);

      // test(): every test image once (gather_for_metrics drops even_batches' repeats); the
      // loss is the mean per image (the original sums batch means and divides by images).
      m->eval();
      double test_loss = 0, test_hits = 0, test_n = 0;
      for (auto& batch : *test_loader) {
        const tl::TestRows rows = tl::test_rows(*m, batch[0], batch[1]);
        const Tensor l = acc.gather_for_metrics(rows.loss, batch);
        test_loss += sum(l).item();
        test_hits += sum(acc.gather_for_metrics(rows.hit, batch)).item();
        test_n += double(l.numel());
      }
      std::snprintf(line, sizeof line, "Test Loss: %g, Acc:%g", test_loss / test_n,
                    test_hits / test_n);
      acc.print(line);

      if (accuracy > best_accuracy) {
        best_accuracy = accuracy;
        acc.print("Saving model");
        if (acc.is_main_process()) {
          io::save_pt((std::filesystem::path(save_dir) / "model.pth").string(),
                      m->torchvision_state_dict());
          io::save_pt((std::filesystem::path(save_dir) / "model_linear.pth").string(),
                      m->lin->state_dict());
        }
        acc.wait_for_everyone();
      }
    }
    return 0;
  });
}
