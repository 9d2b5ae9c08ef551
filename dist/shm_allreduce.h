// All-reduce through a shared-memory segment, for the ranks of a group that share one host
// (the common case of `accel-run launch --num-processes N` and of the ddp-mlp workload).
// Loopback TCP costs two kernel copies per byte and direction plus Gloo's per-segment
// rendezvous; here each rank writes its chunk once into its slot, reduces its 1/N of the chunk
// across all slots, and copies the reduced chunk back: memory bandwidth only, no syscalls on the
// way. See Note [shm all-reduce] in the .cc. Used by the Gloo backend when every rank could map
// the segment; otherwise Gloo's TCP ring runs as before.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dist/reduce_kernels.h"
#include "dist/store.h"

namespace accel::dist {

class ShmAllReduce {
 public:
  // Collective over the group's store. Returns null on every rank unless every rank mapped the
  // same segment (ranks on different hosts, /dev/shm missing or full, ...): callers fall back.
  static std::unique_ptr<ShmAllReduce> create(const std::shared_ptr<Store>& store, int rank,
                                              int size, size_t slot_bytes, Milliseconds timeout);
  ~ShmAllReduce();
  ShmAllReduce(const ShmAllReduce&) = delete;
  ShmAllReduce& operator=(const ShmAllReduce&) = delete;

  // In place: data[0, n) = fn-reduction over ranks. Throws PeerError when a rank does not
  // arrive within `timeout` or has died.
  void all_reduce(void* data, size_t n, size_t elem_size, ReduceFn fn, Milliseconds timeout);

  size_t slot_bytes() const { return slot_bytes_; }

  // Thread-safe: makes the all-reduce running now (and every later one) on this rank throw
  // PeerError(reason) within about a millisecond. Called when the group learns from elsewhere
  // (heartbeat, control plane) that a peer is gone, so a waiter does not sit out its timeout.
  void abort(const std::string& reason);

 private:
  ShmAllReduce() = default;
  struct Header;
  void barrier(Milliseconds timeout, const char* phase);

  int rank_ = 0, size_ = 1;
  size_t slot_bytes_ = 0;
  size_t map_bytes_ = 0;
  void* map_ = nullptr;
  Header* header_ = nullptr;
  char* slots_ = nullptr;
  uint64_t generation_ = 0;
  std::vector<int> pids_;
  std::atomic<bool> aborted_{false};
  std::mutex abort_mu_;
  std::string abort_reason_;
};

}  // namespace accel::dist
