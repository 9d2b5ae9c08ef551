// The libtorch peer of bench/workloads: the workloads of shared/WORKLOADS.md (op, mlp, cnn, gpt)
// and word_language_model's LSTM (lstm)
// written against the libtorch C++ API, printing the same key=value lines as build/bench/workloads
// with `impl=libtorch` added:
//   workload=op impl=libtorch mode=grad us_per_op=1.530
//   workload=mlp impl=libtorch threads=2 steps=50 ms_per_step=29.812 loss=0.5312
//
// usage: torch_workloads NAME [--threads N] [--steps N] [--warmup N]
//   NAME: op | mlp | cnn | gpt | all.  Defaults: threads = libtorch's default,
//   50 timed steps after 5 warm-up steps (WORKLOADS.md), figure = median ms per step.
// Exit status: 0 on success, 1 when a workload fails (data missing, libtorch error; the reason
// goes to stderr), 2 on bad usage. The contract with the runner is in docs/bench.md.
//
// One translation unit on purpose: the libtorch headers dominate the build time.
#include <dirent.h>
#include <dlfcn.h>
#include <torch/torch.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

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

struct Options {
  int threads = 0;  // 0: libtorch's default
  int steps = 50;
  int warmup = 5;
};

// ---------------- data (WORKLOADS.md: real data from Debian packages) ----------------

const char* const kFashionDir = "/usr/share/datasets/fashion-mnist";
const char* const kFortunesDir = "/usr/share/games/fortunes";

std::vector<uint8_t> read_gz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error("[torch_workloads] cannot open " + path);
  std::vector<uint8_t> out;
  std::vector<uint8_t> buf(1 << 20);
  int got;
  while ((got = gzread(f, buf.data(), unsigned(buf.size()))) > 0)
    out.insert(out.end(), buf.begin(), buf.begin() + got);
  const bool failed = got < 0;
  gzclose(f);
  if (failed) throw std::runtime_error("[torch_workloads] corrupt gzip stream in " + path);
  return out;
}

uint32_t be32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

// Fashion-MNIST train split: images (60000, 784) float in [0, 1], labels (60000) int64.
struct Fashion {
  torch::Tensor images, labels;
};

Fashion load_fashion() {
  const std::string dir = kFashionDir;
  const std::vector<uint8_t> img = read_gz(dir + "/train-images-idx3-ubyte.gz");
  const std::vector<uint8_t> lab = read_gz(dir + "/train-labels-idx1-ubyte.gz");
  if (img.size() < 16 || be32(img.data()) != 0x803 || lab.size() < 8 || be32(lab.data()) != 0x801)
    throw std::runtime_error("[torch_workloads] bad IDX header in " + dir);
  const int64_t n = be32(img.data() + 4), rows = be32(img.data() + 8), cols = be32(img.data() + 12);
  if (int64_t(img.size()) != 16 + n * rows * cols || int64_t(lab.size()) != 8 + n)
    throw std::runtime_error("[torch_workloads] truncated IDX files in " + dir);
  Fashion f;
  f.images =
      torch::from_blob(const_cast<uint8_t*>(img.data() + 16), {n, rows * cols}, torch::kUInt8)
          .to(torch::kFloat32)
          .div_(255.0);
  f.labels =
      torch::from_blob(const_cast<uint8_t*>(lab.data() + 8), {n}, torch::kUInt8).to(torch::kInt64);
  return f;
}

