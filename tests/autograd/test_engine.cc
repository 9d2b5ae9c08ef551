// Autograd engine: accumulation, retain_graph, hooks, no-grad, detach, autograd::grad.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "accel.h"
#include "autograd/engine.h"

using namespace accel;

TEST_CASE("backward accumulates into leaves") {
  Tensor x = tensor({1.f, 2.f, 3.f}).requires_grad_();
  Tensor y = sum(mul(x, x));
  y.backward();
  CHECK(x.grad().tolist() == std::vector<double>{2, 4, 6});
  Tensor z = sum(mul(x, 3.0));
  z.backward();
  CHECK(x.grad().tolist() == std::vector<double>{5, 7, 9});
  x.zero_grad();
  CHECK_FALSE(x.grad().defined());
}

TEST_CASE("a tensor used twice gets both gradients") {
  Tensor x = tensor({2.f}).requires_grad_();
  Tensor y = add(mul(x, x), x);  // dy/dx = 2x + 1
  y.sum().backward();
  CHECK(x.grad().item() == 5.0);
}

TEST_CASE("second backward needs retain_graph") {
  Tensor x = tensor({1.f, 2.f}).requires_grad_();
  Tensor y = sum(exp(x));
  y.backward({}, true);
  Tensor g1 = x.grad().clone();
  y.backward();
  CHECK(allclose(x.grad(), mul(g1, 2.0)));
  CHECK_THROWS_AS(y.backward(), ValueError);
}

TEST_CASE("no-grad records nothing; detach cuts history") {
  Tensor x = ones({2}).requires_grad_();
  {
    NoGradGuard ng;
    Tensor y = mul(x, 2.0);
    CHECK_FALSE(y.requires_grad());
  }
  Tensor d = mul(x, 2.0).detach();
  CHECK_FALSE(d.requires_grad());
  CHECK(d.is_leaf());
  CHECK(mul(x, 2.0).grad_fn() != nullptr);
  CHECK_THROWS_AS(d.sum().backward(), ValueError);
}

TEST_CASE("non-scalar backward needs a gradient") {
  Tensor x = ones({3}).requires_grad_();
  Tensor y = mul(x, 2.0);
  CHECK_THROWS_AS(y.backward(), ShapeError);
  y.backward(tensor({1.f, 0.f, 2.f}));
  CHECK(x.grad().tolist() == std::vector<double>{2, 0, 4});
  CHECK_THROWS_AS(mul(x, 2.0).backward(ones({2})), ShapeError);
}

TEST_CASE("hooks: leaf hook rewrites, post-accumulate hook fires, non-leaf hook sees grad") {
  Tensor x = ones({2}).requires_grad_();
  x.register_hook([](const Tensor& g) { return mul(g, 10.0); });
  int fired = 0;
  x.register_post_accumulate_grad_hook([&](Tensor& t) {
    ++fired;
    CHECK(t.grad().defined());
  });
  Tensor h = mul(x, 3.0);
  Tensor seen;
  h.register_hook([&](const Tensor& g) {
    seen = g.clone();
    return Tensor();
  });
  h.sum().backward();
  CHECK(fired == 1);
  CHECK(seen.tolist() == std::vector<double>{1, 1});
  CHECK(x.grad().tolist() == std::vector<double>{30, 30});
}

TEST_CASE("retain_grad keeps a non-leaf gradient") {
  Tensor x = ones({2}).requires_grad_();
  Tensor h = mul(x, 3.0);
  h.retain_grad();
  mul(h, h).sum().backward();
  CHECK(h.grad().tolist() == std::vector<double>{6, 6});
}

TEST_CASE("autograd::grad leaves .grad alone") {
  Tensor x = tensor({1.f, 2.f}).requires_grad_();
  Tensor w = tensor({3.f, 4.f}).requires_grad_();
  Tensor y = sum(mul(x, w));
  auto g = autograd::grad({y}, {x});
  CHECK(g[0].tolist() == std::vector<double>{3, 4});
  CHECK_FALSE(x.grad().defined());
  CHECK_FALSE(w.grad().defined());
}

TEST_CASE("backward order: later nodes first (DDP bucket order)") {
  Tensor a = ones({1}).requires_grad_(), b = ones({1}).requires_grad_();
  std::vector<char> order;
  a.register_post_accumulate_grad_hook([&](Tensor&) { order.push_back('a'); });
  b.register_post_accumulate_grad_hook([&](Tensor&) { order.push_back('b'); });
  Tensor h = mul(a, 2.0);       // first layer
  Tensor out = mul(exp(h), b);  // second layer
  out.sum().backward();
  REQUIRE(order.size() == 2);
  CHECK(order[0] == 'b');
  CHECK(order[1] == 'a');
}

TEST_CASE("gradient flows through views and dtype conversion") {
  Tensor x = arange(0.0, 6.0, 1.0, kFloat32).reshape({2, 3}).requires_grad_();
  Tensor y = x.t().select(0, 1).to(kFloat64);  // column 1
  y.sum().backward();
  CHECK(x.grad().tolist() == std::vector<double>{0, 1, 0, 0, 1, 0});
}

// Note [end-of-backward callbacks] (autograd/engine.h): what DDP and ZeRO hang their waits on.
TEST_CASE("queue_callback: runs once the outermost backward ends, also when it fails") {
  Tensor x = tensor({1.f, 2.f}).requires_grad_();
  std::vector<std::string> log;
  x.register_post_accumulate_grad_hook([&](Tensor&) {
    log.push_back("grad");
    autograd::queue_callback([&](bool ok) {
      CHECK_FALSE(autograd::backward_running());
      CHECK(x.grad().defined());  // the backward is over
      log.push_back(ok ? "callback ok" : "callback failed");
    });
  });
  sum(mul(x, x)).backward();
  CHECK(log == std::vector<std::string>{"grad", "callback ok"});
  // Not inside a backward: refused.
  CHECK_THROWS_AS(autograd::queue_callback([](bool) {}), ValueError);
  // An activation checkpoint's recompute runs a backward inside the backward: the callback still
  // waits for the outer one (it would otherwise see the other parameters' gradients missing).
  log.clear();
  Tensor w = tensor({3.f, 4.f}).requires_grad_();
  w.register_post_accumulate_grad_hook([&](Tensor&) { log.push_back("w"); });
  x.zero_grad();
  Tensor h = autograd::checkpoint([&](const Tensor& in) { return mul(in, x); }, w);
  sum(mul(h, w)).backward();
  REQUIRE(log.size() == 3);
  CHECK(log.back() == "callback ok");
  CHECK(std::count(log.begin(), log.end(), "w") == 1);
  // A hook that throws: the callback still runs (told so), and the hook's error propagates.
  log.clear();
  Tensor y = tensor({1.f}).requires_grad_();
  y.register_post_accumulate_grad_hook([&](Tensor&) {
    autograd::queue_callback([&](bool ok) { log.push_back(ok ? "ok" : "failed"); });
    throw ValueError("[hook] boom");
  });
  CHECK_THROWS_WITH_AS(sum(y).backward(), doctest::Contains("boom"), ValueError);
  CHECK(log == std::vector<std::string>{"failed"});
  // A callback's own error propagates from backward().
  Tensor z = tensor({1.f}).requires_grad_();
  z.register_post_accumulate_grad_hook([&](Tensor&) {
    autograd::queue_callback([](bool) { throw DistError("[callback] peer gone"); });
  });
  CHECK_THROWS_WITH_AS(sum(z).backward(), doctest::Contains("peer gone"), DistError);
}
