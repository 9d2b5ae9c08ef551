// parallelize(): tensor-parallel styles applied to modules by name pattern
// (parallel/tensor_parallel.h; docs/parallelism.md "Tensor parallel").
//
// Note [tp styles as call wrappers]
// A style is the module's own forward with this rank's shard of its parameters, plus a region
// entry before it and a region exit after it (Note [tp regions] in tp_collectives.cc). The entry
// and exit run in a call wrapper (Note [module calls] in nn/module.h), so nn::Linear and
// nn::Embedding stay unaware of tensor parallelism and the parameters stay plain tensors that an
// optimizer, DDP or FSDP over another group can take as they are. Two consequences: the parent
// must call the module through operator() (a direct forward() skips the wrapper, as it skips
// hooks), and a planned module cannot also be a ZeRO-3 unit (one wrapper per module): shard
// blocks or the root with FSDP, not the Linear layers inside them. Rowwise computes
// linear(x, weight) itself, so that its bias is added once after the reduction; its module's own
// forward hooks therefore do not run.
//
// Note [uneven tp shards]
// A size tp does not divide is cut as torch's DTensor cuts it (torch.chunk): c = ceil(n / p) per
// rank, the last ranks get fewer or nothing (vocabulary 31 over tp 3: 11, 11, 9; 5 heads over tp
// 4: 2, 2, 1, 0). Layers whose pieces must be whole groups of features are cut in units:
// nn::CausalSelfAttention's qkv (each of q, k, v) and proj by heads (unit = head_dim), so a rank
// runs its torch.chunk of the heads (local_heads, possibly 0: it then contributes nothing to the
// rowwise sum, but runs every collective). Nothing else changes: a colwise output stays this
// rank's features; a rowwise layer all-reduces full-size partial sums; a vocab embedding looks up
// its rows [begin, begin + length); the gathers (gather_output, tp_full_parameters) pad each piece
// to c for the all-gather and cut the padding after; vocab_parallel_cross_entropy all-gathers the
// ranks' widths. What stays refused: sequence parallelism with a sequence length tp does not
// divide (its reduce-scatter and all-gather need equal chunks: ShapeError naming the sequence
// length), dropout on uneven sharded features (Note [dropout under tensor parallelism]: its mask
// layout assumes equal pieces; ValueError naming the style), and layers planned require_even.
//
// Note [tp registry]
// tp_full_parameters and the gradient norm must know which parameters are shards, of what and
// over which group, given only the module. parallelize records that per module in a process-wide
// table keyed by the module's address and holding a weak reference, so an entry of a module that
// died (and an address reused since) is recognised and dropped.
#include "parallel/tensor_parallel.h"

#include "nn/wrapper_label.h"
#include "parallel/materialize.h"
#include "parallel/placement.h"
#include "parallel/tp_random.h"

#include <cmath>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>

#include "nn/attention.h"
#include "nn/linear.h"
#include "autograd/ops.h"
#include "core/error.h"

