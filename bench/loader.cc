// Loader throughput on Fashion-MNIST (the `mlp` workload's input): train split, images
// flattened to 784 float32 in [0, 1], batch 256, shuffled, with 0, 1 and 2 worker threads.
// Prints samples/s (median over epochs) next to the floor measured in the same run: a bare
// loop that gathers the same shuffled rows with memcpy into one reused buffer.
//
//   bench_loader [--dir DIR] [--epochs N] [--batch B] [--workers 0,1,2]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "data/data.h"

using namespace accel;
using namespace accel::data;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = kFashionMnistDir;
  int epochs = 5;
  int64_t batch = 256;
  std::vector<int> worker_counts{0, 1, 2};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "missing value for %s\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--dir") {
      dir = value();
    } else if (a == "--epochs") {
      epochs = std::max(1, std::atoi(value().c_str()));
    } else if (a == "--batch") {
      batch = std::max<int64_t>(1, std::atoll(value().c_str()));
    } else if (a == "--workers") {
      worker_counts.clear();
      std::stringstream ss(value());
      for (std::string t; std::getline(ss, t, ',');) worker_counts.push_back(std::atoi(t.c_str()));
    } else {
      std::fprintf(stderr, "usage: %s [--dir DIR] [--epochs N] [--batch B] [--workers 0,1,2]\n",
                   argv[0]);
      return 2;
    }
  }
  if (!std::filesystem::exists(dir + "/train-images-idx3-ubyte.gz") &&
      !std::filesystem::exists(dir + "/train-images-idx3-ubyte")) {
    std::printf("skipped: Fashion-MNIST not found in %s (package dataset-fashion-mnist)\n",
                dir.c_str());
    return 0;
  }

  auto t0 = Clock::now();
  MnistOptions mo;
  mo.flatten = true;
  auto ds = load_mnist(dir, mo);
  const double load_s = seconds_since(t0);
  const int64_t n = ds->size();
  const int64_t row = ds->tensors()[0].size(1);
  std::printf("fashion-mnist train: %lld x %lld f32 + int64 labels, read+decode %.3f s\n",
              (long long)n, (long long)row, load_s);
  std::printf("batch %lld, shuffle, %d timed epochs after 1 warm-up; median samples/s\n",
              (long long)batch, epochs);

  // Floor: the same shuffled gather as bare memcpys into one reused buffer (no allocation,
  // no threads, no Batch objects).
  {
    RandomSampler sampler(n, 0);
    std::vector<float> xb(static_cast<size_t>(batch * row));
    std::vector<int64_t> yb(static_cast<size_t>(batch));
    const float* x = ds->tensors()[0].data<float>();
    const int64_t* y = ds->tensors()[1].data<int64_t>();
    std::vector<double> rates;
    double sink = 0;
    for (int e = 0; e <= epochs; ++e) {
      const auto order = sampler.epoch_indices(e);
      auto t = Clock::now();
      for (int64_t s = 0; s < n; s += batch) {
        const int64_t b = std::min(batch, n - s);
        for (int64_t j = 0; j < b; ++j) {
          const int64_t i = order[size_t(s + j)];
          std::memcpy(xb.data() + j * row, x + i * row, size_t(row) * sizeof(float));
          yb[size_t(j)] = y[i];
        }
        sink += xb[0] + double(yb[0]);
      }
      if (e > 0) rates.push_back(double(n) / seconds_since(t));
    }
    std::printf("floor (bare memcpy gather)   : %12.0f samples/s   (checksum %.1f)\n",
                median(rates), sink);
  }

  for (int w : worker_counts) {
    DataLoaderOptions o;
    o.batch_size = batch;
    o.shuffle = true;
    o.num_workers = w;
    o.rank = 0;
    o.world_size = 1;
    DataLoader loader(ds, o);
    std::vector<double> rates;
    double sink = 0;
    for (int e = 0; e <= epochs; ++e) {
      auto t = Clock::now();
      int64_t seen = 0;
      for (auto& b : loader) {
        seen += b.size();
        sink += b[0].data<float>()[0] + double(b[1].data<int64_t>()[0]);
      }
      if (seen != n) {
        std::fprintf(stderr, "loader returned %lld samples, expected %lld\n", (long long)seen,
                     (long long)n);
        return 1;
      }
      if (e > 0) rates.push_back(double(n) / seconds_since(t));
    }
    std::printf("DataLoader num_workers=%d      : %12.0f samples/s   (%.2f ms per batch of %lld)\n",
                w, median(rates), 1e3 * double(batch) / median(rates), (long long)batch);
    (void)sink;
  }
  return 0;
}
