// What accel writes into the committed accel_*.pt fixtures: write_pt_fixtures.cc writes them
// (make_torch_fixtures.py runs it and checks every file in PyTorch, building the same content with
// the same formulas), test_torch_format.cc builds the content again and checks that save_pt writes
// the committed bytes. Change a formula here and in make_torch_fixtures.py together.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "io/torch_format.h"
#include "autograd/ops.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "optim/torch_state.h"

namespace pt_content {

using accel::DType;
using accel::Shape;
using accel::Tensor;
using accel::io::PtEntry;
using accel::io::PtValue;

// The dtypes and the names the fixtures give them.
struct NamedDType {
  const char* name;
  DType dtype;
};
inline const std::vector<NamedDType>& dtypes() {
  static const std::vector<NamedDType> d = {{"f32", accel::kFloat32}, {"f64", accel::kFloat64},
                                            {"f16", accel::kFloat16}, {"bf16", accel::kBFloat16},
                                            {"i32", accel::kInt32},   {"i64", accel::kInt64},
                                            {"u8", accel::kUInt8},    {"bool", accel::kBool}};
  return d;
}

// Element i of a tensor of dtype d (values every dtype holds exactly; `salt` shifts them).
inline double value(int64_t i, DType d, int64_t salt) {
  const int64_t k = i + salt;
  switch (d) {
    case DType::Bool: return k % 3 == 0 ? 1 : 0;
    case DType::UInt8: return double((k * 7) % 256);
    case DType::Int32: return double((k % 17 - 8) * 100003);
    case DType::Int64: return double((k % 17 - 8) * (int64_t(1) << 40));
    default: return double(k % 17 - 8) + 0.25 * double(k % 4);
  }
}

inline Tensor make(const Shape& shape, DType d, int64_t salt = 0) {
  std::vector<double> v(size_t(accel::shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = value(int64_t(i), d, salt);
  return accel::tensor(v, shape, accel::TensorOptions(accel::kFloat64)).to(d);
}

// accel_state.pt: every dtype as a matrix, its transpose (a view of the same storage), rows 1-3
// of a larger matrix (a view at an offset), a 0-dim and an empty tensor; an expanded vector.
inline accel::io::TensorDict state() {
  accel::io::TensorDict sd;
  int64_t salt = 0;
  for (const NamedDType& d : dtypes()) {
    const std::string n = d.name;
    const Tensor base = make({3, 4}, d.dtype, salt);
    sd[n] = base;
    sd[n + ".t"] = base.t();
    sd[n + ".narrow"] = make({5, 4}, d.dtype, salt + 1).narrow(0, 1, 3);
    sd[n + ".scalar"] = make({}, d.dtype, salt + 2);
    sd[n + ".empty"] = make({0, 3}, d.dtype);
    salt += 5;
  }
  sd["expand"] = make({3}, accel::kFloat32, 1).expand({4, 3});
  return sd;
}

// accel_tree.pt: the values of a Python tree, with list and dict batches over 1000 items (a last
// batch of one, a dict of exactly 1000, containers of one item) and more than 256 memoized
// strings.
inline PtValue tree() {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<PtValue> ints;
  for (int64_t v :
       {int64_t(0), int64_t(1), int64_t(255), int64_t(256), int64_t(65535), int64_t(65536),
        int64_t(-1), int64_t(INT32_MIN), int64_t(INT32_MAX), int64_t(INT32_MAX) + 1,
        int64_t(INT32_MIN) - 1, int64_t(1) << 40, -(int64_t(1) << 40), INT64_MAX, INT64_MIN})
    ints.push_back(v);
  // prefix + i, built in place (GCC 12 warns falsely on "s" + std::string temporaries).
  auto named = [](char prefix, int64_t i) {
    std::string s(1, prefix);
    s += std::to_string(i);
    return s;
  };
  std::vector<PtValue> counting, strs;
  for (int64_t i = 0; i < 2001; ++i) counting.push_back(i);
  for (int i = 0; i < 300; ++i) strs.push_back(named('s', i));
  std::vector<PtEntry> big, thousand;
  for (int64_t i = 0; i < 1001; ++i) big.push_back({named('k', i), i});
  for (int64_t i = 0; i < 1000; ++i) thousand.push_back({named('d', i), -i});
  const Tensor m = make({2, 3}, accel::kFloat32, 7);
  PtValue od = PtValue::ordered_dict(
      {{"weight", make({2, 2}, accel::kFloat64, 3)}, {"steps", make({}, accel::kInt64, 4)}});
  od.attributes().push_back(
      {"_metadata", PtValue::ordered_dict({{"", PtValue::dict({{"version", 1}})}})});
  return PtValue::dict({
      {"ints", PtValue::list(ints)},
      {"floats", PtValue::list({0.0, -0.0, 1.5, -2.25, 1e-300, 1e300, inf, -inf})},
      {"strings",
       PtValue::list({"", "a", "h\xc3\xa9llo w\xc3\xb6rld", "\xe6\x97\xa5\xe6\x9c\xac"})},
      {"bools", PtValue::list({true, false})},
      {"none", PtValue()},
      {"tuples", PtValue::list({PtValue::tuple(), PtValue::tuple({1}), PtValue::tuple({1, 2}),
                                PtValue::tuple({1, 2, 3}), PtValue::tuple({1, 2, 3, 4, 5})})},
      {"nested",
       PtValue::dict(
           {{"a",
             PtValue::dict({{"b", PtValue::list({1, PtValue::list({2, PtValue::list({3})})})}})}})},
      {"int_keys", PtValue::dict({{0, "zero"}, {1, "one"}, {-7, "minus seven"}})},
      {"od", od},
      {"matrix", m},
      {"matrix_t", m.t()},
      {"counting", PtValue::list(counting)},
      {"strs", PtValue::list(strs)},
      {"big_dict", PtValue::dict(big)},
      {"dict_1000", PtValue::dict(thousand)},
      {"one", PtValue::list({PtValue::dict({{"x", PtValue::list({7})}})})},
  });
}

// The optimizer runs of accel_adam.pt and accel_sgd.pt: two steps over float64 parameters
// (weight (2, 3), bias (2,)) with gradients from value(), then {'optimizer': torch's layout,
// 'params': {'weight': ..., 'bias': ...}}.
inline Tensor grad(const Shape& s, int step, int64_t which) {
  return make(s, accel::kFloat64, 10 * step + which) * 0.1;
}

template <typename Run>
PtValue run_optimizer(Run make_opt) {
  Tensor w = make({2, 3}, accel::kFloat64, 1) * 0.5;
  Tensor b = make({2}, accel::kFloat64, 2) * 0.5;
  w.requires_grad_(true);
  b.requires_grad_(true);
  auto opt = make_opt(w, b);
  for (int step = 1; step <= 2; ++step) {
    w.set_grad(grad({2, 3}, step, 0));
    b.set_grad(grad({2}, step, 1));
    opt->step();
  }
  return PtValue::dict({{"optimizer", accel::optim::torch_state(*opt)},
                        {"params", PtValue::dict({{"weight", w.detach()}, {"bias", b.detach()}})}});
}

inline PtValue adam_run() {
  return run_optimizer([](const Tensor& w, const Tensor& b) {
    using namespace accel::optim;
    return std::make_unique<Adam>(
        std::vector<ParamGroup>{ParamGroup{{w}, 0.01, 0.1}, ParamGroup{{b}, 0.02, 0.0}},
        AdamFields{.lr = 0.01, .betas = {0.9, 0.99}, .eps = 1e-6, .weight_decay = 0.1});
  });
}

inline PtValue sgd_run() {
  return run_optimizer([](const Tensor& w, const Tensor& b) {
    using namespace accel::optim;
    return std::make_unique<SGD>(
        std::vector<Tensor>{w, b},
        SGDFields{.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01});
  });
}

inline PtValue adamw_run() {
  return run_optimizer([](const Tensor& w, const Tensor& b) {
    using namespace accel::optim;
    return std::make_unique<AdamW>(
        std::vector<Tensor>{w, b},
        AdamWFields{.lr = 0.01, .betas = {0.8, 0.9}, .eps = 1e-7, .weight_decay = 0.05});
  });
}

// The zip64 threshold of accel_zip64.pt (accel_state's content): every record and offset from
// this size on goes to zip64 fields.
constexpr uint64_t kZip64Threshold = 0;

}  // namespace pt_content
