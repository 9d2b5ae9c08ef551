#include "data/dataset.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "core/checked_size.h"
#include "core/error.h"

namespace accel::data {

// ---- Example ----

int64_t Example::index_of(const std::string& name) const {
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return int64_t(i);
  }
  return -1;
}

namespace {
[[noreturn]] void throw_no_field(const Example& e, const std::string& name) {
  std::ostringstream os;
  for (size_t i = 0; i < e.names.size(); ++i) os << (i ? ", " : "") << e.names[i];
  ACCEL_THROW(IndexError, "Example", "no field named '", name,
              "' (fields: ", e.names.empty() ? std::string("unnamed") : os.str(), ")");
}
}  // namespace

const Tensor& Example::operator[](const std::string& name) const {
  const int64_t i = index_of(name);
  if (i < 0) throw_no_field(*this, name);
  return fields[size_t(i)];
}

Tensor& Example::operator[](const std::string& name) {
  const int64_t i = index_of(name);
  if (i < 0) throw_no_field(*this, name);
  return fields[size_t(i)];
}

// ---- helpers ----

uint64_t mix_seed(uint64_t a, uint64_t b) {
  uint64_t z = a + 0x9e3779b97f4a7c15ULL * (b + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

Tensor empty_with_allocator(const Shape& shape, DType dtype, Allocator* alloc) {
  const size_t nbytes = checked_nbytes(shape, dtype_size(dtype), "empty");
  auto storage = make_intrusive<Storage>(nbytes, kCPU, alloc);
  return Tensor(
      make_intrusive<TensorImpl>(std::move(storage), shape, contiguous_strides(shape), 0, dtype));
}

namespace {

Shape batch_shape(int64_t n, const Shape& row) {
  Shape s;
  s.reserve(row.size() + 1);
  s.push_back(n);
  for (int64_t d : row) s.push_back(d);
  return s;
}

// Copies `src` (any layout/device) into row i of the contiguous CPU tensor `out`.
void copy_row(Tensor& out, int64_t i, const Tensor& src, size_t row_bytes) {
  if (src.is_contiguous() && src.device().is_cpu()) {
    std::memcpy(static_cast<char*>(out.data_ptr()) + size_t(i) * row_bytes, src.data_ptr(),
                row_bytes);
  } else {
    Tensor dst = out.select(0, i);
    dst.copy_(src);
  }
}

}  // namespace

Example collate_stack(const std::vector<Example>& examples, Allocator* alloc) {
  ACCEL_CHECK(!examples.empty(), ValueError, "collate", "cannot collate an empty batch");
  const Example& first = examples.front();
  const int64_t n = int64_t(examples.size());
  for (int64_t j = 1; j < n; ++j) {
    ACCEL_CHECK(examples[size_t(j)].size() == first.size(), ShapeError, "collate", "example ", j,
                " has ", examples[size_t(j)].size(), " fields, example 0 has ", first.size());
  }
  Example out;
  out.names = first.names;
  out.fields.reserve(first.size());
  for (size_t k = 0; k < first.size(); ++k) {
    const Tensor& f0 = first.fields[k];
    ACCEL_CHECK(f0.defined(), ValueError, "collate", "field ", k, " of example 0 is undefined");
    for (int64_t j = 1; j < n; ++j) {
      const Tensor& fj = examples[size_t(j)].fields[k];
      ACCEL_CHECK(fj.defined(), ValueError, "collate", "field ", k, " of example ", j,
                  " is undefined");
      ACCEL_CHECK(fj.sizes() == f0.sizes(), ShapeError, "collate", "field ", k, ": example ", j,
                  " has shape ", fj.sizes(), ", example 0 has ", f0.sizes());
      ACCEL_CHECK(fj.dtype() == f0.dtype(), DTypeError, "collate", "field ", k, ": example ", j,
                  " has dtype ", fj.dtype(), ", example 0 has ", f0.dtype());
    }
    Tensor b = empty_with_allocator(batch_shape(n, f0.sizes()), f0.dtype(), alloc);
    const size_t row_bytes = f0.nbytes();
    for (int64_t j = 0; j < n; ++j) copy_row(b, j, examples[size_t(j)].fields[k], row_bytes);
    out.fields.push_back(std::move(b));
  }
  return out;
}

// ---- TensorDataset ----

TensorDataset::TensorDataset(std::vector<Tensor> tensors, std::vector<std::string> names)
    : names_(std::move(names)) {
  ACCEL_CHECK(!tensors.empty(), ValueError, "TensorDataset", "needs at least one tensor");
  ACCEL_CHECK(names_.empty() || names_.size() == tensors.size(), ValueError, "TensorDataset",
              names_.size(), " names for ", tensors.size(), " tensors");
  for (size_t k = 0; k < tensors.size(); ++k) {
    const Tensor& t = tensors[k];
    ACCEL_CHECK(t.defined(), ValueError, "TensorDataset", "tensor ", k, " is undefined");
    ACCEL_CHECK(t.dim() >= 1, ShapeError, "TensorDataset", "tensor ", k,
                " is 0-dimensional; rows are indexed along dim 0");
    ACCEL_CHECK(t.size(0) == tensors[0].size(0), ShapeError, "TensorDataset", "tensor ", k,
                " has shape ", t.sizes(), " but tensor 0 has ", tensors[0].sizes(),
                ": all tensors need the same number of rows");
    // Own contiguous CPU copy of the layout (no copy when it already is): batches are memcpys.
    Tensor c = t.detach().cpu().contiguous();
    row_bytes_.push_back(c.size(0) ? c.nbytes() / size_t(c.size(0)) : 0);
    tensors_.push_back(std::move(c));
  }
  size_ = tensors_[0].size(0);
}

Example TensorDataset::get(int64_t index) const {
  ACCEL_CHECK(index >= 0 && index < size_, IndexError, "TensorDataset", "index ", index,
              " out of range for dataset of size ", size_);
  Example e;
  e.names = names_;
  e.fields.reserve(tensors_.size());
  for (const Tensor& t : tensors_) e.fields.push_back(t.select(0, index));
  return e;
}

bool TensorDataset::get_batch(std::span<const int64_t> indices, Allocator* alloc,
                              Example& out) const {
  const int64_t n = int64_t(indices.size());
  for (int64_t i : indices) {
    ACCEL_CHECK(i >= 0 && i < size_, IndexError, "TensorDataset", "index ", i,
                " out of range for dataset of size ", size_);
  }
  out.names = names_;
  out.fields.clear();
  out.fields.reserve(tensors_.size());
  for (size_t k = 0; k < tensors_.size(); ++k) {
    const Tensor& t = tensors_[k];
    Shape s = t.sizes();
    s[0] = n;
    Tensor b = empty_with_allocator(s, t.dtype(), alloc);
    const size_t rb = row_bytes_[k];
    const char* src = static_cast<const char*>(t.data_ptr());
    char* dst = static_cast<char*>(b.data_ptr());
    // Runs of consecutive indices (sequential sampling) become one memcpy each.
    for (int64_t j = 0; j < n;) {
      int64_t run = 1;
      while (j + run < n && indices[size_t(j + run)] == indices[size_t(j)] + run) ++run;
      std::memcpy(dst + size_t(j) * rb, src + size_t(indices[size_t(j)]) * rb, size_t(run) * rb);
      j += run;
    }
    out.fields.push_back(std::move(b));
  }
  return true;
}

// ---- MapDataset ----

MapDataset::MapDataset(DatasetPtr base, TransformFn fn)
    : base_(std::move(base)), fn_(std::move(fn)) {
  ACCEL_CHECK(base_ != nullptr, ValueError, "MapDataset", "base dataset is null");
  ACCEL_CHECK(bool(fn_), ValueError, "MapDataset", "transform is empty");
}

DatasetPtr map(DatasetPtr base, TransformFn fn) {
  return std::make_shared<MapDataset>(std::move(base), std::move(fn));
}

DatasetPtr map_field(DatasetPtr base, size_t field, std::function<Tensor(Tensor)> fn) {
  ACCEL_CHECK(bool(fn), ValueError, "map_field", "transform is empty");
  return map(std::move(base), [field, fn = std::move(fn)](Example e) {
    ACCEL_CHECK(field < e.size(), IndexError, "map_field", "field ", field,
                " out of range for an example with ", e.size(), " fields");
    e.fields[field] = fn(std::move(e.fields[field]));
    return e;
  });
}

// ---- Subset ----

Subset::Subset(DatasetPtr base, std::vector<int64_t> indices)
    : base_(std::move(base)), indices_(std::move(indices)) {
  ACCEL_CHECK(base_ != nullptr, ValueError, "Subset", "base dataset is null");
  const int64_t n = base_->size();
  for (size_t j = 0; j < indices_.size(); ++j) {
    ACCEL_CHECK(indices_[j] >= 0 && indices_[j] < n, IndexError, "Subset", "index ", indices_[j],
                " (position ", j, ") out of range for dataset of size ", n);
  }
}

Example Subset::get(int64_t index) const {
  ACCEL_CHECK(index >= 0 && index < size(), IndexError, "Subset", "index ", index,
              " out of range for subset of size ", size());
  return base_->get(indices_[size_t(index)]);
}

bool Subset::get_batch(std::span<const int64_t> indices, Allocator* alloc, Example& out) const {
  std::vector<int64_t> mapped(indices.size());
  for (size_t j = 0; j < indices.size(); ++j) {
    const int64_t i = indices[j];
    ACCEL_CHECK(i >= 0 && i < size(), IndexError, "Subset", "index ", i,
                " out of range for subset of size ", size());
    mapped[j] = indices_[size_t(i)];
  }
  return base_->get_batch(mapped, alloc, out);
}

// ---- ConcatDataset ----

ConcatDataset::ConcatDataset(std::vector<DatasetPtr> parts) : parts_(std::move(parts)) {
  int64_t total = 0;
  for (size_t k = 0; k < parts_.size(); ++k) {
    ACCEL_CHECK(parts_[k] != nullptr, ValueError, "ConcatDataset", "part ", k, " is null");
    total += parts_[k]->size();
    cum_.push_back(total);
  }
}

std::pair<size_t, int64_t> ConcatDataset::locate(int64_t index) const {
  ACCEL_CHECK(index >= 0 && index < size(), IndexError, "ConcatDataset", "index ", index,
              " out of range for dataset of size ", size());
  const size_t k = size_t(std::upper_bound(cum_.begin(), cum_.end(), index) - cum_.begin());
  return {k, index - (k ? cum_[k - 1] : 0)};
}

Example ConcatDataset::get(int64_t index) const {
  auto [k, local] = locate(index);
  return parts_[k]->get(local);
}

bool ConcatDataset::get_batch(std::span<const int64_t> indices, Allocator* alloc,
                              Example& out) const {
  if (indices.empty()) return false;
  const size_t k = locate(indices[0]).first;
  std::vector<int64_t> local(indices.size());
  for (size_t j = 0; j < indices.size(); ++j) {
    auto [kj, lj] = locate(indices[j]);
    if (kj != k) return false;  // spans parts: per-example path
    local[j] = lj;
  }
  return parts_[k]->get_batch(local, alloc, out);
}

std::vector<DatasetPtr> random_split(DatasetPtr base, const std::vector<int64_t>& lengths,
                                     uint64_t seed) {
  ACCEL_CHECK(base != nullptr, ValueError, "random_split", "base dataset is null");
  int64_t total = 0;
  for (int64_t l : lengths) {
    ACCEL_CHECK(l >= 0, ValueError, "random_split", "negative length ", l);
    total += l;
  }
  ACCEL_CHECK(total == base->size(), ValueError, "random_split", "lengths sum to ", total,
              " but the dataset has ", base->size(), " examples");
  std::vector<int64_t> perm(static_cast<size_t>(total));
  for (int64_t i = 0; i < total; ++i) perm[size_t(i)] = i;
  Generator g(seed);
  for (int64_t i = total - 1; i > 0; --i) {
    const int64_t j = int64_t(g.next_u64() % uint64_t(i + 1));
    std::swap(perm[size_t(i)], perm[size_t(j)]);
  }
  std::vector<DatasetPtr> out;
  int64_t at = 0;
  for (int64_t l : lengths) {
    out.push_back(std::make_shared<Subset>(
        base, std::vector<int64_t>(perm.begin() + at, perm.begin() + at + l)));
    at += l;
  }
  return out;
}

// Note [Deterministic sample randomness]
// Augmentations that draw random numbers must not depend on which worker thread fetched the
// example or on how many examples that thread fetched before: otherwise changing num_workers or
// resuming mid-epoch changes the data. The loader sets a thread-local (seed, epoch, index) before
// each fetch, and sample_generator() derives a fresh generator from exactly those three values.
namespace {
thread_local SampleContext t_sample;
}

const SampleContext& current_sample() { return t_sample; }
void set_current_sample(const SampleContext& c) { t_sample = c; }

Generator sample_generator() {
  return Generator(
      mix_seed(mix_seed(t_sample.seed, uint64_t(t_sample.epoch)), uint64_t(t_sample.index)));
}

}  // namespace accel::data
