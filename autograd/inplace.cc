// Autograd of in-place ops and views: saved-tensor version errors, InplaceOp (the checks, the
// version bump, the rebase of history), CopySlices for writes through a view, the regeneration of
// a stale view's grad_fn, and inplace_method. Notes [saved tensors], [in-place ops], [views and
// in-place autograd] and [in-place methods] in autograd/function.h.
#include <algorithm>
#include <array>
#include <string>

#include "autograd/engine.h"
#include "autograd/ops.h"
#include "core/dispatch.h"
#include "core/raw.h"

namespace accel::autograd {

// ---------------- saved tensors ----------------

void SavedTensor::throw_modified() const {
  const Node* n = current_node();
  const std::string op = n ? n->name() : "an op";
  ACCEL_THROW(ValueError, "backward",
              "one of the tensors needed for gradient computation has been modified by an "
              "in-place operation: the backward of ",
              op, " reads its ", is_output_ ? "output " : "input ", index_, " (a ", data_.dtype(),
              " tensor of shape ", data_.sizes(), "), which is at version ", data_.version(),
              "; expected version ", version_,
              ". Clone it before writing to it in place, or use the out-of-place op");
}

const Tensor& SavedTensor::output_with_history() const {
  const std::shared_ptr<Node>* owner = current_node_owner();
  if (!data_.defined() || !owner || !*owner || !is_floating(data_.dtype()) ||
      index_ >= (*owner)->num_outputs())
    return data_;
  Tensor t = data_.detach();
  AutogradMeta& m = t.autograd_meta();
  m.requires_grad = true;
  m.grad_fn = *owner;
  m.output_nr = index_;
  return keep_for_current_node(std::move(t));
}

void throw_no_double_backward(const char* op, const char* why) {
  ACCEL_THROW(ValueError, op, "double backward is not supported: ", why,
              " (docs/design.md, \"Double backward\")");
}

namespace {

// ---------------- geometry ----------------

// Where a tensor's elements sit in its storage.
struct Geometry {
  Shape sizes, strides;
  int64_t offset = 0;
  explicit Geometry(const Tensor& t) : sizes(t.sizes()), strides(t.strides()), offset(t.offset()) {}
};

// Elements of a storage that `g` spans, from its offset (0 when it has none).
int64_t span(const Geometry& g) {
  int64_t n = 1;
  for (size_t i = 0; i < g.sizes.size(); ++i) {
    if (g.sizes[i] == 0) return 0;
    n += (g.sizes[i] - 1) * g.strides[i];
  }
  return n;
}

// A view whose dims of stride 0 (expand) reach one element several times.
bool overlaps(const Shape& sizes, const Shape& strides) {
  for (size_t i = 0; i < sizes.size(); ++i)
    if (strides[i] == 0 && sizes[i] > 1) return true;
  return false;
}

// A zero gradient for `base`, laid out like it (its strides, in a buffer of its span), and the
// region of it where the view's elements sit. The view's offset is at least the base's: a view
// only reaches elements of its base.
void grad_layout(const Geometry& base, const Geometry& view, DType dt, Device dev,
                 Tensor& base_grad, Tensor& region) {
  ACCEL_INTERNAL_ASSERT(view.offset >= base.offset || shape_numel(view.sizes) == 0);
  Tensor flat = zeros({span(base)}, TensorOptions(dt, dev));
  base_grad = raw::as_strided(flat, base.sizes, base.strides, 0);
  region = raw::as_strided(flat, view.sizes, view.strides,
                           std::max<int64_t>(view.offset - base.offset, 0));
}

// A fresh contiguous copy (the in-place backward may keep what it is given).
Tensor copy_of(const Tensor& t) {
  Tensor c = empty(t.sizes(), TensorOptions(t.dtype(), t.device()));
  copy_stub(t.device(), c, t);
  return c;
}

// Calls f(k, offset) for the k-th element (row-major) of geometry g, offset relative to g's.
template <typename F>
void for_each_offset(const Geometry& g, F&& f) {
  const int64_t n = shape_numel(g.sizes);
  const size_t d = g.sizes.size();
  std::vector<int64_t> idx(d, 0);
  int64_t off = 0;
  for (int64_t k = 0; k < n; ++k) {
    f(k, off);
    for (size_t i = d; i-- > 0;) {  // next multi-index, updating the offset incrementally
      if (++idx[i] < g.sizes[i]) {
        off += g.strides[i];
        break;
      }
      off -= (idx[i] - 1) * g.strides[i];
      idx[i] = 0;
    }
  }
}

// Where the view's elements (row-major over the view's sizes) sit among the base's elements
// (row-major over the base's sizes), as an int64 tensor on dev: what the create_graph forms of
// AsStridedBackward and CopySlices gather and scatter through (differentiable index ops instead
// of writes into strided buffers). The view must not overlap itself.
Tensor view_positions(const Geometry& base, const Geometry& view, Device dev) {
  std::vector<int64_t> base_index(size_t(span(base)), -1);  // storage offset -> base element
  for_each_offset(base, [&](int64_t k, int64_t off) { base_index[size_t(off)] = k; });
  std::vector<int64_t> pos(size_t(shape_numel(view.sizes)));
  const int64_t shift = view.offset - base.offset;
  for_each_offset(view, [&](int64_t k, int64_t off) {
    const int64_t o = shift + off;
    ACCEL_INTERNAL_ASSERT(o >= 0 && o < int64_t(base_index.size()) && base_index[size_t(o)] >= 0);
    pos[size_t(k)] = base_index[size_t(o)];
  });
  Tensor t = tensor(pos, Shape{int64_t(pos.size())});
  return dev.is_cpu() ? t : t.to(dev);
}

// ---------------- nodes ----------------

// The grad_fn of a view regenerated from its base: the gradient of the view's elements, placed
// where they sit in the base (summed over the dims an expand repeats).
class AsStridedBackward final : public Node {
 public:
  AsStridedBackward(Geometry base, Geometry view)
      : Node(1), base_(std::move(base)), view_(std::move(view)) {}
  const char* name() const override { return "AsStridedBackward"; }
  Grads apply(Grads&& grads) override {
    Tensor g = std::move(grads[0]);
    Geometry view = view_;
    if (overlaps(view.sizes, view.strides)) {
      Shape dims;
      for (size_t i = 0; i < view.sizes.size(); ++i) {
        if (view.strides[i] == 0 && view.sizes[i] > 1) {
          dims.push_back(int64_t(i));
          view.sizes[i] = 1;
        }
      }
      g = sum(g, dims, true);
    }
    if (creating_graph()) [[unlikely]] {
      // Note [double backward]: the same placement by a differentiable scatter.
      const Tensor pos = view_positions(base_, view, g.device());
      Tensor flat = zeros({shape_numel(base_.sizes)}, TensorOptions(g.dtype(), g.device()));
      return {index_add(flat, 0, pos, g.reshape({-1})).reshape(base_.sizes)};
    }
    Tensor base_grad, region;
    grad_layout(base_, view, g.dtype(), g.device(), base_grad, region);
    raw::copy_(region, g);
    return {base_grad};
  }

