// Loader throughput on Fashion-MNIST (the `mlp` workload's input): train split, images
// flattened to 784 float32 in [0, 1], batch 256, shuffled, with 0, 1 and 2 worker threads.
// Prints samples/s (median over epochs) next to the floor measured in the same run: a bare
// loop that gathers the same shuffled rows with memcpy into one reused buffer.
//
//   bench_loader [--dir DIR] [--epochs N] [--batch B] [--workers 0,1,2]
//
// --tokens: the token reader instead (Note [token files are read, not mapped] in data/tokens.h):
// random (x, y) windows of --context tokens (default 1024) from a 64 MB uint16 token file in
// $TMPDIR, batches of --batch (default 16) through TokenWindowDataset::get_batch, read with
// pread (TokenFile::open), from memory (TokenFile::from_bytes) and, for comparison, gathered by
// a bare loop from a memory map of the same file (what TokenFile did before). Median of 7 rounds.
//
// --images: ImageFolder over a synthetic shapes folder written to $TMPDIR (write_shapes_folder:
// 4 classes x 128 images of --size pixels, default 64, as PNG and as JPEG), decoded and
// augmented (RandomResizedCrop(size - 8), RandomHorizontalFlip, ToTensor, Normalize) in the
// DataLoader's workers, batch --batch (default 64); median images/s over --epochs.
//
// --transform JPEG: one thread, the ImageNet training augmentation on one photo (e.g.
// tests/data/images/photo_coffee_500x375.jpg): the decode alone, then RandomResizedCrop(224) +
// RandomHorizontalFlip + ToTensor + Normalize with bilinear (antialias off, torchvision 0.14's
// tensor default, and on) and bicubic; median microseconds per image over 7 rounds of 200
// images (each image a new random crop).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "data/data.h"
#include "bench/median.h"
#include "bench/timing.h"

using namespace accel;
using bench::median;
using namespace accel::data;

