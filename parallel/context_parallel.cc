// Context parallelism: zig-zag sequence sharding and ring attention (parallel/context_parallel.h).
//
// Note [ring attention]
// Each of the c ranks of the cp group holds the queries, keys and values of its 2L tokens (Note
// [zig-zag sequence sharding] in the header: chunks r and 2c - 1 - r). The keys and values go
// round the ring: at step s rank r holds those of rank src = (r - s) mod c (sent to r + 1,
// received from r - 1, the next block's exchange posted before this block is computed, so it
// overlaps). With causal attention and zig-zag chunks every step is one block of equal work:
//   src == r: this rank's own tokens, causal (its chunks are in global order, so the top-left
//             aligned causal mask of its 2L x 2L scores is the global one);
//   src <  r: every query sees chunk src (it comes before both of this rank's chunks) and none
//             sees chunk 2c - 1 - src (it comes after both: 2c - 1 - src > 2c - 1 - r): one full
//             block of 2L queries x L keys;
//   src >  r: chunk r's queries see nothing of it (both chunks come after r), chunk 2c - 1 - r's
//             queries see all of it: one full block of L queries x 2L keys.
// (Without causality every block is full: 2L x 2L.) Each block is the fused kernel's forward
// (kernels/stubs/nn.h sdpa_stub), which also returns the rows' logsumexp; the partial results are
// merged as the online softmax merges key blocks (Note [fused attention]):
//   lse = log(exp(lse_a) + exp(lse_b)),  out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b,
// in float32 for bf16 (the kernel's statistics dtype). The backward goes round the ring again: the
// keys and values travel with their gradients' accumulators; for each block the fused backward
// runs with the final out and lse of the rows, so P = exp(S - lse) is the global softmax's and
// delta = rowsum(dO * O) the global one, and the block's dQ, dK, dV are exact parts of the sums.
// After c steps the accumulators have gone once round and one more send hands each to its owner.
// Off the CPU the block backward runs composed ops with the same formulas (the CUDA kernel's
// backward normalises P by the block's own sum).
// Memory per rank: the 2L-token q, k, v, out and lse, and two blocks of k, v in flight: O(T / c).
#include "parallel/context_parallel.h"

#include <atomic>
#include <cmath>
#include <limits>

#include "autograd/context_attention.h"
#include "autograd/function.h"
#include "autograd/ops.h"
#include "core/error.h"
#include "kernels/stubs/nn.h"