 private:
  Geometry base_, view_;
};

// Note [views and in-place autograd]: the base's grad_fn after an in-place write through a view.
// Edges: [the base's previous history, the in-place op's operands...].
class CopySlices final : public Node {
 public:
  CopySlices(Geometry base, Geometry view, std::shared_ptr<Node> fn)
      : Node(1), base_(std::move(base)), view_(std::move(view)), fn_(std::move(fn)) {}
  const char* name() const override { return "CopySlices"; }
  void release() override { fn_->release(); }
  bool released() const override { return fn_->released(); }
  Grads apply(Grads&& grads) override {
    const Tensor& g = grads[0];
    if (creating_graph()) [[unlikely]]
      return apply_differentiable(g);
    Tensor base_grad, region;
    grad_layout(base_, view_, g.dtype(), g.device(), base_grad, region);
    raw::copy_(base_grad, g);
    Grads res;
    {
      CurrentNodeScope running(fn_.get());  // a version error names the in-place op
      res = fn_->apply({copy_of(region)});
    }
    const size_t n = next_edges_.size();
    ACCEL_CHECK(res.empty() || res.size() == n, Error, "backward", "node ", fn_->name(),
                " returned ", res.size(), " gradients for ", n, " inputs");
    if (!res.empty() && res[0].defined()) {
      raw::copy_(region, res[0]);
    } else {
      raw::fill_(region, 0);  // the old values of the region were overwritten
    }
    Grads out(n);
    out[0] = std::move(base_grad);
    for (size_t i = 1; i < n && !res.empty(); ++i) out[i] = std::move(res[i]);
    return out;
  }

