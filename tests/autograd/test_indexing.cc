// Advanced indexing and the smaller ops (sort, topk, multinomial, ...): semantics against PyTorch
// (the fixture tests/autograd/indexing_fixture.txt, written by make_indexing_fixture.py with
// python3-torch; no Python at test time), gradients, errors, and the cases the fixture cannot
// hold.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "accel.h"
#include "tests/common/check.h"
#include "tests/common/tensors.h"
#include "tests/common/util.h"

#ifndef ACCEL_SOURCE_ROOT
#error "ACCEL_SOURCE_ROOT (the repository root) is passed by tests/autograd/meson.build"
#endif

using namespace accel;
using namespace accel::indexing;
using accel::test::check_close;
using accel::test::split;
using accel::test::values_of;

namespace {

std::vector<int64_t> int_list(const std::string& s) {
  std::vector<int64_t> v;
  if (s.empty()) return v;
  for (const std::string& e : split(s, ',')) v.push_back(std::stoll(e));
  return v;
}

std::vector<double> double_list(const std::string& s) {
  std::vector<double> v;
  if (s.empty() || s == "-") return v;
  for (const std::string& e : split(s, ',')) v.push_back(std::stod(e));
  return v;
}

Shape shape_of(const std::string& s) {
  Shape r;
  for (int64_t v : int_list(s)) r.push_back(v);
  return r;
}

// The spec language of make_indexing_fixture.py. `int32` turns the int64 index tensors into
// int32 ones (the same meaning).
std::vector<TensorIndex> parse_spec(const std::string& spec, bool int32 = false) {
  std::vector<TensorIndex> out;
  std::istringstream in(spec);
  std::string tok;
  while (in >> tok) {
    if (tok == "N") {
      out.emplace_back(None);
    } else if (tok == "...") {
      out.emplace_back(Ellipsis);
    } else if (tok == "T" || tok == "F") {
      out.emplace_back(tok == "T");
    } else if (tok.find('(') != std::string::npos) {
      const std::string kind = tok.substr(0, tok.find('('));
      const std::string sh = tok.substr(tok.find('(') + 1, tok.find(")=") - tok.find('(') - 1);
      const std::vector<int64_t> vals = int_list(tok.substr(tok.find(")=") + 2));
      Tensor t = tensor(vals, Shape{int64_t(vals.size())}).reshape(shape_of(sh));
      if (kind == "b") t = t.to(kBool);
      if (kind == "u8") t = t.to(kUInt8);
      if (kind == "i32" || (kind == "i64" && int32)) t = t.to(kInt32);
      out.emplace_back(t);
    } else if (tok.find(':') != std::string::npos) {
      const std::vector<std::string> p = split(tok, ':');
      auto bound = [&](size_t i) -> std::optional<int64_t> {
        if (i >= p.size() || p[i].empty()) return std::nullopt;
        return std::stoll(p[i]);
      };
      out.emplace_back(Slice(bound(0), bound(1), bound(2)));
    } else {
      out.emplace_back(std::stoll(tok));
    }
  }
  return out;
}

std::vector<std::vector<std::string>> fixture(const std::string& kind) {
  std::ifstream f(std::string(ACCEL_SOURCE_ROOT) + "/tests/autograd/indexing_fixture.txt");
  REQUIRE_MESSAGE(f.good(), "cannot read the fixture");
  std::vector<std::vector<std::string>> rows;
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> r = split(line, '|');
    if (r[0] == kind) rows.push_back(r);
  }
  return rows;
}

Tensor arange_as(const Shape& s) {
  return arange(0.0, double(shape_numel(s)), 1.0, TensorOptions(kFloat64)).reshape(s);
}

// The same values as arange_as(s), stored with reversed dims (non-contiguous for rank >= 2).
Tensor arange_strided(const Shape& s) {
  Shape rev;
  for (int64_t d = int64_t(s.size()) - 1; d >= 0; --d) rev.push_back(d);
  return arange_as(s).permute(rev).contiguous().permute(rev);
}

}  // namespace

