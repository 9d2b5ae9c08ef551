// Registry of gradcheck sample inputs. Each op family adds samples in samples_<family>.cc:
//
//   GRAD_SAMPLE("mul", "broadcast row", (rnd({3, 4}), rnd({4})),
//               { return mul(x[0], x[1]); });
//
// Inputs made with rnd()/rnd_pos() are float64 and require grad; pass other tensors (indices,
// masks) as-is. Every name in autograd::differentiable_ops() needs at least one sample.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "accel.h"

namespace accel::testing {

struct GradSample {
  std::string op;
  std::string label;
  std::function<std::vector<Tensor>()> make_inputs;
  std::function<Tensor(const std::vector<Tensor>&)> fn;
  double eps = 1e-6;  // only conversions to a narrower dtype override this (see samples_views.cc)
};

std::vector<GradSample>& grad_samples();

struct GradSampleRegistrar {
  GradSampleRegistrar(const char* op, const char* label, std::function<std::vector<Tensor>()> mk,
                      std::function<Tensor(const std::vector<Tensor>&)> fn) {
    grad_samples().push_back({op, label, std::move(mk), std::move(fn)});
  }
};

// Changes the finite-difference step of the most recently registered sample.
struct GradSampleEps {
  explicit GradSampleEps(double eps) { grad_samples().back().eps = eps; }
};

// Deterministic float64 inputs requiring grad: uniform in [-1, 1) / [0.5, 1.5).
Tensor rnd(const Shape& shape);
Tensor rnd_pos(const Shape& shape);

}  // namespace accel::testing

#define GRAD_SAMPLE_CAT2(a, b) a##b
#define GRAD_SAMPLE_CAT(a, b) GRAD_SAMPLE_CAT2(a, b)
#define GRAD_SAMPLE_UNPAREN(...) __VA_ARGS__
// GRAD_SAMPLE(op, label, (input, input, ...), { body using x[i] })
#define GRAD_SAMPLE(op, label, inputs, ...)                                                   \
  static ::accel::testing::GradSampleRegistrar GRAD_SAMPLE_CAT(grad_sample_, __LINE__)(      \
      op, label,                                                                              \
      []() -> std::vector<::accel::Tensor> {                                                  \
        return std::vector<::accel::Tensor>{GRAD_SAMPLE_UNPAREN inputs};                      \
      },                                                                                      \
      [](const std::vector<::accel::Tensor>& x) -> ::accel::Tensor __VA_ARGS__)