 private:
  // apply() under create_graph (Note [double backward]): the region is gathered from the base's
  // gradient and written back by differentiable index ops, so the gradients keep their history.
  // A saved output of the in-place op (the view's new value) gets, as torch's does, the view of
  // the base's new history as grad_fn: an AsStridedBackward into this node, so a gradient of the
  // double-backward graph reaches the in-place op through this node (never through the op's
  // node directly, which this node calls and frees).
  Grads apply_differentiable(const Tensor& g) {
    const Tensor pos = view_positions(base_, view_, g.device());
    const Tensor flat = g.reshape({-1});
    std::shared_ptr<Node> view_fn;
    if (const std::shared_ptr<Node>* self = current_node_owner(); self && self->get() == this) {
      view_fn = std::make_shared<AsStridedBackward>(base_, view_);
      view_fn->mutable_next_edges().push_back(Edge{*self, 0});
    }
    Grads res;
    {
      CurrentNodeScope running(fn_.get(), view_fn ? &view_fn : nullptr);
      res = fn_->apply({index_select(flat, 0, pos).reshape(view_.sizes)});
    }
    const size_t n = next_edges_.size();
    ACCEL_CHECK(res.empty() || res.size() == n, Error, "backward", "node ", fn_->name(),
                " returned ", res.size(), " gradients for ", n, " inputs");
    Tensor written = zeros_like(flat);  // the region's new gradient, zero elsewhere
    if (!res.empty() && res[0].defined())
      written = index_add(written, 0, pos, ops_reshape_flat(res[0], flat.dtype()));
    Tensor in_region;  // bool (base numel): the view's elements
    {
      NoGradGuard no_grad;
      const TensorOptions f32(kFloat32, flat.device());
      in_region = gt(index_add(zeros({flat.numel()}, f32), 0, pos, ones({pos.numel()}, f32)), 0.0);
    }
    Grads out(n);
    out[0] = where(in_region, written, flat).reshape(base_.sizes);
    for (size_t i = 1; i < n && !res.empty(); ++i) out[i] = std::move(res[i]);
    return out;
  }
  static Tensor ops_reshape_flat(const Tensor& t, DType dt) {
    return (t.dtype() == dt ? t : t.to(dt)).reshape({-1});
  }

