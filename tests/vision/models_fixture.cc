#include "tests/vision/models_fixture.h"

#include <doctest/doctest.h>

#include <fstream>
#include <sstream>

namespace accel::testing {

namespace {
constexpr int64_t kP = 2147483647, kW1 = 1327217885, kW2 = 1103515245;

std::string root() { return ACCEL_SOURCE_ROOT; }

Shape parse_shape(const std::string& s) {
  Shape shape;
  if (s == "-") return shape;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ',')) shape.push_back(std::stoll(part));
  return shape;
}

std::vector<ModelSpec> read_specs() {
  const std::string path = root() + "/tests/vision/models_fixture.txt";
  std::ifstream f(path);
  REQUIRE_MESSAGE(f.good(), "cannot read ", path);
  std::vector<ModelSpec> specs;
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream in(line);
    std::string tag;
    in >> tag;
    if (tag == "model") {
      ModelSpec m;
      std::string kwargs, input_word, input, mode;
      in >> m.name >> m.builder >> kwargs >> input_word >> input >> mode;
      REQUIRE_MESSAGE(input_word == "input", "bad model line: ", line);
      std::stringstream kw(kwargs);
      std::string item;
      while (kwargs != "-" && std::getline(kw, item, ',')) {
        const size_t eq = item.find('=');
        m.kwargs[item.substr(0, eq)] = item.substr(eq + 1);
      }
      m.input = parse_shape(input);
      m.mode = mode;
      specs.push_back(std::move(m));
      continue;
    }
    const bool entry_line = (tag == "p" || tag == "b") && !specs.empty();
    REQUIRE_MESSAGE(entry_line, "bad line: ", line);
    EntrySpec e;
    std::string dtype, shape, scale, offset;
    in >> e.key >> dtype >> shape >> scale >> offset;
    e.parameter = tag == "p";
    e.dtype = dtype == "int64" ? kInt64 : kFloat32;
    e.shape = parse_shape(shape);
    e.scale = std::stod(scale);
    e.offset = std::stod(offset);
    specs.back().entries.push_back(std::move(e));
  }
  return specs;
}
}  // namespace

Tensor formula(const Shape& shape, int64_t k, double scale, double offset) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  Tensor t = empty(shape, TensorOptions(kFloat64));
  double* v = t.data<double>();
  // r(i) = (i W1 + (k + 1) W2) mod P, stepped by W1 mod P; u = (2 r - P) 2^-31, exact.
  int64_t r = (((k + 1) * kW2) % kP + kP) % kP;
  for (int64_t i = 0; i < n; ++i) {
    const double u = double(2 * r - kP) * 0x1p-31;
    v[i] = u * scale + offset;
    r += kW1;
    if (r >= kP) r -= kP;
  }
  return t;
}

const std::vector<ModelSpec>& model_specs() {
  static const std::vector<ModelSpec> specs = read_specs();
  return specs;
}

const ModelSpec& model_spec(const std::string& name) {
  for (const ModelSpec& m : model_specs())
    if (m.name == name) return m;
  FAIL("no model ", name, " in models_fixture.txt");
  throw std::logic_error("unreachable");
}

const Tensor& fixture_tensor(const std::string& key) {
  static const nn::TensorDict t =
      nn::load_safetensors(root() + "/tests/vision/models_fixture.safetensors");
  auto it = t.find(key);
  REQUIRE_MESSAGE(it != t.end(), "models_fixture.safetensors lacks ", key);
  return it->second;
}

std::shared_ptr<nn::Module> build_model(const std::string& b,
                                        const std::map<std::string, std::string>& kwargs,
                                        const std::string& weights) {
  namespace vm = vision::models;
  auto num = [&](const char* k, int64_t def) {
    auto it = kwargs.find(k);
    return it == kwargs.end() ? def : std::stoll(it->second);
  };
  auto real = [&](const char* k, double def) {
    auto it = kwargs.find(k);
    return it == kwargs.end() ? def : std::stod(it->second);
  };
  for (const auto& [k, v] : kwargs) {
    const bool known = k == "num_classes" || k == "image_size" || k == "dropout";
    REQUIRE_MESSAGE(known, "kwarg ", k);
  }
  const int64_t nc = num("num_classes", 1000);
  if (b == "resnet18") return vm::resnet18({.weights = weights, .num_classes = nc});
  if (b == "resnet34") return vm::resnet34({.weights = weights, .num_classes = nc});
  if (b == "resnet50") return vm::resnet50({.weights = weights, .num_classes = nc});
  if (b == "resnet101") return vm::resnet101({.weights = weights, .num_classes = nc});
  // VGG's re-initialisation would draw 120M values that the fixture's formula replaces.
  const vm::VGGOptions vgg{.weights = weights, .num_classes = nc, .init_weights = false};
  if (b == "vgg11") return vm::vgg11(vgg);
  if (b == "vgg11_bn") return vm::vgg11_bn(vgg);
  if (b == "vgg16") return vm::vgg16(vgg);
  if (b == "vgg16_bn") return vm::vgg16_bn(vgg);
  if (b == "mobilenet_v2")
    return vm::mobilenet_v2(
        {.weights = weights, .num_classes = nc, .dropout = real("dropout", 0.2)});
  if (b == "mobilenet_v3_small")
    return vm::mobilenet_v3_small({.weights = weights, .num_classes = nc});
  if (b == "mobilenet_v3_large")
    return vm::mobilenet_v3_large({.weights = weights, .num_classes = nc});
  if (b == "efficientnet_b0") return vm::efficientnet_b0({.weights = weights, .num_classes = nc});
  if (b == "vit_b_16")
    return vm::vit_b_16(
        {.weights = weights, .num_classes = nc, .image_size = num("image_size", 224)});
  if (b == "alexnet") return vm::alexnet({.weights = weights, .num_classes = nc});
  if (b == "squeezenet1_0") return vm::squeezenet1_0({.weights = weights, .num_classes = nc});
  if (b == "squeezenet1_1") return vm::squeezenet1_1({.weights = weights, .num_classes = nc});
  FAIL("no builder ", b);
  return nullptr;
}

nn::TensorDict formula_state(const ModelSpec& spec) {
  nn::TensorDict sd;
  for (size_t k = 0; k < spec.entries.size(); ++k) {
    const EntrySpec& e = spec.entries[k];
    sd[e.key] = e.dtype == kInt64 ? full(e.shape, int64_t(e.offset), TensorOptions(kInt64))
                                  : formula(e.shape, int64_t(k), e.scale, e.offset);
  }
  return sd;
}

}  // namespace accel::testing