TEST_CASE("index: every fixture case matches PyTorch, and its gradient counts the picks") {
  const auto rows = fixture("read");
  REQUIRE(rows.size() >= 30);
  for (const auto& r : rows) {
    CAPTURE(r[1]);
    CAPTURE(r[3]);
    const Shape xs = shape_of(r[2]);
    const Shape want_shape = shape_of(r[4]);
    const std::vector<int64_t> want = int_list(r[5]);
    for (int variant = 0; variant < 3; ++variant) {
      CAPTURE(variant);  // 0: contiguous, 1: strided input, 2: int32 indices
      Tensor x = (variant == 1 ? arange_strided(xs) : arange_as(xs)).requires_grad_(true);
      if (variant == 1 && xs.size() >= 2) CHECK_FALSE(x.is_contiguous());
      Tensor out = x.index(parse_spec(r[3], variant == 2));
      REQUIRE(out.sizes() == want_shape);
      const std::vector<double> got = values_of(out);
      REQUIRE(got.size() == want.size());
      for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == double(want[i]));
      // d sum(out) / dx = how often each element was picked (the backward's scatter-add).
      std::vector<double> picks(size_t(shape_numel(xs)), 0.0);
      for (int64_t v : want) picks[size_t(v)] += 1;
      sum(out).backward();
      REQUIRE(x.grad().defined());
      CHECK(values_of(x.grad()) == picks);
    }
  }
}

TEST_CASE("index_put: every fixture case matches PyTorch (out of place and in place)") {
  const auto rows = fixture("put");
  REQUIRE(rows.size() >= 10);
  for (const auto& r : rows) {
    CAPTURE(r[1]);
    const Shape xs = shape_of(r[2]);
    const auto idx = parse_spec(r[3]);
    const std::vector<double> v = double_list(r[5]);
    const Tensor vals = tensor(v, Shape{int64_t(v.size())}).reshape(shape_of(r[4]));
    const bool acc = r[6] == "1";
    const std::vector<double> want = double_list(r[7]);
    Tensor x = arange_as(xs);
    CHECK(values_of(index_put(x, idx, vals, acc)) == want);
    CHECK(values_of(x.index_put(idx, vals, acc)) == want);
    Tensor y = arange_strided(xs);
    Tensor alias = y;
    Tensor& ret = y.index_put_(idx, vals, acc);
    CHECK(&ret == &y);
    CHECK(values_of(alias) == want);
    CHECK(values_of(x) == values_of(arange_as(xs)));  // out of place left x alone
    // Gradients: x gets 1 where kept (everywhere when accumulating), values get the sum of the
    // gradient at the places they went to (here: how many places each value went to).
    Tensor xg = arange_as(xs).requires_grad_(true);
    Tensor vg = vals.clone().requires_grad_(true);
    sum(index_put(xg, idx, vg, acc)).backward();
    const std::vector<double> gx = values_of(xg.grad());
    const std::vector<double> base = values_of(arange_as(xs));
    for (size_t i = 0; i < gx.size(); ++i) {
      if (acc) {
        CHECK(gx[i] == 1.0);
      } else {
        CHECK(gx[i] == ((want[i] == base[i]) ? 1.0 : 0.0));  // fixture values never equal x's
      }
    }
    const double total = sum(vg.grad()).item();
    CHECK(total == double(shape_numel(x.index(idx).sizes())));
  }
}

