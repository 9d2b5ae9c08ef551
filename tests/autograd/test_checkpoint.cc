// Activation checkpointing (autograd/checkpoint.h): gradients bit-identical to the plain run,
// dropout masks and the random stream, nesting, parameters-only segments, hooks, memory, errors.
#include <doctest/doctest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "accel.h"
#include "autograd/autocast.h"
#include "examples/models.h"

using namespace accel;

namespace {

// Same dtype, shape and bytes (== on values would let -0.0 == 0.0 through).
bool bits_equal(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  if (a.dtype() != b.dtype() || a.sizes() != b.sizes()) return false;
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), size_t(ca.numel()) * dtype_size(ca.dtype())) ==
         0;
}

struct RunResult {
  Tensor out;                 // forward output, detached
  std::vector<Tensor> grads;  // grad of x (when it requires grad), then of every parameter
  std::string rng_after;      // default generator after backward
  Tensor next_draw;           // what the random stream gives after backward
};

using BlockFn = std::function<Tensor(const Tensor&)>;

// Seeds, runs loss = sum(f(x) * weights) (+ a dropout after the segment, so the stream between
// forward and backward matters), backward, and collects everything a checkpointed run must match.
RunResult run(const BlockFn& f, const std::vector<Tensor>& params, const Tensor& x,
              bool dropout_after = false) {
  for (Tensor p : params) p.zero_grad();
  Tensor xx = x.requires_grad() ? x.detach().requires_grad_() : x;
  manual_seed(1234);
  Tensor y = f(xx);
  Tensor z = dropout_after ? dropout(y, 0.25, true) : y;
  Tensor w = linspace(-1.0, 1.0, z.numel()).view(z.sizes());
  sum(mul(z, w)).backward();
  RunResult r;
  r.out = y.detach();
  if (xx.requires_grad()) r.grads.push_back(xx.grad());
  for (const Tensor& p : params) r.grads.push_back(p.grad());
  r.rng_after = default_generator().state();
  r.next_draw = rand({16});
  return r;
}

void check_same(const RunResult& plain, const RunResult& ckpt) {
  CHECK(bits_equal(plain.out, ckpt.out));
  REQUIRE(plain.grads.size() == ckpt.grads.size());
  for (size_t i = 0; i < plain.grads.size(); ++i) {
    INFO("gradient ", i);
    REQUIRE(plain.grads[i].defined());
    CHECK(bits_equal(plain.grads[i], ckpt.grads[i]));
  }
  CHECK(plain.rng_after == ckpt.rng_after);
  CHECK(bits_equal(plain.next_draw, ckpt.next_draw));
}

BlockFn checkpointed(BlockFn f) {
  return [f](const Tensor& x) { return autograd::checkpoint(f, x); };
}

struct MlpBlock {
  std::shared_ptr<nn::Linear> fc1, fc2;
  std::shared_ptr<nn::Dropout> drop;
  MlpBlock(int64_t d, int64_t hidden, double p, Generator* gen)
      : fc1(std::make_shared<nn::Linear>(d, hidden, true, gen)),
        fc2(std::make_shared<nn::Linear>(hidden, d, true, gen)),
        drop(std::make_shared<nn::Dropout>(p)) {}
  Tensor forward(const Tensor& x) const {
    return fc2->forward(drop->forward(gelu(fc1->forward(x)))) + x;
  }
  std::vector<Tensor> parameters() const {
    return {fc1->weight, fc1->bias, fc2->weight, fc2->bias};
  }
};

}  // namespace

TEST_CASE("checkpoint: MLP block gradients are bit-identical") {
  Generator gen(7);
  MlpBlock block(24, 96, 0.0, &gen);
  const Tensor x = randn({6, 24}, {}, &gen).requires_grad_();
  BlockFn f = [&](const Tensor& in) { return block.forward(in); };
  RunResult plain = run(f, block.parameters(), x);
  RunResult ckpt = run(checkpointed(f), block.parameters(), x);
  check_same(plain, ckpt);
}