namespace accel::dist {

namespace {

std::atomic<bool> g_composed{false};

int64_t wrap_dim(const Tensor& x, int64_t dim, const char* op) {
  const int64_t n = x.dim();
  ACCEL_CHECK(dim >= -n && dim < n, IndexError, op, "dim ", dim, " out of range for shape ",
              x.sizes());
  return dim < 0 ? dim + n : dim;
}

void check_group_size(int rank, int size, const char* op) {
  ACCEL_CHECK(size >= 1 && rank >= 0 && rank < size, ValueError, op, "rank ", rank, " of ", size,
              " is not a cp rank");
}

bool fused_forward(const Tensor& q) {
  const DType dt = q.dtype();
  return !g_composed.load(std::memory_order_relaxed) && sdpa_stub.has(q.device().type) &&
         (dt == kFloat32 || dt == kFloat64 || (dt == kBFloat16 && q.device().is_cpu()));
}
bool fused_backward(const Tensor& q) { return fused_forward(q) && q.device().is_cpu(); }

// (n, S) bool: true where a query may not look (top-left causal).
Tensor future(int64_t n, int64_t S, Device dev) {
  return triu(ones({n, S}, TensorOptions(kBool, kCPU)), 1).to(dev);
}

// One block's attention: q (B, H, n, D) against k, v (B, H, S, .): out (B, H, n, Dv) in the
// accumulation dtype, lse (B, H, n) in the statistics dtype (the accumulation one).
void block_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                   Tensor& out, Tensor& lse) {
  const int64_t B = q.size(0), H = q.size(1), n = q.size(2), S = k.size(2), Dv = v.size(3);
  const DType at = acc_dtype(q.dtype());
  if (fused_forward(q)) {
    Tensor o = empty({B, H, n, Dv}, TensorOptions(q.dtype(), q.device()));
    lse = empty({B, H, n}, TensorOptions(q.device().is_cpu() ? at : q.dtype(), q.device()));
    Tensor p;  // not kept: the backward recomputes from lse
    sdpa_stub(q.device(), q, k, v, Tensor(), scale, causal, o, lse, p);
    out = o.dtype() == at ? o : o.to(at);
    if (lse.dtype() != at) lse = lse.to(at);
    return;
  }
  Tensor s = matmul(q.to(at), k.to(at).transpose(-2, -1)).mul(scale);  // (B, H, n, S)
  if (causal) s = masked_fill(s, future(n, S, q.device()), -INFINITY);
  const Tensor m = amax(s, {-1}, /*keepdim=*/true);  // every row sees a key: finite
  const Tensor e = exp(s - m);
  lse = (m + log(sum(e, {-1}, /*keepdim=*/true))).squeeze(-1);
  out = matmul(e / sum(e, {-1}, /*keepdim=*/true), v.to(at));
}

// Merges the block (out_b, lse_b) into rows [r0, r0 + n) of the accumulators.
void merge(Tensor& acc, Tensor& acc_lse, int64_t r0, const Tensor& out_b, const Tensor& lse_b) {
  const int64_t n = out_b.size(2);
  Tensor o = acc.narrow(2, r0, n), l = acc_lse.narrow(2, r0, n);
  const Tensor m = maximum(l, lse_b);
  const Tensor lse = m + log(exp(l - m) + exp(lse_b - m));
  const Tensor merged = o * exp(l - lse).unsqueeze(-1) + out_b * exp(lse_b - lse).unsqueeze(-1);
  o.copy_(merged);
  l.copy_(lse);
}

// One block's gradients, given the rows' final out and lse: dq (rows), dk, dv (the block's keys),
// in the accumulation dtype.
void block_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                    const Tensor& out, const Tensor& lse, bool causal, double scale, Tensor& dq,
                    Tensor& dk, Tensor& dv) {
  const DType at = acc_dtype(q.dtype());
  if (fused_backward(q)) {
    const TensorOptions o(q.dtype(), q.device());
    Tensor gq = empty(q.sizes(), o), gk = empty(k.sizes(), o), gv = empty(v.sizes(), o);
    // lse in the accumulation dtype is what the CPU kernel reads (float32 for bf16 q).
    sdpa_backward_stub(q.device(), dout, q, k, v, Tensor(), out, lse.contiguous(), Tensor(), scale,
                       causal, gq, gk, gv);
    dq = gq.to(at);
    dk = gk.to(at);
    dv = gv.to(at);
    return;
  }
  const Tensor qa = q.to(at), ka = k.to(at), va = v.to(at), doa = dout.to(at), oa = out.to(at);
  Tensor s = matmul(qa, ka.transpose(-2, -1)).mul(scale);
  const int64_t n = q.size(2), S = k.size(2);
  if (causal) s = masked_fill(s, future(n, S, q.device()), -INFINITY);
  const Tensor p = exp(s - lse.to(at).unsqueeze(-1));          // (B, H, n, S)
  const Tensor dp = matmul(doa, va.transpose(-2, -1));         // (B, H, n, S)
  const Tensor delta = sum(doa * oa, {-1}, /*keepdim=*/true);  // (B, H, n, 1)
  const Tensor ds = p * (dp - delta);
  dq = matmul(ds, ka).mul(scale);
  dk = matmul(ds.transpose(-2, -1), qa).mul(scale);
  dv = matmul(p.transpose(-2, -1), doa);
}

// What a step's block is: the query rows [r0, r0 + nq) against the received keys [k0, k0 + nk),
// causal or full (Note [ring attention]).
struct Block {
  int64_t r0, nq, k0, nk;
  bool causal;
};

