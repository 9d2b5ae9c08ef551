// The model-zoo fixture of tests/vision (models_fixture.txt and models_fixture.safetensors, made
// by make_models_fixture.py with torchvision 0.14): the specs of torchvision's state dicts, the
// deterministic values every entry is set to, and the models built by the same names.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "accel.h"

namespace accel::testing {

struct EntrySpec {
  bool parameter;  // 'p' or 'b'
  std::string key;
  DType dtype;
  Shape shape;
  double scale, offset;
};

struct ModelSpec {
  std::string name, builder;
  std::map<std::string, std::string> kwargs;
  Shape input;
  std::string mode;                // "eval", "train", or "names" (checked by name only)
  std::vector<EntrySpec> entries;  // torchvision's state_dict() order
};

// u(i, k) of make_models_fixture.py, offset + scale u(i, k) for i < shape.numel(), float64.
Tensor formula(const Shape& shape, int64_t k, double scale = 1.0, double offset = 0.0);

const std::vector<ModelSpec>& model_specs();
const ModelSpec& model_spec(const std::string& name);
// models_fixture.safetensors: <case>.logits, <case>.grad.<key>, <case>.after.<key>.
const Tensor& fixture_tensor(const std::string& key);

// The torchvision builder `builder` with the fixture's kwargs (num_classes, image_size, dropout).
std::shared_ptr<nn::Module> build_model(const std::string& builder,
                                        const std::map<std::string, std::string>& kwargs,
                                        const std::string& weights = "");

// Every entry of the spec set by the formula: float64 values, int64 counters.
nn::TensorDict formula_state(const ModelSpec& spec);

}  // namespace accel::testing
