#include "parallel/buckets.h"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <unordered_set>

#include "autograd/engine.h"
#include "core/error.h"

// Note [bucket order]
// Buckets are numbered in reverse parameter order (the order gradients usually become ready
// in backward) and issued strictly in that order: bucket b is issued only after 0..b-1, even if
// its gradients were ready earlier. Every rank therefore issues the same collectives in the
// same order whatever order its hooks fire in, which keeps the reduction deterministic and the
// fingerprint check meaningful. Parameters whose gradient never arrives hold their bucket back
// until finish(), which zero-fills them: all ranks still issue every bucket, so a rank with an
// unused parameter raises a clear error instead of leaving its peers blocked.

// Note [sync at the end of backward]
// PyTorch's DDP averages the gradients inside loss.backward(): its reducer's hooks launch the
// buckets and the engine's final callback waits for them. The bucketer does the same for its
// owner (DDP, ZeRO) through set_backward_hooks: the first gradient of a backward runs the owner's
// `begin` check and queues an end-of-backward callback (Note [end-of-backward callbacks] in
// autograd/engine.h); at the end of a backward that was synced and is not finished yet, the
// callback runs the owner's `end` (its finish_gradient_sync), so a plain loss.backward() leaves
// the averaged gradients in .grad exactly as ddp.backward(loss) does: the same collectives, in
// the same order, on the same buffers. The callback runs whether the backward succeeded or threw
// (buckets already issued must be waited for, and the peers issue them too). A caller that
// finishes first (the Accelerator's strategies queue their own callback before the bucketer's)
// leaves nothing for it to do. Once `end` ran, the owner's explicit finish_gradient_sync() is a
// no-op until the next synced gradient or forward (finished_at_backward_end), so code written
// for the explicit call keeps working; a rank whose loss reached none of the parameters gets no
// hook, so it still needs ddp.backward(loss) or finish_gradient_sync() to issue the zero-filled
// collectives its peers issue (as with find_unused_parameters).

namespace accel::dist {

namespace {
using Clock = std::chrono::steady_clock;

// dst[i] = src[i] * scale for a contiguous CPU floating tensor pair, else framework ops.
void copy_scaled(const Tensor& dst, const Tensor& src, double scale) {
  const int64_t n = dst.numel();
  if (dst.device().is_cpu() && src.device().is_cpu() && src.is_contiguous() &&
      src.dtype() == dst.dtype()) {
    void* d = dst.data_ptr();
    const void* s = src.data_ptr();
    if (dst.dtype() == kFloat32) {
      auto* __restrict__ pd = static_cast<float*>(d);
      auto* ps = static_cast<const float*>(s);
      const float f = float(scale);
      for (int64_t i = 0; i < n; ++i) pd[i] = ps[i] * f;
      return;
    }
    if (dst.dtype() == kFloat64) {
      auto* __restrict__ pd = static_cast<double*>(d);
      auto* ps = static_cast<const double*>(s);
      for (int64_t i = 0; i < n; ++i) pd[i] = ps[i] * scale;
      return;
    }
  }
  Tensor flat = dst;
  flat.copy_(src.reshape({n}));
  if (scale != 1.0) flat.mul_(Scalar(scale));
}
}  // namespace

std::vector<Bucket> assign_buckets(const NamedParams& params, size_t cap_bytes, int world,
                                   const std::vector<size_t>& group_of) {
  std::vector<Bucket> out;
  Bucket cur;
  size_t cur_bytes = 0;
  auto close = [&] {
    if (cur.params.empty()) return;
    cur.numel = (cur.used + world - 1) / world * world;
    cur.shard_numel = cur.numel / world;
    out.push_back(std::move(cur));
    cur = Bucket{};
    cur_bytes = 0;
  };
  for (size_t k = params.size(); k-- > 0;) {
    const Tensor& p = params[k].second;
    size_t bytes = p.nbytes();
    bool compatible =
        cur.params.empty() || (cur.dtype == p.dtype() && cur.device == p.device() &&
                               (group_of.empty() || group_of[cur.params.back()] == group_of[k]));
    if (!compatible || (!cur.params.empty() && cur_bytes + bytes > cap_bytes)) close();
    if (cur.params.empty()) {
      cur.dtype = p.dtype();
      cur.device = p.device();
    }
    cur.params.push_back(k);
    cur.offset.push_back(cur.used);
    cur.used += p.numel();
    cur_bytes += bytes;
  }
  close();
  return out;
}

struct GradBucketer::State {
  NamedParams params;
  ProcessGroupPtr pg;
  GradReduction mode;
  bool find_unused;
  std::string owner;
  int world = 1;
  std::vector<Bucket> buckets;
  std::vector<std::pair<size_t, size_t>> where;  // param -> (bucket, index in bucket)

