// CUDA caching device allocator, pinned host allocator, and host<->device copies.
#include <algorithm>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/dispatch.h"
#include "kernels/cuda/device.h"

namespace accel::cuda {
namespace {

// Note [CUDA caching allocator]
// cudaMalloc/cudaFree synchronise the device and cost tens of microseconds, so no op may call
// them in steady state. Requests are rounded to a size class (512-byte granules up to 4 KiB,
// then four steps per power of two: at most 25% slack) and a freed block goes to a free list
// keyed by (stream, class) of its device. A block is reused only by allocations on the stream it
// was allocated on: work on one stream runs in order, so a kernel queued after the free cannot
// overtake the kernels that still read the old contents. A block also used on other streams
// (record_stream) waits for events on those streams before it returns to a free list. When
// cudaMalloc fails, the cached blocks of the device are released and the call retried once.
constexpr int kMaxDevices = 64;
constexpr size_t kGranule = 512;
constexpr size_t kSmallMax = 4096;

size_t round_size(size_t n, int* cls) {
  if (n <= kSmallMax) {
    const size_t g = std::max<size_t>((n + kGranule - 1) / kGranule, 1);
    *cls = int(g) - 1;  // 0..7
    return g * kGranule;
  }
  const int p = 63 - __builtin_clzll(n - 1);  // 2^p < n <= 2^(p+1)
  const size_t base = size_t(1) << p;
  const size_t step = base / 4;
  const size_t k = (n - base + step - 1) / step;  // 1..4
  *cls = 8 + (p - 12) * 4 + int(k) - 1;
  return base + k * step;
}

struct Block {
  size_t size = 0;  // rounded
  int cls = 0;
  int device = 0;
  cudaStream_t stream = nullptr;
  std::vector<Stream> used_on;  // other streams (record_stream)
};

struct PendingFree {
  void* ptr;
  std::vector<cudaEvent_t> events;
};

struct DeviceStats {
  size_t in_use = 0, reserved = 0, allocs = 0, hits = 0, peak = 0;
  void note_peak() { peak = std::max(peak, in_use); }
};

class CudaCachingAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes, Device device) override {
    const int dev = device.index;
    DeviceGuard guard(dev);  // cudaMalloc and the current stream are per device
    const cudaStream_t stream = current_stream(dev).handle();
    int cls = 0;
    const size_t size = round_size(nbytes, &cls);
    std::lock_guard<std::mutex> lk(mu_);
    if (!pending_.empty()) process_pending();
    DeviceStats& st = stats_[dev];
    auto it = free_[dev].find({stream, cls});
    if (it != free_[dev].end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      st.in_use += size;
      st.note_peak();
      ++st.hits;
      Block& b = live_[p];
      b = Block{size, cls, dev, stream, {}};
      return p;
    }
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, size);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      release_cached(dev);
      e = cudaMalloc(&p, size);
    }
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      ACCEL_THROW(Error, "allocate", "CUDA out of memory allocating ", nbytes,
                  " bytes on cuda:", dev, " (", cudaGetErrorString(e), "; ", st.in_use,
                  " bytes in use, ", st.reserved, " reserved by accel)");
    }
    st.in_use += size;
    st.reserved += size;
    st.note_peak();
    ++st.allocs;
    live_[p] = Block{size, cls, dev, stream, {}};
    return p;
  }

  void deallocate(void* p, size_t) override {
    if (!p) return;
    std::lock_guard<std::mutex> lk(mu_);
    auto it = live_.find(p);
    if (it == live_.end()) return;  // not ours: nothing sane to do in a destructor
    Block& b = it->second;
    stats_[b.device].in_use -= b.size;
    if (b.used_on.empty()) {
      free_[b.device][{b.stream, b.cls}].push_back(p);
      return;
    }
    // Reuse only after the other streams are past their uses (Note [CUDA caching allocator]).
    PendingFree pf{p, {}};
    for (const Stream& s : b.used_on) {
      cudaEvent_t ev = nullptr;
      if (cudaSetDevice(s.device()) == cudaSuccess &&
          cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) == cudaSuccess &&
          cudaEventRecord(ev, s.handle()) == cudaSuccess) {
        pf.events.push_back(ev);
      }
    }
    (void)cudaSetDevice(current_device());
    b.used_on.clear();
    pending_.push_back(std::move(pf));
  }

  AllocatorStats stats() const override { return stats_for(-1); }

  AllocatorStats stats_for(int device) const {
    std::lock_guard<std::mutex> lk(mu_);
    AllocatorStats s;
    for (int d = 0; d < kMaxDevices; ++d) {
      if (device >= 0 && d != device) continue;
      s.bytes_in_use += stats_[d].in_use;
      s.bytes_reserved += stats_[d].reserved;
      s.alloc_count += stats_[d].allocs;
      s.cache_hits += stats_[d].hits;
      s.peak_bytes_in_use += stats_[d].peak;
    }
    return s;
  }

  void empty_cache() override {
    std::lock_guard<std::mutex> lk(mu_);
    for (int d = 0; d < kMaxDevices; ++d) release_cached(d);
  }

  void reset_peak_stats() override {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& st : stats_) st.peak = st.in_use;
  }

  void record_stream(void* base, const Stream& s) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = live_.find(base);
    ACCEL_CHECK(it != live_.end(), ValueError, "record_stream",
                "tensor memory was not allocated by the CUDA caching allocator");
    Block& b = it->second;
    if (s.handle() == b.stream && s.device() == b.device) return;
    for (const Stream& u : b.used_on)
      if (u == s) return;
    b.used_on.push_back(s);
  }

 private:
  // Caller holds mu_.
  void process_pending() {
    for (size_t i = 0; i < pending_.size();) {
      bool done = true;
      for (cudaEvent_t ev : pending_[i].events) {
        const cudaError_t e = cudaEventQuery(ev);
        if (e == cudaErrorNotReady) {
          (void)cudaGetLastError();
          done = false;
          break;
        }
      }
      if (!done) {
        ++i;
        continue;
      }
      for (cudaEvent_t ev : pending_[i].events) (void)cudaEventDestroy(ev);
      const Block& b = live_.at(pending_[i].ptr);
      free_[b.device][{b.stream, b.cls}].push_back(pending_[i].ptr);
      pending_[i] = std::move(pending_.back());
      pending_.pop_back();
    }
  }

  // Caller holds mu_. cudaFree synchronises the device, so no kernel still uses these blocks.
  void release_cached(int dev) {
    if (free_[dev].empty()) return;
    const int cur = current_device();
    if (dev != cur) (void)cudaSetDevice(dev);
    for (auto& [key, blocks] : free_[dev]) {
      for (void* p : blocks) {
        auto it = live_.find(p);
        stats_[dev].reserved -= it->second.size;
        live_.erase(it);
        (void)cudaFree(p);
      }
    }
    free_[dev].clear();
    if (dev != cur) (void)cudaSetDevice(cur);
  }

  using FreeKey = std::pair<cudaStream_t, int>;
  mutable std::mutex mu_;
  std::unordered_map<void*, Block> live_;  // every block we own, in use or cached
  std::map<FreeKey, std::vector<void*>> free_[kMaxDevices];
  std::vector<PendingFree> pending_;
  DeviceStats stats_[kMaxDevices];
};

