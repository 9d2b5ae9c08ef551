// Gradcheck in float64 over every differentiable case of the op table (tests/ops/), and the
// failure for a differentiable op without one.
#include <doctest/doctest.h>

#include <cmath>
#include <set>

#include "autograd/gradcheck.h"
#include "op_table.h"

using namespace accel;

TEST_CASE("gradcheck: every differentiable op case matches finite differences") {
  const auto& cases = optable::op_cases();
  REQUIRE(!cases.empty());
  int checked = 0;
  for (const auto& c : cases) {
    if (!c.differentiable || !c.gradcheck) continue;
    INFO("op ", c.name());
    autograd::GradcheckResult r;
    try {
      optable::Maker m(kFloat64, kCPU, optable::case_seed(c));
      std::vector<Tensor> inputs = c.make(m);
      autograd::GradcheckOptions opt;
      opt.eps = c.gradcheck_eps;
      r = autograd::gradcheck(c.fn, inputs, opt);
    } catch (const std::exception& e) {
      FAIL_CHECK("threw: ", e.what());
      continue;
    }
    CHECK_MESSAGE(r.ok, r.message);
    CHECK(r.elements_checked > 0);
    ++checked;
  }
  MESSAGE(checked, " cases gradchecked");
}

TEST_CASE("gradcheck: every differentiable op has a case") {
  std::set<std::string> covered, named;
  for (const auto& c : optable::op_cases()) {
    if (!c.differentiable) continue;
    named.insert(c.op);
    if (c.gradcheck) covered.insert(c.op);
  }
  const auto& ops = autograd::differentiable_ops();
  REQUIRE(ops.size() > 10);
  for (const char* op_c : ops) {
    const std::string op = op_c;
    INFO("op ", op);
    CHECK_MESSAGE(covered.count(op) == 1, "differentiable op '", op,
                  "' has no gradcheck case in tests/ops/");
  }
  // And no differentiable case names an op that does not exist (a typo would hide a missing case).
  std::set<std::string> known(ops.begin(), ops.end());
  for (const auto& name : named)
    CHECK_MESSAGE(known.count(name) == 1, "case for unknown op ", name);
}

TEST_CASE("gradcheck: detects a wrong gradient") {
  // A deliberately wrong backward must fail the check (so the check can fail at all).
  optable::Maker m(kFloat64, kCPU, 1);
  Tensor x = m.rnd({3});
  auto wrong = [](const std::vector<Tensor>& in) {
    Tensor y = mul(in[0].detach(), 2.0);
    autograd::record("wrong", {&in[0]}, {&y},
                     [](const autograd::Grads& g) { return autograd::Grads{mul(g[0], 3.0)}; });
    return y;
  };
  auto r = autograd::gradcheck(wrong, {x});
  CHECK_FALSE(r.ok);
  // A NaN gradient fails too (a comparison with NaN is false either way round).
  auto nan_grad = [](const std::vector<Tensor>& in) {
    Tensor y = mul(in[0].detach(), 2.0);
    autograd::record("nan", {&in[0]}, {&y},
                     [](const autograd::Grads& g) { return autograd::Grads{mul(g[0], NAN)}; });
    return y;
  };
  CHECK_FALSE(autograd::gradcheck(nan_grad, {x}).ok);
}