TEST_CASE("cross_entropy with weights or probability targets matches PyTorch") {
  const auto rows = fixture("ce");
  REQUIRE(rows.size() >= 8);
  for (const auto& r : rows) {
    CAPTURE(r[1]);
    const Shape ls = shape_of(r[2]);
    const std::vector<double> lv = double_list(r[3]);
    Tensor logits = tensor(lv, Shape{int64_t(lv.size())}).reshape(ls).requires_grad_(true);
    const bool probs = r[4] == "p";
    const Shape ts = shape_of(r[5]);
    Tensor target;
    if (probs) {
      const std::vector<double> tv = double_list(r[6]);
      target = tensor(tv, Shape{int64_t(tv.size())}).reshape(ts).requires_grad_(true);
    } else {
      const std::vector<int64_t> tv = int_list(r[6]);
      target = tensor(tv, Shape{int64_t(tv.size())}).reshape(ts);
    }
    const std::vector<double> wv = double_list(r[7]);
    Tensor w = wv.empty() ? Tensor() : tensor(wv, Shape{int64_t(wv.size())});
    const int64_t ignore = std::stoll(r[8]);
    const Reduction red = r[9] == "mean"  ? Reduction::Mean
                          : r[9] == "sum" ? Reduction::Sum
                                          : Reduction::None;
    const double smoothing = std::stod(r[10]);
    Tensor loss = cross_entropy(logits, target, w, ignore, red, smoothing);
    REQUIRE(loss.sizes() == shape_of(r[11]));
    check_close(loss, double_list(r[12]), 1e-10, 1e-10);
    sum(loss).backward();
    check_close(logits.grad(), double_list(r[13]), 1e-9, 1e-9);
    if (probs) check_close(target.grad(), double_list(r[14]), 1e-9, 1e-9);
    if (!w.defined()) {  // the overload without weights gives the same
      Tensor l2 = cross_entropy(logits.detach(), target.detach(), ignore, red, smoothing);
      check_close(l2, double_list(r[12]), 1e-10, 1e-10);
    }
  }
}

TEST_CASE("norm(p, dims, keepdim) matches PyTorch, zero-norm gradient included") {
  const auto rows = fixture("norm");
  REQUIRE(rows.size() >= 8);
  for (const auto& r : rows) {
    CAPTURE(r[1]);
    const std::vector<double> xv = double_list(r[3]);
    Tensor x = tensor(xv, Shape{int64_t(xv.size())}).reshape(shape_of(r[2])).requires_grad_(true);
    const Shape dims = shape_of(r[5]);
    const bool keep = r[6] == "1";
    Tensor out = r[4] == "fro" ? x.norm("fro", dims, keep)
                               : x.norm(r[4] == "inf"    ? INFINITY
                                        : r[4] == "-inf" ? -INFINITY
                                                         : std::stod(r[4]),
                                        dims, keep);
    REQUIRE(out.sizes() == shape_of(r[7]));
    check_close(out, double_list(r[8]), 1e-12, 1e-12);
    sum(out).backward();
    check_close(x.grad(), double_list(r[9]), 1e-12, 1e-12);
  }
}

TEST_CASE("index: basic indexing is a view, advanced indexing a copy, x[t] is index({t})") {
  Tensor x = arange_as({3, 4});
  Tensor v = x.index({Slice(), 1});
  CHECK(v.storage().get() == x.storage().get());
  CHECK(v.sizes() == Shape{3});
  {
    NoGradGuard ng;
    v.fill_(-1.0);
  }
  CHECK(x.index({2, 1}).item() == -1.0);
  Tensor idx = tensor(std::vector<int64_t>{2, 0}, {2});
  Tensor c = x.index({idx});
  CHECK(c.storage().get() != x.storage().get());
  CHECK(equal(x[idx], c));
  CHECK(equal(x[gt(x, 5.0)], x.masked_select(gt(x, 5.0))));
  CHECK(x[1].sizes() == Shape{4});                          // the int overload still selects
  CHECK(x.index({}).storage().get() == x.storage().get());  // x[()] is x
  // The README spellings.
  Tensor rows = tensor(std::vector<int64_t>{0, 2}, {2}),
         labels = tensor(std::vector<int64_t>{3, 1}, {2});
  Tensor y = zeros({3, 4});
  y.index_put_({rows, labels}, 1.0);
  CHECK(y.sum().item() == 2.0);
  CHECK(y.index({rows, labels}).tolist() == std::vector<double>{1, 1});
  CHECK(y.index({"...", None}).sizes() == Shape{3, 4, 1});
  CHECK(y.index({Ellipsis, None, 0}).sizes() == Shape{3, 1});
}

