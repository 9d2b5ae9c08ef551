// Thread-local autocast state and weight cache; see autograd/autocast.h, Note [autocast on CPU]
// and Note [autocast weight cache].
#include "autograd/autocast.h"

#include "kernels/stubs/linalg.h"

#include <unordered_map>

namespace accel {

namespace detail {
// initial-exec TLS like grad mode: the ops read it on every call.
constinit thread_local AutocastState tls_autocast __attribute__((tls_model("initial-exec")));
}  // namespace detail

namespace {
using detail::tls_autocast;

struct CacheEntry {
  Tensor source;  // keeps the key alive (and its address unique) while cached
  // The storage the copy was made from, held so that a storage swapped in later (ZeRO-3
  // gathers, load_state_dict) can never reuse its address with the same version.
  StoragePtr storage;
  uint32_t version;
  bool with_grad;
  Tensor low;
  DType low_dtype = kBFloat16;  // the 16-bit dtype `low` holds (images: the one it is rounded to)
};

struct WeightCache {
  std::unordered_map<const TensorImpl*, CacheEntry> entries;
  std::unordered_map<const TensorImpl*, CacheEntry> images;    // float32 images (with_grad unused)
  std::unordered_map<const TensorImpl*, CacheEntry> detached;  // 16-bit, no history (ditto)
  int guard_depth = 0;  // AutocastGuards alive on this thread
  int64_t conversions = 0, hits = 0;
};

WeightCache& weight_cache() {
  thread_local WeightCache cache;
  return cache;
}

// x (float32 or the other 16-bit dtype) converted to `low`, from the cache when x is a parameter
// (Note [autocast weight cache]).
Tensor cached_cast(const Tensor& x, DType low) {
  WeightCache& c = weight_cache();
  const bool cacheable = c.guard_depth > 0 && x.is_leaf() && x.requires_grad();
  if (!cacheable) {
    ++c.conversions;
    return x.to(low);
  }
  const bool with_grad = grad_enabled();
  const Storage* st = x.storage().get();
  auto it = c.entries.find(x.impl());
  if (it != c.entries.end()) {
    CacheEntry& e = it->second;
    if (e.storage.get() == st && e.version == st->version() && e.with_grad == with_grad &&
        e.low.dtype() == low) {
      ++c.hits;
      return e.low;
    }
  }
  ++c.conversions;
  Tensor out = x.to(low);
  c.entries[x.impl()] = CacheEntry{x, x.storage(), st->version(), with_grad, out, low};
  return out;
}

void check_low_precision(DType dtype) {
  ACCEL_CHECK(dtype == kBFloat16 || dtype == kFloat16, DTypeError, "autocast",
              "autocast dtype must be bfloat16 or float16, got ", dtype);
}
}  // namespace

void set_autocast_enabled(bool enabled) { tls_autocast.enabled = enabled; }
void set_autocast_dtype(DType dtype) {
  check_low_precision(dtype);
  tls_autocast.dtype = dtype;
}

AutocastGuard::AutocastGuard(bool enabled, DType dtype)
    : prev_enabled_(tls_autocast.enabled), prev_dtype_(tls_autocast.dtype) {
  check_low_precision(dtype);
  tls_autocast.enabled = enabled;
  tls_autocast.dtype = dtype;
  ++weight_cache().guard_depth;
}

AutocastGuard::~AutocastGuard() {
  tls_autocast.enabled = prev_enabled_;
  tls_autocast.dtype = prev_dtype_;
  WeightCache& c = weight_cache();
  if (--c.guard_depth == 0) {
    c.entries.clear();
    c.images.clear();
    c.detached.clear();
  }
}

AutocastCacheStats autocast_cache_stats() {
  const WeightCache& c = weight_cache();
  return {c.conversions, c.hits, int64_t(c.entries.size() + c.images.size() + c.detached.size())};
}

void clear_autocast_cache() {
  weight_cache().entries.clear();
  weight_cache().images.clear();
  weight_cache().detached.clear();
}

Tensor autocast_cast_detached(const Tensor& x, DType low) {
  check_low_precision(low);
  if (x.dtype() == low) return x.detach();
  WeightCache& c = weight_cache();
  if (!(c.guard_depth > 0 && x.is_leaf() && x.requires_grad())) {
    ++c.conversions;
    return x.detach().to(low);
  }
  const Storage* st = x.storage().get();
  auto it = c.detached.find(x.impl());
  if (it != c.detached.end()) {
    const CacheEntry& e = it->second;
    if (e.storage.get() == st && e.version == st->version() && e.low_dtype == low) {
      ++c.hits;
      return e.low;
    }
  }
  ++c.conversions;
  Tensor out = x.detach().to(low);
  c.detached[x.impl()] = CacheEntry{x, x.storage(), st->version(), false, out, low};
  return out;
}

Tensor autocast_weight_image(const Tensor& x, DType low, bool* exact) {
  check_low_precision(low);
  ACCEL_CHECK(x.dtype() == kFloat32, DTypeError, "autocast",
              "autocast_weight_image expects float32, got ", x.dtype(), " of shape ",
              x.shape_str());
  WeightCache& c = weight_cache();
  *exact = c.guard_depth > 0 && x.is_leaf() && x.requires_grad();
  if (!*exact) return x.detach();
  const Storage* st = x.storage().get();
  auto it = c.images.find(x.impl());
  if (it != c.images.end()) {
    const CacheEntry& e = it->second;
    // An image rounded to one 16-bit dtype is never handed out for the other.
    if (e.storage.get() == st && e.version == st->version() && e.low_dtype == low) {
      ++c.hits;
      return e.low;
    }
  }
  ++c.conversions;
  Tensor image = empty(x.sizes(), TensorOptions(kFloat32, x.device()));
  round_to_lowp_stub(x.device(), x.detach(), image, low);
  c.images[x.impl()] = CacheEntry{x, x.storage(), st->version(), false, image, low};
  return image;
}

Tensor round_to_precision(const Tensor& x, DType dtype) {
  check_low_precision(dtype);
  ACCEL_CHECK(x.dtype() == kFloat32, DTypeError, "autocast",
              "round_to_precision expects float32, got ", x.dtype(), " of shape ", x.shape_str());
  return x.to(dtype).to(kFloat32);
}

Tensor autocast_cast(const Tensor& x) {
  if (!tls_autocast.enabled || !x.defined()) return x;
  const DType dt = x.dtype();
  if (dt != kFloat32 && dt != kBFloat16 && dt != kFloat16) return x;  // f64, integers, bool
  const DType low = tls_autocast.dtype;
  // CPU and CUDA alike (Note [autocast on CPU]).
  return dt == low ? x : cached_cast(x, low);
}

Tensor autocast_upcast(const Tensor& x) {
  if (!tls_autocast.enabled || !x.defined()) return x;
  if (x.dtype() == kBFloat16 || x.dtype() == kFloat16) return x.to(kFloat32);
  return x;
}

}  // namespace accel
