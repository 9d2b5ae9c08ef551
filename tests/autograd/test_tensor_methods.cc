// Tensor methods (core/tensor.h, "ops as methods") against their free functions, and the drift
// check that keeps the two sets together: an op added to autograd/ops.h must get a method or a
// reason in kNoMethod below, else this suite fails.
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "accel.h"

#ifndef ACCEL_SOURCE_ROOT
#error "ACCEL_SOURCE_ROOT (the repository root) is passed by tests/autograd/meson.build"
#endif

using namespace accel;

namespace {

// Free functions of autograd/ops.h that take a tensor first but are deliberately no method,
// each with its reason (torch has them only as free or torch.nn.functional functions, or they
// are internal). A stale entry (the op got a method, or left ops.h) fails too.
const std::map<std::string, std::string> kNoMethod = {
    {"rsub", "no torch.Tensor method; `s - t` (operator) is the spelling"},
    {"rdiv", "no torch.Tensor method; `s / t` (operator) is the spelling"},
    {"gelu", "torch.nn.functional.gelu, not a torch.Tensor method"},
    {"silu", "torch.nn.functional.silu, not a torch.Tensor method"},
    {"where", "torch.where(cond, a, b); Tensor.where reorders the arguments confusingly"},
    {"sum_to", "internal: backward of broadcasting"},
    {"linear", "torch.nn.functional.linear"},
    {"conv2d", "torch.nn.functional.conv2d"},
    {"max_pool2d", "torch.nn.functional.max_pool2d"},
    {"avg_pool2d", "torch.nn.functional.avg_pool2d"},
    {"layer_norm", "torch.nn.functional.layer_norm"},
    {"rms_norm", "torch.nn.functional.rms_norm"},
    {"cross_entropy", "torch.nn.functional.cross_entropy"},
    {"nll_loss", "torch.nn.functional.nll_loss"},
    {"mse_loss", "torch.nn.functional.mse_loss"},
    {"binary_cross_entropy_with_logits", "torch.nn.functional loss"},
    {"binary_cross_entropy", "torch.nn.functional.binary_cross_entropy"},
    {"l1_loss", "torch.nn.functional.l1_loss"},
    {"smooth_l1_loss", "torch.nn.functional.smooth_l1_loss"},
    {"huber_loss", "torch.nn.functional.huber_loss"},
    {"kl_div", "torch.nn.functional.kl_div"},
    {"cosine_similarity", "torch.nn.functional.cosine_similarity"},
    {"cosine_embedding_loss", "torch.nn.functional.cosine_embedding_loss"},
    {"dropout", "torch.nn.functional.dropout"},
    {"scaled_dot_product_attention", "torch.nn.functional.scaled_dot_product_attention"},
    {"scaled_dot_product_attention_packed", "fused variant of the functional attention"},
    {"embedding", "torch.nn.functional.embedding (weight first)"},
    {"conv_transpose2d", "torch.nn.functional.conv_transpose2d"},
    {"conv1d", "torch.nn.functional.conv1d"},
    {"conv_transpose1d", "torch.nn.functional.conv_transpose1d"},
    {"adaptive_avg_pool2d", "torch.nn.functional.adaptive_avg_pool2d"},
    {"adaptive_max_pool2d", "torch.nn.functional.adaptive_max_pool2d"},
    {"adaptive_max_pool2d_with_indices", "torch.nn.functional.adaptive_max_pool2d_with_indices"},
    {"group_norm", "torch.nn.functional.group_norm"},
    {"instance_norm", "torch.nn.functional.instance_norm"},
    {"dropout2d", "torch.nn.functional.dropout2d"},
    {"pixel_shuffle", "torch.nn.functional.pixel_shuffle"},
    {"pixel_unshuffle", "torch.nn.functional.pixel_unshuffle"},
    {"pad", "torch.nn.functional.pad"},
    {"interpolate", "torch.nn.functional.interpolate"},
    {"leaky_relu", "torch.nn.functional.leaky_relu"},
    {"elu", "torch.nn.functional.elu"},
    {"hardtanh", "torch.nn.functional.hardtanh"},
    {"relu6", "torch.nn.functional.relu6"},
    {"selu", "torch.nn.functional.selu"},
    {"celu", "torch.nn.functional.celu"},
    {"threshold", "torch.nn.functional.threshold"},
    {"hardswish", "torch.nn.functional.hardswish"},
    {"hardsigmoid", "torch.nn.functional.hardsigmoid"},
    {"dropout1d", "torch.nn.functional.dropout1d"},
    {"dropout3d", "torch.nn.functional.dropout3d"},
    {"embedding_renorm_", "torch.embedding_renorm_, a free function"},
};

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  REQUIRE_MESSAGE(f.good(), "cannot read ", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Declarations of `text` with `//` comments removed and lines joined, one per statement (split
// at ';', '{' and '}'), so that a declaration clang-format wraps over lines still reads as one.
std::vector<std::string> statements(const std::string& text) {
  std::istringstream in(text);
  std::string line, joined;
  while (std::getline(in, line)) {
    const size_t c = line.find("//");
    joined += (c == std::string::npos ? line : line.substr(0, c)) + ' ';
  }
  std::vector<std::string> out(1);
  for (char ch : joined) {
    if (ch == ';' || ch == '{' || ch == '}') {
      out.emplace_back();
    } else {
      out.back() += ch;
    }
  }
  return out;
}

// Names of the free functions whose first parameter is a `const Tensor&` (operators have no
// identifier before '(' and are not matched; cat/stack take a list).
std::set<std::string> free_ops_taking_tensor(const std::string& ops_h) {
  static const std::regex decl(
      R"(^\s*(?:inline\s+)?[A-Za-z_][\w:<>, ]*[\s&*]+(\w+)\(\s*const Tensor&)");
  std::set<std::string> out;
  std::smatch m;
  for (const std::string& st : statements(ops_h)) {
    if (std::regex_search(st, m, decl)) out.insert(m[1]);
  }
  return out;
}

// Names of the member functions declared in `class Tensor { ... };`, or only those of its "ops
// as methods" block (up to the private section) when `block_only`.
std::set<std::string> tensor_methods(const std::string& tensor_h, bool block_only) {
  size_t begin = tensor_h.find("class Tensor {");
  REQUIRE(begin != std::string::npos);
  size_t end = tensor_h.find("\n};", begin);
  if (block_only) {
    begin = tensor_h.find("---- ops as methods", begin);
    REQUIRE(begin != std::string::npos);
    end = std::min(end, tensor_h.find("\n private:", begin));
    begin = tensor_h.find('\n', begin);  // past the block's title comment
  } else {
    begin += std::string("class Tensor {").size();
  }
  REQUIRE(end != std::string::npos);
  static const std::regex decl(R"(^\s*[A-Za-z_][\w:<>, ]*[\s&*]+(\w+)\()");
  std::set<std::string> out;
  std::smatch m;
  for (const std::string& st : statements(tensor_h.substr(begin, end - begin))) {
    if (std::regex_search(st, m, decl)) out.insert(m[1]);
  }
  return out;
}

// Problems: an op with neither a method nor a reason, and exclusions that no longer apply.
std::vector<std::string> drift(const std::set<std::string>& ops,
                               const std::set<std::string>& methods,
                               const std::map<std::string, std::string>& excluded) {
  std::vector<std::string> problems;
  for (const std::string& op : ops) {
    if (!methods.count(op) && !excluded.count(op))
      problems.push_back(op +
                         ": in autograd/ops.h without a Tensor method; add one (autograd/ops/"
                         "methods.cc) or a reason to kNoMethod");
  }
  for (const auto& [name, why] : excluded) {
    if (!ops.count(name)) problems.push_back(name + ": excluded but no longer in autograd/ops.h");
    if (methods.count(name)) problems.push_back(name + ": excluded but Tensor has the method");
  }
  return problems;
}

// ---- method vs free function ----

using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
std::set<std::string> g_compared;  // names whose method was checked

// Fresh leaves of `inputs` (floating ones require grad when `grad`).
std::vector<Tensor> leaves(const std::vector<Tensor>& inputs, bool grad) {
  std::vector<Tensor> out;
  for (const Tensor& t : inputs) {
    Tensor c = t.detach().clone();
    if (grad && c.is_floating_point()) c.requires_grad_(true);
    out.push_back(c);
  }
  return out;
}

// Runs both on copies of `inputs`; outputs must be identical (dtype, shape, every value) and,
// with `grad`, so must the inputs' gradients of sum_k sum(out_k * w_k) (w: fixed, not constant).
void same(const std::string& name, const std::vector<Tensor>& inputs, const Fn& method,
          const Fn& free_fn, bool grad = true) {
  g_compared.insert(name);
  CAPTURE(name);
  std::vector<Tensor> a_in = leaves(inputs, grad), b_in = leaves(inputs, grad);
  std::vector<Tensor> a = method(a_in), b = free_fn(b_in);
  REQUIRE(a.size() == b.size());
  REQUIRE(!a.empty());
  for (size_t k = 0; k < a.size(); ++k) {
    REQUIRE(a[k].dtype() == b[k].dtype());
    REQUIRE(a[k].sizes() == b[k].sizes());
    CHECK(equal(a[k], b[k]));
  }
  if (!grad) return;
  auto loss = [](const std::vector<Tensor>& outs) {
    Tensor l;
    for (const Tensor& o : outs) {
      if (!o.requires_grad()) continue;
      Tensor w = arange(0.0, double(o.numel()), 1.0, TensorOptions(o.dtype())).reshape(o.sizes());
      Tensor term = sum(mul(o, add(w, 1.0)));
      l = l.defined() ? add(l, term) : term;
    }
    return l;
  };
  Tensor la = loss(a), lb = loss(b);
  REQUIRE(la.defined() == lb.defined());  // both record a graph, or neither (sign, argmax)
  if (!la.defined()) return;
  la.backward();
  lb.backward();
  for (size_t i = 0; i < a_in.size(); ++i) {
    if (!a_in[i].requires_grad()) continue;
    CAPTURE(i);
    REQUIRE(a_in[i].grad().defined() == b_in[i].grad().defined());
    if (a_in[i].grad().defined()) CHECK(equal(a_in[i].grad(), b_in[i].grad()));
  }
}

Fn one(std::function<Tensor(const std::vector<Tensor>&)> f) {
  return [f](const std::vector<Tensor>& v) { return std::vector<Tensor>{f(v)}; };
}
Fn two(std::function<std::tuple<Tensor, Tensor>(const std::vector<Tensor>&)> f) {
  return [f](const std::vector<Tensor>& v) {
    auto [x, y] = f(v);
    return std::vector<Tensor>{x, y};
  };
}
Fn flag(std::function<bool(const std::vector<Tensor>&)> f) {
  return [f](const std::vector<Tensor>& v) {
    return std::vector<Tensor>{scalar_tensor(int64_t(f(v)), TensorOptions(kInt64))};
  };
}

Generator& gen() {
  static Generator g(15015);
  return g;
}
// Values in [0.5, 1.5): log, sqrt, rsqrt, reciprocal are all smooth there.
Tensor pos(const Shape& s) { return uniform(s, 0.5, 1.5, TensorOptions(kFloat64), &gen()); }
Tensor rn(const Shape& s) { return randn(s, TensorOptions(kFloat64), &gen()); }

// In-place method vs its out-of-place free function: same values, returns *this, and `self`
// itself changed (not a copy).
void same_inplace(const std::string& name, const Tensor& x,
                  const std::function<Tensor&(Tensor&)>& method,
                  const std::function<Tensor(const Tensor&)>& free_fn) {
  g_compared.insert(name);
  CAPTURE(name);
  Tensor self = x.clone();
  Tensor alias = self;  // shares the TensorImpl: sees the in-place write
  Tensor& r = method(self);
  CHECK(&r == &self);
  Tensor expect = free_fn(x);
  REQUIRE(alias.sizes() == expect.sizes());
  CHECK(equal(alias, expect));
  CHECK(!equal(alias, x));  // the cases below all change something
}

}  // namespace

TEST_CASE("ops.h and the Tensor methods do not drift") {
  const std::string root = ACCEL_SOURCE_ROOT;
  const std::set<std::string> ops = free_ops_taking_tensor(read_text(root + "/autograd/ops.h"));
  const std::set<std::string> methods = tensor_methods(read_text(root + "/core/tensor.h"), false);
  // The parsers see what they must (guards against a parser that silently finds nothing).
  for (const char* op : {"add", "softmax", "split", "max", "masked_fill", "scatter_add"})
    CHECK_MESSAGE(ops.count(op), op, " not parsed from ops.h");
  CHECK_MESSAGE(!ops.count("cat"), "cat takes a list: not a tensor-first op");
  for (const char* m : {"reshape", "sum", "softmax", "split", "to", "cuda", "tril_"})
    CHECK_MESSAGE(methods.count(m), m, " not parsed from tensor.h");
  for (const std::string& p : drift(ops, methods, kNoMethod)) FAIL_CHECK(p);
}

TEST_CASE("the drift check catches an undecided op and stale exclusions") {
  const std::string fake_ops =
      "Tensor add(const Tensor& a, const Tensor& b, Scalar alpha = 1);\n"
      "std::vector<Tensor> frobnicate(const Tensor& x, int64_t dim = 0);\n"
      "Tensor cat(const std::vector<Tensor>& xs, int64_t dim = 0);\n"
      "inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }\n";
  const std::string fake_tensor =
      "class Tensor {\n public:\n  Tensor add(const Tensor& other, Scalar alpha = 1) const;\n"
      "  std::tuple<Tensor, Tensor> gone(int64_t dim) const;\n};\n";
  const auto ops = free_ops_taking_tensor(fake_ops);
  CHECK(ops == std::set<std::string>{"add", "frobnicate"});
  const auto methods = tensor_methods(fake_tensor, false);
  CHECK(methods == std::set<std::string>{"add", "gone"});
  CHECK(drift(ops, methods, {}).size() == 1);  // frobnicate undecided
  CHECK(drift(ops, methods, {{"frobnicate", "reason"}}).empty());
  CHECK(drift(ops, methods, {{"frobnicate", "r"}, {"add", "r"}}).size() == 1);      // has a method
  CHECK(drift(ops, methods, {{"frobnicate", "r"}, {"nothere", "r"}}).size() == 1);  // gone
}

TEST_CASE("every method equals its free function (float64 values and gradients)") {
  using V = const std::vector<Tensor>&;
  const Tensor a = pos({3, 4}), b = pos({3, 4}), row = pos({4});
  const Tensor sq = rn({4, 4}), m3 = rn({2, 3, 4});
  const Tensor mask = gt(rn({3, 4}), 0.0);
  const Tensor idx = tensor(std::vector<int64_t>{2, 0, 2}, {3});
  const Tensor gidx = tensor(std::vector<int64_t>{0, 3, 1, 1, 2, 0, 3, 3, 1, 0, 0, 2}, {3, 4});

  // binary
  same("add", {a, b}, one([](V v) { return v[0].add(v[1], 2.5); }),
       one([](V v) { return add(v[0], v[1], 2.5); }));
  same("add", {a, row}, one([](V v) { return v[0].add(v[1]); }),
       one([](V v) { return add(v[0], v[1]); }));
  same("add", {a}, one([](V v) { return v[0].add(3); }), one([](V v) { return add(v[0], 3); }));
  same("sub", {a, b}, one([](V v) { return v[0].sub(v[1], 0.5); }),
       one([](V v) { return sub(v[0], v[1], 0.5); }));
  same("sub", {a}, one([](V v) { return v[0].sub(1.5); }), one([](V v) { return sub(v[0], 1.5); }));
  same("mul", {a, b}, one([](V v) { return v[0].mul(v[1]); }),
       one([](V v) { return mul(v[0], v[1]); }));
  same("mul", {a}, one([](V v) { return v[0].mul(-2); }), one([](V v) { return mul(v[0], -2); }));
  same("div", {a, b}, one([](V v) { return v[0].div(v[1]); }),
       one([](V v) { return div(v[0], v[1]); }));
  same("div", {a}, one([](V v) { return v[0].div(4.0); }), one([](V v) { return div(v[0], 4.0); }));
  same("pow", {a, b}, one([](V v) { return v[0].pow(v[1]); }),
       one([](V v) { return pow(v[0], v[1]); }));
  same("maximum", {a, b}, one([](V v) { return v[0].maximum(v[1]); }),
       one([](V v) { return maximum(v[0], v[1]); }));
  same("minimum", {a, b}, one([](V v) { return v[0].minimum(v[1]); }),
       one([](V v) { return minimum(v[0], v[1]); }));

  // comparisons and logic (not differentiable)
  const Tensor c = where(mask, a, b);  // equal to a where mask
  const Tensor small = tensor(std::vector<double>{1, 2, 1, 3, 1, 0}, {2, 3});
  same("eq", {a, c}, one([](V v) { return v[0].eq(v[1]); }),
       one([](V v) { return eq(v[0], v[1]); }), false);
  same("eq", {small}, one([](V v) { return v[0].eq(1); }), one([](V v) { return eq(v[0], 1); }),
       false);
  same("ne", {a, c}, one([](V v) { return v[0].ne(v[1]); }),
       one([](V v) { return ne(v[0], v[1]); }), false);
  same("ne", {small}, one([](V v) { return v[0].ne(1); }), one([](V v) { return ne(v[0], 1); }),
       false);
  same("lt", {a, b}, one([](V v) { return v[0].lt(v[1]); }),
       one([](V v) { return lt(v[0], v[1]); }), false);
  same("lt", {a}, one([](V v) { return v[0].lt(1.0); }), one([](V v) { return lt(v[0], 1.0); }),
       false);
  same("le", {a, b}, one([](V v) { return v[0].le(v[1]); }),
       one([](V v) { return le(v[0], v[1]); }), false);
  same("le", {a}, one([](V v) { return v[0].le(1.0); }), one([](V v) { return le(v[0], 1.0); }),
       false);
  same("gt", {a, b}, one([](V v) { return v[0].gt(v[1]); }),
       one([](V v) { return gt(v[0], v[1]); }), false);
  same("gt", {a}, one([](V v) { return v[0].gt(1.0); }), one([](V v) { return gt(v[0], 1.0); }),
       false);
  same("ge", {a, b}, one([](V v) { return v[0].ge(v[1]); }),
       one([](V v) { return ge(v[0], v[1]); }), false);
  same("ge", {a}, one([](V v) { return v[0].ge(1.0); }), one([](V v) { return ge(v[0], 1.0); }),
       false);
  const Tensor m2 = lt(a, b);
  same("logical_and", {mask, m2}, one([](V v) { return v[0].logical_and(v[1]); }),
       one([](V v) { return logical_and(v[0], v[1]); }), false);
  same("logical_or", {mask, m2}, one([](V v) { return v[0].logical_or(v[1]); }),
       one([](V v) { return logical_or(v[0], v[1]); }), false);
  same("logical_not", {mask}, one([](V v) { return v[0].logical_not(); }),
       one([](V v) { return logical_not(v[0]); }), false);
  same("equal", {a, a}, flag([](V v) { return v[0].equal(v[1]); }),
       flag([](V v) { return equal(v[0], v[1]); }), false);
  same("equal", {a, b}, flag([](V v) { return v[0].equal(v[1]); }),
       flag([](V v) { return equal(v[0], v[1]); }), false);
  CHECK(a.equal(a.clone()));
  CHECK(!a.equal(b));
  const Tensor a_eps = add(a, 1e-3);
  same("allclose", {a, a_eps}, flag([](V v) { return v[0].allclose(v[1], 0.0, 1e-2); }),
       flag([](V v) { return allclose(v[0], v[1], 0.0, 1e-2); }), false);
  CHECK(a.allclose(a_eps, 0.0, 1e-2));
  CHECK(!a.allclose(a_eps));  // the defaults are tight

  // unary
  const std::vector<
      std::pair<std::string, std::pair<Tensor (Tensor::*)() const, Tensor (*)(const Tensor&)>>>
      unary = {{"neg", {&Tensor::neg, &neg}},
               {"exp", {&Tensor::exp, &exp}},
               {"log", {&Tensor::log, &log}},
               {"sqrt", {&Tensor::sqrt, &sqrt}},
               {"rsqrt", {&Tensor::rsqrt, &rsqrt}},
               {"abs", {&Tensor::abs, &abs}},
               {"tanh", {&Tensor::tanh, &tanh}},
               {"sigmoid", {&Tensor::sigmoid, &sigmoid}},
               {"relu", {&Tensor::relu, &relu}},
               {"sin", {&Tensor::sin, &sin}},
               {"cos", {&Tensor::cos, &cos}},
               {"sign", {&Tensor::sign, &sign}},
               {"reciprocal", {&Tensor::reciprocal, &reciprocal}},
               {"square", {&Tensor::square, &square}},
               {"log1p", {&Tensor::log1p, &log1p}},
               {"expm1", {&Tensor::expm1, &expm1}},
               {"erf", {&Tensor::erf, &erf}}};
  for (const auto& [name, fns] : unary) {
    auto [meth, fr] = fns;
    same(name, {a}, one([meth](V v) { return (v[0].*meth)(); }),
         one([fr](V v) { return fr(v[0]); }));
  }
  same("clamp", {m3}, one([](V v) { return v[0].clamp(-0.5, 0.5); }),
       one([](V v) { return clamp(v[0], -0.5, 0.5); }));
  same("clamp", {m3}, one([](V v) { return v[0].clamp(0); }),
       one([](V v) { return clamp(v[0], 0, std::nullopt); }));
  same("clamp", {m3}, one([](V v) { return v[0].clamp(std::nullopt, 0.25); }),
       one([](V v) { return clamp(v[0], std::nullopt, 0.25); }));
  same("masked_fill", {a, mask}, one([](V v) { return v[0].masked_fill(v[1], -7.0); }),
       one([](V v) { return masked_fill(v[0], v[1], -7.0); }));

  // reductions
  same("sum", {m3}, one([](V v) { return v[0].sum({1}, true); }),
       one([](V v) { return sum(v[0], {1}, true); }));
  same("mean", {m3}, one([](V v) {
         return v[0].mean({0, 2});
       }),
       one([](V v) {
         return mean(v[0], {0, 2});
       }));
  same("amax", {m3}, one([](V v) { return v[0].amax({2}); }),
       one([](V v) { return amax(v[0], {2}); }));
  same("amin", {m3}, one([](V v) { return v[0].amin({}, true); }),
       one([](V v) { return amin(v[0], {}, true); }));
  same("max", {m3}, one([](V v) { return v[0].max(); }), one([](V v) { return max(v[0]); }));
  same("min", {m3}, one([](V v) { return v[0].min(); }), one([](V v) { return min(v[0]); }));
  same("max", {m3}, two([](V v) { return v[0].max(1, true); }),
       two([](V v) { return max(v[0], 1, true); }));
  same("min", {m3}, two([](V v) { return v[0].min(-1); }), two([](V v) { return min(v[0], -1); }));
  same("argmax", {m3}, one([](V v) { return v[0].argmax(); }),
       one([](V v) { return argmax(v[0]); }), false);
  same("argmax", {m3}, one([](V v) { return v[0].argmax(1); }),
       one([](V v) { return argmax(v[0], 1); }), false);
  same("argmin", {m3}, one([](V v) { return v[0].argmin(2, true); }),
       one([](V v) { return argmin(v[0], 2, true); }), false);
  same("var", {m3}, one([](V v) { return v[0].var({1}, 0, true); }),
       one([](V v) { return var(v[0], {1}, 0, true); }));
  same("std_dev", {m3}, one([](V v) { return v[0].std_dev({2}); }),
       one([](V v) { return std_dev(v[0], {2}); }));
  same("std", {m3}, one([](V v) { return v[0].std(); }), one([](V v) { return std_dev(v[0]); }));
  same("prod", {a}, one([](V v) { return v[0].prod({0}); }),
       one([](V v) { return prod(v[0], {0}); }));
  same("norm", {m3}, one([](V v) { return v[0].norm(1.0); }),
       one([](V v) { return norm(v[0], 1.0); }));
  same("norm", {m3}, one([](V v) { return v[0].norm(); }), one([](V v) { return norm(v[0]); }));

  // linear algebra, softmax
  same("matmul", {m3, sq}, one([](V v) { return v[0].matmul(v[1]); }),
       one([](V v) { return matmul(v[0], v[1]); }));
  same("mm", {a, sq}, one([](V v) { return v[0].mm(v[1]); }),
       one([](V v) { return mm(v[0], v[1]); }));
  const Tensor bt = rn({2, 4, 5});
  same("bmm", {m3, bt}, one([](V v) { return v[0].bmm(v[1]); }),
       one([](V v) { return bmm(v[0], v[1]); }));
  same("softmax", {m3}, one([](V v) { return v[0].softmax(-1); }),
       one([](V v) { return softmax(v[0], -1); }));
  same("log_softmax", {m3}, one([](V v) { return v[0].log_softmax(1); }),
       one([](V v) { return log_softmax(v[0], 1); }));

  // indexing
  same("index_select", {a, idx}, one([](V v) { return v[0].index_select(0, v[1]); }),
       one([](V v) { return index_select(v[0], 0, v[1]); }));
  same("gather", {a, gidx}, one([](V v) { return v[0].gather(1, v[1]); }),
       one([](V v) { return gather(v[0], 1, v[1]); }));
  same("scatter_add", {a, gidx, b}, one([](V v) { return v[0].scatter_add(1, v[1], v[2]); }),
       one([](V v) { return scatter_add(v[0], 1, v[1], v[2]); }));
  same("index_add", {a, idx, b}, one([](V v) { return v[0].index_add(0, v[1], v[2]); }),
       one([](V v) { return index_add(v[0], 0, v[1], v[2]); }));

  // advanced indexing, sorting, sampling, shapes, norms
  {
    using namespace accel::indexing;
    const Tensor rows = tensor(std::vector<int64_t>{2, 0}, {2});
    const Tensor cols = tensor(std::vector<int64_t>{1, 3}, {2});
    const Tensor vals = pos({2});
    same("index", {m3, rows}, one([](V v) {
           return v[0].index({Slice(), v[1], None});
         }),
         one([](V v) {
           return index(v[0], {Slice(), v[1], None});
         }));
    same("index_put", {a, rows, cols, vals}, one([](V v) {
           return v[0].index_put({v[1], v[2]}, v[3], true);
         }),
         one([](V v) {
           return index_put(v[0], {v[1], v[2]}, v[3], true);
         }));
    same("masked_select", {a, mask}, one([](V v) { return v[0].masked_select(v[1]); }),
         one([](V v) { return masked_select(v[0], v[1]); }));
    same("masked_scatter", {a, mask, b}, one([](V v) { return v[0].masked_scatter(v[1], v[2]); }),
         one([](V v) { return masked_scatter(v[0], v[1], v[2]); }));
    same("take_along_dim", {a, gidx}, one([](V v) { return v[0].take_along_dim(v[1], 1); }),
         one([](V v) { return take_along_dim(v[0], v[1], 1); }));
    same("nonzero", {mask}, one([](V v) { return v[0].nonzero(); }),
         one([](V v) { return nonzero(v[0]); }), false);
    same(
        "nonzero_numpy", {mask}, [](V v) { return v[0].nonzero_numpy(); },
        [](V v) { return nonzero_numpy(v[0]); }, false);
    same("sort", {m3}, two([](V v) { return v[0].sort(1, true); }),
         two([](V v) { return sort(v[0], 1, true); }));
    same("argsort", {m3}, one([](V v) { return v[0].argsort(-1, false, true); }),
         one([](V v) { return argsort(v[0], -1, false, true); }), false);
    same("topk", {m3}, two([](V v) { return v[0].topk(2, 1, false); }),
         two([](V v) { return topk(v[0], 2, 1, false); }));
    same("multinomial", {a}, one([](V v) {
           Generator g(1);
           return v[0].multinomial(5, true, &g);
         }),
         one([](V v) {
           Generator g(1);
           return multinomial(v[0], 5, true, &g);
         }),
         false);
    same("repeat", {m3}, one([](V v) {
           return v[0].repeat({2, 1, 1, 2});
         }),
         one([](V v) {
           return repeat(v[0], {2, 1, 1, 2});
         }));
    same("norm", {m3}, one([](V v) { return v[0].norm(3.0, {1}, true); }),
         one([](V v) { return norm(v[0], 3.0, {1}, true); }));
    same("norm", {m3}, one([](V v) {
           return v[0].norm("fro", {0, 2});
         }),
         one([](V v) {
           return norm(v[0], "fro", {0, 2});
         }));
    same("view_as", {m3, a}, one([](V v) {
           return v[0].view_as(v[0].reshape({4, 6}));
         }),
         one([](V v) {
           return v[0].view({4, 6});
         }));
    // new_*: this tensor's dtype and device, the given shape
    g_compared.insert({"new_empty", "new_zeros", "new_ones", "new_full"});
    const Tensor i32 = zeros({2}, kInt32);
    CHECK(i32.new_empty({3, 1}).dtype() == kInt32);
    CHECK(i32.new_empty({3, 1}).sizes() == Shape{3, 1});
    CHECK(equal(i32.new_zeros({2, 2}), zeros({2, 2}, kInt32)));
    CHECK(equal(a.new_ones({3}), ones({3}, kFloat64)));
    CHECK(equal(a.new_full({2}, -1.5), full({2}, -1.5, kFloat64)));
  }

  // joining and splitting
  same(
      "split", {m3}, [](V v) { return v[0].split(3, 2); }, [](V v) { return split(v[0], 3, 2); });
  same(
      "split", {m3},
      [](V v) {
        return v[0].split(std::vector<int64_t>{1, 2}, 1);
      },
      [](V v) {
        return split(v[0], std::vector<int64_t>{1, 2}, 1);
      });
  same(
      "chunk", {m3}, [](V v) { return v[0].chunk(2, -1); }, [](V v) { return chunk(v[0], 2, -1); });
  same("tril", {sq}, one([](V v) { return v[0].tril(-1); }),
       one([](V v) { return tril(v[0], -1); }));
  same("triu", {sq}, one([](V v) { return v[0].triu(); }), one([](V v) { return triu(v[0]); }));

  // in-place
  NoGradGuard no_grad;
  same_inplace(
      "add_", a, [](Tensor& t) -> Tensor& { return t.add_(2); },
      [](const Tensor& t) { return add(t, 2); });
  same_inplace(
      "add_", a, [&](Tensor& t) -> Tensor& { return t.add_(row, 3); },
      [&](const Tensor& t) { return add(t, row, 3); });
  same_inplace(
      "sub_", a, [](Tensor& t) -> Tensor& { return t.sub_(0.25); },
      [](const Tensor& t) { return sub(t, 0.25); });
  same_inplace(
      "sub_", a, [&](Tensor& t) -> Tensor& { return t.sub_(b, 2); },
      [&](const Tensor& t) { return sub(t, b, 2); });
  same_inplace(
      "sub_", a, [&](Tensor& t) -> Tensor& { return t.sub_(b); },
      [&](const Tensor& t) { return sub(t, b); });
  same_inplace(
      "mul_", a, [&](Tensor& t) -> Tensor& { return t.mul_(b); },
      [&](const Tensor& t) { return mul(t, b); });
  same_inplace(
      "mul_", a, [](Tensor& t) -> Tensor& { return t.mul_(3); },
      [](const Tensor& t) { return mul(t, 3); });
  same_inplace(
      "div_", a, [&](Tensor& t) -> Tensor& { return t.div_(b); },
      [&](const Tensor& t) { return div(t, b); });
  same_inplace(
      "div_", a, [](Tensor& t) -> Tensor& { return t.div_(4); },
      [](const Tensor& t) { return div(t, 4); });
  same_inplace(
      "masked_fill_", a, [&](Tensor& t) -> Tensor& { return t.masked_fill_(mask, 9); },
      [&](const Tensor& t) { return masked_fill(t, mask, 9); });
  same_inplace(
      "index_add_", a, [&](Tensor& t) -> Tensor& { return t.index_add_(0, idx, b); },
      [&](const Tensor& t) { return index_add(t, 0, idx, b); });
  same_inplace(
      "scatter_add_", a, [&](Tensor& t) -> Tensor& { return t.scatter_add_(1, gidx, b); },
      [&](const Tensor& t) { return scatter_add(t, 1, gidx, b); });
  same_inplace(
      "tril_", sq, [](Tensor& t) -> Tensor& { return t.tril_(); },
      [](const Tensor& t) { return tril(t); });
  same_inplace(
      "triu_", sq, [](Tensor& t) -> Tensor& { return t.triu_(1); },
      [](const Tensor& t) { return triu(t, 1); });
  {
    const Tensor rows = tensor(std::vector<int64_t>{2, 0}, {2});
    same_inplace(
        "index_put_", a,
        [&](Tensor& t) -> Tensor& { return t.index_put_({rows}, b.index({rows}), true); },
        [&](const Tensor& t) { return index_put(t, {rows}, b.index({rows}), true); });
    same_inplace(
        "index_put_", a,
        [&](Tensor& t) -> Tensor& {
          return t.index_put_({rows, 1}, 9.0);
        },
        [&](const Tensor& t) {
          return index_put(t, {rows, 1}, full({}, 9.0, kFloat64));
        });
    same_inplace(
        "masked_scatter_", a, [&](Tensor& t) -> Tensor& { return t.masked_scatter_(mask, b); },
        [&](const Tensor& t) { return masked_scatter(t, mask, b); });
  }
  same_inplace(
      "clamp_", m3, [](Tensor& t) -> Tensor& { return t.clamp_(-0.1, 0.1); },
      [](const Tensor& t) { return clamp(t, -0.1, 0.1); });

  // conversions
  const std::vector<std::pair<std::string, std::pair<Tensor (Tensor::*)() const, DType>>> casts = {
      {"float32", {&Tensor::float32, kFloat32}}, {"float64", {&Tensor::float64, kFloat64}},
      {"half", {&Tensor::half, kFloat16}},       {"bfloat16", {&Tensor::bfloat16, kBFloat16}},
      {"int32", {&Tensor::int32, kInt32}},       {"int64", {&Tensor::int64, kInt64}}};
  const Tensor m3x4 = mul(m3, 4.0);  // integer parts for the int casts
  for (const auto& [name, p] : casts) {
    auto [meth, dt] = p;
    same(name, {m3x4}, one([meth](V v) { return (v[0].*meth)(); }),
         one([dt](V v) { return v[0].to(dt); }), false);
  }
  const Tensor f32 = rn({2, 2}).to(kFloat32);
  same("type_as", {m3, f32}, one([](V v) { return v[0].type_as(v[1]); }),
       one([](V v) { return v[0].to(v[1].dtype()); }), false);
  same("to", {m3, f32}, one([](V v) { return v[0].to(v[1]); }),
       one([](V v) { return v[0].to(v[1].device()).to(v[1].dtype()); }), false);
  same("to", {m3}, one([](V v) { return v[0].to(kCPU, kBFloat16, true); }),
       one([](V v) { return v[0].to(kBFloat16); }), false);
  g_compared.insert({"is_cpu", "is_cuda", "cuda"});
  CHECK(m3.is_cpu());
  CHECK(!m3.is_cuda());
  bool cuda = false;
  try {
    cuda = get_allocator(Device::cuda(0)) != nullptr;
  } catch (const Error&) {
  }
  if (!cuda) {
    CHECK_THROWS_AS(m3.cuda(), DeviceError);
  } else {
    Tensor g = m3.cuda(0, true);
    CHECK(g.is_cuda());
    CHECK(!g.is_cpu());
    CHECK(equal(g.cpu(), m3));
  }

  // Every method of the block was compared above: a new method needs its line here too.
  const std::string root = ACCEL_SOURCE_ROOT;
  for (const std::string& m : tensor_methods(read_text(root + "/core/tensor.h"), true))
    CHECK_MESSAGE(g_compared.count(m), "method ", m, " is not compared with its free function");
}

TEST_CASE("in-place methods refuse what they cannot store") {
  Tensor i = arange(6).reshape({2, 3});
  CHECK_THROWS_AS(i.add_(0.5), DTypeError);  // int64 + 0.5 promotes to float
  Tensor v = pos({3});
  {
    NoGradGuard no_grad;
    CHECK_THROWS_AS(v.add_(pos({2, 3}), 1), ShapeError);  // core's add_: no growing broadcast
    CHECK_THROWS_AS(v.div_(pos({2, 3})), ShapeError);     // result would be (2, 3)
  }
  Tensor w = pos({3}).requires_grad_(true);
  CHECK_THROWS_WITH_AS(w.masked_fill_(gt(w.detach(), 1.0), 0), doctest::Contains("masked_fill_"),
                       ValueError);
  CHECK(!w.grad_fn());  // refused before any graph was recorded
  // Method chains read as in PyTorch.
  Tensor x = tensor({1.f, -2.f, 3.f, -4.f}).reshape({2, 2});
  auto [vals, idx] = x.abs().max(1);
  CHECK(vals.tolist() == std::vector<double>{2, 4});
  CHECK(idx.tolist() == std::vector<double>{1, 1});
  CHECK(x.masked_fill(x.lt(0), 0).sum().item() == 4.0);
  CHECK(x.softmax(-1).sum(Shape{1}).allclose(ones({2})));
}