TEST_CASE("the backward uses the forward's indices even if the caller overwrites them") {
  Tensor x = arange_as({4}).requires_grad_(true);
  Tensor idx = tensor(std::vector<int64_t>{0, 2}, {2});
  Tensor y = x.index({idx});
  Tensor v = zeros({2}, kFloat64).requires_grad_(true);
  Tensor z = index_put(x, {idx}, v);
  auto [sv, si] = x.sort(0, true);
  {
    NoGradGuard ng;
    idx.fill_(1);
    si.fill_(0);
  }
  (sum(y) + sum(mul(z, arange_as({4}))) + sum(mul(sv, arange_as({4})))).backward();
  // y: 1 at 0 and 2; z: x's gradient 0..3 with the written places (0, 2) zeroed; sv: x sorted
  // descending is x[3, 2, 1, 0], so x[j] gets 3 - j.
  CHECK(x.grad().tolist() == std::vector<double>{1 + 0 + 3, 0 + 1 + 2, 1 + 0 + 1, 0 + 3 + 0});
  CHECK(v.grad().tolist() == std::vector<double>{0, 2});
}

TEST_CASE("index_put without accumulate: the last duplicate wins on the CPU") {
  // Documented choice (torch leaves it unspecified): the CPU kernel writes in index order.
  Tensor x = zeros({4});
  Tensor idx = tensor(std::vector<int64_t>{1, 3, 1, 1}, {4});
  Tensor v = tensor({10.f, 20.f, 30.f, 40.f});
  CHECK(index_put(x, {idx}, v).tolist() == std::vector<double>{0, 40, 0, 20});
  CHECK(index_put(x, {idx}, v, true).tolist() == std::vector<double>{0, 80, 0, 20});
}

TEST_CASE("index: errors name the op, the dim, the index and the size") {
  Tensor x = zeros({3, 4});
  CHECK_THROWS_WITH_AS(x.index({5}),
                       doctest::Contains("[index] index 5 is out of bounds for dimension 0 with "
                                         "size 3"),
                       IndexError);
  CHECK_THROWS_WITH_AS(x.index({Slice(), -5}),
                       doctest::Contains("index -5 is out of bounds for dimension 1 with size 4"),
                       IndexError);
  Tensor bad = tensor(std::vector<int64_t>{0, 4, 1}, {3});
  CHECK_THROWS_WITH_AS(x.index({Slice(), bad}),
                       doctest::Contains("[index] index 4 is out of bounds for dimension 1 with "
                                         "size 4"),
                       IndexError);
  CHECK_THROWS_WITH_AS(x.index({bad.to(kInt32) - 7}),
                       doctest::Contains("index -7 is out of bounds for dimension 0 with size 3"),
                       IndexError);
  CHECK_THROWS_WITH_AS(index_put(x, {bad}, zeros({})),
                       doctest::Contains("[index_put] index 4 is out of bounds for dimension 0"),
                       IndexError);
  // mask shapes: both named
  Tensor m = tensor(std::vector<int64_t>{1, 0, 1}, {3}).to(kBool);
  CHECK_THROWS_WITH_AS(x.index({Slice(), m}),
                       doctest::Contains("the mask of shape (3,) does not match the indexed "
                                         "tensor's dims 1..1 of shape (4,)"),
                       IndexError);
  // dtype misuse
  CHECK_THROWS_WITH_AS(x.index({tensor({1.f})}),
                       doctest::Contains("must be int64, int32, bool or uint8, got float32"),
                       DTypeError);
  CHECK_THROWS_AS(x.index({1, 2, 3}), IndexError);             // too many
  CHECK_THROWS_AS(x.index({Ellipsis, "...", 0}), IndexError);  // two ellipses
  CHECK_THROWS_WITH_AS(x.index({Slice(0, 3, 0)}),
                       doctest::Contains("step must be greater than zero"), ValueError);
  CHECK_THROWS_AS(x.index({Slice(3, 0, -1)}), ValueError);
  CHECK_THROWS_WITH_AS(x.index({"..x"}), doctest::Contains("\"...\""), ValueError);
  CHECK_THROWS_AS(x.index({Tensor()}), ValueError);
  Tensor a = tensor(std::vector<int64_t>{0, 1}, {2}),
         b = tensor(std::vector<int64_t>{0, 1, 2}, {3});
  CHECK_THROWS_WITH_AS(x.index({a, b}),
                       doctest::Contains("shape mismatch: indexing tensors could not be broadcast "
                                         "together with shapes (2,), (3,)"),
                       IndexError);
  // index_put's values
  CHECK_THROWS_WITH_AS(index_put(x, {a}, zeros({2, 4}, kFloat64)),
                       doctest::Contains("values of dtype float64 cannot be put into a float32"),
                       DTypeError);
  CHECK_THROWS_WITH_AS(index_put(x, {a}, zeros({3})),
                       doctest::Contains("values of shape (3,) cannot be broadcast to the indexing "
                                         "result of shape (2, 4)"),
                       ShapeError);
  Tensor z0 = zeros({});
  CHECK_THROWS_AS(z0.index({0}), IndexError);  // a 0-dim tensor has no dim to index
}