Block block_of(int rank, int src, int64_t L, bool causal) {
  if (!causal) return {0, 2 * L, 0, 2 * L, false};
  if (src == rank) return {0, 2 * L, 0, 2 * L, true};
  if (src < rank) return {0, 2 * L, 0, L, false};
  return {L, L, 0, 2 * L, false};
}

// Posts the exchange of `tensors` around the ring: each to rank + 1, the same from rank - 1 into
// fresh buffers. Returns the buffers and the works to wait on. One left unwaited (the block
// between threw) is waited for on destruction, errors dropped, so that no transfer outlives the
// buffers it writes into (each work has the group's timeout).
struct Exchange {
  std::vector<Tensor> in;
  std::vector<WorkPtr> works;
  Exchange() = default;
  Exchange(Exchange&& o) noexcept : in(std::move(o.in)), works(std::move(o.works)) {
    o.works.clear();
  }
  Exchange& operator=(Exchange&& o) noexcept {
    drain();
    in = std::move(o.in);
    works = std::move(o.works);
    o.works.clear();
    return *this;
  }
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;
  ~Exchange() { drain(); }
  void wait() {
    for (const WorkPtr& w : works) w->wait();
    works.clear();
  }

 private:
  void drain() noexcept {
    for (const WorkPtr& w : works) {
      try {
        w->wait();
      } catch (...) {  // the error that unwinds is the caller's
      }
    }
    works.clear();
  }
};

Exchange post_shift(const std::vector<Tensor>& tensors, ProcessGroup& g, int tag0) {
  const int c = g.size(), r = g.rank();
  const int next = (r + 1) % c, prev = (r - 1 + c) % c;
  Exchange e;
  for (size_t i = 0; i < tensors.size(); ++i) {
    e.in.push_back(
        empty(tensors[i].sizes(), TensorOptions(tensors[i].dtype(), tensors[i].device())));
    e.works.push_back(g.recv_async(e.in.back(), prev, tag0 + int(i)));
  }
  for (size_t i = 0; i < tensors.size(); ++i)
    e.works.push_back(g.send_async(tensors[i], next, tag0 + int(i)));
  return e;
}

// Tags: the forward's keys and values, the backward's, the backward's gradient accumulators.
constexpr int kTagForward = 0, kTagBackward = 2, kTagGrads = 4;

struct Saved {
  Tensor q, k, v, out, lse;  // detached; out in q's dtype, lse in the accumulation dtype
};

Tensor ring_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                    ProcessGroup& g, Tensor& lse_out) {
  const int c = g.size(), r = g.rank();
  const int64_t T = q.size(2), L = T / 2;
  Tensor acc, acc_lse;
  Tensor kc = k, vc = v;
  for (int s = 0; s < c; ++s) {
    const int src = (r - s + c) % c;
    Exchange next;
    if (s + 1 < c) next = post_shift({kc, vc}, g, kTagForward);
    const Block b = block_of(r, src, L, causal);
    Tensor ob, lb;
    block_forward(q.narrow(2, b.r0, b.nq), kc.narrow(2, b.k0, b.nk), vc.narrow(2, b.k0, b.nk),
                  b.causal, scale, ob, lb);
    if (s == 0) {
      acc = ob.contiguous();
      acc_lse = lb.contiguous();
    } else {
      merge(acc, acc_lse, b.r0, ob, lb);
    }
    if (s + 1 < c) {
      next.wait();
      kc = next.in[0];
      vc = next.in[1];
    }
  }
  lse_out = acc_lse;
  return acc.dtype() == q.dtype() ? acc : acc.to(q.dtype());
}

