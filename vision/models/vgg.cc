#include "vision/models/vgg.h"

#include "nn/activation.h"
#include "nn/batchnorm.h"
#include "nn/linear.h"
#include "vision/models/model_init.h"
#include "vision/models/weights.h"

namespace accel::vision::models {

namespace {
constexpr int64_t M = -1;  // a max pool in a cfg
const std::vector<int64_t> kCfgA = {64, M, 128, M, 256, 256, M, 512, 512, M, 512, 512, M};
const std::vector<int64_t> kCfgD = {64, 64,  M,   128, 128, M,   256, 256, 256,
                                    M,  512, 512, 512, M,   512, 512, 512, M};
}  // namespace

std::shared_ptr<nn::Sequential> make_vgg_layers(const std::vector<int64_t>& cfg, bool batch_norm) {
  auto layers = std::make_shared<nn::Sequential>();
  int64_t in_channels = 3;
  for (int64_t v : cfg) {
    if (v == M) {
      layers->push_back(std::make_shared<nn::MaxPool2d>(2, 2));
      continue;
    }
    ACCEL_CHECK(v > 0, ValueError, "make_vgg_layers",
                "cfg entries are channel counts or -1 (a max pool), got ", v);
    layers->push_back(std::make_shared<nn::Conv2d>(in_channels, v, 3, 1, 1));
    if (batch_norm) layers->push_back(std::make_shared<nn::BatchNorm2d>(v));
    layers->push_back(std::make_shared<nn::ReLU>(true));
    in_channels = v;
  }
  return layers;
}

VGG::VGG(std::shared_ptr<nn::Sequential> features_, const VGGOptions& o) {
  ACCEL_CHECK(features_ != nullptr, ValueError, "VGG", "features is null");
  ACCEL_CHECK(o.num_classes >= 1, ValueError, "VGG", "num_classes must be positive, got ",
              o.num_classes);
  features = register_module("features", std::move(features_));
  avgpool = register_module("avgpool", std::make_shared<nn::AdaptiveAvgPool2d>(7));
  classifier = register_module(
      "classifier",
      std::make_shared<nn::Sequential>(
          std::make_shared<nn::Linear>(512 * 7 * 7, 4096), std::make_shared<nn::ReLU>(true),
          std::make_shared<nn::Dropout>(o.dropout), std::make_shared<nn::Linear>(4096, 4096),
          std::make_shared<nn::ReLU>(true), std::make_shared<nn::Dropout>(o.dropout),
          std::make_shared<nn::Linear>(4096, o.num_classes)));
  if (o.init_weights) {
    detail::init_convs_kaiming_fan_out(*this, "relu");
    detail::init_norms(*this);
    detail::init_linears_normal(*this, 0.01);
  }
}

Tensor VGG::forward(const Tensor& x) {
  ACCEL_CHECK(x.defined() && x.dim() == 4 && x.size(1) == 3, ShapeError, "VGG",
              "expected an input (N, 3, H, W), got ", x.defined() ? x.sizes() : Shape{});
  Tensor h = (*avgpool)((*features)(x)).flatten(1);  // (N, 512 * 7 * 7)
  return (*classifier)(h);
}

namespace {
std::shared_ptr<VGG> build_vgg(const std::vector<int64_t>& cfg, bool batch_norm,
                               const VGGOptions& o) {
  return detail::build_as<VGG>(o.weights, [&] {
    VGGOptions opts = o;
    if (!o.weights.empty()) opts.init_weights = false;  // torchvision's, the file has the values
    return std::make_shared<VGG>(make_vgg_layers(cfg, batch_norm), opts);
  });
}
}  // namespace

std::shared_ptr<VGG> vgg11(const VGGOptions& o) { return build_vgg(kCfgA, false, o); }
std::shared_ptr<VGG> vgg11_bn(const VGGOptions& o) { return build_vgg(kCfgA, true, o); }
std::shared_ptr<VGG> vgg16(const VGGOptions& o) { return build_vgg(kCfgD, false, o); }
std::shared_ptr<VGG> vgg16_bn(const VGGOptions& o) { return build_vgg(kCfgD, true, o); }

}  // namespace accel::vision::models
