// imagenet: pytorch/examples imagenet/main.py: a torchvision model (--arch, resnet18 by default)
// trained on an ImageFolder root with train/ and val/ (RandomResizedCrop + flip / Resize +
// CenterCrop, ImageNet's normalisation), SGD with momentum and weight decay, StepLR(30, 0.1) per
// epoch, top-1 / top-5 accuracy, main.py's progress lines and checkpoint.pth.tar /
// model_best.pth.tar (torch.save's format: main.py --resume reads them). Distributed through the
// Accelerator: `accel-run launch --num_processes N build/examples/imagenet DIR`, --batch-size being
// the global batch. The model, transforms, step and checkpoint code are in examples/imagenet.h.
//
//   build/examples/imagenet DIR [-a resnet18] [--epochs 90] [-b 256] [--lr 0.1] [--resume PATH]
//       [--evaluate] [--pretrained FILE] [--crop-size 224 --resize-size 256] [--dummy]
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "examples/common.h"
#include "examples/imagenet.h"

namespace {

using namespace accel;
using namespace accel::examples;
using imagenet::AverageMeter;
using imagenet::Summary;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// main.py's train(): one epoch; main.py's line every print_freq batches (main process).
void train(Accelerator& acc, data::DataLoader& loader, nn::Module& model,
           AcceleratedOptimizer& optimizer, int64_t epoch, int64_t print_freq) {
  AverageMeter batch_time("Time", "%6.3f", Summary::kNone);
  AverageMeter data_time("Data", "%6.3f", Summary::kNone);
  AverageMeter losses("Loss", "%.4e", Summary::kNone);
  AverageMeter top1("Acc@1", "%6.2f", Summary::kNone);
  AverageMeter top5("Acc@5", "%6.2f", Summary::kNone);
  imagenet::ProgressMeter progress(loader.size(), {&batch_time, &data_time, &losses, &top1, &top5},
                                   "Epoch: [" + std::to_string(epoch) + "]");
  model.train();
  auto end = Clock::now();
  int64_t i = 0;
  for (auto& batch : loader) {
    data_time.update(since(end));
    auto scope = acc.accumulate();
    const imagenet::StepResult r = imagenet::train_step(
        model, optimizer, batch[0], batch[1], [&](const Tensor& loss) { acc.backward(loss); });
    const double n = double(batch[0].size(0));
    losses.update(r.loss, n);
    top1.update(r.acc1, n);
    top5.update(r.acc5, n);
    batch_time.update(since(end));
    end = Clock::now();
    if (i % print_freq == 0) acc.print(progress.line(i + 1));
    ++i;
  }
}

// main.py's validate(): every validation image once whatever the process count (the rows that
// even_batches repeats are dropped by gather_for_metrics); returns the mean Acc@1.
double validate(Accelerator& acc, data::DataLoader& loader, nn::Module& model, int64_t print_freq) {
  AverageMeter batch_time("Time", "%6.3f", Summary::kNone);
  AverageMeter losses("Loss", "%.4e", Summary::kNone);
  AverageMeter top1("Acc@1", "%6.2f", Summary::kAverage);
  AverageMeter top5("Acc@5", "%6.2f", Summary::kAverage);
  imagenet::ProgressMeter progress(loader.size(), {&batch_time, &losses, &top1, &top5}, "Test: ");
  model.eval();
  {
    NoGradGuard ng;
    auto end = Clock::now();
    int64_t i = 0;
    for (auto& batch : loader) {
      const imagenet::EvalRows rows = imagenet::eval_rows(model, batch[0], batch[1]);
      const Tensor loss = acc.gather_for_metrics(rows.loss, batch);
      const Tensor hit1 = acc.gather_for_metrics(rows.top1, batch);
      const Tensor hit5 = acc.gather_for_metrics(rows.top5, batch);
      const double n = double(loss.numel());
      if (n > 0) {
        losses.update(sum(loss).item() / n, n);
        top1.update(100 * sum(hit1).item() / n, n);
        top5.update(100 * sum(hit5).item() / n, n);
      }
      batch_time.update(since(end));
      end = Clock::now();
      if (i % print_freq == 0) acc.print(progress.line(i + 1));
      ++i;
    }
  }
  acc.print(progress.summary_line());
  return top1.avg;
}

}  // namespace