// Pinned host memory: cudaHostAlloc is slower still (it maps pages for the GPU), so the same
// size-class caching applies. A freed pinned block may still be the source or target of an async
// copy; it is reused only after an event recorded at free time on the current stream completes.
class PinnedAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes, Device) override {
    int cls = 0;
    const size_t size = round_size(nbytes, &cls);
    std::lock_guard<std::mutex> lk(mu_);
    auto& list = free_[cls];
    for (size_t i = 0; i < list.size(); ++i) {
      if (event_done(list[i].second)) {
        void* p = list[i].first;
        if (list[i].second) (void)cudaEventDestroy(list[i].second);
        list[i] = list.back();
        list.pop_back();
        stats_.bytes_in_use += size;
        ++stats_.cache_hits;
        return p;
      }
    }
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, size, cudaHostAllocPortable);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      ACCEL_THROW(Error, "allocate", "pinned host allocation of ", nbytes,
                  " bytes failed: ", cudaGetErrorString(e));
    }
    live_[p] = cls;
    stats_.bytes_in_use += size;
    stats_.bytes_reserved += size;
    ++stats_.alloc_count;
    return p;
  }

  void deallocate(void* p, size_t) override {
    if (!p || !owns(p)) return;
    cudaEvent_t ev = nullptr;
    if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) == cudaSuccess) {
      if (cudaEventRecord(ev, current_stream().handle()) != cudaSuccess) {
        (void)cudaEventDestroy(ev);
        ev = nullptr;
        (void)cudaDeviceSynchronize();  // no event: make sure no copy still uses the block
      }
    }
    std::lock_guard<std::mutex> lk(mu_);
    const int cls = live_.at(p);
    stats_.bytes_in_use -= class_size(cls);
    free_[cls].emplace_back(p, ev);
  }

  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return stats_;
  }

  void empty_cache() override {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& [cls, list] : free_) {
      for (auto& [p, ev] : list) {
        if (ev) {
          (void)cudaEventSynchronize(ev);
          (void)cudaEventDestroy(ev);
        }
        (void)cudaFreeHost(p);
        live_.erase(p);
        stats_.bytes_reserved -= class_size(cls);
      }
      list.clear();
    }
  }

  bool owns(const void* p) const {
    std::lock_guard<std::mutex> lk(mu_);
    return live_.count(const_cast<void*>(p)) != 0;
  }

 private:
  static bool event_done(cudaEvent_t ev) {
    if (!ev) return true;
    const cudaError_t e = cudaEventQuery(ev);
    if (e == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    return true;
  }
  static size_t class_size(int cls) {
    if (cls < 8) return size_t(cls + 1) * kGranule;
    const int p = (cls - 8) / 4 + 12;
    const size_t k = size_t((cls - 8) % 4 + 1);
    const size_t base = size_t(1) << p;
    return base + k * (base / 4);
  }

  mutable std::mutex mu_;
  std::unordered_map<void*, int> live_;
  std::map<int, std::vector<std::pair<void*, cudaEvent_t>>> free_;
  AllocatorStats stats_;
};