TEST_CASE("checkpoint: the forward keeps no graph of the segment, the output gets one node") {
  Generator gen(8);
  MlpBlock block(8, 16, 0.0, &gen);
  const Tensor x = randn({2, 8}, {}, &gen).requires_grad_();
  Tensor y = autograd::checkpoint([&](const Tensor& in) { return block.forward(in); }, x);
  REQUIRE(y.grad_fn() != nullptr);
  CHECK(std::string(y.grad_fn()->name()) == "checkpoint");
  // Its one edge leads straight to x's accumulator: nothing of the segment was recorded.
  REQUIRE(y.grad_fn()->next_edges().size() == 1);
  CHECK(std::string(y.grad_fn()->next_edges()[0].fn->name()) == "AccumulateGrad");
}

TEST_CASE("checkpoint: dropout draws the same mask and the random stream is not shifted") {
  Generator gen(9);
  MlpBlock block(16, 64, 0.4, &gen);
  const Tensor x = randn({5, 16}, {}, &gen).requires_grad_();
  BlockFn f = [&](const Tensor& in) { return block.forward(in); };
  RunResult plain = run(f, block.parameters(), x, /*dropout_after=*/true);
  RunResult ckpt = run(checkpointed(f), block.parameters(), x, /*dropout_after=*/true);
  check_same(plain, ckpt);
  // The dropout inside is live: about 40 % of the hidden units of the output are dropped.
  const Tensor h = gelu(block.fc1->forward(x.detach()));
  manual_seed(1234);
  const double kept = block.drop->forward(h).ne(0.0).to(kFloat32).mean().item();
  CHECK(kept > 0.4);
  CHECK(kept < 0.8);
}

TEST_CASE("checkpoint: randn inside the segment (cached Box-Muller value) draws the same noise") {
  // randn of an odd count leaves half a Box-Muller pair cached in the generator: the recompute
  // must start from that cached value too, not only from the engine's state.
  Generator gen(20);
  Tensor w = randn({5}, {}, &gen).requires_grad_();
  const Tensor x = randn({5}, {}, &gen).requires_grad_();
  BlockFn f = [&](const Tensor& in) { return in * w + randn({5}) * in; };
  for (const bool cached : {false, true}) {
    auto once = [&](bool ckpt) {
      w.zero_grad();
      Tensor xx = x.detach().requires_grad_();
      default_generator().set_state(Generator(77).state());  // empty cache (manual_seed keeps it)
      if (cached) (void)randn({1});
      Tensor y = ckpt ? autograd::checkpoint(f, xx) : f(xx);
      Tensor between = randn({3});  // the stream moves on between forward and backward
      sum(y * linspace(-1.0, 1.0, 5)).backward();
      return std::vector<Tensor>{y.detach(), xx.grad(), w.grad(), between, randn({7})};
    };
    INFO("cached normal before the forward: ", cached);
    const std::vector<Tensor> plain = once(false), ck = once(true);
    for (size_t i = 0; i < plain.size(); ++i) {
      INFO("tensor ", i);
      CHECK(bits_equal(plain[i], ck[i]));
    }
  }
}

TEST_CASE("checkpoint: GPT block (layer norm, attention, GELU) gradients are bit-identical") {
  Generator gen(10);
  models::GptConfig c;
  c.context = 16;
  c.layers = 1;
  c.heads = 2;
  c.d_model = 32;
  auto block = std::make_shared<models::GptBlock>(c, &gen);
  const Tensor x = randn({2, 12, 32}, {}, &gen).requires_grad_();
  BlockFn f = [&](const Tensor& in) { return block->forward(in); };
  RunResult plain = run(f, block->parameters(), x);
  RunResult ckpt = run(checkpointed(f), block->parameters(), x);
  check_same(plain, ckpt);

  SUBCASE("under bf16 autocast, with the backward outside the autocast region") {
    BlockFn fa = [&](const Tensor& in) {
      AutocastGuard ac(true, kBFloat16);
      return block->forward(in);
    };
    BlockFn fa_ckpt = [&](const Tensor& in) {
      AutocastGuard ac(true, kBFloat16);
      return autograd::checkpoint(f, in);  // f itself does not open autocast: the node must
    };
    RunResult plain_ac = run(fa, block->parameters(), x);
    RunResult ckpt_ac = run(fa_ckpt, block->parameters(), x);
    CHECK_FALSE(bits_equal(plain_ac.out, plain.out));  // autocast did change the numbers
    check_same(plain_ac, ckpt_ac);
  }
}