  std::vector<Tensor> staging;  // full flat buffers
  std::vector<Tensor> shards;   // ReduceScatter outputs
  std::vector<WorkPtr> works;
  std::vector<int> pending;  // params of each bucket still missing this backward
  std::vector<char> ready;   // per param
  size_t next_launch = 0;    // Note [bucket order]
  bool sync = true;
  bool active = false;  // a synced backward has started
  SyncStats stats;
  // Note [sync at the end of backward]
  std::function<void()> on_begin, on_end;
  bool pass_open = false;      // a backward's first gradient came; its end callback is queued
  bool ended_by_hook = false;  // the last synced backward was finished by on_end
  uint64_t finishes = 0;

  Tensor& staging_for(size_t b) {
    if (!staging[b].defined()) {
      const Bucket& bk = buckets[b];
      staging[b] = empty({bk.numel}, TensorOptions(bk.dtype, bk.device));
      if (bk.numel > bk.used) staging[b].narrow(0, bk.used, bk.numel - bk.used).zero_();
    }
    return staging[b];
  }

  void reset_iteration() {
    for (size_t b = 0; b < buckets.size(); ++b) pending[b] = int(buckets[b].params.size());
    std::fill(ready.begin(), ready.end(), 0);
    works.assign(buckets.size(), nullptr);
    next_launch = 0;
    active = false;
  }

  // Copies param i's gradient into its bucket slot (scaled to an average). `grad` may be
  // undefined (unused parameter): zeros.
  void stage(size_t i, const Tensor& grad) {
    auto [b, j] = where[i];
    const Bucket& bk = buckets[b];
    const Tensor& p = params[i].second;
    Tensor slot = staging_for(b).narrow(0, bk.offset[j], p.numel());
    if (!grad.defined()) {
      slot.zero_();
      return;
    }
    const double scale = 1.0 / double(world);
    if (grad.data_ptr() == slot.data_ptr() && grad.is_contiguous()) {
      // .grad already is this slot (gradient as bucket view, zeroed in place): scale in place.
      if (world > 1) slot.mul_(Scalar(scale));
      return;
    }
    copy_scaled(slot, grad, scale);
  }

  void launch_in_order() {
    while (next_launch < buckets.size() && pending[next_launch] == 0) {
      size_t b = next_launch++;
      Tensor& buf = staging_for(b);
      if (mode == GradReduction::AllReduce) {
        works[b] = pg->all_reduce_async(buf, ReduceOp::Sum);
      } else {
        works[b] = pg->reduce_scatter_async(shards[b], buf, ReduceOp::Sum);
      }
    }
  }

  // The first gradient of a backward (Note [sync at the end of backward]).
  void open_pass(const std::weak_ptr<State>& self) {
    if (on_begin) on_begin();  // may throw: nothing is staged or queued then
    if (!autograd::backward_running()) return;
    pass_open = true;
    autograd::queue_callback([self](bool) {
      auto st = self.lock();
      if (!st) return;
      st->pass_open = false;
      if (!st->active || !st->on_end) return;  // not synced, or finished by the caller already
      st->ended_by_hook = true;
      st->on_end();
    });
  }

