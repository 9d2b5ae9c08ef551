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
  Geometry base_, view_;
  std::shared_ptr<Node> fn_;
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
// `first`); reaching an older node or another leaf's accumulator is the author's bug.
void check_closed(const Edge& root, uint64_t first, const std::vector<Tensor>& leaves,
                  const char* op) {
  std::vector<Node*> stack;
  std::vector<Node*> seen;
  if (root.fn) stack.push_back(root.fn.get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    if (std::find(seen.begin(), seen.end(), n) != seen.end()) continue;
    seen.push_back(n);
    if (auto* acc = dynamic_cast<AccumulateGrad*>(n)) {
      bool ours = false;
      for (const Tensor& l : leaves) ours = ours || acc->leaf().is_same(l);
      ACCEL_CHECK(ours, ValueError, op,
                  "the out-of-place computation read a leaf tensor that requires grad (shape ",
                  acc->leaf().sizes(),
                  ") that is not one of the in-place op's operands; pass it as an operand (Note "
                  "[in-place methods])");
      continue;
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
  // Stand-ins: fn's graph ends at them, so the in-place node can run it (Note [in-place
  // methods]). The old value of self is copied only when fn's backward reads it.
  const uint64_t first = current_sequence_nr();
  Tensor s = reads_self ? copy_of(self) : self.detach();
  std::vector<Tensor> leaves;   // what grad_from_edges differentiates against
  std::vector<size_t> slot_of;  // leaves[k] is the gradient of input slot_of[k] (0: self)
  if (self.requires_grad()) {
    s.requires_grad_(true);
    leaves.push_back(s);
    slot_of.push_back(0);
  }
  std::vector<Tensor> stand = operands;
  for (size_t i = 0; i < stand.size(); ++i) {
    if (!stand[i].defined() || !stand[i].requires_grad()) continue;
    stand[i] = stand[i].detach().requires_grad_(true);
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
    Grads got = grad_from_edges({root}, {g[0]}, leaves, /*retain_graph=*/true);
    for (size_t k = 0; k < got.size(); ++k) out[slot_of[k]] = std::move(got[k]);
    return out;
  });
  return self;
}

}  // namespace accel::autograd