TEST_CASE("checkpoint: nested checkpoints give bit-identical gradients") {
  Generator gen(11);
  MlpBlock a(16, 32, 0.3, &gen), b(16, 32, 0.3, &gen), c(16, 32, 0.0, &gen);
  std::vector<Tensor> params = a.parameters();
  for (const auto& blk : {&b, &c})
    for (const Tensor& p : blk->parameters()) params.push_back(p);
  const Tensor x = randn({4, 16}, {}, &gen).requires_grad_();
  auto inner = [&](const Tensor& h) { return b.forward(h); };
  BlockFn plain_f = [&](const Tensor& in) { return c.forward(inner(a.forward(in))); };
  BlockFn nested_f = [&](const Tensor& in) {
    return autograd::checkpoint(
        [&](const Tensor& h) { return c.forward(autograd::checkpoint(inner, a.forward(h))); }, in);
  };
  RunResult plain = run(plain_f, params, x, /*dropout_after=*/true);
  RunResult nested = run(nested_f, params, x, /*dropout_after=*/true);
  check_same(plain, nested);
}

TEST_CASE("checkpoint: an input without grad, parameters with grad") {
  Generator gen(12);
  MlpBlock block(12, 48, 0.2, &gen);
  const Tensor x = randn({3, 12}, {}, &gen);  // does not require grad
  BlockFn f = [&](const Tensor& in) { return block.forward(in); };
  RunResult plain = run(f, block.parameters(), x, /*dropout_after=*/true);
  RunResult ckpt = run(checkpointed(f), block.parameters(), x, /*dropout_after=*/true);
  REQUIRE(plain.grads.size() == 4);
  check_same(plain, ckpt);

  // The probe's graph is dropped: the output's grad_fn is the checkpoint node.
  Tensor y = autograd::checkpoint(f, x);
  REQUIRE(y.grad_fn() != nullptr);
  CHECK(std::string(y.grad_fn()->name()) == "checkpoint");

  SUBCASE("integer input (token ids) into an embedding") {
    auto emb = std::make_shared<nn::Embedding>(10, 8, &gen);
    const Tensor idx = tensor(std::vector<int64_t>{1, 4, 4, 9, 0, 2}, {2, 3});
    BlockFn fe = [&](const Tensor& in) { return gelu(emb->forward(in)); };
    check_same(run(fe, emb->parameters(), idx), run(checkpointed(fe), emb->parameters(), idx));
  }
}

TEST_CASE("checkpoint: nothing to differentiate or no grad mode just calls fn") {
  Generator gen(13);
  MlpBlock block(8, 8, 0.0, &gen);
  int calls = 0;
  BlockFn f = [&](const Tensor& in) {
    ++calls;
    return block.forward(in);
  };
  const Tensor x = randn({2, 8}, {}, &gen);
  {
    NoGradGuard ng;
    Tensor y = autograd::checkpoint(f, x.detach().requires_grad_());
    CHECK_FALSE(y.requires_grad());
    CHECK(calls == 1);
  }
  for (Tensor p : block.parameters()) p.requires_grad_(false);
  Tensor y = autograd::checkpoint(f, x);
  CHECK_FALSE(y.requires_grad());
  CHECK(y.grad_fn() == nullptr);
  CHECK(calls == 2);
  CHECK(bits_equal(y, block.forward(x)));
}