std::vector<Tensor> ring_backward(const Tensor& dout, const Saved& sv, bool causal, double scale,
                                  ProcessGroup& g) {
  const int c = g.size(), r = g.rank();
  const int64_t T = sv.q.size(2), L = T / 2;
  const DType at = acc_dtype(sv.q.dtype());
  const TensorOptions ao(at, sv.q.device());
  Tensor dq = zeros(sv.q.sizes(), ao);
  Tensor dk = zeros(sv.k.sizes(), ao), dv = zeros(sv.v.sizes(), ao);  // travel with kc, vc
  Tensor kc = sv.k, vc = sv.v;
  for (int s = 0; s < c; ++s) {
    const int src = (r - s + c) % c;
    Exchange next;
    if (s + 1 < c) next = post_shift({kc, vc}, g, kTagBackward);
    const Block b = block_of(r, src, L, causal);
    Tensor gq, gk, gv;
    block_backward(dout.narrow(2, b.r0, b.nq), sv.q.narrow(2, b.r0, b.nq), kc.narrow(2, b.k0, b.nk),
                   vc.narrow(2, b.k0, b.nk), sv.out.narrow(2, b.r0, b.nq),
                   sv.lse.narrow(2, b.r0, b.nq), b.causal, scale, gq, gk, gv);
    dq.narrow(2, b.r0, b.nq).add_(gq);
    dk.narrow(2, b.k0, b.nk).add_(gk);
    dv.narrow(2, b.k0, b.nk).add_(gv);
    if (c > 1) {
      Exchange grads = post_shift({dk, dv}, g, kTagGrads);
      grads.wait();
      dk = grads.in[0];
      dv = grads.in[1];
    }
    if (s + 1 < c) {
      next.wait();
      kc = next.in[0];
      vc = next.in[1];
    }
  }
  const DType dt = sv.q.dtype();
  return {dq.to(dt), dk.to(dt), dv.to(dt)};
}

}  // namespace

namespace detail {
void set_ring_attention_composed(bool on) { g_composed.store(on, std::memory_order_relaxed); }
}  // namespace detail

SequenceSplit sequence_split(const DeviceMesh& mesh) {
  if (!mesh.has_dim("cp")) return {};
  return {mesh.coordinate("cp"), mesh.size("cp")};
}

Tensor cp_positions(int64_t local_len, int rank, int size, Device device) {
  const char* op = "cp_positions";
  check_group_size(rank, size, op);
  ACCEL_CHECK(local_len >= 0 && local_len % 2 == 0, ShapeError, op, "a rank's ", local_len,
              " tokens are not two equal chunks (Note [zig-zag sequence sharding]: the sequence "
              "length must be divisible by 2 x cp_size = ",
              2 * size, ")");
  const int64_t L = local_len / 2;
  Tensor p = empty({local_len}, TensorOptions(kInt64, kCPU));
  int64_t* d = p.data<int64_t>();
  for (int64_t i = 0; i < L; ++i) {
    d[i] = int64_t(rank) * L + i;
    d[L + i] = int64_t(2 * size - 1 - rank) * L + i;
  }
  return device.is_cpu() ? p : p.to(device);
}

Tensor cp_shard_sequence(const Tensor& x, int64_t dim, int rank, int size) {
  const char* op = "cp_shard_sequence";
  ACCEL_CHECK(x.defined(), ValueError, op, "input is undefined");
  check_group_size(rank, size, op);
  dim = wrap_dim(x, dim, op);
  const int64_t T = x.size(dim);
  ACCEL_CHECK(T % (2 * int64_t(size)) == 0, ShapeError, op, "the sequence (dim ", dim, " of shape ",
              x.sizes(), ") has ", T, " tokens, not divisible by 2 x cp_size = ", 2 * size,
              " (Note [zig-zag sequence sharding]: each rank holds two chunks of T / (2 cp))");
  if (size == 1) return x;
  return zigzag_part(x, dim, rank, size);
}

