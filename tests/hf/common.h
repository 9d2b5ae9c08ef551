// Shared pieces of the hf/ tests: the fixture folder (tests/hf/fixtures, written by
// make_hf_fixture.py with python3-torch), its expected values, scratch folders.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>

#include "io/safetensors.h"
#include "autograd/ops.h"
#include "core/tensor.h"
#include "tests/common/tensors.h"

namespace accel::test {

inline std::string hf_fixtures() { return std::string(ACCEL_SOURCE_ROOT) + "/tests/hf/fixtures"; }
inline std::string hf_fixture(const std::string& model) { return hf_fixtures() + "/" + model; }

// expected.safetensors: <model>.input_ids, <model>.logits, <model>.greedy.
inline const nn::TensorDict& hf_expected() {
  static const nn::TensorDict d = nn::load_safetensors(hf_fixtures() + "/expected.safetensors");
  return d;
}
inline Tensor hf_expected(const std::string& key) { return hf_expected().at(key); }

// Whether two integer tensors are equal element for element (and in shape).
inline bool same_tokens(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes()) return false;
  return a.to(kInt64).eq(b.to(kInt64)).to(kInt64).sum().item<int64_t>() == a.numel();
}

// An empty directory /tmp/accel-hf-<pid>-<tag> (removed first if a crashed run left it).
inline std::string hf_scratch(const std::string& tag) {
  const std::string d = "/tmp/accel-hf-" + std::to_string(getpid()) + "-" + tag;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

}  // namespace accel::test