TEST_CASE("checkpoint: post-accumulate hooks of parameters fire once per backward") {
  Generator gen(14);
  MlpBlock a(8, 16, 0.0, &gen), b(8, 16, 0.0, &gen);
  std::vector<Tensor> params = a.parameters();
  for (const Tensor& p : b.parameters()) params.push_back(p);
  std::vector<int> fired(params.size(), 0);
  std::vector<bool> grad_seen(params.size(), false);
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].register_post_accumulate_grad_hook([&fired, &grad_seen, i](Tensor& p) {
      ++fired[i];
      grad_seen[i] = p.grad().defined();
    });
  }
  const Tensor x = randn({3, 8}, {}, &gen).requires_grad_();
  for (int step = 1; step <= 2; ++step) {
    Tensor h = autograd::checkpoint([&](const Tensor& in) { return a.forward(in); }, x);
    Tensor y = autograd::checkpoint([&](const Tensor& in) { return b.forward(in); }, h);
    sum(y).backward();
    for (size_t i = 0; i < params.size(); ++i) {
      INFO("parameter ", i, " step ", step);
      CHECK(fired[i] == step);
      CHECK(grad_seen[i]);
    }
  }
}

TEST_CASE("checkpoint: several inputs and outputs") {
  Generator gen(15);
  auto lin = std::make_shared<nn::Linear>(6, 6, true, &gen);
  const Tensor a0 = randn({4, 6}, {}, &gen).requires_grad_();
  const Tensor b0 = randn({4, 6}, {}, &gen);  // no grad
  const Tensor c0 = randn({4, 6}, {}, &gen).requires_grad_();
  autograd::CheckpointFn f = [&](const std::vector<Tensor>& in) {
    Tensor h = lin->forward(in[0] * in[1]) + in[2];
    return std::vector<Tensor>{tanh(h), h.sum(), argmax(h, 1)};
  };
  auto once = [&](bool ckpt) {
    lin->zero_grad();
    Tensor a = a0.detach().requires_grad_(), c = c0.detach().requires_grad_();
    std::vector<Tensor> outs = ckpt ? autograd::checkpoint(f, {a, b0, c}) : f({a, b0, c});
    CHECK_FALSE(outs[2].requires_grad());  // integer output
    (sum(outs[0] * outs[0]) + outs[1] * 0.5).backward();
    return std::vector<Tensor>{a.grad(), c.grad(), lin->weight.grad(), lin->bias.grad()};
  };
  std::vector<Tensor> plain = once(false), ck = once(true);
  for (size_t i = 0; i < plain.size(); ++i) {
    INFO("gradient ", i);
    CHECK(bits_equal(plain[i], ck[i]));
  }
}

TEST_CASE("checkpoint: fn returning its input or a parameter leaves their history alone") {
  Generator gen(16);
  const Tensor w = randn({3}, {}, &gen).requires_grad_();
  const Tensor x = randn({3}, {}, &gen).requires_grad_();
  Tensor y = autograd::checkpoint([](const Tensor& in) { return in; }, x);
  CHECK(x.is_leaf());
  CHECK(y.grad_fn() != nullptr);
  Tensor v = autograd::checkpoint([&](const Tensor&) { return w; }, x);
  CHECK(w.is_leaf());
  sum(mul(y, 2.0) + v).backward();
  CHECK(x.grad().tolist() == std::vector<double>{2, 2, 2});
  CHECK(w.grad().tolist() == std::vector<double>{1, 1, 1});
}

TEST_CASE("checkpoint: retain_graph recomputes again; without it a second backward throws") {
  Generator gen(17);
  MlpBlock block(8, 8, 0.0, &gen);
  const Tensor x = randn({2, 8}, {}, &gen).requires_grad_();
  Tensor y = sum(autograd::checkpoint([&](const Tensor& in) { return block.forward(in); }, x));
  y.backward({}, /*retain_graph=*/true);
  const Tensor g1 = x.grad().clone();
  y.backward();
  CHECK(allclose(x.grad(), mul(g1, 2.0)));
  CHECK_THROWS_AS(y.backward(), ValueError);
}

