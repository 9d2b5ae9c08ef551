#include "vision/models/small.h"

#include "nn/init.h"
#include "nn/linear.h"
#include "autograd/ops.h"
#include "vision/models/weights.h"

namespace accel::vision::models {

namespace {
void check_input(const char* model, const Tensor& x) {
  ACCEL_CHECK(x.defined() && x.dim() == 4 && x.size(1) == 3, ShapeError, model,
              "expected an input (N, 3, H, W), got ", x.defined() ? x.sizes() : Shape{});
}
std::shared_ptr<nn::ReLU> relu() { return std::make_shared<nn::ReLU>(true); }
}  // namespace

// ---------------- AlexNet ----------------

AlexNet::AlexNet(const AlexNetOptions& o) {
  ACCEL_CHECK(o.num_classes >= 1, ValueError, "AlexNet", "num_classes must be positive, got ",
              o.num_classes);
  features = register_module(
      "features",
      std::make_shared<nn::Sequential>(std::make_shared<nn::Conv2d>(3, 64, 11, 4, 2), relu(),
                                       std::make_shared<nn::MaxPool2d>(3, 2),
                                       std::make_shared<nn::Conv2d>(64, 192, 5, 1, 2), relu(),
                                       std::make_shared<nn::MaxPool2d>(3, 2),
                                       std::make_shared<nn::Conv2d>(192, 384, 3, 1, 1), relu(),
                                       std::make_shared<nn::Conv2d>(384, 256, 3, 1, 1), relu(),
                                       std::make_shared<nn::Conv2d>(256, 256, 3, 1, 1), relu(),
                                       std::make_shared<nn::MaxPool2d>(3, 2)));
  avgpool = register_module("avgpool", std::make_shared<nn::AdaptiveAvgPool2d>(6));
  classifier = register_module(
      "classifier",
      std::make_shared<nn::Sequential>(std::make_shared<nn::Dropout>(o.dropout),
                                       std::make_shared<nn::Linear>(256 * 6 * 6, 4096), relu(),
                                       std::make_shared<nn::Dropout>(o.dropout),
                                       std::make_shared<nn::Linear>(4096, 4096), relu(),
                                       std::make_shared<nn::Linear>(4096, o.num_classes)));
}

Tensor AlexNet::forward(const Tensor& x) {
  check_input("AlexNet", x);
  Tensor h = (*avgpool)((*features)(x)).flatten(1);  // (N, 256 * 6 * 6)
  return (*classifier)(h);
}

std::shared_ptr<AlexNet> alexnet(const AlexNetOptions& o) {
  return detail::build_as<AlexNet>(o.weights, [&] { return std::make_shared<AlexNet>(o); });
}

// ---------------- SqueezeNet ----------------

Fire::Fire(int64_t inplanes_, int64_t squeeze_planes, int64_t expand1x1_planes,
           int64_t expand3x3_planes)
    : inplanes(inplanes_) {
  squeeze = register_module("squeeze", std::make_shared<nn::Conv2d>(inplanes, squeeze_planes, 1));
  squeeze_activation = register_module("squeeze_activation", relu());
  expand1x1 = register_module("expand1x1",
                              std::make_shared<nn::Conv2d>(squeeze_planes, expand1x1_planes, 1));
  expand1x1_activation = register_module("expand1x1_activation", relu());
  expand3x3 = register_module(
      "expand3x3", std::make_shared<nn::Conv2d>(squeeze_planes, expand3x3_planes, 3, 1, 1));
  expand3x3_activation = register_module("expand3x3_activation", relu());
}

Tensor Fire::forward(const Tensor& x) {
  const Tensor s = (*squeeze_activation)((*squeeze)(x));
  return cat({(*expand1x1_activation)((*expand1x1)(s)), (*expand3x3_activation)((*expand3x3)(s))},
             1);
}

SqueezeNet::SqueezeNet(const std::string& version, const SqueezeNetOptions& o)
    : num_classes(o.num_classes) {
  ACCEL_CHECK(version == "1_0" || version == "1_1", ValueError, "SqueezeNet",
              "unsupported SqueezeNet version ", version, ": 1_0 or 1_1 expected");
  ACCEL_CHECK(num_classes >= 1, ValueError, "SqueezeNet", "num_classes must be positive, got ",
              num_classes);
  auto pool = [] {
    return std::make_shared<nn::MaxPool2d>(nn::MaxPool2dOptions(3).stride(2).ceil_mode(true));
  };
  auto fire = [](int64_t a, int64_t b, int64_t c, int64_t d) {
    return std::make_shared<Fire>(a, b, c, d);
  };
  std::shared_ptr<nn::Sequential> f;
  if (version == "1_0") {
    f = std::make_shared<nn::Sequential>(std::make_shared<nn::Conv2d>(3, 96, 7, 2), relu(), pool(),
                                         fire(96, 16, 64, 64), fire(128, 16, 64, 64),
                                         fire(128, 32, 128, 128), pool(), fire(256, 32, 128, 128),
                                         fire(256, 48, 192, 192), fire(384, 48, 192, 192),
                                         fire(384, 64, 256, 256), pool(), fire(512, 64, 256, 256));
  } else {
    f = std::make_shared<nn::Sequential>(std::make_shared<nn::Conv2d>(3, 64, 3, 2), relu(), pool(),
                                         fire(64, 16, 64, 64), fire(128, 16, 64, 64), pool(),
                                         fire(128, 32, 128, 128), fire(256, 32, 128, 128), pool(),
                                         fire(256, 48, 192, 192), fire(384, 48, 192, 192),
                                         fire(384, 64, 256, 256), fire(512, 64, 256, 256));
  }
  features = register_module("features", f);
  auto final_conv = std::make_shared<nn::Conv2d>(512, num_classes, 1);
  classifier = register_module(
      "classifier",
      std::make_shared<nn::Sequential>(std::make_shared<nn::Dropout>(o.dropout), final_conv, relu(),
                                       std::make_shared<nn::AdaptiveAvgPool2d>(1)));
  for (auto& [name, m] : named_modules()) {
    if (auto* conv = dynamic_cast<nn::Conv2d*>(m)) {
      if (conv == final_conv.get()) {
        nn::init::normal_(conv->weight, 0.0, 0.01);
      } else {
        nn::init::kaiming_uniform_(conv->weight);
      }
      nn::init::zeros_(conv->bias);
    }
  }
}

Tensor SqueezeNet::forward(const Tensor& x) {
  check_input("SqueezeNet", x);
  return (*classifier)((*features)(x)).flatten(1);
}

std::shared_ptr<SqueezeNet> squeezenet1_0(const SqueezeNetOptions& o) {
  return detail::build_as<SqueezeNet>(o.weights,
                                      [&] { return std::make_shared<SqueezeNet>("1_0", o); });
}
std::shared_ptr<SqueezeNet> squeezenet1_1(const SqueezeNetOptions& o) {
  return detail::build_as<SqueezeNet>(o.weights,
                                      [&] { return std::make_shared<SqueezeNet>("1_1", o); });
}

}  // namespace accel::vision::models