TEST_CASE("index: empty and 0-dim cases") {
  Tensor x = arange_as({3, 4});
  Tensor e = tensor(std::vector<int64_t>{}, {0});
  CHECK(x.index({e}).sizes() == Shape{0, 4});
  CHECK(x.index({Slice(), e}).sizes() == Shape{3, 0});
  CHECK(index_put(x, {e}, zeros({}, kFloat64)).tolist() == x.tolist());
  Tensor s = scalar_tensor(7.0, kFloat64);
  CHECK(s.index({None}).sizes() == Shape{1});
  CHECK(s.index({"..."}).item() == 7.0);
  CHECK(s.index({true}).sizes() == Shape{1});
  CHECK(s.index({false}).sizes() == Shape{0});
  CHECK(s.index({scalar_tensor(true, kBool)}).sizes() == Shape{1});
  CHECK(index_put(s, {true}, scalar_tensor(2.0, kFloat64)).item() == 2.0);
  Tensor empty_x = zeros({0, 3});
  CHECK(empty_x.index({Slice(), 1}).sizes() == Shape{0});
  CHECK_THROWS_WITH_AS(empty_x.index({tensor(std::vector<int64_t>{0}, {1})}),
                       doctest::Contains("index 0 is out of bounds for dimension 0 with size 0"),
                       IndexError);
  // A 0-dim int tensor selects, as PyTorch's int does.
  CHECK(x.index({scalar_tensor(int64_t(1), kInt64)}).tolist() == x[1].tolist());
}

