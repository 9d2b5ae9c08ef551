// The op table's own machinery: the comparison, the input maker, the runner, the registry.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <set>

#include "op_table.h"

using namespace accel;
using namespace accel::optable;

TEST_CASE("compare: tolerance, non-finite values, shapes") {
  const Tensor want = tensor({1.0f, -2.0f, 4.0f});
  CHECK(compare(tensor({1.0f, -2.0f, 4.0f}), want, Tol{0, 0}).ok);
  const Compare c = compare(tensor({1.0f, -2.0f, 4.1f}), want, Tol{1e-3, 1e-3});
  CHECK_FALSE(c.ok);
  CHECK(c.max_abs == doctest::Approx(0.1).epsilon(1e-5));
  CHECK(c.max_rel == doctest::Approx(0.025).epsilon(1e-4));
  CHECK(compare(tensor({1.0f, -2.0f, 4.1f}), want, Tol{0, 0.03}).ok);   // within rtol |want|
  CHECK_FALSE(compare(tensor({1.0f, NAN, 4.0f}), want, Tol{1, 1}).ok);  // NaN is never close
  CHECK(compare(tensor({1.0f, NAN, INFINITY}), tensor({1.0f, NAN, INFINITY}), Tol{0, 0}).ok);
  CHECK_FALSE(
      compare(tensor({1.0f, 2.0f, -INFINITY}), tensor({1.0f, 2.0f, INFINITY}), Tol{1, 1}).ok);
  const Compare shape = compare(tensor({1.0f, 2.0f}), want, Tol{1, 1});
  CHECK_FALSE(shape.ok);
  CHECK(shape.why.find("shape") != std::string::npos);
}

TEST_CASE("Maker: same values for a seed, rounded to the dtype, integers stay integers") {
  Maker a(kFloat64, kCPU, 42), b(kFloat64, kCPU, 42), h(kBFloat16, kCPU, 42),
      w(kBFloat16, kCPU, 42, kFloat32);
  const Tensor xa = a.rnd({5, 3}), xb = b.rnd({5, 3}), xh = h.rnd({5, 3}), xw = w.rnd({5, 3});
  CHECK(xa.requires_grad());
  CHECK(xa.is_leaf());
  CHECK(xa.to_vector<double>() == xb.to_vector<double>());
  CHECK(xh.dtype() == kBFloat16);
  CHECK(xw.dtype() == kFloat32);  // computed in float32 on the bfloat16-rounded values
  CHECK(xw.to_vector<double>() == xh.to_vector<double>());
  CHECK(xh.to_vector<double>() != xa.to_vector<double>());
  Maker i(kInt32, kCPU, 1);
  const Tensor xi = i.rnd_int({100}, -3, 3);
  CHECK(xi.dtype() == kInt32);
  CHECK_FALSE(xi.requires_grad());
  for (double v : xi.to_vector<double>()) CHECK((v >= -3 && v <= 3));
  const Tensor idx = i.idx({2, 0}, {2}, kInt32);
  CHECK(idx.dtype() == kInt32);
  const Tensor p = a.perm(20, {4, 5});
  const std::vector<double> pv = p.to_vector<double>();
  CHECK(std::set<double>(pv.begin(), pv.end()).size() == 20);
}

TEST_CASE("run_case: forward and the gradient of every floating input that requires grad") {
  Table t;
  OpCase& c = t.add("mul", "test", OP_INPUTS(m.rnd({3}), m.rnd({3}), m.idx({0}, {1})),
                    OP_FN(return mul(x[0], x[1]);));
  Maker m(kFloat64, kCPU, case_seed(c));
  const RunResult r = run_case(c, m, true);
  REQUIRE(r.grads.size() == 2);
  // d/dx0 sum(x0 * x1 * cot) = x1 * cot: rerun the inputs and check against that.
  Maker m2(kFloat64, kCPU, case_seed(c));
  const In in = c.make(m2);
  const Tensor cot = div(r.grads[0], in[1].detach());
  CHECK(compare(r.grads[1], mul(in[0].detach(), cot), Tol{1e-12, 1e-12}).ok);
  CHECK(compare(r.out, mul(in[0], in[1]).detach(), Tol{0, 0}).ok);
  c.not_differentiable();
  Maker m3(kFloat64, kCPU, case_seed(c));
  CHECK(run_case(c, m3, true).grads.empty());
}

TEST_CASE("the table: unique case names, known dtypes, bench entries well formed") {
  const std::vector<OpCase>& cases = op_cases();
  REQUIRE(cases.size() > 100);
  std::set<std::string> names, ops;
  for (const OpCase& c : cases) {
    INFO(c.name());
    ops.insert(c.op);
    CHECK(names.insert(c.name()).second);
    CHECK(!c.dtypes.empty());
    CHECK(c.make);
    CHECK(c.fn);
    if (!c.differentiable) CHECK(c.gradcheck);  // the flag only matters for differentiable cases
    for (const OpCase::Bench& b : c.benches) {
      CHECK(!b.family.empty());
      CHECK(!b.shape.empty());
      CHECK(b.work > 0);
    }
  }
  MESSAGE("the op table: " << cases.size() << " cases over " << ops.size() << " ops; "
                           << autograd::differentiable_ops().size()
                           << " registered differentiable ops");
}
