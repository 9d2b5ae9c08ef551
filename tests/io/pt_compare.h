// Helpers of the torch.save tests: the fixture folder, whole-file reads and writes, and exact
// comparison of PtValue trees (tensors byte for byte, with their geometry and storage sharing).
#pragma once

#include <doctest/doctest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>

#include "io/torch_format.h"
#include "tests/common/util.h"

namespace pt_test {

using accel::test::read_file;
using accel::test::TempDir;
using accel::test::write_file;

using accel::Tensor;
using accel::io::PtEntry;
using accel::io::PtValue;

inline std::string fixture(const std::string& name) {
  return std::string(ACCEL_SOURCE_ROOT) + "/tests/io/fixtures/" + name;
}

// Exact equality of two trees; a tensor equals another of the same dtype, sizes, strides, storage
// offset, requires_grad and storage bytes (the whole storage: a file holds storages whole).
// Storages shared in `a` must be shared the same way in `b`.
class SameTree {
 public:
  void check(const PtValue& a, const PtValue& b, const std::string& where) {
    INFO(where);
    REQUIRE(a.type_name() == b.type_name());
    switch (a.kind()) {
      case PtValue::Kind::kNone: return;
      case PtValue::Kind::kBool: CHECK(a.to_bool() == b.to_bool()); return;
      case PtValue::Kind::kInt: CHECK(a.to_int() == b.to_int()); return;
      case PtValue::Kind::kDouble: {
        const double x = a.to_double(), y = b.to_double();
        CHECK(std::memcmp(&x, &y, sizeof x) == 0);  // -0.0 and 0.0 differ
        return;
      }
      case PtValue::Kind::kString: CHECK(a.to_string() == b.to_string()); return;
      case PtValue::Kind::kTensor: tensor(a.to_tensor(), b.to_tensor()); return;
      case PtValue::Kind::kList:
      case PtValue::Kind::kTuple:
        REQUIRE(a.size() == b.size());
        for (size_t i = 0; i < a.size(); ++i)
          check(a.item(i), b.item(i), where + "[" + std::to_string(i) + "]");
        return;
      case PtValue::Kind::kDict:
        entries(a.entries(), b.entries(), where);
        entries(a.attributes(), b.attributes(), where + " attributes");
        return;
    }
  }

 private:
  void entries(const std::vector<PtEntry>& a, const std::vector<PtEntry>& b,
               const std::string& where) {
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      check(a[i].key, b[i].key, where + " key " + std::to_string(i));
      check(a[i].value, b[i].value, where + "[" + a[i].key.repr() + "]");
    }
  }
  void tensor(const Tensor& a, const Tensor& b) {
    REQUIRE(a.defined());
    REQUIRE(b.defined());
    CHECK(a.dtype() == b.dtype());
    CHECK(a.sizes() == b.sizes());
    CHECK(a.strides() == b.strides());
    CHECK(a.offset() == b.offset());
    CHECK(a.requires_grad() == b.requires_grad());
    CHECK(a.device().is_cpu());
    REQUIRE(a.storage()->nbytes() == b.storage()->nbytes());
    CHECK(std::memcmp(a.storage()->data(), b.storage()->data(), a.storage()->nbytes()) == 0);
    // One storage of `a` is one storage of `b`, and the other way round.
    CHECK(shared_.emplace(a.storage().get(), b.storage().get()).first->second == b.storage().get());
    CHECK(back_.emplace(b.storage().get(), a.storage().get()).first->second == a.storage().get());
  }
  std::map<const void*, const void*> shared_, back_;
};

inline void check_same(const PtValue& a, const PtValue& b) { SameTree().check(a, b, "value"); }

}  // namespace pt_test
