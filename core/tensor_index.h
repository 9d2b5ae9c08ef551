// The index list of Tensor::index / index_put_ (libtorch's spelling of Python's x[...]):
//
//   using namespace accel::indexing;
//   x.index({Slice(), idx, None, Ellipsis, 3, mask})   // x[:, idx, None, ..., 3, mask]
//   x.index({Slice(1, None, 2), "..."})                // x[1::2, ...]
//   x.index_put_({rows, labels}, 1.0)                  // x[rows, labels] = 1.0
//
// An entry is an integer (select, negative counts from the end), a Slice (start, stop, step;
// Slice() is `:`), None (a new axis of size 1), Ellipsis or "..." (as many `:` as needed), true
// or false (a new axis of size 1 or 0), or a Tensor: int64/int32 (advanced indexing: the index
// tensors broadcast together and pick elements) or bool/uint8 (a mask over as many dims as it
// has, like its nonzero()). The rules are numpy's and PyTorch's; docs/indexing.md has them.
// Only types live here; the ops are in autograd/ops/indexing.cc.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace accel::indexing {

// `None` in an index list is a new axis; inside a Slice it is an omitted bound (Slice(None, 3)).
inline constexpr std::nullopt_t None = std::nullopt;

struct EllipsisIndexType {
  explicit constexpr EllipsisIndexType() = default;
};
inline constexpr EllipsisIndexType Ellipsis{};

// Python's start:stop:step. Omitted bounds are the whole dim; out-of-range bounds clamp, as in
// Python. The step must be positive (PyTorch has no negative-step slices).
class Slice {
 public:
  Slice(std::optional<int64_t> start = std::nullopt,  // NOLINT(google-explicit-constructor)
        std::optional<int64_t> stop = std::nullopt, std::optional<int64_t> step = std::nullopt)
      : start_(start), stop_(stop), step_(step) {}
  const std::optional<int64_t>& start() const { return start_; }
  const std::optional<int64_t>& stop() const { return stop_; }
  const std::optional<int64_t>& step() const { return step_; }

 private:
  std::optional<int64_t> start_, stop_, step_;
};

enum class TensorIndexType : uint8_t { None, Ellipsis, Integer, Boolean, Slice, Tensor };

class TensorIndex {
 public:
  TensorIndex(std::nullopt_t) : type_(TensorIndexType::None) {}         // NOLINT
  TensorIndex(EllipsisIndexType) : type_(TensorIndexType::Ellipsis) {}  // NOLINT
  TensorIndex(const char* s);                                           // NOLINT: "..." only
  template <typename I,
            std::enable_if_t<std::is_integral_v<I> && !std::is_same_v<I, bool>, int> = 0>
  TensorIndex(I i) : type_(TensorIndexType::Integer), integer_(int64_t(i)) {}       // NOLINT
  TensorIndex(bool b) : type_(TensorIndexType::Boolean), boolean_(b) {}             // NOLINT
  TensorIndex(Slice s) : type_(TensorIndexType::Slice), slice_(s) {}                // NOLINT
  TensorIndex(Tensor t) : type_(TensorIndexType::Tensor), tensor_(std::move(t)) {}  // NOLINT

  TensorIndexType type() const { return type_; }
  bool is_none() const { return type_ == TensorIndexType::None; }
  bool is_ellipsis() const { return type_ == TensorIndexType::Ellipsis; }
  bool is_integer() const { return type_ == TensorIndexType::Integer; }
  bool is_boolean() const { return type_ == TensorIndexType::Boolean; }
  bool is_slice() const { return type_ == TensorIndexType::Slice; }
  bool is_tensor() const { return type_ == TensorIndexType::Tensor; }
  int64_t integer() const { return integer_; }
  bool boolean() const { return boolean_; }
  const Slice& slice() const { return slice_; }
  const Tensor& tensor() const { return tensor_; }

 private:
  TensorIndexType type_;
  int64_t integer_ = 0;
  bool boolean_ = false;
  Slice slice_;
  Tensor tensor_;
};

// "x[:, 1:3, ...]"-style text of an index list, for error messages.
std::string index_str(const std::vector<TensorIndex>& indices);

}  // namespace accel::indexing
