// Pipeline parallelism, the runtime (parallel/pipeline.h).
//
// Note [pipeline schedules]
// p ranks, v chunks per rank (virtual stage s = chunk * p + rank: chunk j of every rank comes
// before chunk j + 1 of any), m microbatches. A schedule is each rank's list of actions, F(mb, j)
// and B(mb, j); the runtime executes them in order, its only waits the receives of an activation
// (before a forward past virtual stage 0) and of a gradient (before a backward short of the last
// virtual stage); sends are posted and waited for at the end, so a schedule runs exactly when its
// order never waits on something a waiting rank has yet to send (tests/parallel/test_pipeline.cc
// simulates every schedule below for that, p 2-4, v 1-3, m up to 12).
//   GPipe:   F(0..m-1) chunk by chunk, then B in reverse: every activation of the step stashed;
//            bubble (p - 1) / (m + p - 1) of a step.
//   1F1B:    (p - 1 - rank) warm-up forwards, then one forward and one backward in turn, then the
//            rest of the backwards (PipeDream-flush, Megatron's default): the same bubble, at most
//            p - rank microbatches' activations stashed instead of m.
//   interleaved 1F1B (v >= 2, m a multiple of p; Megatron's): the forward order takes microbatches
//            in groups of p, chunk by chunk inside a group; the backward order the same with the
//            chunks reversed; (p - 1 - rank) * 2 + (v - 1) p warm-up forwards, then one of each
//            in turn. Each bubble is 1 / v as long: (p - 1) / (v m + p - 1).
// Messages between a pair of ranks are told apart by a tag of (direction, virtual stage,
// microbatch), so their order on the wire does not matter; each is a small header (dims, sizes,
// dtype) then the tensor.
#include "parallel/pipeline.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <map>
#include <utility>

#include "autograd/autocast.h"
#include "autograd/ops.h"
#include "core/error.h"

namespace accel::dist {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kMaxDims = 8;

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

void check_sizes(int stages, int rank, int microbatches, int chunks, const char* op) {
  ACCEL_CHECK(stages >= 1 && rank >= 0 && rank < stages, ValueError, op, "rank ", rank, " of ",
              stages, " stages is not a pipeline rank");
  ACCEL_CHECK(microbatches >= 1 && chunks >= 1, ValueError, op,
              "microbatches and chunks per rank must be >= 1, got ", microbatches, " and ", chunks);
}

// The tag of a message: direction (0 activation, 1 gradient), the virtual stage that sends it,
// the microbatch, and whether it is the header (0) or the data (1).
int tag_of(int dir, int vstage, int mb, int microbatches, int part) {
  return ((vstage * microbatches + mb) * 2 + dir) * 2 + part;
}

// Sends posted during the step, waited for at its end (or when it unwinds).
struct Outbox {
  std::vector<std::pair<WorkPtr, Tensor>> works;  // the tensor kept alive until sent
  ~Outbox() {
    for (auto& w : works) {
      try {
        w.first->wait();
      } catch (...) {  // the error that unwinds is the caller's
      }
    }
  }
  void finish() {
    for (auto& w : works) w.first->wait();
    works.clear();
  }
};

Tensor header_of(const Tensor& t) {
  ACCEL_CHECK(t.dim() <= kMaxDims, ShapeError, "pipeline_step", "activations of at most ", kMaxDims,
              " dimensions cross stages, got ", t.sizes());
  Tensor h = zeros({kMaxDims + 2}, TensorOptions(kInt64));
  int64_t* p = h.data<int64_t>();
  p[0] = t.dim();
  p[1] = int64_t(t.dtype());
  for (int64_t d = 0; d < t.dim(); ++d) p[2 + d] = t.size(d);
  return h;
}

// The point-to-point side of one step: to and from the neighbours of this rank, or, in a group
// of one, to itself through a mailbox.
class Wire {
 public:
  Wire(const ProcessGroupPtr& pp, int microbatches) : pp_(pp), m_(microbatches) {}