int main(int argc, char** argv) {
  std::string data_dir = "imagenet", arch = "resnet18", resume, pretrained, checkpoint_dir = ".";
  int workers = 4, threads = 0;
  int64_t epochs = 90, start_epoch = 0, batch_size = 256, print_freq = 10, seed = -1;
  int64_t crop = 224, resize = 256, num_classes = 1000;
  double lr = 0.1, momentum = 0.9, weight_decay = 1e-4;
  bool evaluate = false, dummy = false;
  constexpr int64_t kStepSize = 30;  // StepLR(step_size=30, gamma=0.1), as main.py
  constexpr double kGamma = 0.1;

  CLI::App app("PyTorch's ImageNet training example (torchvision models, SGD, StepLR)", "imagenet");
  app.add_option("data", data_dir, "path to dataset (train/ and val/ image folders)")
      ->capture_default_str();
  std::string names;
  for (const std::string& n : imagenet::model_names()) names += (names.empty() ? "" : " | ") + n;
  app.add_option("-a,--arch", arch, "model architecture: " + names)
      ->capture_default_str()
      ->check(CLI::IsMember(imagenet::model_names()));
  app.add_option("-j,--workers", workers, "number of data loading workers")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--epochs", epochs, "number of total epochs to run")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--start-epoch", start_epoch, "manual epoch number (useful on restarts)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("-b,--batch-size", batch_size, "mini-batch size: the total batch of all processes")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--lr,--learning-rate", lr, "initial learning rate")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--momentum", momentum, "momentum")->capture_default_str();
  app.add_option("--wd,--weight-decay", weight_decay, "weight decay")->capture_default_str();
  app.add_option("-p,--print-freq", print_freq, "print frequency")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--resume", resume, "path to latest checkpoint (default: none)");
  app.add_flag("-e,--evaluate", evaluate, "evaluate model on validation set");
  app.add_option("--pretrained", pretrained,
                 "use pre-trained weights: a torchvision state-dict file (.pth or safetensors)");
  app.add_option("--seed", seed, "seed for initializing training (-1: none)")
      ->capture_default_str();
  app.add_flag("--dummy", dummy, "use fake data to benchmark");
  app.add_option("--crop-size", crop, "training crop and validation centre crop (main.py: 224)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--resize-size", resize, "validation resize of the shorter side (main.py: 256)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--num-classes", num_classes, "classes of the model's head (torchvision: 1000)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--checkpoint-dir", checkpoint_dir,
                 "where checkpoint.pth.tar and model_best.pth.tar go")
      ->capture_default_str();
  app.add_option("--threads", threads, "OpenMP threads per process (0: default)")
      ->capture_default_str();

  return run_example(app, argc, argv, [&] {
    if (threads > 0) omp_set_num_threads(threads);
    if (!std::filesystem::is_directory(checkpoint_dir))
      throw CLI::ValidationError("--checkpoint-dir", "'" + checkpoint_dir + "' is not a directory");
    AcceleratorConfig config;
    if (seed >= 0) config.seed = uint64_t(seed);
    config.split_batches = true;  // -b is the total batch, as main.py's DataParallel
    config.log_with = {};
    Accelerator acc(config);
    // Note [imagenet checkpoints]: the checkpoint holds the whole SGD state, as main.py's.
    ACCEL_CHECK(acc.strategy_name() == "none" || acc.strategy_name() == "ddp", ValueError,
                "imagenet",
                "checkpoints hold main.py's whole optimizer state; run data parallel "
                "(zero_stage 0), not '",
                acc.strategy_name(), "'");
    acc.print("Using device: ", acc.device().str());

    if (!pretrained.empty())
      acc.print("=> using pre-trained model '", arch, "'");
    else
      acc.print("=> creating model '", arch, "'");
    auto model = imagenet::create_model(arch, num_classes, pretrained, crop);
    if (acc.device().is_cpu()) acc.print("using CPU, this will be slow");

    auto base_opt = std::make_shared<optim::SGD>(
        model->parameters(),
        optim::SGDFields{.lr = lr, .momentum = momentum, .weight_decay = weight_decay});
    // Sets the learning rate to the initial LR decayed by 10 every 30 epochs.
    optim::StepLR scheduler(*base_opt, kStepSize, kGamma);
    auto [m, opt] = acc.prepare(model, base_opt);

    double best_acc1 = 0;
    if (!resume.empty()) {
      if (std::filesystem::is_regular_file(resume)) {
        acc.print("=> loading checkpoint '", resume, "'");
        const imagenet::Resumed r = imagenet::load_checkpoint(resume, *m, *base_opt, scheduler);
        start_epoch = r.epoch;
        best_acc1 = r.best_acc1;
        acc.print("=> loaded checkpoint '", resume, "' (epoch ", r.epoch, ")");
      } else {
        acc.print("=> no checkpoint found at '", resume, "'");
      }
    }

    // Data loading code
    data::DatasetPtr train_dataset, val_dataset;
    imagenet::Sizes sizes;
    sizes.crop = crop;
    sizes.resize = resize;
    if (dummy) {
      acc.print("=> Dummy data is used!");
      train_dataset = std::make_shared<imagenet::FakeData>(1281167, crop, num_classes, 0);
      val_dataset = std::make_shared<imagenet::FakeData>(50000, crop, num_classes, 1);
    } else {
      train_dataset = std::make_shared<data::ImageFolder>(
          (std::filesystem::path(data_dir) / "train").string(), imagenet::train_transform(sizes));
      val_dataset = std::make_shared<data::ImageFolder>(
          (std::filesystem::path(data_dir) / "val").string(), imagenet::val_transform(sizes));
    }
    data::DataLoaderOptions lo;
    lo.batch_size = batch_size;
    lo.num_workers = workers;
    lo.shuffle = true;
    if (seed >= 0) lo.seed = uint64_t(seed);
    auto train_loader =
        acc.prepare_data_loader(std::make_shared<data::DataLoader>(train_dataset, lo));
    lo.shuffle = false;
    auto val_loader = acc.prepare_data_loader(std::make_shared<data::DataLoader>(val_dataset, lo));

    if (evaluate) {
      validate(acc, *val_loader, *m, print_freq);
      return 0;
    }

    const std::string file =
        (std::filesystem::path(checkpoint_dir) / "checkpoint.pth.tar").string();
    for (int64_t epoch = start_epoch; epoch < epochs; ++epoch) {
      train_loader->set_epoch(epoch);
      // train for one epoch
      train(acc, *train_loader, *m, *opt, epoch, print_freq);
      // evaluate on validation set
      const double acc1 = validate(acc, *val_loader, *m, print_freq);
      scheduler.step();
      // remember best acc@1 and save checkpoint
      const bool is_best = acc1 > best_acc1;
      best_acc1 = std::max(acc1, best_acc1);
      if (acc.is_main_process()) {
        imagenet::save_checkpoint(
            imagenet::make_checkpoint(epoch + 1, arch, m->state_dict(), best_acc1, *base_opt,
                                      scheduler, kStepSize, kGamma),
            is_best, file);
      }
      acc.wait_for_everyone();
    }
    return 0;
  });
}
