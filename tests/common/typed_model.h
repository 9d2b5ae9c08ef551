// A model whose pieces have PyTorch-style signatures (Note [module calls] in
// nn/module.h), for the tests that train it under every strategy against one process
// (ddp_worker, fsdp_worker, accel_worker):
//   root     TypedNet::forward(x, optional ctx) -> HeadOut {logits, aux}   (a struct)
//   blocks   ModuleList: PairBlock, PairBlock (two inputs, an optional mask, a double; a tuple
//            out), PairHead (an optional input; a struct out): under ZeRO-3 each is a unit
//   tie      (tie = true) block 1's fc.weight is block 0's (set_parameter): a parameter shared
//            by two units, which ZeRO-3 keeps in the root unit
// The blocks are called three ways: the typed operator() of the module (at<M>(i)), the entry's
// call<R>() (a Module pointer), and the typed operator() again for the struct result.
#pragma once

#include <memory>
#include <optional>
#include <tuple>

#include "nn/container.h"
#include "nn/linear.h"
#include "nn/norm.h"
#include "autograd/ops.h"
#include "core/generator.h"

namespace accel::test {

constexpr int64_t kTypedIn = 6, kTypedHidden = 8, kTypedClasses = 3;

struct PairBlock : nn::TypedModule<PairBlock> {
  std::shared_ptr<nn::LayerNorm> ln;
  std::shared_ptr<nn::Linear> fc, gate;
  explicit PairBlock(Generator* g) {
    ln = register_module("ln", std::make_shared<nn::LayerNorm>(kTypedHidden));
    fc = register_module("fc", std::make_shared<nn::Linear>(kTypedHidden, kTypedHidden, true, g));
    gate =
        register_module("gate", std::make_shared<nn::Linear>(kTypedHidden, kTypedHidden, false, g));
  }
  // x, ctx: (B, H) -> (x + f(x) [* mask] * scale, ctx + tanh(gate x))
  std::tuple<Tensor, Tensor> forward(const Tensor& x, const Tensor& ctx,
                                     std::optional<Tensor> mask = std::nullopt,
                                     double scale = 1.0) {
    Tensor h = gelu(fc->forward(ln->forward(x))) * scale;
    if (mask) h = h * *mask;
    return {x + h, ctx + tanh(gate->forward(x))};
  }
};

struct HeadOut {
  Tensor logits, aux;
};

struct PairHead : nn::TypedModule<PairHead> {
  std::shared_ptr<nn::Linear> out;
  explicit PairHead(Generator* g) {
    out =
        register_module("out", std::make_shared<nn::Linear>(kTypedHidden, kTypedClasses, true, g));
  }
  // x: (B, H), ctx: (B, H) or None -> logits (B, C), aux () = mean square of the features
  HeadOut forward(Tensor x, std::optional<Tensor> ctx = std::nullopt) {
    Tensor h = ctx ? x + *ctx : x;
    return {out->forward(h), mean(h * h)};
  }
};

struct TypedNet : nn::TypedModule<TypedNet> {
  std::shared_ptr<nn::Linear> stem;
  std::shared_ptr<nn::ModuleList> blocks;
  // default_gen: draw from the default generator (what deferred init replays).
  bool reuse = false;  // run block 0 twice (a unit called twice in one forward)
  explicit TypedNet(bool tie = true, bool default_gen = false) {
    Generator own(29);
    Generator* g = default_gen ? nullptr : &own;
    stem = register_module("stem", std::make_shared<nn::Linear>(kTypedIn, kTypedHidden, true, g));
    blocks = register_module("blocks", std::make_shared<nn::ModuleList>());
    blocks->push_back(std::make_shared<PairBlock>(g));
    blocks->push_back(std::make_shared<PairBlock>(g));
    blocks->push_back(std::make_shared<PairHead>(g));
    if (tie) {
      auto b0 = blocks->at<PairBlock>(0), b1 = blocks->at<PairBlock>(1);
      b1->fc->weight = b1->fc->set_parameter("weight", b0->fc->weight);
    }
  }
  HeadOut forward(const Tensor& x, std::optional<Tensor> ctx0 = std::nullopt) {
    Tensor h = stem->forward(x);
    Tensor ctx = ctx0 ? *ctx0 : h * 0.5;
    auto [h1, c1] = (*blocks->at<PairBlock>(0))(h, ctx);
    if (reuse) std::tie(h1, c1) = (*blocks->at<PairBlock>(0))(h1, c1, std::nullopt, 0.25);
    Tensor mask = sigmoid(h1.detach());
    auto [h2, c2] = (*blocks)[1]->call<std::tuple<Tensor, Tensor>>(h1, c1, mask, 0.5);
    return (*blocks->at<PairHead>(2))(h2, c2);
  }
};

inline Tensor typed_loss(const HeadOut& o, const Tensor& y) {
  return cross_entropy(o.logits.to(kFloat32), y) + o.aux.to(kFloat32) * 0.1;
}

}  // namespace accel::test