  void send(const Tensor& t, int to, int dir, int vstage, int mb, Outbox& out, int64_t& count) {
    const Tensor data = t.detach().contiguous();
    ++count;
    if (!pp_ || pp_->size() == 1) {
      mailbox_[tag_of(dir, vstage, mb, m_, 1)] = data;
      return;
    }
    const Tensor h = header_of(data);
    out.works.emplace_back(pp_->send_async(h, to, tag_of(dir, vstage, mb, m_, 0)), h);
    out.works.emplace_back(pp_->send_async(data, to, tag_of(dir, vstage, mb, m_, 1)), data);
  }

  Tensor recv(int from, int dir, int vstage, int mb, Device device, double& idle) {
    if (!pp_ || pp_->size() == 1) {
      const auto it = mailbox_.find(tag_of(dir, vstage, mb, m_, 1));
      ACCEL_CHECK(it != mailbox_.end(), ValueError, "pipeline_step",
                  "the schedule reads a tensor before it was computed (virtual stage ", vstage,
                  ", microbatch ", mb, ")");
      Tensor t = it->second;
      mailbox_.erase(it);
      return t;
    }
    const auto t0 = Clock::now();
    Tensor h = empty({kMaxDims + 2}, TensorOptions(kInt64));
    pp_->recv(h, from, tag_of(dir, vstage, mb, m_, 0));
    const int64_t* p = h.data<int64_t>();
    ACCEL_CHECK(p[0] >= 0 && p[0] <= kMaxDims, DistError, "pipeline_step", "rank ", from,
                " sent a header of ", p[0], " dimensions");
    Shape shape;
    for (int64_t d = 0; d < p[0]; ++d) shape.push_back(p[2 + d]);
    Tensor t = empty(shape, TensorOptions(DType(p[1]), kCPU));
    pp_->recv(t, from, tag_of(dir, vstage, mb, m_, 1));
    idle += seconds(t0, Clock::now());
    return device.is_cpu() ? t : t.to(device);
  }

 private:
  ProcessGroupPtr pp_;
  int m_;
  std::map<int, Tensor> mailbox_;
};

// The microbatches of `t` along dim 0.
std::vector<Tensor> microbatches_of(const Tensor& t, int m, const char* what) {
  ACCEL_CHECK(t.defined() && t.dim() >= 1, ShapeError, "pipeline_step", what,
              " must be a tensor of a batch (dim 0), got ",
              t.defined() ? t.shape_str() : std::string("an undefined tensor"));
  ACCEL_CHECK(t.size(0) % m == 0, ShapeError, "pipeline_step", what, " of shape ", t.sizes(),
              " does not split into ", m, " microbatches of equal size (dim 0)");
  std::vector<Tensor> out;
  const int64_t n = t.size(0) / m;
  for (int i = 0; i < m; ++i) out.push_back(t.narrow(0, i * n, n));
  return out;
}

// begin[s]: the first layer of virtual stage s; begin[stages x chunks] = the layer count.
std::vector<int> stage_begins(const std::vector<PipelineLayer>& layers, int stages, int chunks,
                              const std::vector<std::string>& split, const char* op) {
  const int n = int(layers.size()), vstages = stages * chunks;
  ACCEL_CHECK(n >= vstages, ValueError, op, "a model of ", n, " layers cannot fill ", vstages,
              " virtual stages (", stages, " stages x ", chunks, " chunks)");
  // begin[s]: the first layer of virtual stage s; begin[vstages] = n.
  std::vector<int> begin(size_t(vstages + 1), 0);
  begin[size_t(vstages)] = n;
  if (split.empty()) {
    for (int s = 1; s < vstages; ++s) {
      const int base = n / vstages, extra = n % vstages;
      begin[size_t(s)] = s * base + std::min(s, extra);
    }
  } else {
    ACCEL_CHECK(int(split.size()) == vstages - 1, ValueError, op, "a split of ", split.size(),
                " points makes ", split.size() + 1, " virtual stages, not ", vstages, " (", stages,
                " stages x ", chunks, " chunks)");
    for (int s = 1; s < vstages; ++s) {
      const std::string& name = split[size_t(s - 1)];
      int at = -1;
      for (int i = 0; i < n; ++i)
        if (layers[size_t(i)].name == name) at = i;
      ACCEL_CHECK(at >= 0, ValueError, op, "split point '", name, "' names no layer");
      ACCEL_CHECK(at > begin[size_t(s - 1)], ValueError, op, "split point '", name,
                  "' does not come after the previous one: every virtual stage needs a layer");
      begin[size_t(s)] = at;
    }
  }
  return begin;
}

}  // namespace

