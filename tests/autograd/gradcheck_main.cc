// Runs every registered gradcheck sample and fails for any differentiable op without one.
#include <doctest/doctest.h>

#include <set>

#include "autograd/gradcheck.h"
#include "samples.h"

namespace accel::testing {

std::vector<GradSample>& grad_samples() {
  static std::vector<GradSample> s;
  return s;
}

namespace {
Generator& sample_gen() {
  static Generator g(20261202);
  return g;
}
}  // namespace

Tensor rnd(const Shape& shape) {
  return uniform(shape, -1.0, 1.0, TensorOptions(kFloat64), &sample_gen()).requires_grad_(true);
}
Tensor rnd_pos(const Shape& shape) {
  return uniform(shape, 0.5, 1.5, TensorOptions(kFloat64), &sample_gen()).requires_grad_(true);
}

}  // namespace accel::testing

using namespace accel;

TEST_CASE("gradcheck: every registered sample matches finite differences") {
  auto& samples = testing::grad_samples();
  REQUIRE(!samples.empty());
  for (const auto& s : samples) {
    INFO("op ", s.op, " [", s.label, "]");
    autograd::GradcheckResult r;
    try {
      std::vector<Tensor> inputs = s.make_inputs();
      autograd::GradcheckOptions opt;
      opt.eps = s.eps;
      r = autograd::gradcheck(s.fn, inputs, opt);
    } catch (const std::exception& e) {
      FAIL_CHECK("threw: ", e.what());
      continue;
    }
    CHECK_MESSAGE(r.ok, r.message);
    CHECK(r.elements_checked > 0);
  }
}

TEST_CASE("gradcheck: every differentiable op has a sample input") {
  std::set<std::string> covered;
  for (const auto& s : testing::grad_samples()) covered.insert(s.op);
  const auto& ops = autograd::differentiable_ops();
  REQUIRE(ops.size() > 10);
  for (const char* op_c : ops) {
    const std::string op = op_c;
    INFO("op ", op);
    CHECK_MESSAGE(covered.count(op) == 1, "differentiable op '", op, "' has no gradcheck sample");
  }
  // And no sample names an op that does not exist (typos would hide a missing sample).
  std::set<std::string> known(ops.begin(), ops.end());
  for (const auto& name : covered) CHECK_MESSAGE(known.count(name) == 1, "sample for unknown op ", name);
}

TEST_CASE("gradcheck: detects a wrong gradient") {
  // A deliberately wrong backward must fail the check (so the check can fail at all).
  Tensor x = testing::rnd({3});
  auto wrong = [](const std::vector<Tensor>& in) {
    Tensor y = mul(in[0].detach(), 2.0);
    autograd::record("wrong", {&in[0]}, {&y},
                     [](const autograd::Grads& g) { return autograd::Grads{mul(g[0], 3.0)}; });
    return y;
  };
  auto r = autograd::gradcheck(wrong, {x});
  CHECK_FALSE(r.ok);
}
