// Shared oneDNN plumbing for the CPU kernels (linalg.cc, conv.cc, pool.cc). Private to
// kernels/cpu/: oneDNN types never leave this folder.
//
// Note [oneDNN primitive cache]: creating a primitive descriptor + primitive costs 10-100 us
// (oneDNN walks its implementation list and JIT-compiles), far more than a small matmul. Each
// kernel keeps a per-thread hash map from a PrimKey (dtype, shapes, strides, flags) to the
// primitive and pre-built memory objects without buffers. A call then costs one hash lookup,
// a data-handle swap per argument and dnnl_primitive_execute through the C API (the C++
// execute() builds an std::unordered_map of arguments on every call). Thread-local maps need no
// lock; each training thread builds its own primitives. When a map reaches kMaxCachedPrims it
// is cleared (shape churn is rare in training; a full clear keeps the code small).
#pragma once

#include <array>
#include <cstdint>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>

#include "core/dtype.h"
#include "kernels/cpu/threading.h"
#include "core/error.h"
#include "core/shape.h"

namespace accel::cpu::onednn {

// One engine per process; one stream per thread (streams are not thread-safe).
inline dnnl::engine& engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}
inline dnnl::stream& stream() {
  thread_local dnnl::stream s(engine());
  return s;
}

// oneDNN data type of an accel dtype, or undef when oneDNN has none (f64, i64, bool).
inline dnnl::memory::data_type to_dnnl(DType t) {
  switch (t) {
    case DType::Float32: return dnnl::memory::data_type::f32;
    case DType::BFloat16: return dnnl::memory::data_type::bf16;
    case DType::Float16: return dnnl::memory::data_type::f16;
    case DType::Int32: return dnnl::memory::data_type::s32;
    case DType::UInt8: return dnnl::memory::data_type::u8;
    default: return dnnl::memory::data_type::undef;
  }
}

inline void check_status(dnnl_status_t st, const char* op, const char* what) {
  ACCEL_CHECK(st == dnnl_success, Error, op, "oneDNN ", what, " failed with status ", int(st));
}

// A memory object without a buffer: the data handle is set right before each execute.
inline dnnl::memory unbound_memory(const dnnl::memory::desc& md) {
  return dnnl::memory(md, engine(), DNNL_MEMORY_NONE);
}
inline void bind(const dnnl::memory& m, const void* ptr, const char* op) {
  check_status(dnnl_memory_set_data_handle(m.get(), const_cast<void*>(ptr)), op, "set_data_handle");
}

inline dnnl::memory::dims dims_of(const Shape& s) { return dnnl::memory::dims(s.begin(), s.end()); }

// Primitive creation; false when oneDNN has no implementation (the caller converts to f32 or
// runs its own kernel).
template <typename F>
bool try_create(const char* op, F&& f) {
  try {
    f();
    return true;
  } catch (const dnnl::error& err) {
    if (err.status == dnnl_unimplemented) return false;
    ACCEL_THROW(Error, op, "oneDNN primitive creation failed: ", err.what());
  }
}

// Arguments of one execute, kept in the cache entry (no allocation per call).
template <int N>
struct ExecArgs {
  std::array<dnnl_exec_arg_t, N> args{};
  int count = 0;
  void add(int arg, const dnnl::memory& m) { args[size_t(count++)] = {arg, m.get()}; }
};

template <int N>
inline void execute(const dnnl::primitive& p, const ExecArgs<N>& a, const char* op) {
  before_team();  // Note [OpenMP wait default]: oneDNN may open the process's first team
  check_status(dnnl_primitive_execute(p.get(), stream().get(), a.count, a.args.data()), op,
               "execute");
  // CPU streams are in-order and synchronous for the OpenMP runtime; wait() is a no-op there but
  // keeps the contract explicit should the runtime change.
  check_status(dnnl_stream_wait(stream().get()), op, "stream wait");
}

// Cache key: a short list of int64 fields.
constexpr int kMaxKeyFields = 96;
struct PrimKey {
  std::array<int64_t, kMaxKeyFields> v;
  int n = 0;
  void push(int64_t x) { v[size_t(n++)] = x; }
  bool operator==(const PrimKey& o) const {
    if (n != o.n) return false;
    for (int i = 0; i < n; ++i)
      if (v[size_t(i)] != o.v[size_t(i)]) return false;
    return true;
  }
};
struct PrimKeyHash {
  size_t operator()(const PrimKey& k) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the fields
    for (int i = 0; i < k.n; ++i) {
      h ^= uint64_t(k.v[size_t(i)]);
      h *= 1099511628211ull;
    }
    return size_t(h);
  }
};

constexpr size_t kMaxCachedPrims = 512;

template <typename Entry>
class PrimCache {
 public:
  // The cached entry for `key`, built with make() on a miss.
  template <typename Make>
  Entry& get(const PrimKey& key, Make&& make) {
    auto it = map_.find(key);
    if (it != map_.end()) return it->second;
    if (map_.size() >= kMaxCachedPrims) map_.clear();
    return map_.emplace(key, make()).first->second;
  }
  size_t size() const { return map_.size(); }

 private:
  std::unordered_map<PrimKey, Entry, PrimKeyHash> map_;
};

}  // namespace accel::cpu::onednn