std::vector<int> pipeline_stage_of(const std::vector<PipelineLayer>& layers, int stages, int chunks,
                                   const std::vector<std::string>& split) {
  check_sizes(stages, 0, 1, chunks, "pipeline_stage_of");
  const std::vector<int> begin = stage_begins(layers, stages, chunks, split, "pipeline_stage_of");
  std::vector<int> out(layers.size(), 0);
  for (size_t s = 0; s + 1 < begin.size(); ++s)
    for (int i = begin[s]; i < begin[s + 1]; ++i) out[size_t(i)] = int(s);
  return out;
}

std::vector<PipelineChunk> pipeline_chunks(const std::vector<PipelineLayer>& layers, int stages,
                                           int rank, int chunks,
                                           const std::vector<std::string>& split) {
  const char* op = "pipeline_chunks";
  check_sizes(stages, rank, 1, chunks, op);
  const std::vector<int> begin = stage_begins(layers, stages, chunks, split, op);
  std::vector<PipelineChunk> out;
  for (int j = 0; j < chunks; ++j) {
    const int s = j * stages + rank;
    std::vector<PipelineChunk> run;
    for (int i = begin[size_t(s)]; i < begin[size_t(s + 1)]; ++i) {
      ACCEL_CHECK(static_cast<bool>(layers[size_t(i)].forward), ValueError, op, "layer '",
                  layers[size_t(i)].name, "' has no forward");
      run.push_back(layers[size_t(i)].forward);
    }
    out.push_back([run](const Tensor& x) {
      Tensor h = x;
      for (const PipelineChunk& f : run) h = f(h);
      return h;
    });
  }
  return out;
}

std::string schedule_name(PipelineScheduleKind kind) {
  switch (kind) {
    case PipelineScheduleKind::GPipe: return "gpipe";
    case PipelineScheduleKind::OneFOneB: return "1f1b";
    case PipelineScheduleKind::Interleaved1F1B: return "interleaved-1f1b";
  }
  return "?";
}

std::vector<PipelineAction> pipeline_schedule(PipelineScheduleKind kind, int stages, int rank,
                                              int microbatches, int chunks) {
  const char* op = "pipeline_schedule";
  check_sizes(stages, rank, microbatches, chunks, op);
  const int p = stages, m = microbatches, v = chunks;
  using K = PipelineAction::Kind;
  std::vector<PipelineAction> out;
  if (kind == PipelineScheduleKind::GPipe) {
    for (int j = 0; j < v; ++j)
      for (int mb = 0; mb < m; ++mb) out.push_back({K::Forward, mb, j});
    for (int j = v - 1; j >= 0; --j)
      for (int mb = m - 1; mb >= 0; --mb) out.push_back({K::Backward, mb, j});
    return out;
  }
  if (kind == PipelineScheduleKind::OneFOneB) {
    ACCEL_CHECK(v == 1, ValueError, op, "1F1B runs one chunk per rank, got ", v,
                " (interleaved 1F1B runs several)");
    const int warmup = std::min(p - rank - 1, m);
    for (int i = 0; i < warmup; ++i) out.push_back({K::Forward, i, 0});
    for (int i = 0; i < m - warmup; ++i) {
      out.push_back({K::Forward, warmup + i, 0});
      out.push_back({K::Backward, i, 0});
    }
    for (int i = m - warmup; i < m; ++i) out.push_back({K::Backward, i, 0});
    return out;
  }
  ACCEL_CHECK(v >= 2, ValueError, op, "interleaved 1F1B needs at least 2 chunks per rank, got ", v);
  ACCEL_CHECK(m % p == 0, ValueError, op, "interleaved 1F1B needs microbatches (", m,
              ") to be a multiple of the pipeline stages (", p, ")");
  const int total = m * v;
  // The k-th forward (backward) of this rank: microbatches in groups of p, chunk by chunk inside
  // a group (chunks reversed for the backwards).
  auto nth = [&](int k, bool backward) {
    const int group = k / (p * v), idx = k % (p * v);
    const int chunk = backward ? v - 1 - idx / p : idx / p;
    return std::make_pair(group * p + idx % p, chunk);
  };
  const int warmup = std::min((p - rank - 1) * 2 + (v - 1) * p, total);
  for (int k = 0; k < warmup; ++k) {
    const auto [mb, j] = nth(k, false);
    out.push_back({K::Forward, mb, j});
  }
  for (int i = 0; i < total - warmup; ++i) {
    const auto [fm, fj] = nth(warmup + i, false);
    out.push_back({K::Forward, fm, fj});
    const auto [bm, bj] = nth(i, true);
    out.push_back({K::Backward, bm, bj});
  }
  for (int k = total - warmup; k < total; ++k) {
    const auto [mb, j] = nth(k, true);
    out.push_back({K::Backward, mb, j});
  }
  return out;
}

