// Datasets, transforms, subsets, concatenation and the default collate.
#include <doctest/doctest.h>

#include "helpers.h"

using namespace accel;
using namespace accel::data;
using namespace accel::data::testing;

namespace {
// (n, 3) float features with row i = (i, i + 0.5, -i), labels i % 4.
std::shared_ptr<TensorDataset> toy(int64_t n) {
  std::vector<float> f;
  std::vector<int64_t> l;
  for (int64_t i = 0; i < n; ++i) {
    f.insert(f.end(), {float(i), float(i) + 0.5f, -float(i)});
    l.push_back(i % 4);
  }
  return std::make_shared<TensorDataset>(std::vector<Tensor>{tensor(f, {n, 3}), tensor(l, {n})},
                                         std::vector<std::string>{"x", "y"});
}
}  // namespace

TEST_CASE("TensorDataset get and get_batch agree with the rows") {
  auto ds = toy(10);
  CHECK(ds->size() == 10);
  Example e = ds->get(7);
  CHECK(e["x"].tolist() == std::vector<double>{7, 7.5, -7});
  CHECK(e["y"].item<int64_t>() == 3);
  CHECK_THROWS_AS(ds->get(10), IndexError);
  CHECK_THROWS_AS(e["z"], IndexError);

  std::vector<int64_t> idx{3, 4, 5, 9, 0};  // a run and singles
  Example b;
  REQUIRE(ds->get_batch(idx, nullptr, b));
  CHECK(b["x"].sizes() == Shape{5, 3});
  CHECK(ints(b["y"]) == std::vector<int64_t>{3, 0, 1, 1, 0});
  // Same as get() + collate_stack.
  std::vector<Example> ex;
  for (int64_t i : idx) ex.push_back(ds->get(i));
  Example c = collate_stack(ex);
  CHECK(c["x"].tolist() == b["x"].tolist());
  CHECK(c["y"].tolist() == b["y"].tolist());
  CHECK(c.names == b.names);
}

TEST_CASE("TensorDataset rejects mismatched rows, and non-contiguous input is copied") {
  CHECK_THROWS_AS(TensorDataset({zeros({4, 2}), zeros({5})}), ShapeError);
  CHECK_THROWS_AS(TensorDataset({scalar_tensor(1)}), ShapeError);
  CHECK_THROWS_AS(TensorDataset({zeros({4})}, {"a", "b"}), ValueError);
  Tensor t = arange(0, 6, 1, kFloat32).view({2, 3}).t();  // (3, 2), non-contiguous
  TensorDataset ds({t});
  CHECK(ds.get(1)[0].tolist() == std::vector<double>{1, 4});
  Example b;
  ds.get_batch(std::vector<int64_t>{2, 0}, nullptr, b);
  CHECK(b[0].tolist() == std::vector<double>{2, 5, 0, 3});
}

TEST_CASE("collate_stack checks shapes and dtypes, and stacks scalars and strided fields") {
  std::vector<Example> ok{Example{scalar_tensor(1.0), zeros({2})},
                          Example{scalar_tensor(2.0), ones({2})}};
  Example c = collate_stack(ok);
  CHECK(c[0].sizes() == Shape{2});
  CHECK(c[0].tolist() == std::vector<double>{1, 2});
  CHECK(c[1].tolist() == std::vector<double>{0, 0, 1, 1});

  Tensor m = arange(0, 4, 1, kFloat32).view({2, 2});
  std::vector<Example> strided{Example{m.t()}, Example{m}};
  CHECK(collate_stack(strided)[0].tolist() == std::vector<double>{0, 2, 1, 3, 0, 1, 2, 3});

  std::vector<Example> bad_shape{Example{zeros({2})}, Example{zeros({3})}};
  CHECK_THROWS_AS(collate_stack(bad_shape), ShapeError);
  std::vector<Example> bad_dtype{Example{zeros({2})}, Example{zeros({2}, kFloat64)}};
  CHECK_THROWS_AS(collate_stack(bad_dtype), DTypeError);
  std::vector<Example> bad_count{Example{zeros({2})}, Example{zeros({2}), zeros({2})}};
  CHECK_THROWS_AS(collate_stack(bad_count), ShapeError);
  CHECK_THROWS_AS(collate_stack({}), ValueError);
}

TEST_CASE("map, map_field, Subset, ConcatDataset, random_split") {
  auto ds = toy(6);
  auto doubled = map_field(ds, 0, [](Tensor t) { return t.clone().mul_(2.0); });
  CHECK(doubled->get(2)[0].tolist() == std::vector<double>{4, 5, -4});
  CHECK(doubled->get(2)[1].item<int64_t>() == 2);
  Example dummy;
  CHECK_FALSE(doubled->get_batch(std::vector<int64_t>{0}, nullptr, dummy));  // transform must run

  Subset sub(ds, {5, 1, 1});
  CHECK(sub.size() == 3);
  CHECK(sub.get(0)["y"].item<int64_t>() == 1);
  Example sb;
  REQUIRE(sub.get_batch(std::vector<int64_t>{0, 2}, nullptr, sb));
  CHECK(sb[0].tolist() == std::vector<double>{5, 5.5, -5, 1, 1.5, -1});
  CHECK_THROWS_AS(Subset(ds, {6}), IndexError);

  auto other = toy(3);
  ConcatDataset cat({ds, other});
  CHECK(cat.size() == 9);
  CHECK(cat.get(6)[0].tolist() == std::vector<double>{0, 0.5, 0});
  CHECK(cat.get(5)[0].tolist() == std::vector<double>{5, 5.5, -5});
  CHECK_THROWS_AS(cat.get(9), IndexError);
  Example cb;
  CHECK(cat.get_batch(std::vector<int64_t>{7, 8}, nullptr, cb));
  CHECK(cb[0].tolist() == std::vector<double>{1, 1.5, -1, 2, 2.5, -2});
  CHECK_FALSE(cat.get_batch(std::vector<int64_t>{5, 6}, nullptr, cb));  // spans parts

  auto parts = random_split(ds, {4, 2}, 7);
  REQUIRE(parts.size() == 2);
  std::vector<int64_t> seen;
  for (auto& p : parts)
    for (int64_t i = 0; i < p->size(); ++i) seen.push_back(p->get(i)[0].tolist()[0]);
  std::sort(seen.begin(), seen.end());
  CHECK(seen == std::vector<int64_t>{0, 1, 2, 3, 4, 5});
  CHECK_THROWS_AS(random_split(ds, {4, 1}, 7), ValueError);
}

TEST_CASE("sample_generator depends only on (seed, epoch, index)") {
  set_current_sample({11, 2, 5});
  const uint64_t a = sample_generator().next_u64();
  set_current_sample({11, 2, 6});
  const uint64_t b = sample_generator().next_u64();
  set_current_sample({11, 3, 5});
  const uint64_t c = sample_generator().next_u64();
  set_current_sample({11, 2, 5});
  CHECK(sample_generator().next_u64() == a);
  CHECK(a != b);
  CHECK(a != c);
  set_current_sample({});
}