Tensor cp_unshard_sequence(const Tensor& x, int64_t dim, const ProcessGroupPtr& group) {
  const char* op = "cp_unshard_sequence";
  ACCEL_CHECK(x.defined(), ValueError, op, "input is undefined");
  if (!group || group->size() == 1) return x;
  dim = wrap_dim(x, dim, op);
  const int c = group->size();
  const int64_t T = x.size(dim);
  ACCEL_CHECK(T % 2 == 0, ShapeError, op, "a rank's ", T, " tokens (dim ", dim, " of shape ",
              x.sizes(), ") are not two equal chunks");
  NoGradGuard ng;
  const Tensor in = x.detach().transpose(0, dim).contiguous();  // the sequence first
  Shape bs{int64_t(c)};
  for (int64_t n : in.sizes()) bs.push_back(n);
  Tensor all = empty(bs, TensorOptions(in.dtype(), in.device()));
  group->all_gather(all, in);
  const int64_t L = T / 2;
  std::vector<Tensor> chunks(size_t(2 * c));
  for (int r = 0; r < c; ++r) {
    chunks[size_t(r)] = all.select(0, r).narrow(0, 0, L);
    chunks[size_t(2 * c - 1 - r)] = all.select(0, r).narrow(0, L, L);
  }
  return cat(chunks, 0).transpose(0, dim).contiguous();
}

Tensor ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                      const ProcessGroupPtr& group) {
  const char* op = "ring_attention";
  ACCEL_CHECK(q.defined() && k.defined() && v.defined(), ValueError, op, "q, k or v is undefined");
  ACCEL_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.sizes() == q.sizes() &&
                  v.size(0) == q.size(0) && v.size(1) == q.size(1) && v.size(2) == q.size(2),
              ShapeError, op,
              "expected q, k (B, H, T, D) and v (B, H, T, Dv) of one sequence, got ", q.sizes(),
              ", ", k.sizes(), ", ", v.sizes());
  ACCEL_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype() && is_floating(q.dtype()),
              DTypeError, op, "q, k, v must share one floating dtype, got ", q.dtype(), ", ",
              k.dtype(), ", ", v.dtype());
  ACCEL_CHECK(q.device() == k.device() && q.device() == v.device(), DeviceError, op,
              "q, k, v are on ", q.device(), ", ", k.device(), ", ", v.device());
  if (!group || group->size() == 1) {
    return scaled_dot_product_attention(q, k, v, Tensor(), 0.0, causal, scale);
  }
  ACCEL_CHECK(q.size(2) % 2 == 0 && q.size(2) > 0, ShapeError, op, "a rank's ", q.size(2),
              " tokens (q ", q.sizes(),
              ") are not two equal chunks (Note [zig-zag sequence sharding]: the sequence length "
              "must be divisible by 2 x cp_size = ",
              2 * group->size(), ")");
  Saved sv;
  Tensor out;
  {
    NoGradGuard ng;
    sv.q = q.detach().contiguous();
    sv.k = k.detach().contiguous();
    sv.v = v.detach().contiguous();
    out = ring_forward(sv.q, sv.k, sv.v, causal, scale, *group, sv.lse);
    sv.out = out;
  }
  if (autograd::needs_grad(q, k, v)) {
    autograd::record(op, {&q, &k, &v}, {&out},
                     [sv, causal, scale, group](const autograd::Grads& g) -> autograd::Grads {
                       ACCEL_CHECK(!autograd::creating_graph(), ValueError, "ring_attention",
                                   "a second derivative through ring attention is not "
                                   "supported (context parallelism)");
                       NoGradGuard ng;
                       const Tensor dout =
                           g[0].defined() ? g[0].contiguous()
                                          : zeros(sv.out.sizes(),
                                                  TensorOptions(sv.out.dtype(), sv.out.device()));
                       return ring_backward(dout, sv, causal, scale, *group);
                     });
  }
  return out;
}

std::string CpStyle::name() const {
  return kind == Kind::RingAttention ? "ring_attention" : "positions";
}

CpStyle cp_ring_attention() { return CpStyle{CpStyle::Kind::RingAttention}; }
CpStyle cp_position_ids() { return CpStyle{CpStyle::Kind::Positions}; }

}  // namespace accel::dist