namespace {

// Every rank must run the same schedule over as many chunks; a rank's own refusal is raised
// after the agreement, so that every rank raises.
void agree(ProcessGroup& pp, int v, int m, PipelineScheduleKind schedule,
           const std::exception_ptr& refusal) {
  const char* op = "pipeline_step";
  Tensor mine =
      tensor(std::vector<double>{double(v), double(m), double(int(schedule)), refusal ? 1.0 : 0.0},
             {4}, TensorOptions(kFloat64));
  Tensor lo = mine.clone(), hi = mine.clone();
  pp.all_reduce(lo, ReduceOp::Min);
  pp.all_reduce(hi, ReduceOp::Max);
  ACCEL_CHECK(lo.data<double>()[0] == hi.data<double>()[0] &&
                  lo.data<double>()[1] == hi.data<double>()[1] &&
                  lo.data<double>()[2] == hi.data<double>()[2],
              ValueError, op,
              "the pp ranks disagree on the chunks per rank, the microbatches or the schedule "
              "(this rank: ",
              v, " chunks, ", m, " microbatches, ", schedule_name(schedule), ")");
  if (refusal) std::rethrow_exception(refusal);
  ACCEL_CHECK(hi.data<double>()[3] == 0.0, ValueError, op,
              "another pp rank refused the step (the first rank checks the inputs, the last the "
              "targets; its error says why)");
}

}  // namespace

