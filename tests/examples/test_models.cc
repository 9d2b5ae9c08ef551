// The reference models of examples/models.h: the sizes WORKLOADS.md fixes, output shapes, the
// GPT's causality, and that each one can fit a small batch (its gradients reach every layer).
#include <doctest.h>

#include <string>

#include "accel.h"
#include "examples/models.h"

using namespace accel;

namespace {

bool has_name(const nn::Module& m, const std::string& name) {
  for (const auto& [n, p] : m.named_parameters())
    if (n == name) return true;
  return false;
}

// AdamW steps on one fixed batch; returns (first loss, last loss).
template <typename F>
std::pair<double, double> fit(nn::Module& model, int steps, double lr, F&& loss_fn) {
  optim::AdamWOptions o;
  o.lr(lr);
  optim::AdamW opt(model.parameters(), o);
  double first = 0, last = 0;
  for (int i = 0; i < steps; ++i) {
    Tensor loss = loss_fn();
    loss.backward();
    opt.step();
    opt.zero_grad();
    (i == 0 ? first : last) = loss.item();
  }
  return {first, last};
}

}  // namespace

TEST_CASE("mlp: 784-1024-1024-10 with 1,863,690 parameters") {
  manual_seed(1);
  models::Mlp m;
  CHECK(m.num_parameters() == 784 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 10 + 10);
  CHECK(m.num_parameters() == 1863690);
  Tensor x = rand({4, 784});
  CHECK(m.forward(x).sizes() == Shape{4, 10});
  CHECK_THROWS_AS(m.forward(rand({4, 783})), ShapeError);
}

TEST_CASE("cnn: conv 1->32, conv 32->64, 3136->128->10") {
  manual_seed(2);
  models::Cnn m;
  CHECK(m.conv1->weight.sizes() == Shape{32, 1, 3, 3});
  CHECK(m.conv2->weight.sizes() == Shape{64, 32, 3, 3});
  CHECK(m.fc1->weight.sizes() == Shape{128, 3136});
  CHECK(m.num_parameters() == (32 * 9 + 32) + (64 * 32 * 9 + 64) + (3136 * 128 + 128) + 1290);
  CHECK(m.forward(rand({2, 1, 28, 28})).sizes() == Shape{2, 10});
}

TEST_CASE("gpt: exactly 875,264 parameters, untied head without bias") {
  manual_seed(3);
  models::Gpt g;
  CHECK(g.num_parameters() == models::Gpt::kExpectedParameters);
  CHECK(g.num_parameters() == 875264);
  CHECK(has_name(g, "blocks.3.attn.qkv.weight"));
  CHECK(has_name(g, "blocks.0.fc_out.bias"));
  CHECK(has_name(g, "head.weight"));
  CHECK_FALSE(has_name(g, "head.bias"));
  // Untied: the head is its own tensor, not the token embedding.
  CHECK(g.head->weight.data_ptr() != g.tok->weight.data_ptr());
  CHECK(g.blocks->size() == 4);
}

TEST_CASE("gpt: shapes, context limit and errors") {
  manual_seed(4);
  models::Gpt g;
  Tensor idx = randint(0, 256, {2, 16});
  CHECK(g.forward(idx).sizes() == Shape{2, 16, 256});
  CHECK(g.forward(randint(0, 256, {1, 128})).sizes() == Shape{1, 128, 256});
  try {
    g.forward(randint(0, 256, {1, 129}));
    FAIL("a window longer than the context must throw");
  } catch (const ShapeError& e) {
    const std::string what = e.what();
    CHECK(what.find("[Gpt]") != std::string::npos);
    CHECK(what.find("(1, 129)") != std::string::npos);
  }
  CHECK_THROWS_AS(g.forward(randint(0, 256, {16})), ShapeError);
  CHECK_THROWS_AS(g.forward(randint(256, 300, {1, 4})), IndexError);  // bytes only
}

TEST_CASE("gpt: position t sees only positions <= t") {
  manual_seed(5);
  models::Gpt g;
  NoGradGuard ng;
  g.eval();
  Tensor a = randint(0, 256, {1, 32});
  Tensor b = a.clone();
  b.data<int64_t>()[20] = (a.data<int64_t>()[20] + 1) % 256;  // change byte 20 only
  const Tensor la = g.forward(a), lb = g.forward(b);
  CHECK(allclose(la.narrow(1, 0, 20), lb.narrow(1, 0, 20), 0, 1e-6));  // the past: unchanged
  CHECK_FALSE(allclose(la.narrow(1, 20, 1), lb.narrow(1, 20, 1), 1e-4, 1e-4));
}

TEST_CASE("each model fits one small batch") {
  SUBCASE("mlp") {
    manual_seed(6);
    models::Mlp m;
    Tensor x = rand({16, 784}), y = randint(0, 10, {16});
    auto [first, last] = fit(m, 30, 1e-3, [&] { return cross_entropy(m.forward(x), y); });
    CHECK(first > 1.5);
    CHECK(last < 0.1 * first);
  }
  SUBCASE("cnn") {
    manual_seed(7);
    models::Cnn m;
    Tensor x = rand({8, 1, 28, 28}), y = randint(0, 10, {8});
    auto [first, last] = fit(m, 40, 3e-3, [&] { return cross_entropy(m.forward(x), y); });
    CHECK(first > 1.5);
    CHECK(last < 0.1 * first);
  }
  SUBCASE("gpt") {
    manual_seed(8);
    models::Gpt g;
    Tensor seq = randint(0, 256, {2, 17});
    Tensor x = seq.narrow(1, 0, 16).contiguous(), y = seq.narrow(1, 1, 16).contiguous();
    auto [first, last] = fit(g, 40, 3e-3, [&] { return models::lm_loss(g.forward(x), y); });
    CHECK(first > 4.0);  // near log(256) = 5.55 at initialisation (N(0, 1) embeddings)
    CHECK(last < 0.5 * first);
  }
}
