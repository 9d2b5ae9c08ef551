// TokenWindowDataset: (x, y) windows over a TokenFile. Kept apart from tokens.cc, which holds
// no tensor code, so the token fuzz target builds from a few sources.
#include <cstring>

#include "core/error.h"
#include "data/tokens.h"

namespace accel::data {

TokenWindowDataset::TokenWindowDataset(std::shared_ptr<const TokenFile> tokens, int64_t context,
                                       int64_t stride)
    : tokens_(std::move(tokens)), context_(context), stride_(stride < 0 ? context : stride) {
  ACCEL_CHECK(tokens_ != nullptr, ValueError, "TokenWindowDataset", "token source is null");
  num_windows_ = token_window_count(tokens_->size(), context, stride_, tokens_->name());
}

Example TokenWindowDataset::get(int64_t index) const {
  ACCEL_CHECK(index >= 0 && index < num_windows_, IndexError, "TokenWindowDataset", "index ", index,
              " out of range for ", num_windows_, " windows");
  // One read of T+1 tokens; x and y are views into it, offset by one.
  Tensor buf = empty({context_ + 1}, kInt64);
  tokens_->read(index * stride_, context_ + 1, buf.data<int64_t>());
  return Example({buf.narrow(0, 0, context_), buf.narrow(0, 1, context_)}, {"x", "y"});
}

bool TokenWindowDataset::get_batch(std::span<const int64_t> indices, Allocator* alloc,
                                   Example& out) const {
  const int64_t b = int64_t(indices.size()), t = context_;
  Tensor x = empty_with_allocator({b, t}, kInt64, alloc);
  Tensor y = empty_with_allocator({b, t}, kInt64, alloc);
  int64_t* px = x.data<int64_t>();
  int64_t* py = y.data<int64_t>();
  std::vector<int64_t> tmp(size_t(t + 1));
  for (int64_t j = 0; j < b; ++j) {
    const int64_t i = indices[size_t(j)];
    ACCEL_CHECK(i >= 0 && i < num_windows_, IndexError, "TokenWindowDataset", "index ", i,
                " out of range for ", num_windows_, " windows");
    tokens_->read(i * stride_, t + 1, tmp.data());
    std::memcpy(px + j * t, tmp.data(), size_t(t) * sizeof(int64_t));
    std::memcpy(py + j * t, tmp.data() + 1, size_t(t) * sizeof(int64_t));
  }
  out.fields = {std::move(x), std::move(y)};
  out.names = {"x", "y"};
  return true;
}

}  // namespace accel::data