TEST_CASE("masked_select, masked_scatter(_), take_along_dim, nonzero") {
  Tensor x = arange_as({2, 3});
  Tensor m = tensor(std::vector<int64_t>{1, 0, 1}, {3}).to(kBool);
  CHECK(x.masked_select(m).tolist() == std::vector<double>{0, 2, 3, 5});
  Tensor src = tensor(std::vector<double>{10, 20, 30, 40, 50}, {5});
  CHECK(x.masked_scatter(m, src).tolist() == std::vector<double>{10, 1, 20, 30, 4, 40});
  Tensor y = x.clone();
  y.masked_scatter_(m, src);
  CHECK(y.tolist() == std::vector<double>{10, 1, 20, 30, 4, 40});
  CHECK_THROWS_WITH_AS(x.masked_scatter(m, src.narrow(0, 0, 3)),
                       doctest::Contains("[masked_scatter] source has 3 elements"), ShapeError);
  CHECK_THROWS_AS(x.masked_select(m.to(kInt64)), DTypeError);
  // gradients: masked_select gives 1 at the selected places, masked_scatter splits g.
  Tensor xg = x.clone().requires_grad_(true), sg = src.clone().requires_grad_(true);
  sum(mul(masked_scatter(xg, m, sg), arange_as({2, 3}))).backward();
  CHECK(xg.grad().tolist() == std::vector<double>{0, 1, 0, 0, 4, 0});
  CHECK(sg.grad().tolist() == std::vector<double>{0, 2, 3, 5, 0});
  // take_along_dim: argsort then take is sort.
  Tensor r = tensor(std::vector<double>{3, 1, 2, 9, 7, 8}, {2, 3});
  CHECK(equal(r.take_along_dim(r.argsort(1), 1), std::get<0>(r.sort(1))));
  CHECK(r.take_along_dim(tensor(std::vector<int64_t>{5, 0}, {2})).tolist() ==
        std::vector<double>{8, 3});
  CHECK_THROWS_AS(r.take_along_dim(tensor(std::vector<int64_t>{0}, {1}), 1), ShapeError);
  // nonzero: NaN counts, -0.0 does not; 0-dim; empty
  Tensor z = tensor({0.f, NAN, -0.0f, 2.f}).reshape({2, 2});
  CHECK(z.nonzero().tolist() == std::vector<double>{0, 1, 1, 1});
  CHECK(z.nonzero().sizes() == Shape{2, 2});
  const auto cols = z.nonzero_numpy();
  REQUIRE(cols.size() == 2);
  CHECK(cols[0].tolist() == std::vector<double>{0, 1});
  CHECK(cols[1].tolist() == std::vector<double>{1, 1});
  CHECK(scalar_tensor(3.0).nonzero().sizes() == Shape{1, 0});
  CHECK(scalar_tensor(0.0).nonzero_numpy()[0].sizes() == Shape{0});
  CHECK(zeros({0, 5}).nonzero().sizes() == Shape{0, 2});
  // A large input: chunks in parallel, row-major order kept.
  Tensor big = gt(randn({300, 700}, TensorOptions(kFloat32), nullptr), 1.0);
  Tensor nz = big.nonzero();
  const std::vector<int64_t> flat =
      add(mul(nz.select(1, 0), 700), nz.select(1, 1)).to_vector<int64_t>();
  CHECK(int64_t(flat.size()) == sum(big).item<int64_t>());
  for (size_t i = 1; i < flat.size(); ++i) REQUIRE(flat[i] > flat[i - 1]);
}

TEST_CASE("sort, argsort, topk: order, stability, NaN, ties, gradient") {
  Tensor x = tensor(std::vector<double>{2, 1, 2, NAN, 1, 0}, {6});
  auto [v, i] = x.sort(0, false, true);
  CHECK(i.tolist() == std::vector<double>{5, 1, 4, 0, 2, 3});
  auto [vd, id] = x.sort(0, true, true);
  CHECK(id.tolist() == std::vector<double>{3, 0, 2, 1, 4, 5});  // NaN first, ties in input order
  CHECK(std::isnan(vd.tolist()[0]));
  auto [tv, ti] = x.topk(2, 0, false);
  CHECK(ti.tolist() == std::vector<double>{5, 1});  // tie 1/1: lower index first
  CHECK(ti.dtype() == kInt64);
  CHECK(x.argsort().tolist() == i.tolist());
  CHECK_THROWS_WITH_AS(x.topk(7), doctest::Contains("[topk] k = 7 is out of range"), ValueError);
  // topk along a middle dim, smallest, values and gradient
  Tensor y = arange_as({2, 4, 3}).neg().requires_grad_(true);
  auto [yv, yi] = y.topk(2, 1, false);
  CHECK(yv.sizes() == Shape{2, 2, 3});
  CHECK(yi.select(0, 0).select(1, 0).tolist() == std::vector<double>{3, 2});
  sum(yv).backward();
  CHECK(sum(y.grad()).item() == 12.0);
  CHECK(y.grad().select(1, 3).sum().item() == 6.0);
  // sort of an int tensor, and of bools
  Tensor b = tensor(std::vector<int64_t>{1, 0, 1, 0}, {4}).to(kBool);
  CHECK(std::get<1>(b.sort(0, false, true)).tolist() == std::vector<double>{1, 3, 0, 2});
  Tensor s0 = scalar_tensor(3.0);
  CHECK(std::get<0>(s0.sort()).item() == 3.0);
}

