// Replay driver for fuzz targets in builds without libFuzzer (gcc, no sanitizers): runs
// LLVMFuzzerTestOneInput over every file of the given corpus directories, then over a fixed
// number of deterministic pseudo-random mutations of them, so the targets run as plain tests.
//
//   fuzz_x_replay [--mutations=N] [--seed=S] [--max-len=L] <corpus dir or file>...
//
// A crash, an abort() of the target, or an exception escaping it fails the run; the input is
// written to ./replay-crash-<target>.bin first so it can be replayed with libFuzzer.
#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

namespace fs = std::filesystem;

constexpr uint64_t kDefaultMutations = 20000;
constexpr size_t kDefaultMaxLen = 8192;

// splitmix64: small, deterministic, good enough to pick mutations.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return n ? size_t(next() % n) : 0; }
};

std::vector<uint8_t> read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

// Values that tend to sit on boundaries of size fields.
constexpr uint64_t kInteresting[] = {0,
                                     1,
                                     0x7f,
                                     0x80,
                                     0xff,
                                     0x100,
                                     0x7fff,
                                     0xffff,
                                     0x10000,
                                     0x7fffffff,
                                     0x80000000,
                                     0xffffffff,
                                     0x7fffffffffffffffULL,
                                     0xffffffffffffffffULL};

void mutate(std::vector<uint8_t>& b, const std::vector<std::vector<uint8_t>>& corpus, Rng& r,
            size_t max_len) {
  const int steps = 1 + int(r.below(4));
  for (int s = 0; s < steps; ++s) {
    switch (r.below(8)) {
      case 0:  // flip a bit
        if (!b.empty()) b[r.below(b.size())] ^= uint8_t(1u << r.below(8));
        break;
      case 1:  // random byte
        if (!b.empty()) b[r.below(b.size())] = uint8_t(r.next());
        break;
      case 2:  // insert random bytes
        if (b.size() < max_len) {
          const size_t at = r.below(b.size() + 1), n = 1 + r.below(16);
          for (size_t i = 0; i < n; ++i) b.insert(b.begin() + long(at), uint8_t(r.next()));
        }
        break;
      case 3:  // erase a range
        if (!b.empty()) {
          const size_t at = r.below(b.size()), n = 1 + r.below(std::min<size_t>(b.size() - at, 32));
          b.erase(b.begin() + long(at), b.begin() + long(at + n));
        }
        break;
      case 4: {  // an interesting integer, 1/2/4/8 bytes, either byte order
        const uint64_t v = kInteresting[r.below(std::size(kInteresting))];
        const size_t w = size_t(1) << r.below(4);
        if (b.size() >= w) {
          const size_t at = r.below(b.size() - w + 1);
          const bool big = r.below(2);
          for (size_t i = 0; i < w; ++i) b[at + i] = uint8_t(v >> (8 * (big ? w - 1 - i : i)));
        }
        break;
      }
      case 5:  // duplicate a chunk
        if (!b.empty() && b.size() < max_len) {
          const size_t at = r.below(b.size()), n = 1 + r.below(std::min<size_t>(b.size() - at, 64));
          std::vector<uint8_t> chunk(b.begin() + long(at), b.begin() + long(at + n));
          b.insert(b.begin() + long(r.below(b.size() + 1)), chunk.begin(), chunk.end());
        }
        break;
      case 6: {  // splice with another corpus input
        const auto& o = corpus[r.below(corpus.size())];
        if (!o.empty()) {
          const size_t cut = r.below(b.size() + 1), from = r.below(o.size());
          b.resize(cut);
          b.insert(b.end(), o.begin() + long(from), o.end());
        }
        break;
      }
      default:  // truncate
        if (!b.empty()) b.resize(r.below(b.size()));
        break;
    }
  }
  if (b.size() > max_len) b.resize(max_len);
}

std::string g_target = "target";
const std::vector<uint8_t>* g_current = nullptr;

void save_crash() {
  if (!g_current) return;
  const std::string name = "replay-crash-" + g_target + ".bin";
  std::ofstream f(name, std::ios::binary);
  f.write(reinterpret_cast<const char*>(g_current->data()), std::streamsize(g_current->size()));
  std::cerr << "replay: input saved to " << name << " (" << g_current->size() << " bytes)\n";
}

void run_one(const std::vector<uint8_t>& b) {
  g_current = &b;
  // A copy in a buffer of exactly the input size, as libFuzzer passes it.
  std::unique_ptr<uint8_t[]> copy(new uint8_t[b.size() ? b.size() : 1]);
  if (!b.empty()) std::memcpy(copy.get(), b.data(), b.size());
  LLVMFuzzerTestOneInput(copy.get(), b.size());
  g_current = nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t mutations = kDefaultMutations, seed = 1;
  size_t max_len = kDefaultMaxLen;
  std::vector<fs::path> inputs;
  g_target = fs::path(argv[0]).filename().string();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--mutations=", 0) == 0) {
      mutations = std::strtoull(a.c_str() + 12, nullptr, 10);
    } else if (a.rfind("--seed=", 0) == 0) {
      seed = std::strtoull(a.c_str() + 7, nullptr, 10);
    } else if (a.rfind("--max-len=", 0) == 0) {
      max_len = std::strtoull(a.c_str() + 10, nullptr, 10);
    } else {
      inputs.emplace_back(a);
    }
  }
  std::set_terminate([] {
    std::cerr << "replay: " << g_target << ": exception escaped LLVMFuzzerTestOneInput";
    if (auto e = std::current_exception()) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        std::cerr << ": " << x.what();
      } catch (...) {
      }
    }
    std::cerr << "\n";
    save_crash();
    std::abort();
  });
  std::signal(SIGABRT, [](int) {
    save_crash();
    std::signal(SIGABRT, SIG_DFL);
  });
  std::vector<std::vector<uint8_t>> corpus;
  for (const auto& in : inputs) {
    std::error_code ec;
    if (fs::is_directory(in, ec)) {
      std::vector<fs::path> files;
      for (const auto& e : fs::directory_iterator(in)) {
        if (e.is_regular_file()) files.push_back(e.path());
      }
      std::sort(files.begin(), files.end());  // deterministic order
      for (const auto& f : files) corpus.push_back(read_file(f));
    } else if (fs::is_regular_file(in, ec)) {
      corpus.push_back(read_file(in));
    } else {
      std::cerr << "replay: no such corpus file or directory: " << in << "\n";
      return 2;
    }
  }
  if (corpus.empty()) corpus.emplace_back();  // at least the empty input
  for (const auto& c : corpus) run_one(c);
  Rng rng{seed};
  for (uint64_t i = 0; i < mutations; ++i) {
    std::vector<uint8_t> b = corpus[rng.below(corpus.size())];
    mutate(b, corpus, rng, max_len);
    run_one(b);
  }
  std::cout << "replay: " << g_target << ": " << corpus.size() << " corpus inputs + " << mutations
            << " mutations, no failures\n";
  return 0;
}