// Never destroyed: storages freed during static destruction still find them.
CudaCachingAllocator& device_allocator() {
  static auto* a = new CudaCachingAllocator();
  return *a;
}
PinnedAllocator& pinned_allocator() {
  static auto* a = new PinnedAllocator();
  return *a;
}

// ---------------- host <-> device copies ----------------

// dst and src contiguous, same dtype and numel, on different devices (one of them CUDA).
void cross_device_copy(Tensor& dst, const Tensor& src, bool non_blocking) {
  ACCEL_CHECK(dst.dtype() == src.dtype() && dst.numel() == src.numel() && dst.is_contiguous() &&
                  src.is_contiguous(),
              ValueError, "copy_",
              "cross-device copy needs contiguous tensors of one dtype and size, got ", src.dtype(),
              " ", src.sizes(), " on ", src.device(), " -> ", dst.dtype(), " ", dst.sizes(), " on ",
              dst.device());
  const size_t bytes = dst.nbytes();
  if (bytes == 0) return;
  const Device dd = dst.device(), sd = src.device();
  if (dd.is_cuda()) check_device(dd, "copy_");
  if (sd.is_cuda()) check_device(sd, "copy_");
  const int dev = dd.is_cuda() ? dd.index : sd.index;
  DeviceGuard g(dev);
  const Stream stream = current_stream(dev);
  cudaStream_t s = stream.handle();
  if (dd.is_cuda() && sd.is_cpu()) {
    ACCEL_CUDA_CHECK(
        cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), bytes, cudaMemcpyHostToDevice, s));
    // From pageable memory the call returns once the bytes are staged, so `src` may be reused;
    // from pinned memory the DMA reads `src` later, so a blocking copy has to wait.
    if (!non_blocking && is_pinned(src.storage()->data()))
      ACCEL_CUDA_CHECK(cudaStreamSynchronize(s));
  } else if (dd.is_cpu() && sd.is_cuda()) {
    ACCEL_CUDA_CHECK(
        cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), bytes, cudaMemcpyDeviceToHost, s));
    // Into pinned memory with non_blocking the caller synchronises before reading `dst`.
    if (!non_blocking || !is_pinned(dst.storage()->data()))
      ACCEL_CUDA_CHECK(cudaStreamSynchronize(s));
  } else {
    // Between two GPUs: the copy runs on the destination's stream, after the work queued so far on
    // the source device's current stream (which may still be producing `src`).
    Event produced;
    produced.record(current_stream(sd.index));
    produced.block(stream);
    ACCEL_CUDA_CHECK(
        cudaMemcpyPeerAsync(dst.data_ptr(), dd.index, src.data_ptr(), sd.index, bytes, s));
    record_stream(src, stream);
    if (!non_blocking) ACCEL_CUDA_CHECK(cudaStreamSynchronize(s));
  }
}

// Registers the allocators only when a device exists, so that without one the core's own
// DeviceError ("no allocator for device cuda:0 ...") is what a CUDA tensor request gets.
const bool g_registered [[maybe_unused]] = [] {
  if (device_count() > 0) {
    set_allocator(DeviceType::CUDA, &device_allocator());
    set_pinned_allocator(&pinned_allocator());
  }
  return true;
}();

}  // namespace

AllocatorStats memory_stats(int device) { return device_allocator().stats_for(device); }

void empty_cache() {
  if (!is_available()) return;
  device_allocator().empty_cache();
  pinned_allocator().empty_cache();
}

void record_stream(const Tensor& t, const Stream& s) {
  ACCEL_CHECK(t.defined() && t.device().is_cuda(), DeviceError, "record_stream",
              "expected a CUDA tensor");
  device_allocator().record_stream(t.storage()->data(), s);
}

bool is_pinned(const void* p) { return is_available() && pinned_allocator().owns(p); }

Tensor empty_pinned(const Shape& shape, DType dtype) {
  ACCEL_CHECK(is_available(), DeviceError, "empty_pinned", "pinned memory needs a CUDA device (",
              unavailable_reason(), ")");
  int64_t n = 1;
  for (int64_t s : shape) {
    ACCEL_CHECK(s >= 0, ShapeError, "empty_pinned", "negative dimension in shape ", shape);
    n *= s;
  }
  auto storage = make_intrusive<Storage>(size_t(n) * dtype_size(dtype), kCPU, &pinned_allocator());
  return Tensor(
      make_intrusive<TensorImpl>(std::move(storage), shape, contiguous_strides(shape), 0, dtype));
}

}  // namespace accel::cuda

namespace accel {
ACCEL_REGISTER_KERNEL(cross_device_copy_stub, CUDA, &cuda::cross_device_copy);
}
