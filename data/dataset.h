// Datasets: random access to examples by index. An Example is a small list of tensors
// (positional, optionally named: "image", "label"). DataLoader workers call get() from several
// threads at once, so get()/get_batch() must be safe to call concurrently (they are const).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/generator.h"
#include "core/storage.h"
#include "core/tensor.h"

namespace accel::data {

struct Example {
  std::vector<Tensor> fields;
  std::vector<std::string> names;  // empty, or one name per field

  Example() = default;
  Example(std::initializer_list<Tensor> ts) : fields(ts) {}
  explicit Example(std::vector<Tensor> ts, std::vector<std::string> ns = {})
      : fields(std::move(ts)), names(std::move(ns)) {}

  size_t size() const { return fields.size(); }
  Tensor& operator[](size_t i) { return fields[i]; }
  const Tensor& operator[](size_t i) const { return fields[i]; }
  // By name; IndexError listing the names when absent.
  const Tensor& operator[](const std::string& name) const;
  Tensor& operator[](const std::string& name);
  int64_t index_of(const std::string& name) const;  // -1 when absent
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual Example get(int64_t index) const = 0;

  // Fast path for the default collate: writes examples `indices` straight into batch tensors of
  // shape (len(indices), ...) allocated from `alloc` (CPU or pinned), skipping the per-example
  // tensors. Returns false when the dataset has no such path (then get() + collate are used).
  virtual bool get_batch(std::span<const int64_t> /*indices*/, Allocator* /*alloc*/,
                         Example& /*out*/) const {
    return false;
  }
};

using DatasetPtr = std::shared_ptr<const Dataset>;

// Rows of equally long tensors: example i is (t0[i], t1[i], ...). The tensors are made
// contiguous (and moved to CPU) once at construction so batches are row memcpys.
class TensorDataset final : public Dataset {
 public:
  explicit TensorDataset(std::vector<Tensor> tensors, std::vector<std::string> names = {});
  int64_t size() const override { return size_; }
  Example get(int64_t index) const override;
  bool get_batch(std::span<const int64_t> indices, Allocator* alloc, Example& out) const override;
  const std::vector<Tensor>& tensors() const { return tensors_; }
  const std::vector<std::string>& names() const { return names_; }

 private:
  std::vector<Tensor> tensors_;
  std::vector<std::string> names_;
  std::vector<size_t> row_bytes_;
  int64_t size_ = 0;
};

// Applies `fn` to every example of `base` on access (in the worker thread that fetches it).
// For random augmentation use sample_generator() inside fn: it is seeded from the loader seed,
// epoch and index, so results do not depend on the number of workers or on resuming.
using TransformFn = std::function<Example(Example)>;
class MapDataset final : public Dataset {
 public:
  MapDataset(DatasetPtr base, TransformFn fn);
  int64_t size() const override { return base_->size(); }
  Example get(int64_t index) const override { return fn_(base_->get(index)); }

 private:
  DatasetPtr base_;
  TransformFn fn_;
};
DatasetPtr map(DatasetPtr base, TransformFn fn);
// Transform of one field only (e.g. normalise images, keep labels).
DatasetPtr map_field(DatasetPtr base, size_t field, std::function<Tensor(Tensor)> fn);

// A view of `base` at the given indices (each in [0, base.size())).
class Subset final : public Dataset {
 public:
  Subset(DatasetPtr base, std::vector<int64_t> indices);
  int64_t size() const override { return int64_t(indices_.size()); }
  Example get(int64_t index) const override;
  bool get_batch(std::span<const int64_t> indices, Allocator* alloc, Example& out) const override;
  const std::vector<int64_t>& indices() const { return indices_; }

 private:
  DatasetPtr base_;
  std::vector<int64_t> indices_;
};

// The datasets one after another: index i maps to (part, i - offset(part)).
class ConcatDataset final : public Dataset {
 public:
  explicit ConcatDataset(std::vector<DatasetPtr> parts);
  int64_t size() const override { return cum_.empty() ? 0 : cum_.back(); }
  Example get(int64_t index) const override;
  // Forwards when every index falls in one part (the common case of a batch from a long run).
  bool get_batch(std::span<const int64_t> indices, Allocator* alloc, Example& out) const override;

 private:
  std::pair<size_t, int64_t> locate(int64_t index) const;
  std::vector<DatasetPtr> parts_;
  std::vector<int64_t> cum_;  // cum_[k] = total size of parts 0..k
};

// Random split by a seeded permutation into pieces of the given lengths (must sum to size).
std::vector<DatasetPtr> random_split(DatasetPtr base, const std::vector<int64_t>& lengths,
                                     uint64_t seed);

// ---- per-sample randomness (see Note [Deterministic sample randomness] in dataset.cc) ----
struct SampleContext {
  uint64_t seed = 0;
  int64_t epoch = 0;
  int64_t index = -1;  // dataset index being fetched; -1 outside a loader fetch
};
// The context of the example the current thread is fetching (set by the DataLoader).
const SampleContext& current_sample();
void set_current_sample(const SampleContext& c);
// A generator seeded from (seed, epoch, index) of the current sample.
Generator sample_generator();

// Default collate: stacks field k of every example into a (B, ...) tensor allocated from
// `alloc` (nullptr = CPU). Fields must agree in shape and dtype (ShapeError/DTypeError naming
// the field and the first example that differs).
Example collate_stack(const std::vector<Example>& examples, Allocator* alloc = nullptr);
// An uninitialised contiguous tensor whose storage comes from `alloc`.
Tensor empty_with_allocator(const Shape& shape, DType dtype, Allocator* alloc);

// splitmix64 finaliser: turns structured seeds (seed, epoch, index) into well-mixed ones.
uint64_t mix_seed(uint64_t a, uint64_t b);

}  // namespace accel::data
