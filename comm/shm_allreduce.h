// All-reduce through a shared-memory segment, for the ranks of a group that share one host
// (the common case of `accel-run launch --num-processes N` and of the ddp-mlp workload).
// Loopback TCP costs two kernel copies per byte and direction plus Gloo's per-segment
// rendezvous; here each rank writes its chunk once into its slot, reduces its 1/N of the chunk
// across all slots, and copies the reduced chunk back: memory bandwidth only, no syscalls on the
// way. See Note [shm all-reduce] in the .cc; all-gather and reduce-scatter use the same slots
// (Note [shm all-gather and reduce-scatter]). Used by the Gloo backend when every rank could map
// the segment; otherwise Gloo's TCP ring runs as before.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/reduce_kernels.h"
#include "comm/store.h"

namespace accel::dist {

class ShmAllReduce {
 public:
  // Collective over the group's store. Returns null on every rank unless every rank has the
  // same host key (host_key()) and mapped the same segment (ranks on different hosts or network
  // namespaces, /dev/shm missing or full, ...): callers fall back. Rank 0 sweeps stale segments
  // first (sweep_stale_segments) and unlinks its segment before returning or throwing.
  static std::unique_ptr<ShmAllReduce> create(const std::shared_ptr<Store>& store, int rank,
                                              int size, size_t slot_bytes, Milliseconds timeout);
  ~ShmAllReduce();
  ShmAllReduce(const ShmAllReduce&) = delete;
  ShmAllReduce& operator=(const ShmAllReduce&) = delete;

  // What a rank publishes with its arrival: the group's collective fingerprint (opaque here).
  static constexpr size_t kStampBytes = 32;
  // Called with every rank's stamp (rank order, kStampBytes each) once all have arrived and
  // before any data moves; it throws to stop the collective (Note [shm stamps]).
  using StampCheck = std::function<void(const void* stamps)>;

  // In place: data[0, n) = fn-reduction over ranks. Throws PeerError when a rank does not
  // arrive within `timeout` or has died. With `stamp`, the first arrival carries it, and
  // `check` (when given) sees all ranks' stamps before anything is reduced.
  void all_reduce(void* data, size_t n, size_t elem_size, ReduceFn fn, Milliseconds timeout,
                  const void* stamp = nullptr, const StampCheck* check = nullptr);
  // All-gather: out[q n, (q + 1) n) = rank q's in[0, n) (elements of elem_size bytes). `in` may
  // be this rank's own part of `out` (in place). Stamps and errors as all_reduce. Note [shm
  // all-gather and reduce-scatter].
  void all_gather(const void* in, void* out, size_t n, size_t elem_size, Milliseconds timeout,
                  const void* stamp = nullptr, const StampCheck* check = nullptr);
  // Reduce-scatter: out[0, k) = fn-reduction over ranks of their in[rank k, (rank + 1) k), in
  // rank order (the same bits as all_reduce gives for that range). `out` must not overlap `in`.
  void reduce_scatter(const void* in, void* out, size_t k, size_t elem_size, ReduceFn fn,
                      Milliseconds timeout, const void* stamp = nullptr,
                      const StampCheck* check = nullptr);
  // One arrival that carries `stamp`: an all-gather of kStampBytes per rank into `out` (rank
  // order), and a barrier. Throws PeerError like all_reduce, and when a peer's arrival is not
  // this one (the ranks' collective sequences diverged).
  void exchange(const void* stamp, void* out, Milliseconds timeout);

  size_t slot_bytes() const { return slot_bytes_; }

  // A subgroup's ranks in messages: "world rank <w> (rank <q> of group <name>)", as the heartbeat
  // path names them (comm/gloo: ProcessGroupGloo::on_peer_lost). Without it: "rank <q>" (the
  // world group, where both are the same). Call before the first collective.
  void label_ranks(const std::vector<int>& world_ranks, const std::string& group);

  // Thread-safe: makes the all-reduce running now (and every later one) on this rank throw
  // PeerError(reason) within about a millisecond. Called when the group learns from elsewhere
  // (heartbeat, control plane) that a peer is gone, so a waiter does not sit out its timeout.
  // Also published through the segment: peers waiting in (or later entering) an all-reduce
  // throw PeerError("rank <this> aborted ...: reason") as soon as they next check (~1 ms).
  void abort(const std::string& reason);

  // Whether all ranks of a group are on one host: "<boot_id>/<netns inode>/<hostname>". Env
  // ACCEL_SHM_HOST_KEY replaces it (tests and exotic setups; see docs/dist.md).
  static std::string host_key();
  // Unlinks /dev/shm/accel-<pidns>-<pid>-<nonce> segments of this pid namespace whose creating
  // process is gone (a rank 0 killed inside create()). Segments of other pid namespaces (other
  // containers sharing /dev/shm) are never touched: their pids mean nothing here. Returns how
  // many were removed. `dir` is for tests.
  static int sweep_stale_segments(const std::string& dir = "/dev/shm");
  // The pid namespace identity used in segment names (the inode of /proc/self/ns/pid, hex).
  static std::string pid_namespace_id();

 private:
  ShmAllReduce() = default;
  struct Header;
  struct AbortBlock;
  // Arrives (publishing `stamp` when given) and waits for every rank's arrival.
  void barrier(Milliseconds timeout, const char* phase, const void* stamp = nullptr);
  // Every rank's stamp of the arrival just completed, into out (rank order).
  void read_stamps(void* out, const void* mine);
  // A chunk's arrival: a barrier. The first chunk of a collective passes its `stamp`: the
  // barrier carries it and `check` (when given) runs over every rank's stamp before any rank
  // reads another's slot; later chunks pass a null stamp (and `check` is not run).
  void arrive(Milliseconds timeout, const char* phase, const void* stamp, const StampCheck* check);
  void check_entry();  // an aborted group fails at once instead of at its next wait
  // Throws PeerError when this rank or a peer aborted, or a peer process has exited.
  void check_peers(const char* phase);
  [[noreturn]] void fail(const std::string& msg);  // publishes, then throws PeerError(msg)
  void publish_abort(const std::string& reason);
  int dead_peer() const;         // a peer rank whose process has exited (zombie or reaped), or -1
  std::string who(int q) const;  // rank q as messages name it (label_ranks)

  int rank_ = 0, size_ = 1;
  size_t slot_bytes_ = 0;
  size_t map_bytes_ = 0;
  void* map_ = nullptr;
  Header* header_ = nullptr;
  char* slots_ = nullptr;
  uint64_t generation_ = 0;
  int spin_limit_ = 0;  // pauses before a barrier yields (Note [shm spinning])
  AbortBlock* abort_block_ = nullptr;
  std::vector<int> pids_;    // per rank, empty unless all ranks share our pid namespace
  std::vector<int> pidfds_;  // per rank, -1 for this rank or where pidfd_open is unavailable
  std::vector<std::string> labels_;  // per rank (label_ranks), empty for "rank <q>"
  std::atomic<bool> aborted_{false};
  std::mutex abort_mu_;
  std::string abort_reason_;
};

}  // namespace accel::dist