TEST_CASE("checkpoint: a chain of segments keeps fewer live bytes after the forward") {
  Allocator* alloc = get_allocator(kCPU);
  Generator gen(18);
  constexpr int kSegments = 6;
  std::vector<std::shared_ptr<nn::Linear>> layers;
  for (int i = 0; i < 2 * kSegments; ++i)
    layers.push_back(std::make_shared<nn::Linear>(128, 128, true, &gen));
  Tensor x = randn({64, 128}, {}, &gen).requires_grad_();
  auto segment = [&](int s) {
    return BlockFn([&, s](const Tensor& in) {
      Tensor h = gelu(layers[size_t(2 * s)]->forward(in));
      return tanh(layers[size_t(2 * s + 1)]->forward(h)) + in;
    });
  };
  struct Bytes {
    size_t live = 0, peak = 0;
  };
  auto forward_bytes = [&](bool ckpt) {
    for (auto& l : layers) l->zero_grad();
    Bytes b;
    Tensor loss;
    {
      const size_t before = alloc->stats().bytes_in_use;
      alloc->reset_peak_stats();
      Tensor h = x;
      for (int s = 0; s < kSegments; ++s)
        h = ckpt ? autograd::checkpoint(segment(s), h) : segment(s)(h);
      loss = sum(h);
      b.live = alloc->stats().bytes_in_use - before;
      b.peak = alloc->stats().peak_bytes_in_use - before;
    }
    loss.backward();
    CHECK(x.grad().defined());
    x.zero_grad();
    return b;
  };
  const Bytes plain = forward_bytes(false);
  const Bytes ckpt = forward_bytes(true);
  MESSAGE("live bytes after forward: plain ", plain.live, ", checkpointed ", ckpt.live,
          "; forward peak: plain ", plain.peak, ", checkpointed ", ckpt.peak);
  // Per segment the plain graph keeps ~4 activations of 64x128 floats, checkpointing 1-2.
  CHECK(ckpt.live * 2 < plain.live);
  CHECK(ckpt.peak < plain.peak);
}

TEST_CASE("checkpoint: errors") {
  Generator gen(19);
  const Tensor x = randn({3}, {}, &gen).requires_grad_();
  SUBCASE("fn returns an undefined tensor") {
    auto undefined = [](const Tensor&) { return Tensor(); };
    CHECK_THROWS_WITH_AS(autograd::checkpoint(undefined, x), doctest::Contains("undefined"),
                         ValueError);
    CHECK_THROWS_AS(autograd::checkpoint(undefined, x.detach()), ValueError);
    NoGradGuard ng;
    CHECK_THROWS_AS(autograd::checkpoint(undefined, x), ValueError);
  }
  SUBCASE("fn returns a tensor that depends on nothing") {
    Tensor y = autograd::checkpoint([](const Tensor&) { return zeros({3}); }, x);
    CHECK_THROWS_WITH_AS(sum(y).backward(), doctest::Contains("depends on"), ValueError);
  }
  SUBCASE("an input modified in place before the backward") {
    Tensor h = x * 1.0;
    Tensor y = autograd::checkpoint([](const Tensor& in) { return in * in; }, h);
    {
      NoGradGuard ng;
      h.add_(ones({3}));
    }
    CHECK_THROWS_WITH_AS(sum(y).backward(), doctest::Contains("modified in place"), ValueError);
  }
  SUBCASE("fn computes something else on the recompute") {
    int calls = 0;
    Tensor y = autograd::checkpoint(
        [&](const Tensor& in) {
          return ++calls == 1 ? in * 2.0 : cat({in, in}, 0);
        },
        x);
    CHECK_THROWS_WITH_AS(sum(y).backward(), doctest::Contains("same thing"), ValueError);
  }
  SUBCASE("empty fn") {
    CHECK_THROWS_AS(autograd::checkpoint(std::function<Tensor(const Tensor&)>(), x), ValueError);
  }
}

