// What the three examples share: the command line, thread setup, the progress display and a
// running loss that is averaged across processes.
#pragma once

#include <omp.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "accel.h"
#include "accelerate/accelerator.h"

namespace accel::examples {

struct Args {
  int epochs = 3;          // classifiers
  int64_t steps = 2000;    // gpt
  int64_t batch_size = 0;  // global batch (split across processes); 0: the example's default
  double lr = 0;           // 0: the example's default
  uint64_t seed = 0;
  std::string checkpoint;  // safetensors of the model, written at the end / read by --eval-only
  bool eval_only = false;
  int threads = 0;  // 0: OpenMP's default (accel-run sets OMP_NUM_THREADS per worker)
  std::string data_dir;
};

// The options every example has; `epochs` picks --epochs (classifiers) rather than --steps (gpt).
inline void add_common_options(CLI::App& app, Args& a, bool epochs) {
  if (epochs)
    app.add_option("--epochs", a.epochs, "passes over the training set")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
  else
    app.add_option("--steps", a.steps, "optimizer steps")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
  app.add_option("--batch-size", a.batch_size,
                 "global batch size, split across processes (0: the example's default)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--lr", a.lr, "peak learning rate (0: the default of the chosen --schedule)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--seed", a.seed, "seed of initialisation, shuffling and sampling")
      ->capture_default_str();
  app.add_option("--checkpoint", a.checkpoint,
                 "safetensors file of the model: written at the end, read by --eval-only");
  app.add_flag("--eval-only", a.eval_only, "load --checkpoint and evaluate; no training");
  app.add_option("--threads", a.threads, "OpenMP threads per process (0: default)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--data-dir", a.data_dir, "where the data files are")->capture_default_str();
}

// Checks that need more than one option, then applies --threads.
inline void finish_args(const Args& a) {
  if (a.eval_only && a.checkpoint.empty())
    throw CLI::ValidationError("--eval-only", "needs --checkpoint PATH");
  if (!a.eval_only && !a.checkpoint.empty()) {
    // Fail before training rather than after it, when the file cannot be written.
    const std::filesystem::path dir = std::filesystem::path(a.checkpoint).parent_path();
    if (!dir.empty() && !std::filesystem::is_directory(dir))
      throw CLI::ValidationError("--checkpoint", "directory '" + dir.string() + "' does not exist");
  }
  if (a.threads > 0) omp_set_num_threads(a.threads);
}

inline AcceleratorConfig accelerator_config(const Args& a) {
  AcceleratorConfig c;
  c.seed = a.seed;
  // --batch-size is the global batch: with W processes each loads batch / W rows, so 1 and 2
  // processes take the same optimizer steps on the same data (up to float reduction order).
  c.split_batches = true;
  c.log_with = {};  // no tracker files in the working directory
  return c;
}

// Local per-step losses averaged over a window, and across processes when the window closes.
// Every rank must call add() for every step: the cross-process mean is a collective, taken at
// steps fixed by the step count (never by what a rank prints), so the ranks stay in step.
class RunningLoss {
 public:
  explicit RunningLoss(int64_t window) : window_(window) {}
  // Returns true when this step closed a window (the value() changed).
  bool add(Accelerator& acc, double loss, bool force_close = false) {
    sum_ += loss;
    ++count_;
    if (count_ < window_ && !force_close) return false;
    Tensor mean = full({1}, sum_ / double(count_), TensorOptions(kFloat64));
    value_ = acc.reduce(mean, "mean").item();
    has_value_ = true;
    sum_ = 0;
    count_ = 0;
    return true;
  }
  // The last closed window's mean; `fallback` (e.g. this step's local loss) before the first.
  double value(double fallback = 0) const { return has_value_ ? value_ : fallback; }

 private:
  bool has_value_ = false;
  int64_t window_;
  double sum_ = 0;
  int64_t count_ = 0;
  double value_ = 0;
};

// Progress of a loop of `total` steps, on the main process only: a bar redrawn with \r when
// stdout is a terminal, otherwise a plain line every `every` steps (and at the last one).
class Progress {
 public:
  Progress(const Accelerator& acc, std::string label, int64_t total, int64_t every = 50)
      : label_(std::move(label)),
        total_(total),
        every_(every),
        show_(acc.is_main_process()),
        tty_(isatty(STDOUT_FILENO) == 1),
        t0_(std::chrono::steady_clock::now()) {}

  void update(int64_t done, double loss, double lr) {
    if (!show_) return;
    const double secs = elapsed();
    const double rate = secs > 0 ? double(done) / secs : 0;
    if (tty_) {
      constexpr int kWidth = 30;
      const int filled = total_ > 0 ? int(kWidth * done / total_) : 0;
      std::string bar(size_t(filled), '#');
      bar.resize(kWidth, '.');
      std::printf("\r%s [%s] %lld/%lld loss %.4f lr %.2e %.1f it/s ", label_.c_str(), bar.c_str(),
                  static_cast<long long>(done), static_cast<long long>(total_), loss, lr, rate);
      if (done == total_) std::printf("\n");
      std::fflush(stdout);
    } else if (done % every_ == 0 || done == total_) {
      std::printf("%s step %lld/%lld loss %.4f lr %.2e %.1f it/s %.1fs\n", label_.c_str(),
                  static_cast<long long>(done), static_cast<long long>(total_), loss, lr, rate,
                  secs);
      std::fflush(stdout);
    }
  }

  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  std::string label_;
  int64_t total_, every_;
  bool show_, tty_;
  std::chrono::steady_clock::time_point t0_;
};

// Runs main_fn and turns errors into a message and exit status 1 (CLI errors: CLI11's status).
template <typename F>
int run_example(CLI::App& app, int argc, char** argv, F&& main_fn) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return main_fn();
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", app.get_name().c_str(), e.what());
    return 1;
  }
}

}  // namespace accel::examples
