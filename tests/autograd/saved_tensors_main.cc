// The saved-tensor audit over the op table (Note [saved tensors] in autograd/function.h): for
// every differentiable case, in float64 on the CPU, each tensor input and then the output is
// overwritten in place between the forward and the backward. The backward must then either throw
// the version error or give exactly the gradients of an untouched run: a backward that reads a
// tensor it did not save through a SavedTensor would compute with the new values and fail here.
#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <string>

#include "op_table.h"

using namespace accel;

namespace {

// The version errors: a saved tensor's, and activation checkpointing's check of its inputs.
bool is_version_error(const std::string& msg) {
  return msg.find("modified by an in-place operation") != std::string::npos ||
         msg.find("was modified in place after the checkpointed forward") != std::string::npos;
}

// The fixed cotangent of a case's output.
Tensor cotangent(const optable::OpCase& c, const Tensor& out) {
  Generator g(optable::case_seed(c) ^ 0x5bd1e995u);
  return uniform(out.sizes(), -1.0, 1.0, TensorOptions(out.dtype()), &g);
}

std::vector<Tensor> grad_leaves(const optable::In& in) {
  std::vector<Tensor> out;
  for (const Tensor& t : in)
    if (t.defined() && t.requires_grad() && t.is_leaf()) out.push_back(t);
  return out;
}

// Overwrites t with other values of the same kind (a float affine map, reversed integers, negated
// bools); an index tensor keeps its set of values, so it stays in range.
void overwrite(Tensor t) {
  if (!t.defined()) return;
  NoGradGuard ng;
  if (t.is_floating_point()) {
    t.mul_(-1.5).add_(0.25);
  } else if (t.dtype() == kBool) {
    t.copy_(logical_not(t));
  } else {
    std::vector<int64_t> v = t.to_vector<int64_t>();
    std::reverse(v.begin(), v.end());
    t.copy_(tensor(v, t.sizes()));
  }
}

struct Tally {
  int detected = 0, unaffected = 0;
};

// Runs case c, overwrites what `pick` returns (an input or the output) after the forward, and
// checks the backward's outcome against the reference gradients.
void run_overwritten(const optable::OpCase& c, const std::vector<Tensor>& ref, const char* what,
                     const std::function<Tensor(const optable::In&, const Tensor&)>& pick,
                     Tally& tally) {
  optable::Maker m(kFloat64, kCPU, optable::case_seed(c));
  optable::In in = c.make(m);
  Tensor out = c.fn(in);
  const Tensor cot = cotangent(c, out);
  overwrite(pick(in, out));
  std::vector<Tensor> got;
  try {
    got = autograd::grad({out}, grad_leaves(in), {cot}, /*retain_graph=*/false,
                         /*create_graph=*/false, /*allow_unused=*/true);
  } catch (const ValueError& e) {
    const std::string msg = e.what();
    CHECK_MESSAGE(is_version_error(msg), what, ": ", msg);
    ++tally.detected;
    return;
  }
  REQUIRE(got.size() == ref.size());
  for (size_t k = 0; k < got.size(); ++k) {
    CAPTURE(k);
    REQUIRE(got[k].defined() == ref[k].defined());
    if (!got[k].defined()) continue;
    CHECK_MESSAGE(allclose(got[k], ref[k], 1e-12, 1e-12), what,
                  " was overwritten after the forward and the gradient changed without a version "
                  "error: the backward reads it without saving it (Note [saved tensors])");
  }
  ++tally.unaffected;
}

}  // namespace

TEST_CASE("saved tensors: an overwritten input or output is a version error or changes nothing") {
  Tally tally;
  int cases = 0;
  for (const auto& c : optable::op_cases()) {
    if (!c.differentiable || !c.gradcheck) continue;
    INFO("case ", c.name());
    std::vector<Tensor> ref;
    size_t n_inputs = 0;
    {
      optable::Maker m(kFloat64, kCPU, optable::case_seed(c));
      optable::In in = c.make(m);
      n_inputs = in.size();
      Tensor out = c.fn(in);
      if (!out.requires_grad() || !out.is_floating_point()) continue;
      ref = autograd::grad({out}, grad_leaves(in), {cotangent(c, out)}, /*retain_graph=*/false,
                           /*create_graph=*/false, /*allow_unused=*/true);
    }
    ++cases;
    for (size_t i = 0; i < n_inputs; ++i) {
      const std::string what = "input " + std::to_string(i);
      CAPTURE(what);
      run_overwritten(
          c, ref, what.c_str(), [i](const optable::In& in, const Tensor&) { return in[i]; }, tally);
    }
    run_overwritten(
        c, ref, "the output", [](const optable::In&, const Tensor& out) { return out; }, tally);
  }
  MESSAGE(cases, " cases: ", tally.detected, " overwrites raised the version error, ",
          tally.unaffected, " left the gradients unchanged");
  CHECK(cases > 100);
  CHECK(tally.detected > 50);  // the check is live: many backwards read what they saved
}