TEST_CASE("multinomial: distribution, zero categories, replacement, generator, errors") {
  Generator g(5);
  Tensor p = tensor({1.f, 0.f, 2.f, 3.f, 4.f});  // not normalised
  const int64_t n = 20000;
  const std::vector<int64_t> s = p.multinomial(n, true, &g).to_vector<int64_t>();
  std::vector<double> count(5, 0);
  for (int64_t c : s) count[size_t(c)] += 1;
  CHECK(count[1] == 0);
  const double probs[5] = {0.1, 0.0, 0.2, 0.3, 0.4};
  for (int c = 0; c < 5; ++c) {
    const double sd = std::sqrt(n * probs[c] * (1 - probs[c]));
    CHECK(std::abs(count[size_t(c)] - n * probs[c]) <= 5 * sd + 1);
  }
  // Same seed, same draws; 2-D rows are independent distributions.
  Generator g1(9), g2(9);
  Tensor rows = tensor({0.f, 1.f, 0.f, 1.f, 0.f, 0.f}).reshape({2, 3});
  CHECK(equal(rows.multinomial(4, true, &g1), rows.multinomial(4, true, &g2)));
  Tensor d = rows.multinomial(3, true, &g1);
  CHECK(d.sizes() == Shape{2, 3});
  CHECK(d.select(0, 0).tolist() == std::vector<double>{1, 1, 1});
  CHECK(d.select(0, 1).tolist() == std::vector<double>{0, 0, 0});
  // Without replacement: distinct, never a zero category, first draw follows p.
  std::vector<double> first(5, 0);
  for (int t = 0; t < 4000; ++t) {
    const std::vector<int64_t> w = p.multinomial(4, false, &g).to_vector<int64_t>();
    REQUIRE(std::set<int64_t>(w.begin(), w.end()).size() == 4);
    for (int64_t c : w) REQUIRE(c != 1);
    first[size_t(w[0])] += 1;
  }
  for (int c = 0; c < 5; ++c) {
    const double sd = std::sqrt(4000 * probs[c] * (1 - probs[c]));
    CHECK(std::abs(first[size_t(c)] - 4000 * probs[c]) <= 5 * sd + 1);
  }
  // Errors, as torch refuses them.
  CHECK_THROWS_WITH_AS(tensor({1.f, -1.f}).multinomial(1), doctest::Contains("element < 0"),
                       ValueError);
  CHECK_THROWS_WITH_AS(tensor({1.f, INFINITY}).multinomial(1), doctest::Contains("inf, nan"),
                       ValueError);
  CHECK_THROWS_WITH_AS(tensor({1.f, NAN}).multinomial(1), doctest::Contains("inf, nan"),
                       ValueError);
  CHECK_THROWS_WITH_AS(tensor({1.f, 1.f, 0.f, 0.f}).reshape({2, 2}).multinomial(1, true),
                       doctest::Contains("row 1 sum to <= 0"), ValueError);
  CHECK_THROWS_WITH_AS(tensor({1.f, 0.f, 1.f}).multinomial(3, false),
                       doctest::Contains("2 categories of nonzero probability"), ValueError);
  CHECK_THROWS_AS(tensor({1.f, 1.f}).multinomial(3, false), ValueError);
  CHECK_THROWS_AS(tensor({1.f, 1.f}).multinomial(0, true), ValueError);
  CHECK_THROWS_AS(tensor(std::vector<int64_t>{1, 1}, {2}).multinomial(1), DTypeError);
}