TEST_CASE("checkpoint: autograd::grad through a segment gives the inputs' gradients") {
  Generator gen(21);
  MlpBlock block(8, 16, 0.0, &gen);
  const Tensor x = randn({2, 8}, {}, &gen).requires_grad_();
  BlockFn f = [&](const Tensor& in) { return block.forward(in); };
  const Tensor plain = autograd::grad({sum(f(x))}, {x})[0];
  const Tensor ck = autograd::grad({sum(autograd::checkpoint(f, x))}, {x})[0];
  CHECK(bits_equal(plain, ck));
  // Documented limit: parameters inside the segment are not reachable from the outer graph.
  for (Tensor p : block.parameters()) p.zero_grad();
  CHECK_THROWS_WITH_AS(autograd::grad({sum(autograd::checkpoint(f, x))}, {block.fc1->weight}),
                       doctest::Contains("not used"), ValueError);
}

TEST_CASE("checkpoint: GPT training with checkpointed blocks follows the plain run bit for bit") {
  models::GptConfig c;
  c.context = 16;
  c.layers = 2;
  c.heads = 2;
  c.d_model = 32;
  auto train = [&](bool ckpt) {
    Generator gen(22);
    models::Gpt model(c, &gen);
    optim::AdamW opt(model.parameters());
    std::vector<double> losses;
    for (int step = 0; step < 3; ++step) {
      const Tensor idx = randint(0, c.vocab, {2, 12}, TensorOptions(kInt64), &gen);
      const Tensor targets = randint(0, c.vocab, {2, 12}, TensorOptions(kInt64), &gen);
      Tensor x = model.tok->forward(idx) + model.pos->forward(arange(12));
      for (const auto& b : *model.blocks) {
        BlockFn f = [b](const Tensor& in) { return b->forward(in); };
        x = ckpt ? autograd::checkpoint(f, x) : f(x);
      }
      Tensor loss = models::lm_loss(model.head->forward(model.ln_f->forward(x)), targets);
      opt.zero_grad();
      loss.backward();
      opt.step();
      losses.push_back(loss.item());
    }
    return std::make_pair(losses, model.parameters());
  };
  const auto [plain_losses, plain_params] = train(false);
  const auto [ck_losses, ck_params] = train(true);
  CHECK(plain_losses == ck_losses);
  REQUIRE(plain_params.size() == ck_params.size());
  for (size_t i = 0; i < plain_params.size(); ++i) {
    INFO("parameter ", i);
    CHECK(bits_equal(plain_params[i], ck_params[i]));
  }
}

TEST_CASE("checkpoint: checkpoint_recomputing() tells the recompute from the first forward") {
  const Tensor x = ones({2}).requires_grad_();
  std::vector<bool> seen;
  BlockFn f = [&](const Tensor& in) {
    seen.push_back(autograd::checkpoint_recomputing());
    return in * 3.0;
  };
  CHECK_FALSE(autograd::checkpoint_recomputing());
  Tensor y = autograd::checkpoint(f, x);
  sum(y).backward();
  CHECK(seen == std::vector<bool>{false, true});
  CHECK_FALSE(autograd::checkpoint_recomputing());
  // Nested: the inner fn runs plainly inside the outer recompute (true), then is recomputed
  // itself (true), and the outer backward is over (false).
  seen.clear();
  Tensor z = autograd::checkpoint([&](const Tensor& in) { return autograd::checkpoint(f, in); }, x);
  sum(z).backward();
  CHECK(seen == std::vector<bool>{false, true, true});
  CHECK_FALSE(autograd::checkpoint_recomputing());
}