namespace {

using accel::bench::Clock;
using accel::bench::seconds_since;

// Tokens per second of random windows: pread, memory and a bare mmap gather (see the top).
int bench_tokens(int64_t context, int64_t batch) {
  constexpr int64_t kTokens = int64_t(32) << 20;  // 64 MB of uint16
  constexpr int kBatches = 400;
  constexpr int kRounds = 7;
  const char* tmp = std::getenv("TMPDIR");
  const std::string path = std::string(tmp && *tmp ? tmp : "/tmp") + "/bench_tokens_" +
                           std::to_string(getpid()) + ".bin";
  {
    std::vector<int64_t> toks(static_cast<size_t>(kTokens));
    for (int64_t i = 0; i < kTokens; ++i) toks[size_t(i)] = (i * 7919) % 50257;
    write_token_file(path, toks, TokenType::UInt16);
  }
  auto file = TokenFile::open(path, {TokenType::UInt16, 0, 0});
  std::vector<uint8_t> bytes(size_t(kTokens) * 2);
  for (int64_t i = 0; i < kTokens; ++i) {
    const uint16_t v = uint16_t((*file)[i]);
    std::memcpy(bytes.data() + 2 * i, &v, 2);
  }
  auto memory = TokenFile::from_bytes(bytes, TokenType::UInt16, "memory");
  TokenWindowDataset on_file(file, context, 1), in_memory(memory, context, 1);
  // The same random windows for every reader.
  std::vector<int64_t> idx(size_t(kBatches * batch));
  uint64_t r = 12345;
  for (auto& i : idx) {
    r = r * 6364136223846793005ull + 1442695040888963407ull;
    i = int64_t((r >> 17) % uint64_t(on_file.size()));
  }
  const int fd = ::open(path.c_str(), O_RDONLY);
  void* map = ::mmap(nullptr, size_t(kTokens) * 2, PROT_READ, MAP_PRIVATE, fd, 0);
  ::madvise(map, size_t(kTokens) * 2, MADV_RANDOM);
  const auto* mapped = static_cast<const uint16_t*>(map);
  double sink = 0;
  auto time = [&](auto&& one_batch) {
    std::vector<double> rates;
    for (int round = 0; round <= kRounds; ++round) {
      auto t = Clock::now();
      for (int b = 0; b < kBatches; ++b)
        one_batch(std::span<const int64_t>(idx.data() + size_t(b) * size_t(batch), size_t(batch)));
      if (round > 0) rates.push_back(double(kBatches * batch * context) / seconds_since(t));
    }
    return median(rates);
  };
  auto through = [&](const TokenWindowDataset& ds) {
    return time([&](std::span<const int64_t> ids) {
      Example e;
      ds.get_batch(ids, get_allocator(kCPU), e);
      sink += double(e.fields[0].data<int64_t>()[0]);
    });
  };
  const double pread_rate = through(on_file);
  const double memory_rate = through(in_memory);
  std::vector<int64_t> xb(size_t(batch * context)), yb(size_t(batch * context));
  const double mmap_rate = time([&](std::span<const int64_t> ids) {
    for (size_t j = 0; j < ids.size(); ++j) {
      const uint16_t* p = mapped + ids[j];
      for (int64_t k = 0; k < context; ++k) {
        xb[j * size_t(context) + size_t(k)] = p[k];
        yb[j * size_t(context) + size_t(k)] = p[k + 1];
      }
    }
    sink += double(xb[0] + yb[0]);
  });
  ::munmap(map, size_t(kTokens) * 2);
  ::close(fd);
  std::remove(path.c_str());
  std::printf(
      "token windows: context %lld, batch %lld, %d random batches, 64 MB uint16 file "
      "(page cache); median of %d rounds\n",
      (long long)context, (long long)batch, kBatches, kRounds);
  auto row = [&](const char* what, double rate) {
    std::printf("%-34s: %8.1f M tokens/s   (%.1f us per batch)\n", what, rate / 1e6,
                1e6 * double(batch * context) / rate);
  };
  row("TokenFile::open (pread per window)", pread_rate);
  row("TokenFile::from_bytes (memory)", memory_rate);
  row("bare gather from an mmap (before)", mmap_rate);
  (void)sink;
  return 0;
}

// Images per second of ImageFolder + transforms through the DataLoader (see the top).
int bench_images(int64_t size, int64_t batch, int epochs, const std::vector<int>& workers) {
  using namespace accel::data::transforms;
  const char* tmp = std::getenv("TMPDIR");
  const std::string root =
      std::string(tmp && *tmp ? tmp : "/tmp") + "/bench_images_" + std::to_string(getpid());
  std::printf(
      "ImageFolder: 4 classes x 128 shapes of %lld x %lld, batch %lld, RandomResizedCrop(%lld)"
      " + flip + ToTensor + Normalize; median images/s over %d epochs\n",
      (long long)size, (long long)size, (long long)batch, (long long)(size - 8), epochs);
  for (bool jpeg : {false, true}) {
    ShapesOptions so;
    so.per_class = 128;
    so.size = size;
    so.jpeg = jpeg;
    const std::string dir = root + (jpeg ? "/jpeg" : "/png");
    write_shapes_folder(dir, so);
    auto ds = std::make_shared<ImageFolder>(
        dir, Compose({RandomResizedCrop(size - 8), RandomHorizontalFlip(), ToTensor(),
                      Normalize({0.5, 0.5, 0.5}, {0.5, 0.5, 0.5})}));
    for (int w : workers) {
      DataLoaderOptions o;
      o.batch_size = batch;
      o.shuffle = true;
      o.num_workers = w;
      o.rank = 0;
      o.world_size = 1;
      DataLoader loader(ds, o);
      std::vector<double> rates;
      for (int e = 0; e <= epochs; ++e) {
        auto t = Clock::now();
        int64_t seen = 0;
        for (auto& b : loader) seen += b.size();
        if (e > 0) rates.push_back(double(seen) / seconds_since(t));
      }
      std::printf("%s, num_workers=%d : %9.0f images/s\n", jpeg ? "JPEG" : "PNG ", w,
                  median(rates));
    }
  }
  std::filesystem::remove_all(root);
  return 0;
}

// Microseconds per image of the augmentation on one decoded photo (see the top).
int bench_transform(const std::string& path) {
  using namespace accel::data::transforms;
  constexpr int kImages = 200, kRounds = 7;
  std::vector<double> decode;
  Tensor img;
  for (int r = 0; r < kRounds; ++r) {
    auto t = Clock::now();
    for (int i = 0; i < 20; ++i) img = read_image(path);
    decode.push_back(1e6 * seconds_since(t) / 20);
  }
  std::printf("%s: %lld x %lld x %lld, decode %.0f us\n", path.c_str(), (long long)img.size(0),
              (long long)img.size(1), (long long)img.size(2), median(decode));
  struct Variant {
    const char* name;
    InterpolationMode mode;
    bool antialias;
  };
  for (const Variant& v : {Variant{"bilinear", InterpolationMode::kBilinear, false},
                           Variant{"bilinear, antialias", InterpolationMode::kBilinear, true},
                           Variant{"bicubic", InterpolationMode::kBicubic, false},
                           Variant{"bicubic, antialias", InterpolationMode::kBicubic, true}}) {
    auto tf =
        Compose({RandomResizedCrop(224, {0.08, 1.0}, {3.0 / 4.0, 4.0 / 3.0}, v.mode, v.antialias),
                 RandomHorizontalFlip(), ToTensor(),
                 Normalize({0.485, 0.456, 0.406}, {0.229, 0.224, 0.225})});
    Generator gen(1);
    std::vector<double> us;
    double sink = 0;
    for (int r = 0; r < kRounds; ++r) {
      auto t = Clock::now();
      for (int i = 0; i < kImages; ++i) sink += tf(img, gen).data<float>()[0];
      us.push_back(1e6 * seconds_since(t) / kImages);
    }
    std::printf("RandomResizedCrop(224, %s) + flip + ToTensor + Normalize: %6.0f us per image\n",
                v.name, median(us));
    (void)sink;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = kFashionMnistDir;
  int epochs = 5;
  int64_t batch = 256;
  std::vector<int> worker_counts{0, 1, 2};
  bool tokens = false, images = false;
  std::string transform_path;
  int64_t image_size = 64;
  int64_t context = 1024, token_batch = 16;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "missing value for %s\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--tokens") {
      tokens = true;
    } else if (a == "--images") {
      images = true;
    } else if (a == "--transform") {
      transform_path = value();
    } else if (a == "--size") {
      image_size = std::max<int64_t>(16, std::atoll(value().c_str()));
    } else if (a == "--context") {
      context = std::max<int64_t>(1, std::atoll(value().c_str()));
    } else if (a == "--dir") {
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
      std::fprintf(stderr,
                   "usage: %s [--dir DIR] [--epochs N] [--batch B] [--workers 0,1,2]\n"
                   "       %s --tokens [--context T] [--batch B]\n"
                   "       %s --images [--size S] [--batch B] [--epochs N] [--workers 0,1,2]\n"
                   "       %s --transform JPEG\n",
                   argv[0], argv[0], argv[0], argv[0]);
      return 2;
    }
  }
  if (!transform_path.empty()) return bench_transform(transform_path);
  if (images) {
    bool batch_given = false;
    for (int i = 1; i < argc; ++i) batch_given |= std::string(argv[i]) == "--batch";
    return bench_images(image_size, batch_given ? batch : 64, epochs, worker_counts);
  }
  if (tokens) {
    for (int i = 1; i < argc; ++i)
      if (std::string(argv[i]) == "--batch") token_batch = batch;
    return bench_tokens(context, token_batch);
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
