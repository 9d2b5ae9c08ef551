// Gradgradcheck (double backward against finite differences of the gradient) in float64 over
// every differentiable case of the op table (tests/ops/), and the cases whose double backward
// is refused: each listed once below with the reason, and required to throw the clear error.
#include <doctest/doctest.h>

#include <chrono>
#include <map>
#include <set>
#include <string>

#include "autograd/gradcheck.h"
#include "op_table.h"

using namespace accel;

namespace {

// The op-table cases whose double backward throws throw_no_double_backward's ValueError, by case
// name, with the reason (docs/design.md, "Double backward"). Each is run in its first dtype with
// create_graph and must throw; every other case must pass gradgradcheck.
const std::map<std::string, std::string>& no_double_backward() {
  static const std::map<std::string, std::string> cases = {
      {"linear [float32 under float16 autocast]",
       "the one-node autocast GEMM (Note [autocast linear in float32]) calls its kernels in the "
       "backward"},
      {"linear [float32 under bfloat16 autocast]",
       "the one-node autocast GEMM (Note [autocast linear, native 16-bit]) calls its kernels in "
       "the backward"},
  };
  return cases;
}

// Cases whose inputs sit, by design, where the gradient itself is not differentiable (the first
// derivative is checked there by gradcheck; finite differences of it are meaningless), with the
// reason. Skipped here; the op's other cases are gradgradchecked.
const std::map<std::string, std::string>& gradient_not_differentiable_at_inputs() {
  static const std::map<std::string, std::string> cases = {
      {"norm [zero norm: p=2 and p=1 give gradient 0]",
       "x = 0: the gradient x / ||x|| is discontinuous at the zero norm"},
  };
  return cases;
}

}  // namespace

TEST_CASE(
    "gradgradcheck: every differentiable op case's double backward matches finite "
    "differences") {
  const auto& cases = optable::op_cases();
  REQUIRE(!cases.empty());
  int checked = 0;
  std::set<std::string> ops, skipped;
  const auto start = std::chrono::steady_clock::now();
  for (const auto& c : cases) {
    if (!c.differentiable || !c.gradcheck) continue;
    if (no_double_backward().count(c.name())) continue;  // the next test case
    if (gradient_not_differentiable_at_inputs().count(c.name())) {
      skipped.insert(c.name());
      continue;
    }
    const std::string name = c.name();  // INFO keeps a reference
    INFO("op ", name);
    autograd::GradcheckResult r;
    try {
      optable::Maker m(kFloat64, kCPU, optable::case_seed(c));
      std::vector<Tensor> inputs = c.make(m);
      autograd::GradcheckOptions opt;
      opt.eps = c.gradcheck_eps;
      r = autograd::gradgradcheck(c.fn, inputs, opt);
    } catch (const std::exception& e) {
      FAIL_CHECK("threw: ", std::string(e.what()));
      continue;
    }
    CHECK_MESSAGE(r.ok, r.message);
    CHECK(r.elements_checked > 0);
    ++checked;
    ops.insert(c.op);
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  MESSAGE(checked, " cases over ", ops.size(), " ops gradgradchecked in ", secs, " s");
  for (const auto& [name, why] : gradient_not_differentiable_at_inputs())
    CHECK_MESSAGE(skipped.count(name) == 1, "listed case '", name, "' is not in the op table");
  // Every registered differentiable op is covered by at least one passing case.
  for (const char* op : autograd::differentiable_ops()) {
    INFO("op ", op);
    CHECK_MESSAGE(ops.count(op) == 1, "differentiable op '", op,
                  "' has no gradgradchecked case in tests/ops/");
  }
}

TEST_CASE("gradgradcheck: the listed cases refuse double backward with the clear error") {
  std::set<std::string> found;
  for (const auto& c : optable::op_cases()) {
    const auto it = no_double_backward().find(c.name());
    if (it == no_double_backward().end()) continue;
    const std::string name = c.name();  // INFO keeps a reference
    found.insert(name);
    INFO("case ", name, " (listed: ", it->second, ")");
    REQUIRE(!c.dtypes.empty());
    optable::Maker m(c.dtypes[0], kCPU, optable::case_seed(c));
    std::vector<Tensor> inputs = c.make(m);
    std::vector<Tensor> wrt;
    for (const Tensor& x : inputs)
      if (x.defined() && x.requires_grad()) wrt.push_back(x);
    const Tensor out = c.fn(inputs);
    REQUIRE(out.requires_grad());
    std::string msg;
    try {
      autograd::grad({out.sum()}, wrt, {}, std::nullopt, /*create_graph=*/true);
    } catch (const ValueError& e) {
      msg = e.what();
    }
    CHECK_MESSAGE(msg.find("double backward is not supported") != std::string::npos,
                  "expected the double-backward error, got: '", msg, "'");
    // Without create_graph the same backward works.
    CHECK_NOTHROW(autograd::grad({c.fn(inputs).sum()}, wrt));
  }
  for (const auto& [name, why] : no_double_backward())
    CHECK_MESSAGE(found.count(name) == 1, "listed case '", name, "' is not in the op table");
}

TEST_CASE("gradgradcheck: detects a wrong second derivative and a backward without history") {
  optable::Maker m(kFloat64, kCPU, 1);
  Tensor x = m.rnd({3});
  // y = x^3 with a first derivative 3 x^2 built from ops, but a wrong second derivative: the
  // gradient is right, its own graph claims d(3 x^2)/dx = 3 (not 6 x).
  auto wrong = [](const std::vector<Tensor>& in) {
    const Tensor xd = in[0].detach();
    Tensor y = mul(mul(xd, xd), xd);
    autograd::record("cube_wrong", {&in[0]}, {&y}, [x = in[0]](const autograd::Grads& g) {
      const Tensor xd = x.detach();
      Tensor d = mul(mul(xd, xd), 3.0);
      if (autograd::creating_graph()) d = add(d, sub(mul(x, 3.0), mul(xd, 3.0)));
      return autograd::Grads{mul(g[0], d)};
    });
    return y;
  };
  CHECK(autograd::gradcheck(wrong, {x}).ok);  // the first derivative is right
  CHECK_FALSE(autograd::gradgradcheck(wrong, {x}).ok);
  // A backward that records no graph: its output does not require grad, so gradgradcheck throws.
  auto no_graph = [](const std::vector<Tensor>& in) {
    const Tensor xd = in[0].detach();
    Tensor y = mul(xd, xd);
    autograd::record("square_no_graph", {&in[0]}, {&y}, [x = in[0]](const autograd::Grads& g) {
      NoGradGuard off;
      return autograd::Grads{mul(g[0], mul(x, 2.0))};
    });
    return y;
  };
  CHECK(autograd::gradcheck(no_graph, {x}).ok);
  CHECK_THROWS_AS(autograd::gradgradcheck(no_graph, {x}), ValueError);
}