namespace accel::dist {

namespace {

constexpr const char* kOp = "parallelize";

struct ShardSpec {
  std::string param;  // the module's own parameter name ("weight", "bias")
  int64_t dim = 0;
  int64_t chunks = 1;
  int64_t unit = 1;  // Note [uneven tp shards]: pieces of whole units
  int64_t full = 0;  // the full length along dim
};

struct TpEntry {
  std::weak_ptr<nn::Module> module;
  ProcessGroupPtr group;
  TpStyle style;
  std::vector<ShardSpec> shards;
};

std::mutex g_registry_mu;
std::map<const nn::Module*, TpEntry>& registry() {
  static std::map<const nn::Module*, TpEntry> r;
  return r;
}

std::optional<TpEntry> find_entry(const nn::Module* m) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  auto it = registry().find(m);
  if (it == registry().end()) return std::nullopt;
  if (it->second.module.lock().get() != m) {  // Note [tp registry]: a dead module's entry
    registry().erase(it);
    return std::nullopt;
  }
  return it->second;
}

int group_size(const ProcessGroupPtr& g) { return g ? g->size() : 1; }
int group_rank(const ProcessGroupPtr& g) { return g ? g->rank() : 0; }

std::vector<std::string> split_name(const std::string& s) {
  std::vector<std::string> out;
  if (s.empty()) return out;
  size_t start = 0;
  while (true) {
    const size_t dot = s.find('.', start);
    out.push_back(s.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return out;
}

bool matches(const std::vector<std::string>& pattern, const std::vector<std::string>& name) {
  if (pattern.size() != name.size()) return false;
  for (size_t i = 0; i < name.size(); ++i)
    if (pattern[i] != "*" && pattern[i] != name[i]) return false;
  return true;
}

// Rank r of p's torch.chunk piece of a block of `block` elements cut in whole units.
Chunk piece_of(int64_t block, int64_t unit, int p, int r) {
  const Chunk c = shard_chunk(block / unit, p, r);
  return {c.begin * unit, c.length * unit};
}

// This rank's shard of `full` along dim: `chunks` equal blocks, each cut in p torch.chunk pieces
// of whole units, piece r of every block concatenated.
Tensor shard_of(const Tensor& full, int64_t dim, int64_t chunks, int64_t unit, int p, int r) {
  const int64_t block = full.size(dim) / chunks;
  const Chunk c = piece_of(block, unit, p, r);
  std::vector<Tensor> pieces;
  for (int64_t b = 0; b < chunks; ++b)
    pieces.push_back(full.narrow(dim, b * block + c.begin, c.length));
  return (pieces.size() == 1 ? pieces[0] : cat(pieces, dim)).contiguous().clone();
}

// A process-group all-reduce (sum) of a gradient: the hook of a parameter replicated in a
// sequence-parallel region, whose every rank saw only its own chunk of the sequence.
GradHook all_reduce_hook(const ProcessGroupPtr& g) {
  return [g](const Tensor& grad) {
    Tensor r = grad.detach().contiguous().clone();
    g->all_reduce(r);
    return r;
  };
}

std::string describe(const std::string& name, const nn::Module& m) {
  return "module '" + name + "' (" + m.type_name() + ": " + m.extra_repr() + ")";
}

// ---- checks (all before anything changes) ----

void check_style(const std::string& name, nn::Module& m, const TpStyle& s, int p, int64_t unit) {
  using K = TpStyle::Kind;
  const bool wraps = s.kind == K::Colwise || s.kind == K::Rowwise || s.kind == K::VocabEmbedding ||
                     (s.kind == K::Sequence && s.shard_input_dim >= 0);
  ACCEL_CHECK(!find_entry(&m), ValueError, kOp, describe(name, m),
              " is tensor-parallel already; parallelize a fresh model");
  ACCEL_CHECK(!wraps || !m.has_call_wrapper(), ValueError, kOp, describe(name, m),
              " has a call wrapper already (a ZeRO-3 unit?): style ", s.name(),
              " needs its own; apply tensor parallel first and shard blocks, not its layers");
  if (s.kind == K::Colwise || s.kind == K::Rowwise) {
    int64_t in_features = 0, out_features = 0;
    if (auto* lin = dynamic_cast<nn::Linear*>(&m)) {
      in_features = lin->in_features;
      out_features = lin->out_features;
    } else if (auto* tl = dynamic_cast<TransposedLinear*>(&m)) {
      const Tensor w = tl->transposed_weight();
      ACCEL_CHECK(w.defined() && w.dim() == 2, ValueError, kOp, "style ", s.name(), ": ",
                  describe(name, m), " is a TransposedLinear whose weight is not 2-D");
      in_features = w.size(0);  // Note [transposed linear layers]: (in, out)
      out_features = w.size(1);
    } else {
      ACCEL_THROW(ValueError, kOp, "style ", s.name(),
                  " needs an nn::Linear (or a TransposedLinear such as hf::Conv1D), ",
                  describe(name, m), " is not one");
    }
    if (s.kind == K::Colwise) {
      const int64_t k = s.colwise.chunks;
      ACCEL_CHECK(k >= 1, ValueError, kOp, "colwise chunks must be >= 1, got ", k, " for ",
                  describe(name, m));
      ACCEL_CHECK(!(s.colwise.gather_output && k > 1), ValueError, kOp, "colwise with chunks ", k,
                  " cannot gather its output (the gathered columns "
                  "would be in rank order, not the packed order) for ",
                  describe(name, m));
      ACCEL_CHECK(unit >= 1 && out_features % (k * unit) == 0, ShapeError, kOp, "colwise ",
                  describe(name, m), ": out_features ", out_features, " is not ", k,
                  " equal block(s) of whole units of ", unit);
      ACCEL_CHECK(!s.colwise.require_even || out_features % (k * unit * p) == 0, ShapeError, kOp,
                  "colwise ", describe(name, m), ": out_features ", out_features,
                  " is not divisible by chunks ", k, " x tp ", p,
                  (unit > 1 ? " x unit " + std::to_string(unit) : std::string()),
                  " (the plan asks for equal pieces: require_even)");
    } else {
      ACCEL_CHECK(unit >= 1 && in_features % unit == 0, ShapeError, kOp, "rowwise ",
                  describe(name, m), ": in_features ", in_features,
                  " is not a whole number of units of ", unit);
      ACCEL_CHECK(!s.rowwise.require_even || in_features % (unit * p) == 0, ShapeError, kOp,
                  "rowwise ", describe(name, m), ": in_features ", in_features,
                  " is not divisible by tp ", p,
                  (unit > 1 ? " x unit " + std::to_string(unit) : std::string()),
                  " (the plan asks for equal pieces: require_even)");
    }
  } else if (s.kind == K::VocabEmbedding) {
    auto* emb = dynamic_cast<nn::Embedding*>(&m);
    ACCEL_CHECK(emb, ValueError, kOp, "style ", s.name(), " needs an nn::Embedding, ",
                describe(name, m), " is not one");
    ACCEL_CHECK(!s.rowwise.require_even || emb->num_embeddings % p == 0, ShapeError, kOp,
                "vocab_embedding ", describe(name, m), ": num_embeddings ", emb->num_embeddings,
                " is not divisible by tp ", p, " (the plan asks for equal pieces: require_even)");
  }
}

// A CausalSelfAttention's heads split: qkv colwise (packed, 3 chunks, not gathered) and proj
// rowwise together, or neither.
void check_attention(const std::string& name, nn::CausalSelfAttention& a,
                     const std::map<std::string, TpStyle>& planned) {
  const std::string pre = name.empty() ? "" : name + ".";
  auto qkv = planned.find(pre + "qkv");
  auto proj = planned.find(pre + "proj");
  const bool q = qkv != planned.end() && qkv->second.kind == TpStyle::Kind::Colwise;
  const bool o = proj != planned.end() && proj->second.kind == TpStyle::Kind::Rowwise;
  if (!q && !o) return;
  ACCEL_CHECK(q && o, ValueError, kOp, describe(name, a),
              ": split its heads with qkv colwise and proj rowwise together (got qkv ",
              qkv == planned.end() ? "unplanned" : qkv->second.name(), ", proj ",
              proj == planned.end() ? "unplanned" : proj->second.name(), ")");
  ACCEL_CHECK(qkv->second.colwise.chunks == 3, ValueError, kOp, describe(name, a),
              ": its qkv is packed [q | k | v]: colwise needs chunks = 3, got ",
              qkv->second.colwise.chunks);
  // Note [uneven tp shards]: the heads are cut whole, torch.chunk over n_heads.
  for (const TpStyle* st : {&qkv->second, &proj->second}) {
    const int64_t u = st->kind == TpStyle::Kind::Colwise ? st->colwise.unit : st->rowwise.unit;
    ACCEL_CHECK(u == 1 || u == a.head_dim, ValueError, kOp, describe(name, a),
                ": its heads are cut whole (unit head_dim = ", a.head_dim, "), but the plan gives ",
                st->name(), " unit ", u);
  }
}

// A sequence module all-reduces the gradients of every parameter below it, so no module below
// it may hold shards.
void check_nesting(const std::map<std::string, TpStyle>& planned) {
  using K = TpStyle::Kind;
  for (const auto& [outer, s] : planned) {
    if (s.kind != K::Sequence) continue;
    const std::string pre = outer.empty() ? "" : outer + ".";
    for (const auto& [inner, t] : planned) {
      const bool below = inner != outer && inner.compare(0, pre.size(), pre) == 0;
      ACCEL_CHECK(!below || t.kind == K::Sequence || t.kind == K::Replicate, ValueError, kOp,
                  "module '", inner, "' (", t.name(), ") lies inside module '", outer,
                  "' (sequence), whose parameters' gradients are all-reduced over tp: plan the "
                  "sequence style on the modules beside it instead");
    }
  }
}

// ---- applying a style ----

void shard_tensor(nn::Module& m, const Tensor& t, const std::string& pname, int64_t dim,
                  int64_t chunks, int64_t unit, const ProcessGroupPtr& g, TpEntry& entry) {
  NoGradGuard no_grad;
  Tensor handle = t;
  const int64_t full = t.size(dim);
  const int p = group_size(g), r = group_rank(g);
  if (nn::is_deferred(t)) {
    // Note [deferred parts] in nn/module.cc: built under nn::DeferredInit, the parameter becomes
    // a deferred tensor of this rank's shape; materialising it draws the full value and keeps
    // this rank's piece (issue 37: only local shards are ever held).
    const Shape full_shape = t.sizes();
    Shape local = full_shape;
    local[size_t(dim)] = chunks * piece_of(full / chunks, unit, p, r).length;
    // The cut as a Region (parallel/materialize.h): materialising streams only this piece.
    RegionCut cut{Region::whole(full_shape).shard(dim, chunks, p, r, unit)};
    ACCEL_CHECK(cut.region.local_shape() == local, ShapeError, kOp, "the tp piece of '", pname,
                "' has shape ", local, ", its region ", cut.region.local_shape());
    nn::assign_tensor_data(handle, nn::deferred_tensor(local, t.dtype(), t.device()));
    m.set_deferred_part(pname, full_shape, std::move(cut));
    entry.shards.push_back({pname, dim, chunks, unit, full});
    return;
  }
  nn::assign_tensor_data(handle, shard_of(t.detach(), dim, chunks, unit, p, r));
  if (handle.grad().defined()) handle.set_grad(Tensor());
  entry.shards.push_back({pname, dim, chunks, unit, full});
}

void shard_param(nn::Module& m, const std::string& pname, int64_t dim, int64_t chunks, int64_t unit,
                 const ProcessGroupPtr& g, TpEntry& entry) {
  for (auto& [n, t] : m.named_parameters(false)) {
    if (n != pname) continue;
    shard_tensor(m, t, pname, dim, chunks, unit, g, entry);
    return;
  }
}

// A TransposedLinear's parameter (found by identity: the layer names it as it likes).
void shard_own(nn::Module& m, const Tensor& p, int64_t dim, int64_t chunks, int64_t unit,
               const ProcessGroupPtr& g, TpEntry& entry) {
  for (auto& [n, t] : m.named_parameters(false)) {
    if (!t.is_same(p)) continue;
    shard_tensor(m, t, n, dim, chunks, unit, g, entry);
    return;
  }
}

// Whether a dimension of `full` elements in `chunks` blocks of units of `unit` splits evenly.
bool even_split(int64_t full, int64_t chunks, int64_t unit, int p) {
  return (full / chunks / unit) % p == 0;
}

void apply_colwise(nn::Module& m, const ColwiseOptions& o, int64_t unit, const ProcessGroupPtr& g,
                   TpEntry& entry, const std::string& label) {
  int64_t full_out = 0;
  if (auto* lin = dynamic_cast<nn::Linear*>(&m)) {
    full_out = lin->out_features;
    shard_param(*lin, "weight", 0, o.chunks, unit, g, entry);
    if (lin->bias.defined()) shard_param(*lin, "bias", 0, o.chunks, unit, g, entry);
    lin->out_features = lin->weight.size(0);
  } else {  // Note [transposed linear layers]: the weight is (in, out)
    auto& tl = dynamic_cast<TransposedLinear&>(m);
    full_out = tl.transposed_weight().size(1);
    shard_own(m, tl.transposed_weight(), 1, o.chunks, unit, g, entry);
    if (tl.transposed_bias().defined())
      shard_own(m, tl.transposed_bias(), 0, o.chunks, unit, g, entry);
  }
  const bool uneven = !even_split(full_out, o.chunks, unit, group_size(g));
  // Note [dropout under tensor parallelism]: what random ops after this layer see.
  auto source = std::make_shared<const std::string>(label);
  m.set_call_wrapper(
      [g, o, unit, full_out, uneven, source](nn::Module&, nn::Values& in, const nn::CallFn& call) {
        ACCEL_CHECK(!in.empty() && in[0].is_tensor() && in[0].tensor().defined(), ValueError,
                    "colwise", "expected a tensor input, got ", nn::describe_values(in));
        Tensor& x = in[0].tensor();
        x = o.sequence_parallel ? gather_from_sequence_region(x, o.sequence_dim, g)
                                : copy_to_tp_region(x, g);
        std::vector<Tensor> out = call(in);
        if (o.gather_output) out[0] = gather_from_tp_region(out[0], -1, g, full_out, unit);
        set_sharded_region(o.gather_output
                               ? ShardedRegion{}
                               : detail::feature_region(g, out[0], o.chunks, uneven, source));
        return out;
      });
  nn::set_call_wrapper_label(m, label);
}

void apply_rowwise(nn::Module& m, const RowwiseOptions& o, int64_t unit, const ProcessGroupPtr& g,
                   TpEntry& entry, const std::string& label) {
  auto* lin = dynamic_cast<nn::Linear*>(&m);
  Tensor bias;
  if (lin) {
    shard_param(*lin, "weight", 1, 1, unit, g, entry);
    lin->in_features = lin->weight.size(1);
    bias = lin->bias;
  } else {  // Note [transposed linear layers]: the weight is (in, out)
    auto& tl = dynamic_cast<TransposedLinear&>(m);
    shard_own(m, tl.transposed_weight(), 0, 1, unit, g, entry);
    bias = tl.transposed_bias();
  }
  if (o.sequence_parallel && bias.defined() && group_size(g) > 1)
    bias.register_hook(all_reduce_hook(g));
  auto source = std::make_shared<const std::string>(label + " (sequence parallel)");
  m.set_call_wrapper([g, o, source](nn::Module& mod, nn::Values& in, const nn::CallFn&) {
    ACCEL_CHECK(in.size() == 1 && in[0].is_tensor() && in[0].tensor().defined(), ValueError,
                "rowwise", "expected one tensor input, got ", nn::describe_values(in));
    const Tensor& x = in[0].tensor();
    auto* l = dynamic_cast<nn::Linear*>(&mod);
    const Tensor w =
        l ? Tensor(l->weight) : dynamic_cast<TransposedLinear&>(mod).transposed_weight();
    const Tensor b = l ? Tensor(l->bias) : dynamic_cast<TransposedLinear&>(mod).transposed_bias();
    const int64_t in_features = l ? l->in_features : w.size(0);
    ACCEL_CHECK(x.dim() >= 1 && x.size(-1) == in_features, ShapeError, "rowwise",
                "expected input sharded on its last dim (..., ", in_features, "), got ", x.sizes());
    Tensor y = l ? linear(x, w) : matmul(x, w);  // this rank's partial sum
    y = o.sequence_parallel ? reduce_scatter_to_sequence_region(y, o.sequence_dim, g)
                            : reduce_from_tp_region(y, g);
    if (b.defined()) y = y + b;  // once, after the reduction
    set_sharded_region(o.sequence_parallel
                           ? detail::sequence_region(g, y, o.sequence_dim, source)
                           : ShardedRegion{});  // Note [dropout under tensor parallelism]
    return std::vector<Tensor>{y};
  });
  nn::set_call_wrapper_label(m, label);
}

void apply_vocab_embedding(nn::Embedding& emb, const RowwiseOptions& o, const ProcessGroupPtr& g,
                           TpEntry& entry, const std::string& label) {
  const int64_t vocab = emb.num_embeddings;
  const Chunk rows = shard_chunk(vocab, group_size(g), group_rank(g));  // Note [uneven tp shards]
  const int64_t vl = rows.length, start = rows.begin;
  shard_param(emb, "weight", 0, 1, 1, g, entry);
  emb.num_embeddings = vl;
  auto source = std::make_shared<const std::string>(label + " (sequence parallel)");
  emb.set_call_wrapper(
      [g, o, vocab, vl, start, source](nn::Module&, nn::Values& in, const nn::CallFn& call) {
        ACCEL_CHECK(in.size() == 1 && in[0].is_tensor() && in[0].tensor().defined(), ValueError,
                    "vocab_embedding", "expected one index tensor, got ", nn::describe_values(in));
        const Tensor idx = in[0].tensor();
        const Tensor ok = logical_and(idx.ge(0), idx.lt(vocab));
        ACCEL_CHECK(ok.to(kInt64).sum().item<int64_t>() == ok.numel(), IndexError,
                    "vocab_embedding", "an index of ", idx.sizes(), " is outside [0, ", vocab, ")");
        const Tensor mine = logical_and(idx.ge(start), idx.lt(start + vl));
        in[0].tensor() = where(mine, idx - start, Scalar(int64_t(0)));
        std::vector<Tensor> out = call(in);
        out[0] = masked_fill(out[0], logical_not(mine).unsqueeze(-1), 0.0);  // other ranks' rows
        out[0] = o.sequence_parallel ? reduce_scatter_to_sequence_region(out[0], o.sequence_dim, g)
                                     : reduce_from_tp_region(out[0], g);
        set_sharded_region(o.sequence_parallel
                               ? detail::sequence_region(g, out[0], o.sequence_dim, source)
                               : ShardedRegion{});  // Note [dropout under tensor parallelism]
        return out;
      });
  nn::set_call_wrapper_label(emb, label);
}

void apply_sequence(nn::Module& m, int64_t shard_input_dim, const ProcessGroupPtr& g,
                    const std::string& label) {
  if (group_size(g) > 1) {
    for (Tensor& t : m.parameters()) t.register_hook(all_reduce_hook(g));
  }
  if (shard_input_dim < 0) return;
  m.set_call_wrapper([g, shard_input_dim](nn::Module&, nn::Values& in, const nn::CallFn& call) {
    ACCEL_CHECK(!in.empty() && in[0].is_tensor() && in[0].tensor().defined(), ValueError,
                "sequence", "expected a tensor input, got ", nn::describe_values(in));
    const Tensor& x = in[0].tensor();
    const int64_t d = shard_input_dim;
    // Note [uneven tp shards]: sequence chunks must be equal.
    ACCEL_CHECK(d >= x.dim() || x.size(d) % g->size() == 0, ShapeError, "sequence",
                "sequence parallelism needs the sequence length divisible by tp: size ",
                d < x.dim() ? x.size(d) : 0, " of dim ", d, " of input ", x.sizes(), " over tp ",
                g->size(), " (uneven sequence chunks are not supported)");
    in[0].tensor() = scatter_to_tp_region(x, d, g);
    return call(in);
  });
  nn::set_call_wrapper_label(m, label);
}

void apply_style(nn::Module& m, const std::string& name, const TpStyle& s, int64_t unit,
                 const ProcessGroupPtr& g, TpEntry& entry) {
  const std::string label = "tensor-parallel " + s.name() + " '" + name + "'";
  switch (s.kind) {
    case TpStyle::Kind::Colwise: apply_colwise(m, s.colwise, unit, g, entry, label); break;
    case TpStyle::Kind::Rowwise: apply_rowwise(m, s.rowwise, unit, g, entry, label); break;
    case TpStyle::Kind::VocabEmbedding:
      apply_vocab_embedding(static_cast<nn::Embedding&>(m), s.rowwise, g, entry, label);
      break;
    case TpStyle::Kind::Sequence: apply_sequence(m, s.shard_input_dim, g, label); break;
    case TpStyle::Kind::Replicate: break;
  }
}

bool is_sequence_parallel(const TpStyle& s) {
  switch (s.kind) {
    case TpStyle::Kind::Colwise: return s.colwise.sequence_parallel;
    case TpStyle::Kind::Rowwise:
    case TpStyle::Kind::VocabEmbedding: return s.rowwise.sequence_parallel;
    case TpStyle::Kind::Sequence: return true;
    case TpStyle::Kind::Replicate: return false;
  }
  return false;
}

// Note [sequence-parallel coverage]
// Under sequence parallelism the modules between a rowwise exit (reduce-scatter) and the next
// colwise entry (all-gather) see this rank's chunk of the sequence, so the gradient of their
// replicated parameters is a partial sum that only sequence() all-reduces over tp. A module the
// plan leaves out trains on partial gradients without a word (weights 4.5e-2 off after 15 steps),
// so with any sequence-parallel style in the plan every module holding parameters of its own must
// be planned itself or sit inside a planned module: sequence() if it runs on sequence chunks,
// replicate() if its input is replicated.
void check_sequence_coverage(nn::Module& root, const std::map<std::string, TpStyle>& planned) {
  bool sp = false;
  for (const auto& [name, style] : planned) sp = sp || is_sequence_parallel(style);
  if (!sp) return;
  auto covered = [&](const std::string& name) {
    for (const auto& [p, style] : planned)
      if (p.empty() || name == p || name.rfind(p + ".", 0) == 0) return true;
    return false;
  };
  for (const auto& [name, m] : root.named_modules()) {
    if (m->named_parameters(false).empty() || covered(name)) continue;
    ACCEL_THROW(ValueError, kOp, "under sequence parallelism module '", name, "' (", m->type_name(),
                ") is not in the plan, and its parameters would get partial gradients when it "
                "runs on this rank's chunk of the sequence: plan it as sequence() (its gradients "
                "are then all-reduced over tp) or replicate() if its input is replicated");
  }
}

// The plan's matches: module name -> (module, plan index). Every pattern must match.
std::map<std::string, std::pair<nn::Module*, size_t>> match_plan(nn::Module& root,
                                                                 const TpPlan& plan) {
  std::map<std::string, std::pair<nn::Module*, size_t>> out;
  const auto modules = root.named_modules();
  for (size_t i = 0; i < plan.size(); ++i) {
    const auto pattern = split_name(plan[i].first);
    ACCEL_CHECK(!pattern.empty(), ValueError, kOp, "plan entry ", i,
                " has an empty pattern; name modules as named_modules() does (\"blocks.*.fc\")");
    bool any = false;
    for (const auto& [name, m] : modules) {
      if (!matches(pattern, split_name(name))) continue;
      any = true;
      auto [it, fresh] = out.emplace(name, std::make_pair(m, i));
      ACCEL_CHECK(fresh, ValueError, kOp, "module '", name, "' is matched by pattern '",
                  plan[it->second.second].first, "' and by pattern '", plan[i].first, "'");
    }
    ACCEL_CHECK(any, ValueError, kOp, "pattern '", plan[i].first, "' (style ",
                plan[i].second.name(), ") matches no module of ", root.type_name(),
                " ('*' matches one name component: \"blocks.*.attn.qkv\")");
  }
  return out;
}

}  // namespace

bool module_name_matches(const std::string& pattern, const std::string& name) {
  return matches(split_name(pattern), split_name(name));
}

std::string TpStyle::name() const {
  switch (kind) {
    case Kind::Colwise: return "colwise";
    case Kind::Rowwise: return "rowwise";
    case Kind::VocabEmbedding: return "vocab_embedding";
    case Kind::Sequence: return "sequence";
    case Kind::Replicate: return "replicate";
  }
  return "?";
}

TpStyle colwise(ColwiseOptions options) {
  TpStyle s;
  s.kind = TpStyle::Kind::Colwise;
  s.colwise = options;
  return s;
}
TpStyle rowwise(RowwiseOptions options) {
  TpStyle s;
  s.kind = TpStyle::Kind::Rowwise;
  s.rowwise = options;
  return s;
}
TpStyle vocab_embedding(RowwiseOptions options) {
  TpStyle s;
  s.kind = TpStyle::Kind::VocabEmbedding;
  s.rowwise = options;
  return s;
}
TpStyle sequence(int64_t shard_input_dim) {
  TpStyle s;
  s.kind = TpStyle::Kind::Sequence;
  s.shard_input_dim = shard_input_dim;
  return s;
}
TpStyle replicate() { return TpStyle{}; }

std::shared_ptr<nn::Module> parallelize(std::shared_ptr<nn::Module> module,
                                        const ProcessGroupPtr& group, const TpPlan& plan) {
  ACCEL_CHECK(module, ValueError, kOp, "module is null");
  const int p = group_size(group);
  const auto matched = match_plan(*module, plan);
  std::map<std::string, TpStyle> planned;
  for (const auto& [name, mi] : matched) planned[name] = plan[mi.second].second;
  // The unit each planned layer is cut in (Note [uneven tp shards]): the style's, or an attention
  // projection's head_dim.
  std::map<std::string, int64_t> units;
  for (const auto& [name, style] : planned)
    units[name] = style.kind == TpStyle::Kind::Rowwise ? style.rowwise.unit : style.colwise.unit;
  std::vector<nn::CausalSelfAttention*> split_heads;
  for (const auto& [name, m] : module->named_modules()) {
    if (auto* a = dynamic_cast<nn::CausalSelfAttention*>(m)) {
      check_attention(name, *a, planned);
      const std::string pre = name.empty() ? "" : name + ".";
      if (!planned.count(pre + "qkv")) continue;
      split_heads.push_back(a);
      for (const char* part : {"qkv", "proj"}) units[pre + part] = a->head_dim;
    }
  }
  for (const auto& [name, mi] : matched)
    check_style(name, *mi.first, plan[mi.second].second, p, units[name]);
  check_nesting(planned);
  check_sequence_coverage(*module, planned);
  // Checked: now change the model.
  for (const auto& [name, mi] : matched) {
    nn::Module& m = *mi.first;
    TpEntry entry{m.weak_from_this(), group, plan[mi.second].second, {}};
    apply_style(m, name, entry.style, units[name], group, entry);
    std::lock_guard<std::mutex> lock(g_registry_mu);
    registry()[&m] = std::move(entry);
  }
  for (auto* a : split_heads) a->local_heads = shard_chunk(a->n_heads, p, group_rank(group)).length;
  detail::install_region_reset(*module, group);  // Note [dropout under tensor parallelism]
  return module;
}

namespace {

struct ParamInfo {
  std::string name;
  Tensor value;
  std::optional<ShardSpec> shard;
  ProcessGroupPtr group;
};

// Every parameter of `root` in named_parameters() order, with its shard spec when it is one.
std::vector<ParamInfo> param_infos(nn::Module& root) {
  std::map<std::string, nn::Module*> by_name;
  for (const auto& [name, m] : root.named_modules()) by_name[name] = m;
  std::vector<ParamInfo> out;
  for (auto& [name, t] : root.named_parameters()) {
    ParamInfo info{name, t, std::nullopt, nullptr};
    const size_t dot = name.rfind('.');
    const std::string mod = dot == std::string::npos ? "" : name.substr(0, dot);
    const std::string own = dot == std::string::npos ? name : name.substr(dot + 1);
    auto it = by_name.find(mod);
    if (it != by_name.end()) {
      if (auto e = find_entry(it->second)) {
        for (const ShardSpec& s : e->shards)
          if (s.param == own) {
            info.shard = s;
            info.group = e->group;
          }
      }
    }
    out.push_back(std::move(info));
  }
  return out;
}

// The full tensor of a shard: each block all-gathered along its dim (pieces padded for the
// collective: Note [uneven tp shards]), blocks put back in packed order.
Tensor gather_full(const Tensor& local, const ShardSpec& s, const ProcessGroupPtr& g) {
  if (group_size(g) == 1) return local.detach();
  const int64_t block = s.full / s.chunks, n = local.size(s.dim) / s.chunks;
  std::vector<Tensor> blocks;
  for (int64_t c = 0; c < s.chunks; ++c)
    blocks.push_back(
        gather_from_tp_region(local.detach().narrow(s.dim, c * n, n), s.dim, g, block, s.unit));
  return blocks.size() == 1 ? blocks[0] : cat(blocks, s.dim);
}

}  // namespace

Tensor tp_piece(const Tensor& full, const TpShard& s, int rank, int size) {
  return shard_of(full, s.dim, s.chunks, s.unit, size, rank);
}

Tensor tp_gather(const Tensor& local, const TpShard& s, const ProcessGroupPtr& group) {
  return gather_full(local, ShardSpec{"", s.dim, s.chunks, s.unit, s.full}, group);
}

io::TensorDict tp_full_parameters(nn::Module& module) {
  NoGradGuard no_grad;
  io::TensorDict out;
  for (const ParamInfo& p : param_infos(module))
    out[p.name] = p.shard ? gather_full(p.value, *p.shard, p.group) : p.value.detach();
  return out;
}

std::map<std::string, TpShard> tp_shards(nn::Module& module) {
  std::map<std::string, TpShard> out;
  for (const ParamInfo& p : param_infos(module))
    if (p.shard) out[p.name] = TpShard{p.shard->dim, p.shard->chunks, p.shard->unit, p.shard->full};
  return out;
}

bool is_tp_sharded(nn::Module& module, const std::string& name) {
  for (const ParamInfo& p : param_infos(module))
    if (p.name == name) return p.shard.has_value();
  ACCEL_THROW(IndexError, "is_tp_sharded", "no parameter '", name, "' in ", module.type_name());
}

double tp_grad_norm_squared(nn::Module& module) {
  NoGradGuard no_grad;
  double replicated = 0;
  std::vector<std::pair<ProcessGroupPtr, double>> sharded;  // per group, in order of appearance
  for (const ParamInfo& p : param_infos(module)) {
    const Tensor g = p.value.grad();
    const double sq = g.defined() ? sum(mul(g, g)).to(kFloat64).item<double>() : 0.0;
    if (!p.shard || group_size(p.group) == 1) {
      replicated += sq;
      continue;
    }
    auto it = std::find_if(sharded.begin(), sharded.end(),
                           [&](const auto& e) { return e.first == p.group; });
    if (it == sharded.end()) {
      sharded.emplace_back(p.group, 0.0);
      it = sharded.end() - 1;
    }
    it->second += sq;
  }
  double total = replicated;
  for (auto& [g, sq] : sharded) {
    Tensor t = full({1}, sq, TensorOptions(kFloat64));
    g->all_reduce(t);
    total += t.item<double>();
  }
  return total;
}

double tp_clip_grad_norm_(nn::Module& module, double max_norm) {
  ACCEL_CHECK(max_norm >= 0, ValueError, "tp_clip_grad_norm_", "max_norm must be >= 0, got ",
              max_norm);
  const double norm = std::sqrt(tp_grad_norm_squared(module));
  const double coef = max_norm / (norm + 1e-6);
  if (!(coef >= 1.0)) {
    NoGradGuard no_grad;
    for (Tensor& t : module.parameters()) {
      Tensor g = t.grad();
      if (g.defined()) g.mul_(coef);
    }
  }
  return norm;
}

}  // namespace accel::dist