// Every plain file of the fortunes directory except *.dat and *.u8, in sorted name order.
torch::Tensor load_fortunes() {
  std::vector<std::string> names;
  DIR* d = opendir(kFortunesDir);
  if (!d) throw std::runtime_error(std::string("[torch_workloads] cannot open ") + kFortunesDir);
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    auto ends = [&](const char* suf) {
      const size_t k = std::strlen(suf);
      return name.size() >= k && name.compare(name.size() - k, k, suf) == 0;
    };
    if (e->d_type != DT_REG || ends(".dat") || ends(".u8")) continue;
    names.push_back(name);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  std::vector<uint8_t> bytes;
  for (const std::string& n : names) {
    std::ifstream in(std::string(kFortunesDir) + "/" + n, std::ios::binary);
    bytes.insert(bytes.end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (bytes.size() < 1024) throw std::runtime_error("[torch_workloads] fortunes text is missing");
  return torch::from_blob(bytes.data(), {int64_t(bytes.size())}, torch::kUInt8).to(torch::kInt64);
}

// Shuffled fixed-size batches, reshuffled each epoch (a DataLoader with shuffle=True).
class Batcher {
 public:
  Batcher(torch::Tensor x, torch::Tensor y, int64_t batch) : x_(x), y_(y), batch_(batch) {}
  std::pair<torch::Tensor, torch::Tensor> next() {
    if (!perm_.defined() || pos_ + batch_ > perm_.size(0)) {
      perm_ = torch::randperm(x_.size(0), torch::kInt64);
      pos_ = 0;
    }
    const torch::Tensor idx = perm_.narrow(0, pos_, batch_);
    pos_ += batch_;
    return {x_.index_select(0, idx), y_.index_select(0, idx)};
  }

 private:
  torch::Tensor x_, y_, perm_;
  int64_t batch_, pos_ = 0;
};

// ---------------- models (PyTorch default initialisation is libtorch's default) ----------------

struct MlpImpl : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  MlpImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(784, 1024));
    fc2 = register_module("fc2", torch::nn::Linear(1024, 1024));
    fc3 = register_module("fc3", torch::nn::Linear(1024, 10));
  }
  torch::Tensor forward(torch::Tensor x) { return fc3(torch::relu(fc2(torch::relu(fc1(x))))); }
};
TORCH_MODULE(Mlp);

struct CnnImpl : torch::nn::Module {
  torch::nn::Conv2d c1{nullptr}, c2{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  CnnImpl() {
    c1 = register_module("c1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3).padding(1)));
    c2 = register_module("c2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).padding(1)));
    fc1 = register_module("fc1", torch::nn::Linear(3136, 128));
    fc2 = register_module("fc2", torch::nn::Linear(128, 10));
  }
  // x: (B, 1, 28, 28) -> (B, 10)
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(c1(x)), 2);  // (B, 32, 14, 14)
    x = torch::max_pool2d(torch::relu(c2(x)), 2);  // (B, 64, 7, 7)
    return fc2(torch::relu(fc1(x.flatten(1))));
  }
};
TORCH_MODULE(Cnn);

constexpr int64_t kCtx = 128, kLayers = 4, kHeads = 4, kDModel = 128, kVocab = 256;

struct BlockImpl : torch::nn::Module {
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc{nullptr}, fc_out{nullptr};
  torch::Tensor causal_mask;  // (T, T) bool, true above the diagonal
  BlockImpl() {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDModel})));
    qkv = register_module("qkv", torch::nn::Linear(kDModel, 3 * kDModel));
    proj = register_module("proj", torch::nn::Linear(kDModel, kDModel));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDModel})));
    fc = register_module("fc", torch::nn::Linear(kDModel, 4 * kDModel));
    fc_out = register_module("fc_out", torch::nn::Linear(4 * kDModel, kDModel));
    causal_mask = torch::ones({kCtx, kCtx}, torch::kBool).triu(1);
  }
  // x: (B, T, C) -> (B, T, C)
  torch::Tensor forward(torch::Tensor x) {
    const int64_t B = x.size(0), T = x.size(1), hd = kDModel / kHeads;
    auto parts = qkv(ln1(x)).split(kDModel, -1);  // 3 x (B, T, C)
    auto heads = [&](const torch::Tensor& t) { return t.view({B, T, kHeads, hd}).transpose(1, 2); };
    const torch::Tensor q = heads(parts[0]), k = heads(parts[1]),
                        v = heads(parts[2]);  // (B, H, T, hd)
    torch::Tensor att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(hd)));
    att = att.masked_fill(causal_mask.narrow(0, 0, T).narrow(1, 0, T), -INFINITY).softmax(-1);
    const torch::Tensor y =
        torch::matmul(att, v).transpose(1, 2).contiguous().view({B, T, kDModel});
    x = x + proj(y);
    return x + fc_out(torch::gelu(fc(ln2(x))));  // gelu default: erf form
  }
};
TORCH_MODULE(Block);

struct GptImpl : torch::nn::Module {
  torch::nn::Embedding tok{nullptr}, pos{nullptr};
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};
  GptImpl() {
    tok = register_module("tok", torch::nn::Embedding(kVocab, kDModel));
    pos = register_module("pos", torch::nn::Embedding(kCtx, kDModel));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < kLayers; ++i) blocks->push_back(Block());
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDModel})));
    head = register_module(
        "head", torch::nn::Linear(torch::nn::LinearOptions(kDModel, kVocab).bias(false)));
  }
  // idx: (B, T) int64 -> logits (B, T, V)
  torch::Tensor forward(torch::Tensor idx) {
    const int64_t T = idx.size(1);
    torch::Tensor x = tok(idx) + pos(torch::arange(T, torch::kInt64));
    for (const auto& b : *blocks) x = b->as<Block>()->forward(x);
    return head(ln_f(x));
  }
};
TORCH_MODULE(Gpt);