  void on_grad_ready(size_t i, Tensor& leaf, const std::weak_ptr<State>& self) {
    if (!pass_open) open_pass(self);
    if (!sync) return;
    const std::string& name = params[i].first;
    ACCEL_CHECK(!ready[i], DistError, owner.c_str(), "gradient of '", name,
                "' arrived twice in one backward: call finish_gradient_sync() between backward "
                "passes, or accumulate inside no_sync()");
    if (!active) {
      active = true;
      ended_by_hook = false;
      stats = SyncStats{};
    }
    ready[i] = 1;
    Tensor g = leaf.grad();
    stage(i, g);
    // ZeRO-2/3 keep only their shard: drop the full-size gradient as soon as it is staged.
    if (mode == GradReduction::ReduceScatter) leaf.set_grad(Tensor());
    size_t b = where[i].first;
    if (--pending[b] == 0) launch_in_order();
  }
};

GradBucketer::GradBucketer(NamedParams params, ProcessGroupPtr pg, size_t cap_bytes,
                           GradReduction mode, bool find_unused_parameters, const char* owner,
                           std::vector<size_t> group_of)
    : state_(std::make_shared<State>()) {
  State& s = *state_;
  s.owner = owner;
  ACCEL_CHECK(pg != nullptr, DistError, owner, "no process group");
  ACCEL_CHECK(!params.empty(), ValueError, owner, "no parameters to synchronise");
  ACCEL_CHECK(cap_bytes > 0, ValueError, owner, "bucket_cap_bytes must be positive");
  std::unordered_set<const TensorImpl*> seen;
  for (auto& [name, p] : params) {
    ACCEL_CHECK(p.defined(), ValueError, owner, "parameter '", name, "' is undefined");
    ACCEL_CHECK(p.is_floating_point(), DTypeError, owner, "parameter '", name, "' has dtype ",
                p.dtype(), "; gradients need a floating dtype");
    ACCEL_CHECK(p.is_leaf() && p.requires_grad(), ValueError, owner, "parameter '", name,
                "' must be a leaf that requires grad");
    ACCEL_CHECK(p.is_contiguous(), ValueError, owner, "parameter '", name, "' of shape ",
                p.shape_str(), " must be contiguous");
    ACCEL_CHECK(seen.insert(p.impl()).second, ValueError, owner, "parameter '", name,
                "' appears twice (shared weights are listed once)");
  }
  s.params = std::move(params);
  s.pg = std::move(pg);
  s.mode = mode;
  s.find_unused = find_unused_parameters;
  s.world = s.pg->size();
  ACCEL_CHECK(group_of.empty() || group_of.size() == s.params.size(), ValueError, owner,
              "group_of has ", group_of.size(), " entries for ", s.params.size(), " parameters");
  s.buckets = assign_buckets(s.params, cap_bytes, s.world, group_of);
  s.where.resize(s.params.size());
  for (size_t b = 0; b < s.buckets.size(); ++b)
    for (size_t j = 0; j < s.buckets[b].params.size(); ++j)
      s.where[s.buckets[b].params[j]] = {b, j};
  s.staging.resize(s.buckets.size());
  s.shards.resize(s.buckets.size());
  if (mode == GradReduction::ReduceScatter) {
    for (size_t b = 0; b < s.buckets.size(); ++b) {
      const Bucket& bk = s.buckets[b];
      s.shards[b] = zeros({bk.shard_numel}, TensorOptions(bk.dtype, bk.device));
    }
  }
  s.pending.resize(s.buckets.size());
  s.ready.resize(s.params.size());
  s.reset_iteration();
  std::weak_ptr<State> weak = state_;
  for (size_t i = 0; i < s.params.size(); ++i) {
    Tensor p = s.params[i].second;
    p.register_post_accumulate_grad_hook([weak, i](Tensor& leaf) {
      if (auto st = weak.lock()) st->on_grad_ready(i, leaf, weak);
    });
  }
}

GradBucketer::~GradBucketer() {
  // A callback still queued (the owner is destroyed inside a backward) must not call it.
  state_->on_begin = nullptr;
  state_->on_end = nullptr;
  // Do not leave collectives in flight that write into buffers we are about to free.
  for (auto& w : state_->works) {
    if (!w) continue;
    try {
      w->wait();
    } catch (...) {
    }
  }
}

void GradBucketer::set_sync(bool on) {
  ACCEL_CHECK(!state_->active, DistError, state_->owner.c_str(),
              "cannot change gradient synchronisation in the middle of a backward");
  state_->sync = on;
}
bool GradBucketer::sync() const { return state_->sync; }
bool GradBucketer::in_backward() const { return state_->active; }
void GradBucketer::set_backward_hooks(std::function<void()> begin, std::function<void()> end) {
  state_->on_begin = std::move(begin);
  state_->on_end = std::move(end);
}
bool GradBucketer::finished_at_backward_end() const { return state_->ended_by_hook; }
void GradBucketer::forget_backward_end() { state_->ended_by_hook = false; }
uint64_t GradBucketer::finish_count() const { return state_->finishes; }
const std::vector<Bucket>& GradBucketer::buckets() const { return state_->buckets; }
Tensor GradBucketer::buffer(size_t b) const { return state_->staging_for(b); }
Tensor GradBucketer::shard(size_t b) const { return state_->shards[b]; }
const NamedParams& GradBucketer::params() const { return state_->params; }
const SyncStats& GradBucketer::last_stats() const { return state_->stats; }

void GradBucketer::release_staging() {
  ACCEL_CHECK(!state_->active, DistError, state_->owner.c_str(),
              "cannot release buffers during a backward");
  for (auto& t : state_->staging) t = Tensor();
}

int64_t GradBucketer::staging_bytes() const {
  int64_t n = 0;
  for (auto& t : state_->staging)
    if (t.defined()) n += int64_t(t.nbytes());
  return n;
}

void GradBucketer::finish() {
  State& s = *state_;
  if (!s.sync) return;
  ++s.finishes;
  const auto backward_end = Clock::now();
  if (!s.active) s.stats = SyncStats{};
  // Unused parameters: zero-fill so that every bucket is issued on every rank.
  std::vector<std::string> missing;
  for (size_t i = 0; i < s.params.size(); ++i) {
    if (s.ready[i]) continue;
    missing.push_back(s.params[i].first);
    s.ready[i] = 1;
    // A parameter skipped in this backward may still hold a gradient from an earlier no_sync
    // pass: that one counts.
    Tensor g = s.params[i].second.grad();
    s.stage(i, g);
    if (s.mode == GradReduction::ReduceScatter && g.defined())
      s.params[i].second.set_grad(Tensor());
    --s.pending[s.where[i].first];
  }
  s.launch_in_order();
  std::exception_ptr err;
  for (size_t b = 0; b < s.works.size(); ++b) {
    try {
      s.works[b]->wait();
    } catch (...) {
      if (!err) err = std::current_exception();
    }
  }
  const auto done = Clock::now();
  SyncStats& st = s.stats;
  st.buckets = int(s.buckets.size());
  st.bytes = 0;
  st.comm_seconds = st.hidden_seconds = 0;
  for (size_t b = 0; b < s.buckets.size(); ++b) {
    st.bytes += s.buckets[b].numel * int64_t(dtype_size(s.buckets[b].dtype));
    auto t0 = s.works[b]->started_at(), t1 = s.works[b]->finished_at();
    if (t0 == Work::TimePoint{}) t0 = t1;
    st.comm_seconds += std::chrono::duration<double>(t1 - t0).count();
    auto hidden_end = std::min(t1, backward_end);
    if (hidden_end > t0)
      st.hidden_seconds += std::chrono::duration<double>(hidden_end - t0).count();
  }
  st.wait_seconds = std::chrono::duration<double>(done - backward_end).count();
  s.reset_iteration();
  if (err) std::rethrow_exception(err);
  if (s.mode == GradReduction::AllReduce) {
    // .grad becomes a view of the averaged bucket: no copy back, and the next backward
    // accumulating into .grad writes straight into the bucket.
    for (size_t i = 0; i < s.params.size(); ++i) {
      auto [b, j] = s.where[i];
      Tensor& p = s.params[i].second;
      p.set_grad(s.staging[b].narrow(0, s.buckets[b].offset[j], p.numel()).view(p.sizes()));
    }
  }
  if (!missing.empty() && !s.find_unused) {
    std::ostringstream os;
    for (size_t k = 0; k < missing.size() && k < 10; ++k) os << (k ? ", " : "") << missing[k];
    if (missing.size() > 10) os << ", ... (" << missing.size() << " in all)";
    ACCEL_THROW(DistError, s.owner.c_str(), "rank ", s.pg->rank(), ": ", missing.size(),
                " parameter(s) received no gradient in this backward: ", os.str(),
                ". Every parameter must contribute to the loss; construct with "
                "find_unused_parameters = true to treat missing gradients as zero");
  }
}

}  // namespace accel::dist
