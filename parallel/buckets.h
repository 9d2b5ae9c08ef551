// Gradient buckets shared by DDP and ZeRO: parameters grouped in reverse order into flat
// buffers of about `cap_bytes`; as soon as every gradient of a bucket has been accumulated during
// backward (Tensor::register_post_accumulate_grad_hook), the bucket is copied into its flat
// buffer (pre-scaled by 1/world, so a sum gives the average) and its collective is issued
// asynchronously, overlapping the rest of backward. See Note [bucket order] and Note [sync at
// the end of backward].
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "comm/process_group.h"

namespace accel::dist {

using NamedParams = std::vector<std::pair<std::string, Tensor>>;

constexpr size_t kDefaultBucketCapBytes = size_t(25) << 20;

enum class GradReduction {
  AllReduce,      // every rank gets the whole averaged bucket (DDP, ZeRO-1)
  ReduceScatter,  // rank r gets the averaged slice r of every bucket (ZeRO-2/3)
};

struct Bucket {
  std::vector<size_t> params;   // indices into the parameter list, in bucket order
  std::vector<int64_t> offset;  // element offset of each param in the flat buffer
  int64_t used = 0;             // elements holding parameters
  int64_t numel = 0;            // padded to a multiple of the world size
  int64_t shard_numel = 0;      // numel / world: rank r owns [r * shard_numel, (r+1) * shard_numel)
  DType dtype = kFloat32;
  Device device = kCPU;
};

// Per-backward statistics, for the overlap figure of docs/dist.md.
struct SyncStats {
  int buckets = 0;
  int64_t bytes = 0;          // bytes reduced
  double comm_seconds = 0;    // sum over buckets of collective start..end
  double hidden_seconds = 0;  // part of it before backward ended
  double wait_seconds = 0;    // time finish() blocked after backward ended
  double hidden_fraction() const { return comm_seconds > 0 ? hidden_seconds / comm_seconds : 0; }
};

class GradBucketer {
 public:
  // Parameters must be floating leaves that require grad, all distinct.
  // `group_of` (empty, or one entry per parameter): a bucket never holds parameters of two
  // groups (ZeRO's optimizer param groups).
  GradBucketer(NamedParams params, ProcessGroupPtr pg, size_t cap_bytes, GradReduction mode,
               bool find_unused_parameters, const char* owner, std::vector<size_t> group_of = {});
  ~GradBucketer();
  GradBucketer(const GradBucketer&) = delete;
  GradBucketer& operator=(const GradBucketer&) = delete;

  // With sync off, hooks do nothing and gradients accumulate locally in .grad (no_sync).
  void set_sync(bool on);
  bool sync() const;

  // Ends a synced backward: issues the buckets whose gradients never came (zero-filled, so
  // every rank issues the same collectives), waits for all of them in order, then
  // - AllReduce: points each parameter's .grad at its averaged slice of the bucket buffer;
  // - ReduceScatter: leaves the averaged slices in shard(b); parameters' .grad stay undefined.
  // Throws DistError naming parameters that got no gradient unless find_unused_parameters.
  // Afterwards the bucketer is ready for the next backward.
  void finish();
  // True between the first gradient of a synced backward and finish().
  bool in_backward() const;

  // Note [sync at the end of backward] (buckets.cc). `begin` runs at the first gradient of every
  // backward (synced or not) before anything is staged, and may throw to stop it; `end` runs
  // from an end-of-backward callback of the engine after a synced backward that gave this
  // bucketer gradients and was not finished yet, also when the backward threw (the started
  // buckets must be waited for); it must call finish(). Either may be empty.
  void set_backward_hooks(std::function<void()> begin, std::function<void()> end);
  // Whether the last synced backward was finished by `end` (and no gradient arrived since):
  // the owner's explicit finish is then a no-op. forget_backward_end() clears it (a new forward).
  bool finished_at_backward_end() const;
  void forget_backward_end();
  // Number of synced finish() calls so far: ddp.backward(loss) tells whether its backward was
  // finished by `end` or needs finish() (a rank whose loss reached no parameter got no hook).
  uint64_t finish_count() const;

  const std::vector<Bucket>& buckets() const;
  // Full flat buffer of bucket b (AllReduce: persistent; ReduceScatter: only during a backward).
  Tensor buffer(size_t b) const;
  // ReduceScatter: this rank's averaged slice of bucket b (shard_numel elements, persistent).
  Tensor shard(size_t b) const;
  const NamedParams& params() const;
  const SyncStats& last_stats() const;
  // Releases the ReduceScatter staging buffers between steps (they are re-created on demand).
  void release_staging();
  int64_t staging_bytes() const;

  struct State;

 private:
  std::shared_ptr<State> state_;  // hooks hold a weak_ptr: they outlive this object harmlessly
};

// Assigns parameters to buckets: reverse order, consecutive parameters of one dtype and device,
// closing a bucket once it holds >= cap_bytes (a larger parameter gets a bucket of its own), and
// where group_of (when not empty) changes.
std::vector<Bucket> assign_buckets(const NamedParams& params, size_t cap_bytes, int world,
                                   const std::vector<size_t>& group_of = {});

}  // namespace accel::dist