  Geometry base_, view_;
  std::shared_ptr<Node> fn_;
};

// Note [stand-ins] in autograd/function.h: passes its gradient on unchanged.
class StandIn final : public Node {
 public:
  StandIn() : Node(1) {}
  const char* name() const override { return "StandIn"; }
  Grads apply(Grads&& grads) override { return {std::move(grads[0])}; }
};

// Makes `node` (output nr) the grad_fn of the tensor with metadata `m`, moving its retain_grad()
// slot along (Note [in-place ops]).
void set_grad_fn(AutogradMeta& m, const std::shared_ptr<Node>& node, uint32_t nr) {
  if (m.retains_grad && m.retained_grad) {
    if (m.grad_fn) m.grad_fn->remove_retained_grad(m.retained_grad);
    node->add_retained_grad(nr, m.retained_grad);
  }
  m.requires_grad = true;
  m.grad_fn = node;
  m.output_nr = nr;
}

bool requires_grad_impl(const TensorImpl* t) { return t->autograd_ && t->autograd_->requires_grad; }

}  // namespace

// ---------------- views ----------------

const std::shared_ptr<Node>& view_grad_fn(const Tensor& view) {
  static const std::shared_ptr<Node> kNone;
  TensorImpl* impl = view.impl();
  AutogradMeta* m = impl->autograd_.get();
  const std::shared_ptr<Node>& own = m ? m->grad_fn : kNone;
  const TensorImpl* base = impl->view_base_.get();
  if (!base || impl->view_no_grad_ || !requires_grad_impl(base)) return own;
  const uint32_t version = view.version();
  if (own && m->attr_version == version) return own;
  // Stale (the storage was written since grad_fn was made) or missing (the base got history
  // after the view was made): a view of the base's current history.
  Tensor b(impl->view_base_);
  auto node = std::make_shared<AsStridedBackward>(Geometry(b), Geometry(view));
  node->mutable_next_edges().push_back(gradient_edge(b));
  if (!impl->autograd_) impl->autograd_ = std::make_unique<AutogradMeta>();
  AutogradMeta& meta = *impl->autograd_;
  set_grad_fn(meta, node, 0);
  meta.attr_version = version;
  return meta.grad_fn;
}

// ---------------- InplaceOp ----------------

InplaceOp::InplaceOp(Tensor& self, const char* op, std::initializer_list<const Tensor*> operands)
    : self_(&self), op_(op) {
  init(operands.begin(), operands.size());
}

InplaceOp::InplaceOp(Tensor& self, const char* op, const Tensor* const* operands, size_t n)
    : self_(&self), op_(op) {
  init(operands, n);
}

void InplaceOp::init(const Tensor* const* operands, size_t n) {
  const Tensor& self = *self_;
  ACCEL_CHECK(self.defined(), ValueError, op_, "tensor is undefined");
  if (!grad_enabled()) return;  // the fast path of optimizers and init
  ACCEL_INTERNAL_ASSERT(n <= kMaxOperands);
  // A view made under NoGradGuard does not require grad itself, but writing it in grad mode
  // changes a base that does: that is the ambiguous case refused below.
  const TensorImpl* impl = self.impl();
  const TensorImpl* base = impl->view_base_.get();
  bool any = self.requires_grad() || (base && requires_grad_impl(base));
  for (size_t i = 0; i < n; ++i)
    any = any || (operands[i] && operands[i]->defined() && operands[i]->requires_grad());
  // Integer results carry no gradient: an int buffer copy_'d from a float that requires grad
  // stays a plain tensor.
  if (!any || !self.is_floating_point()) return;
  if (base) {
    ACCEL_CHECK(!impl->view_no_grad_, ValueError, op_,
                "a view made under NoGradGuard is being modified in place with grad mode on (view ",
                self.sizes(), " of a tensor of shape ", base->sizes_,
                "); whether autograd should track the write is ambiguous: make the view and write "
                "both under NoGradGuard (untracked) or both outside it (tracked)");
    ACCEL_CHECK(!(requires_grad_impl(base) && !base->autograd_->grad_fn), ValueError, op_,
                "a view of a leaf tensor that requires grad is being used in an in-place "
                "operation (view ",
                self.sizes(), " of a leaf of shape ", base->sizes_,
                "); write the leaf under NoGradGuard (optimizer steps, init) or clone() it first");
    ACCEL_CHECK(!overlaps(self.sizes(), self.strides()), ValueError, op_,
                "more than one element of the written-to view refers to the same memory location "
                "(shape ",
                self.sizes(), ", strides ", self.strides(),
                "); clone() it before writing in place");
  }
  ACCEL_CHECK(!(self.requires_grad() && self.is_leaf()), ValueError, op_,
              "a leaf tensor that requires grad (shape ", self.sizes(),
              ") is being used in an in-place operation; write it under NoGradGuard (optimizer "
              "steps, init), or use the out-of-place op");
  record_ = true;
  // Through a view, the gradient of self's old value goes to the base by CopySlices instead.
  edges_.reserve(1 + n);
  edges_.push_back(impl->view_base_ ? Edge{} : gradient_edge(self));
  for (size_t i = 0; i < n; ++i) {
    const Tensor* o = operands[i];
    edges_.push_back(o && o->defined() ? gradient_edge(*o) : Edge{});
  }
}

void InplaceOp::rebase(const std::shared_ptr<Node>& node) {
  Tensor& self = *self_;
  TensorImpl* impl = self.impl();
  const bool is_view = bool(impl->view_base_);
  EdgeList& edges = node->mutable_next_edges();
  edges.reserve(edges_.size());
  for (Edge& e : edges_) edges.push_back(std::move(e));
  if (!is_view) {
    set_grad_fn(self.autograd_meta(), node, 0);
    return;
  }
  Tensor base(impl->view_base_);
  auto slices = std::make_shared<CopySlices>(Geometry(base), Geometry(self), node);
  EdgeList& se = slices->mutable_next_edges();
  se.reserve(edges.size());
  se.push_back(gradient_edge(base));
  for (size_t i = 1; i < edges.size(); ++i) se.push_back(edges[i]);
  set_grad_fn(base.autograd_meta(), slices, 0);
  view_grad_fn(self);  // the view's own history, from the base's new one
}

// ---------------- inplace_method ----------------

namespace {

void check_storable(const Tensor& self, const Tensor& r, const char* op) {
  ACCEL_CHECK(r.dtype() == self.dtype(), DTypeError, op, "result dtype ", r.dtype(),
              " cannot be stored in place into a ", self.dtype(), " tensor");
  ACCEL_CHECK(r.sizes() == self.sizes(), ShapeError, op, "result shape ", r.sizes(),
              " differs from the in-place tensor's shape ", self.sizes());
  ACCEL_CHECK(r.device() == self.device(), DeviceError, op, "result on ", r.device(),
              " cannot be stored in place into a tensor on ", self.device());
}

// fn's graph must end at the stand-ins: a tensor that requires grad read by fn but not passed as
// an operand would get its gradient nowhere. Walks only the nodes fn made (sequence numbers from
// `first`), stopping at the stand-ins' nodes; reaching an older node or a leaf's accumulator is
// the author's bug.
void check_closed(const Edge& root, uint64_t first, const std::vector<Tensor>& stand_ins,
                  const char* op) {
  std::vector<const Node*> ends;
  for (const Tensor& t : stand_ins) ends.push_back(t.grad_fn().get());
  std::vector<Node*> stack;
  std::vector<Node*> seen;
  if (root.fn) stack.push_back(root.fn.get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    if (std::find(seen.begin(), seen.end(), n) != seen.end()) continue;
    seen.push_back(n);
    if (std::find(ends.begin(), ends.end(), n) != ends.end()) continue;
    if (auto* acc = dynamic_cast<AccumulateGrad*>(n)) {
      ACCEL_THROW(ValueError, op,
                  "the out-of-place computation read a leaf tensor that requires grad (shape ",
                  acc->leaf().sizes(),
                  ") that is not one of the in-place op's operands; pass it as an operand (Note "
                  "[in-place methods])");
    }
    ACCEL_CHECK(n->sequence_nr() >= first, ValueError, op,
                "the out-of-place computation read a tensor that requires grad (history ",
                n->name(),
                ") that is not one of the in-place op's operands; pass it as an operand (Note "
                "[in-place methods])");
    for (const Edge& e : n->next_edges())
      if (e.fn) stack.push_back(e.fn.get());
  }
}

}  // namespace

Tensor& inplace_method(Tensor& self, const char* op, const std::vector<Tensor>& operands,
                       const InplaceFn& fn, bool reads_self, const InplaceKernel& kernel) {
  ACCEL_CHECK(operands.size() <= InplaceOp::kMaxOperands, ValueError, op, "at most ",
              InplaceOp::kMaxOperands, " operands, got ", operands.size());
  std::array<const Tensor*, InplaceOp::kMaxOperands> ptrs{};
  for (size_t i = 0; i < operands.size(); ++i) ptrs[i] = &operands[i];
  InplaceOp ip(self, op, ptrs.data(), operands.size());
  if (!ip.recording()) {
    if (kernel) {
      kernel(self);
    } else {
      const Tensor r = fn(self, operands);
      check_storable(self, r, op);
      copy_stub(self.device(), self, r);
    }
    ip.commit();
    return self;
  }
  // Stand-ins (Note [stand-ins]): fn's graph ends at them, so the in-place node can run it (Note
  // [in-place methods]), and under create_graph the gradients it returns reach self's old
  // history and the operands'. The old value of self is copied only when fn's backward reads it.
  const uint64_t first = current_sequence_nr();
  std::vector<Tensor> leaves;   // what grad_from_edges differentiates against
  std::vector<size_t> slot_of;  // leaves[k] is the gradient of input slot_of[k] (0: self)
  Tensor s;
  if (self.requires_grad()) {
    s = reads_self ? stand_in_copy(self) : stand_in(self);
    leaves.push_back(s);
    slot_of.push_back(0);
  } else {
    s = reads_self ? copy_of(self) : self.detach();
  }
  std::vector<Tensor> stand = operands;
  for (size_t i = 0; i < stand.size(); ++i) {
    if (!stand[i].defined() || !stand[i].requires_grad()) continue;
    stand[i] = stand_in(stand[i]);
    leaves.push_back(stand[i]);
    slot_of.push_back(i + 1);
  }
  const Tensor r = fn(s, stand);
  check_storable(self, r, op);
  const Edge root = r.requires_grad() ? gradient_edge(r) : Edge{};
  check_closed(root, first, leaves, op);
  copy_stub(self.device(), self, r);
  ip.commit();
  ip.record([root, leaves = std::move(leaves), slot_of = std::move(slot_of),
             n = operands.size() + 1](const Grads& g) {
    Grads out(n);
    if (!root.fn || leaves.empty()) return out;
    // retain_graph: the subgraph lives as long as this node, which frees it on release().
    Grads got = grad_from_edges({root}, {g[0]}, leaves, /*retain_graph=*/true, creating_graph());
    for (size_t k = 0; k < got.size(); ++k) out[slot_of[k]] = std::move(got[k]);
    return out;
  });
  return self;
}

// ---------------- stand-ins and recompute (Note [double backward] in engine.h) ----------------

namespace {
Tensor attach_stand_in(Tensor alias, Edge edge) {
  auto node = make_node<StandIn>();
  node->mutable_next_edges().push_back(std::move(edge));
  AutogradMeta& m = alias.autograd_meta();
  m.requires_grad = true;
  m.grad_fn = std::move(node);
  m.output_nr = 0;
  return alias;
}
}  // namespace

Tensor stand_in(const Tensor& t) { return attach_stand_in(t.detach(), gradient_edge(t)); }
Tensor stand_in_copy(const Tensor& t) { return attach_stand_in(copy_of(t), gradient_edge(t)); }
Tensor stand_in(const Tensor& data, const Edge& edge) {
  return attach_stand_in(data.detach(), edge);
}

Grads recompute_grads(const std::vector<Tensor>& inputs, const Grads& grads,
                      const RecomputeFn& fn) {
  EnableGradGuard grad_on;
  std::vector<Tensor> stand(inputs.size()), leaves;
  std::vector<size_t> slot_of;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    if (x.defined() && x.requires_grad()) {
      stand[i] = stand_in(x);
      leaves.push_back(stand[i]);
      slot_of.push_back(i);
    } else {
      stand[i] = x;
    }
  }
  Grads res(inputs.size());
  if (leaves.empty()) return res;
  const std::vector<Tensor> outs = fn(stand);
  std::vector<Edge> roots;
  std::vector<Tensor> root_grads;
  for (size_t j = 0; j < outs.size() && j < grads.size(); ++j) {
    if (!outs[j].defined() || !outs[j].requires_grad() || !grads[j].defined()) continue;
    roots.push_back(gradient_edge(outs[j]));
    root_grads.push_back(grads[j].dtype() == outs[j].dtype() ? grads[j]
                                                             : grads[j].to(outs[j].dtype()));
  }
  if (roots.empty()) return res;
  // retain_graph: the recomputed graph is part of the graph being recorded (create_graph).
  Grads got = grad_from_edges(roots, std::move(root_grads), leaves, /*retain_graph=*/true,
                              /*create_graph=*/true);
  for (size_t k = 0; k < got.size(); ++k) {
    Tensor gk = std::move(got[k]);
    const Tensor& x = inputs[slot_of[k]];
    if (gk.defined() && gk.dtype() != x.dtype()) gk = gk.to(x.dtype());
    res[slot_of[k]] = std::move(gk);
  }
  return res;
}

}  // namespace accel::autograd
