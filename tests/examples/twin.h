// What the PyTorch-twin tests of the ported examples share (tests/examples/twin.py is the Python
// side): the deterministic initial weights both sides compute bit for bit, the fixture reader and
// the weights checksum.
#pragma once

#include <doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "accel.h"

namespace accel::twin {

inline uint64_t splitmix64(uint64_t x) {
  uint64_t z = x * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// twin.py's det_values: parameter k (in name order) of `shape`, float64.
inline Tensor det_values(int64_t k, const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  const int64_t fan_in = shape.size() >= 2 ? n / shape[0] : n;
  std::vector<double> v(static_cast<size_t>(n));
  const double scale = 2.0 / std::sqrt(double(fan_in));
  for (int64_t j = 0; j < n; ++j) {
    const uint64_t z = splitmix64(uint64_t(j) + (uint64_t(k + 1) << 32));
    const double u = double(z >> 11) * 0x1p-53 - 0.5;
    v[size_t(j)] = u * scale;
  }
  return tensor(v, shape, TensorOptions(kFloat64));
}

// Converts the model to float64 and gives every parameter det_values, in sorted name order (the
// order of state_dict(), a std::map).
inline void det_init(nn::Module& model) {
  model.to(kFloat64);
  io::TensorDict init;
  int64_t k = 0;
  for (const auto& [name, p] : model.state_dict()) {
    bool is_param = false;
    for (const auto& [pn, pp] : model.named_parameters()) is_param = is_param || pn == name;
    if (is_param) init[name] = det_values(k++, p.sizes());
  }
  model.load_state_dict(init, /*strict=*/false);
}

// twin.py's checksum: sum over parameters of sum(p) + sum(p^2).
inline double checksum(nn::Module& model) {
  NoGradGuard ng;
  double s = 0;
  for (const auto& [name, p] : model.named_parameters()) s += sum(p).item() + sum(p * p).item();
  return s;
}

inline std::string fixture_path(const std::string& name) {
  return std::string(ACCEL_SOURCE_ROOT) + "/tests/examples/" + name;
}

class Fixture {
 public:
  explicit Fixture(const std::string& file)
      : tensors_(io::load_safetensors(fixture_path(file), &meta_)) {}
  const Tensor& operator[](const std::string& name) const {
    auto it = tensors_.find(name);
    REQUIRE_MESSAGE(it != tensors_.end(), "fixture lacks ", name);
    return it->second;
  }
  std::string meta(const std::string& key) const {
    auto it = meta_.find(key);
    REQUIRE_MESSAGE(it != meta_.end(), "fixture metadata lacks ", key);
    return it->second;
  }
  // Element i of a 1-d float64 / int64 tensor.
  double at(const std::string& name, int64_t i) const { return (*this)[name][i].item(); }

 private:
  io::Metadata meta_;
  io::TensorDict tensors_;
};

}  // namespace accel::twin