int64_t count_params(torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

torch::optim::AdamW make_adamw(torch::nn::Module& m, double lr) {
  return torch::optim::AdamW(
      m.parameters(),
      torch::optim::AdamWOptions(lr).betas({0.9, 0.999}).eps(1e-8).weight_decay(0.01));
}

// Runs warmup + steps training steps; prints the median ms per timed step and the last loss.
void train_loop(const char* name, const Options& opt, const std::function<torch::Tensor()>& step) {
  std::vector<double> ms;
  double last_loss = 0;
  for (int i = 0; i < opt.warmup + opt.steps; ++i) {
    const auto t0 = Clock::now();
    const torch::Tensor loss = step();
    const double t = seconds_since(t0) * 1e3;
    last_loss = loss.item<double>();  // outside the timing; the step is synchronous on CPU
    if (i >= opt.warmup) ms.push_back(t);
  }
  std::printf("workload=%s impl=libtorch threads=%d steps=%d ms_per_step=%.3f loss=%.4f\n", name,
              torch::get_num_threads(), opt.steps, median(ms), last_loss);
  std::fflush(stdout);
}

// ---------------- workloads ----------------

// c = a + b on 16 f32 elements; with grad, `a` requires grad so each add records a node.
// Same protocol as bench/workloads: batches of 20000 ops, median over 41 batches.
void run_op(const Options&) {
  constexpr int kOpsPerBatch = 20000, kBatches = 41;
  torch::manual_seed(1);
  const torch::Tensor a = torch::randn({16}).requires_grad_(true), b = torch::randn({16});
  auto measure = [&] {
    auto batch = [&] {
      const auto t0 = Clock::now();
      for (int i = 0; i < kOpsPerBatch; ++i) {
        torch::Tensor c = a + b;
        asm volatile("" : : "r"(c.unsafeGetTensorImpl()) : "memory");
      }
      return seconds_since(t0) * 1e6 / kOpsPerBatch;
    };
    batch();
    std::vector<double> us;
    for (int i = 0; i < kBatches; ++i) us.push_back(batch());
    return median(us);
  };
  const double with_grad = measure();
  double no_grad;
  {
    torch::NoGradGuard ng;
    no_grad = measure();
  }
  std::printf("workload=op impl=libtorch mode=grad us_per_op=%.3f\n", with_grad);
  std::printf("workload=op impl=libtorch mode=nograd us_per_op=%.3f\n", no_grad);
  std::fflush(stdout);
}

void run_mlp(const Options& opt) {
  torch::manual_seed(0);
  const Fashion data = load_fashion();
  Batcher batches(data.images, data.labels, 256);
  Mlp model;
  auto adamw = make_adamw(*model, 1e-3);
  train_loop("mlp", opt, [&] {
    auto [x, y] = batches.next();
    torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    loss.backward();
    adamw.step();
    adamw.zero_grad();
    return loss;
  });
}

void run_cnn(const Options& opt) {
  torch::manual_seed(0);
  const Fashion data = load_fashion();
  Batcher batches(data.images.view({-1, 1, 28, 28}), data.labels, 128);
  Cnn model;
  auto adamw = make_adamw(*model, 1e-3);
  train_loop("cnn", opt, [&] {
    auto [x, y] = batches.next();
    torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    loss.backward();
    adamw.step();
    adamw.zero_grad();
    return loss;
  });
}

void run_gpt(const Options& opt) {
  constexpr int64_t kBatch = 32, kExpectedParams = 875264;
  torch::manual_seed(0);
  const torch::Tensor text = load_fortunes();
  Gpt model;
  if (count_params(*model) != kExpectedParams)
    throw std::runtime_error("[torch_workloads] gpt has " + std::to_string(count_params(*model)) +
                             " parameters, WORKLOADS.md says " + std::to_string(kExpectedParams));
  auto adamw = make_adamw(*model, 3e-4);
  const torch::Tensor window = torch::arange(kCtx + 1, torch::kInt64);  // (T+1)
  train_loop("gpt", opt, [&] {
    // 32 random windows of T+1 bytes: inputs are the first T, targets the last T.
    const torch::Tensor start = torch::randint(text.size(0) - kCtx - 1, {kBatch, 1}, torch::kInt64);
    const torch::Tensor seq = text.index({start + window});  // (B, T+1)
    const torch::Tensor x = seq.narrow(1, 0, kCtx), y = seq.narrow(1, 1, kCtx);
    const torch::Tensor logits = model->forward(x);  // (B, T, V)
    torch::Tensor loss =
        torch::nn::functional::cross_entropy(logits.view({-1, kVocab}), y.reshape({-1}));
    loss.backward();
    adamw.step();
    adamw.zero_grad();
    return loss;
  });
}

// word_language_model's medium LSTM, as bench/workloads' lstm: forward over (35, 20, 650)
// random inputs from zero states, loss = sum(output), backward, zero grads.
void run_lstm(const Options& opt) {
  torch::manual_seed(0);
  torch::nn::LSTM lstm(torch::nn::LSTMOptions(650, 650).num_layers(2));
  const torch::Tensor x = torch::randn({35, 20, 650});
  train_loop("lstm", opt, [&] {
    torch::Tensor loss = std::get<0>(lstm->forward(x)).sum();
    loss.backward();
    for (auto& p : lstm->parameters()) p.mutable_grad() = torch::Tensor();
    return loss;
  });
}

struct Workload {
  const char* name;
  void (*run)(const Options&);
};
const Workload kWorkloads[] = {
    {"op", run_op}, {"mlp", run_mlp}, {"cnn", run_cnn}, {"gpt", run_gpt}, {"lstm", run_lstm}};

int usage(const char* argv0) {
  std::fprintf(stderr, "usage: %s op|mlp|cnn|gpt|lstm|all [--threads N] [--steps N] [--warmup N]\n",
               argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage(argv[0]);
  const std::string name = argv[1];
  Options opt;
  for (int i = 2; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) return usage(argv[0]);
    char* end = nullptr;
    const long v = std::strtol(argv[++i], &end, 10);
    if (*end != '\0' || v < 0) return usage(argv[0]);
    if (flag == "--threads" && v > 0)
      opt.threads = int(v);
    else if (flag == "--steps" && v > 0)
      opt.steps = int(v);
    else if (flag == "--warmup")
      opt.warmup = int(v);
    else
      return usage(argv[0]);
  }
  if (opt.threads > 0) {
    torch::set_num_threads(opt.threads);
    // Debian's libtorch calls the system libblas.so.3; when that is OpenBLAS (pthreads), its
    // own pool would run beside libtorch's OpenMP threads, so cap it to the same count.
    using SetThreads = void (*)(int);
    if (auto f = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads")))
      f(opt.threads);
  }
  // Debian's libtorch calls whatever provides libblas.so.3; the reference BLAS makes its GEMMs
  // 10-30x slower (mlp 780 instead of 89 ms/step at 1 thread on a 2-core Xeon), which makes every
  // ratio against this peer meaningless. Say so where the figures are read.
  {
    Dl_info info{};
    void* gemm = dlsym(RTLD_DEFAULT, "sgemm_");
    std::string lib;
    if (gemm && dladdr(gemm, &info) && info.dli_fname) {
      // Debian's alternatives: /lib/.../libblas.so.3 links to openblas-pthread/ or blas/.
      char* real = realpath(info.dli_fname, nullptr);
      lib = real ? real : info.dli_fname;
      std::free(real);
    }
    if (lib.find("openblas") == std::string::npos && lib.find("mkl") == std::string::npos)
      std::fprintf(stderr,
                   "torch_workloads: warning: sgemm_ comes from %s, neither OpenBLAS nor MKL (the "
                   "reference BLAS?): libtorch's GEMMs are far slower than they should be; install "
                   "libopenblas0 (ACCEL_PEERS=1 scripts/dev.sh)\n",
                   lib.empty() ? "nowhere" : lib.c_str());
  }
  bool found = false;
  for (const Workload& w : kWorkloads) {
    if (name != "all" && name != w.name) continue;
    found = true;
    try {
      w.run(opt);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "torch_workloads %s failed: %s\n", w.name, e.what());
      return 1;
    }
  }
  if (!found) {
    std::fprintf(stderr, "unknown workload '%s'\n", name.c_str());
    return usage(argv[0]);
  }
  return 0;
}