TEST_CASE("randn_like, rand_like, new_*, view_as, repeat, where with scalars") {
  Tensor x = zeros({2, 3}, kFloat64);
  Generator g1(3), g2(3);
  Tensor a = randn_like(x, &g1);
  CHECK(a.sizes() == x.sizes());
  CHECK(a.dtype() == kFloat64);
  CHECK(equal(a, randn({2, 3}, TensorOptions(kFloat64), &g2)));
  Tensor u = rand_like(x.to(kBFloat16));
  CHECK(u.dtype() == kBFloat16);
  CHECK(u.max().item() < 1.0);
  CHECK_THROWS_AS(randn_like(zeros({2}, kInt64)), DTypeError);
  CHECK_THROWS_AS(rand_like(zeros({2}, kInt32)), DTypeError);
  Tensor i = zeros({1}, kInt32);
  CHECK(i.new_zeros({2, 2}).dtype() == kInt32);
  CHECK(i.new_ones({3}).tolist() == std::vector<double>{1, 1, 1});
  CHECK(x.new_full({2}, 2.5).tolist() == std::vector<double>{2.5, 2.5});
  CHECK(x.new_empty({4, 1}).sizes() == Shape{4, 1});
  CHECK(x.new_empty({4, 1}).dtype() == kFloat64);
  Tensor w = arange_as({6});
  Tensor va = w.view_as(x);
  CHECK(va.sizes() == x.sizes());
  CHECK(va.storage().get() == w.storage().get());
  // repeat: hand-derived
  Tensor r = tensor(std::vector<double>{1, 2, 3, 4}, {2, 2});
  CHECK(r.repeat({2, 3}).sizes() == Shape{4, 6});
  CHECK(r.repeat({1, 2}).tolist() == std::vector<double>{1, 2, 1, 2, 3, 4, 3, 4});
  CHECK(r.repeat({2, 1, 1}).sizes() == Shape{2, 2, 2});
  CHECK(r.repeat({1, 1}).storage().get() != r.storage().get());
  CHECK_THROWS_AS(r.repeat({2}), ShapeError);
  // where with python-number scalars: torch's result dtypes
  Tensor c = tensor(std::vector<int64_t>{1, 0}, {2}).to(kBool);
  CHECK(where(c, 1.0, 0.0).dtype() == kFloat32);
  CHECK(where(c, 1, 0).dtype() == kInt64);
  CHECK(where(c, 1, 0.5).tolist() == std::vector<double>{1, 0.5});
  CHECK(where(c, tensor(std::vector<int64_t>{7, 8}, {2}), 0.5).dtype() == kFloat32);
  CHECK(where(c, 2, zeros({2}, kFloat64)).dtype() == kFloat64);
  CHECK(where(c, 2, zeros({2}, kFloat64)).tolist() == std::vector<double>{2, 0});
  CHECK(where(c, tensor(std::vector<int64_t>{7, 8}, {2}), 3).tolist() == std::vector<double>{7, 3});
}

TEST_CASE("cross_entropy: probability targets and weights are checked") {
  Tensor l = zeros({2, 3});
  // A floating target of another shape is taken for class indices, as torch does.
  CHECK_THROWS_WITH_AS(cross_entropy(l, zeros({2, 4})),
                       doctest::Contains("class indices (int64 or int32) or class probabilities "
                                         "of the input's shape (2, 3); got float32 of shape "
                                         "(2, 4)"),
                       DTypeError);
  CHECK_THROWS_AS(cross_entropy(l, zeros({2, 4}), ones({3})), DTypeError);
  CHECK_THROWS_AS(cross_entropy(l, zeros({2, 3}), 0), ValueError);  // ignore_index with probs
  CHECK_THROWS_WITH_AS(cross_entropy(l, tensor(std::vector<int64_t>{0, 1}, {2}), ones({4})),
                       doctest::Contains("weight of shape (4,) must be (C) = (3)"), ShapeError);
  CHECK_THROWS_WITH_AS(cross_entropy(l, tensor(std::vector<int64_t>{0, 5}, {2}), ones({3})),
                       doctest::Contains("target 5 at position 1 is out of bounds for 3 classes"),
                       IndexError);
  // Uniform probability targets of a uniform input: the loss is log(C).
  CHECK(cross_entropy(l, full({2, 3}, 1.0 / 3)).item() == doctest::Approx(std::log(3.0)));
}