PipelineResult pipeline_step(const std::vector<PipelineChunk>& chunks, const ProcessGroupPtr& pp,
                             const Tensor& inputs, const Tensor& targets, const PipelineLoss& loss,
                             const PipelineOptions& options) {
  const char* op = "pipeline_step";
  const auto start = Clock::now();
  const int p = pp ? pp->size() : 1, rank = pp ? pp->rank() : 0;
  const int v = int(chunks.size()), m = options.microbatches;
  check_sizes(p, rank, m, std::max(v, 1), op);
  ACCEL_CHECK(v >= 1, ValueError, op, "rank ", rank, " holds no model chunk");
  for (const PipelineChunk& c : chunks)
    ACCEL_CHECK(static_cast<bool>(c), ValueError, op, "rank ", rank, " has an empty chunk");
  ACCEL_CHECK(static_cast<bool>(loss), ValueError, op, "no loss function");
  // This rank's own checks (the first rank reads the inputs, the last the targets), agreed on
  // below with the schedule, so that a refusal is an error on every rank, never a wait.
  const int last = v * p - 1;  // the last virtual stage (chunk v - 1 of rank p - 1)
  std::vector<Tensor> in_mb, tgt_mb;
  std::vector<PipelineAction> actions;
  std::exception_ptr refusal;
  try {
    if (rank == 0) in_mb = microbatches_of(inputs, m, "inputs");
    if (rank == p - 1) tgt_mb = microbatches_of(targets, m, "targets");
    actions = pipeline_schedule(options.schedule, p, rank, m, v);
  } catch (const Error&) {
    if (p == 1) throw;
    refusal = std::current_exception();
  }
  if (p > 1) agree(*pp, v, m, options.schedule, refusal);
  Device device = kCPU;  // where received activations go
  if (rank == 0) {
    device = inputs.device();
  } else if (rank == p - 1) {
    device = targets.device();
  }

  struct Slot {
    Tensor in, out;  // the chunk's input (a leaf requiring grad past stage 0) and its output / loss
  };
  std::map<std::pair<int, int>, Slot> stash;  // (microbatch, chunk)
  Wire wire(pp, m);
  Outbox outbox;
  PipelineResult res;
  double loss_sum = 0;
  const int64_t total_backwards = int64_t(m) * v;
  int64_t backwards = 0;
  for (const PipelineAction& a : actions) {
    const int vs = a.chunk * p + rank;
    if (a.kind == PipelineAction::Kind::Forward) {
      Slot s;
      if (vs == 0) {
        s.in = in_mb[size_t(a.microbatch)];
      } else {
        s.in = wire.recv((rank - 1 + p) % p, 0, vs - 1, a.microbatch, device, res.idle_s);
        if (is_floating(s.in.dtype())) s.in.requires_grad_(true);
      }
      Tensor y = chunks[size_t(a.chunk)](s.in);
      ACCEL_CHECK(y.defined(), ValueError, op, "chunk ", a.chunk, " of rank ", rank,
                  " returned an undefined tensor");
      if (vs == last) {
        Tensor l = loss(y, tgt_mb[size_t(a.microbatch)]);
        ACCEL_CHECK(l.defined() && l.numel() == 1, ShapeError, op,
                    "the loss must be one element, got ",
                    l.defined() ? l.shape_str() : std::string("an undefined tensor"));
        l = l / double(m);
        loss_sum += l.detach().to(kFloat64).item<double>();
        s.out = l;
      } else {
        wire.send(y, (rank + 1) % p, 0, vs, a.microbatch, outbox, res.messages);
        s.out = y;
      }
      stash[{a.microbatch, a.chunk}] = std::move(s);
    } else {
      const auto it = stash.find({a.microbatch, a.chunk});
      ACCEL_CHECK(it != stash.end(), ValueError, op,
                  "the schedule runs the backward of microbatch ", a.microbatch, " chunk ", a.chunk,
                  " before its forward");
      Slot s = std::move(it->second);
      stash.erase(it);
      // The forwards run in the caller's autocast scope, if any; a backward never casts again
      // (Note [autocast on CPU]).
      AutocastSuspend no_autocast;
      if (options.before_backward) options.before_backward(++backwards == total_backwards);
      if (vs == last) {
        (options.backward_loss ? options.backward_loss(s.out) : s.out).backward();
      } else {
        const Tensor g =
            wire.recv((rank + 1) % p, 1, vs + 1, a.microbatch, s.out.device(), res.idle_s);
        if (s.out.requires_grad()) s.out.backward(g.to(s.out.dtype()));
      }
      if (vs != 0) {
        const Tensor gi = s.in.grad().defined()
                              ? s.in.grad()
                              : zeros(s.in.sizes(), TensorOptions(s.in.dtype(), s.in.device()));
        wire.send(gi, (rank - 1 + p) % p, 1, vs, a.microbatch, outbox, res.messages);
      }
    }
  }
  const auto t_wait = Clock::now();
  outbox.finish();
  res.idle_s += seconds(t_wait, Clock::now());
  // The mean loss lives on the last rank: every rank gets it.
  Tensor l =
      tensor(std::vector<double>{rank == p - 1 ? loss_sum : 0.0}, {1}, TensorOptions(kFloat64));
  if (p > 1) pp->broadcast(l, p - 1);
  res.loss = l.data<double>()[0];
  res.step_s = seconds(start, Clock::now());
  return res;
}

}  // namespace accel::dist
