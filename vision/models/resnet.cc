#include "vision/models/resnet.h"

#include "nn/batchnorm.h"
#include "nn/init.h"
#include "autograd/ops.h"
#include "vision/models/model_init.h"
#include "vision/models/weights.h"

namespace accel::vision::models {

namespace {
ops::NormLayer or_batch_norm(ops::NormLayer norm) {
  return norm ? std::move(norm) : ops::batch_norm2d();
}
// torchvision's conv3x3 / conv1x1 (no bias: a norm follows).
std::shared_ptr<nn::Conv2d> conv3x3(int64_t in, int64_t out, int64_t stride = 1, int64_t groups = 1,
                                    int64_t dilation = 1) {
  return std::make_shared<nn::Conv2d>(in, out, 3, stride, dilation, dilation, groups, false);
}
std::shared_ptr<nn::Conv2d> conv1x1(int64_t in, int64_t out, int64_t stride = 1) {
  return std::make_shared<nn::Conv2d>(in, out, 1, stride, 0, 1, 1, false);
}
// torchvision's `self.downsample = downsample` makes the entry even when it is None, so that a
// later `block->downsample = ...` registers the new module. register_module refuses null: a None
// entry is registered with a placeholder, then set to None (the callers).
std::shared_ptr<nn::Module> or_placeholder(const std::shared_ptr<nn::Module>& m) {
  return m ? m : std::make_shared<nn::Identity>();
}
}  // namespace

BasicBlock::BasicBlock(int64_t inplanes, int64_t planes, int64_t stride_,
                       std::shared_ptr<nn::Module> downsample_, int64_t groups, int64_t base_width,
                       int64_t dilation, ops::NormLayer norm_layer)
    : stride(stride_) {
  ACCEL_CHECK(groups == 1 && base_width == 64, ValueError, "BasicBlock",
              "BasicBlock only supports groups=1 and base_width=64, got groups=", groups,
              ", base_width=", base_width);
  ACCEL_CHECK(dilation == 1, ValueError, "BasicBlock",
              "dilation > 1 is not supported in BasicBlock, got ", dilation);
  norm_layer = or_batch_norm(std::move(norm_layer));
  conv1 = register_module("conv1", conv3x3(inplanes, planes, stride));
  bn1 = register_module("bn1", norm_layer(planes));
  relu = register_module("relu", std::make_shared<nn::ReLU>(true));
  conv2 = register_module("conv2", conv3x3(planes, planes));
  bn2 = register_module("bn2", norm_layer(planes));
  downsample = register_module("downsample", or_placeholder(downsample_));
  if (!downsample_) downsample = nullptr;
}

Tensor BasicBlock::forward(const Tensor& x) {
  Tensor out = (*relu)((*bn1)((*conv1)(x)));
  out = (*bn2)((*conv2)(out));
  const Tensor identity = downsample ? (*downsample)(x) : x;
  return (*relu)(add(out, identity));
}

Bottleneck::Bottleneck(int64_t inplanes, int64_t planes, int64_t stride_,
                       std::shared_ptr<nn::Module> downsample_, int64_t groups, int64_t base_width,
                       int64_t dilation, ops::NormLayer norm_layer)
    : stride(stride_) {
  norm_layer = or_batch_norm(std::move(norm_layer));
  // int(planes * (base_width / 64.0)) * groups, as torchvision computes it.
  const int64_t width = int64_t(double(planes) * (double(base_width) / 64.0)) * groups;
  conv1 = register_module("conv1", conv1x1(inplanes, width));
  bn1 = register_module("bn1", norm_layer(width));
  conv2 = register_module("conv2", conv3x3(width, width, stride, groups, dilation));
  bn2 = register_module("bn2", norm_layer(width));
  conv3 = register_module("conv3", conv1x1(width, planes * expansion));
  bn3 = register_module("bn3", norm_layer(planes * expansion));
  relu = register_module("relu", std::make_shared<nn::ReLU>(true));
  downsample = register_module("downsample", or_placeholder(downsample_));
  if (!downsample_) downsample = nullptr;
}

Tensor Bottleneck::forward(const Tensor& x) {
  Tensor out = (*relu)((*bn1)((*conv1)(x)));
  out = (*relu)((*bn2)((*conv2)(out)));
  out = (*bn3)((*conv3)(out));
  const Tensor identity = downsample ? (*downsample)(x) : x;
  return (*relu)(add(out, identity));
}

ResNet::ResNet(ResNetBlock block, const std::vector<int64_t>& layers, const ResNetOptions& o)
    : norm_layer_(or_batch_norm(o.norm_layer)), groups_(o.groups), base_width_(o.width_per_group) {
  ACCEL_CHECK(layers.size() == 4, ValueError, "ResNet",
              "layers must have 4 entries (blocks per stage), got ", layers.size());
  ACCEL_CHECK(o.num_classes >= 1, ValueError, "ResNet", "num_classes must be positive, got ",
              o.num_classes);
  conv1 =
      register_module("conv1", std::make_shared<nn::Conv2d>(3, inplanes_, 7, 2, 3, 1, 1, false));
  bn1 = register_module("bn1", norm_layer_(inplanes_));
  relu = register_module("relu", std::make_shared<nn::ReLU>(true));
  maxpool = register_module("maxpool", std::make_shared<nn::MaxPool2d>(3, 2, 1));
  layer1 = register_module("layer1", make_layer(block, 64, layers[0], 1, false));
  layer2 = register_module("layer2",
                           make_layer(block, 128, layers[1], 2, o.replace_stride_with_dilation[0]));
  layer3 = register_module("layer3",
                           make_layer(block, 256, layers[2], 2, o.replace_stride_with_dilation[1]));
  layer4 = register_module("layer4",
                           make_layer(block, 512, layers[3], 2, o.replace_stride_with_dilation[2]));
  avgpool = register_module("avgpool", std::make_shared<nn::AdaptiveAvgPool2d>(1));
  const int64_t expansion =
      block == ResNetBlock::Basic ? BasicBlock::expansion : Bottleneck::expansion;
  fc = register_module("fc", std::make_shared<nn::Linear>(512 * expansion, o.num_classes));

  detail::init_convs_kaiming_fan_out(*this, "relu");
  detail::init_norms(*this);
  if (o.zero_init_residual) {
    // The residual branch's last norm starts at zero, so each block starts as the identity.
    for (auto& [name, m] : named_modules()) {
      nn::Module* last = nullptr;
      if (auto* b = dynamic_cast<Bottleneck*>(m)) last = b->bn3.get();
      if (auto* b = dynamic_cast<BasicBlock*>(m)) last = b->bn2.get();
      if (auto* bn = dynamic_cast<nn::BatchNormBase*>(last); bn && bn->affine)
        nn::init::zeros_(bn->weight);
    }
  }
}

std::shared_ptr<nn::Sequential> ResNet::make_layer(ResNetBlock block, int64_t planes,
                                                   int64_t blocks, int64_t stride, bool dilate) {
  const bool basic = block == ResNetBlock::Basic;
  const int64_t expansion = basic ? BasicBlock::expansion : Bottleneck::expansion;
  const int64_t previous_dilation = dilation_;
  if (dilate) {
    dilation_ *= stride;
    stride = 1;
  }
  std::shared_ptr<nn::Module> downsample;
  if (stride != 1 || inplanes_ != planes * expansion) {
    downsample = std::make_shared<nn::Sequential>(conv1x1(inplanes_, planes * expansion, stride),
                                                  norm_layer_(planes * expansion));
  }
  auto make = [&](int64_t in, int64_t s, std::shared_ptr<nn::Module> ds,
                  int64_t dil) -> std::shared_ptr<nn::Module> {
    if (basic)
      return std::make_shared<BasicBlock>(in, planes, s, std::move(ds), groups_, base_width_, dil,
                                          norm_layer_);
    return std::make_shared<Bottleneck>(in, planes, s, std::move(ds), groups_, base_width_, dil,
                                        norm_layer_);
  };
  auto layer = std::make_shared<nn::Sequential>();
  layer->push_back(make(inplanes_, stride, std::move(downsample), previous_dilation));
  inplanes_ = planes * expansion;
  for (int64_t i = 1; i < blocks; ++i) layer->push_back(make(inplanes_, 1, nullptr, dilation_));
  return layer;
}

Tensor ResNet::forward(const Tensor& x) {
  ACCEL_CHECK(x.defined() && x.dim() == 4 && x.size(1) == 3, ShapeError, "ResNet",
              "expected an input (N, 3, H, W), got ", x.defined() ? x.sizes() : Shape{});
  Tensor h = (*maxpool)((*relu)((*bn1)((*conv1)(x))));
  h = (*layer4)((*layer3)((*layer2)((*layer1)(h))));
  h = (*avgpool)(h).flatten(1);  // (N, 512 * expansion)
  return (*fc)(h);
}

namespace {
std::shared_ptr<ResNet> build_resnet(ResNetBlock block, std::vector<int64_t> layers,
                                     const ResNetOptions& o) {
  return detail::build_as<ResNet>(o.weights,
                                  [&] { return std::make_shared<ResNet>(block, layers, o); });
}
}  // namespace

std::shared_ptr<ResNet> resnet18(const ResNetOptions& o) {
  return build_resnet(ResNetBlock::Basic, {2, 2, 2, 2}, o);
}
std::shared_ptr<ResNet> resnet34(const ResNetOptions& o) {
  return build_resnet(ResNetBlock::Basic, {3, 4, 6, 3}, o);
}
std::shared_ptr<ResNet> resnet50(const ResNetOptions& o) {
  return build_resnet(ResNetBlock::Bottleneck, {3, 4, 6, 3}, o);
}
std::shared_ptr<ResNet> resnet101(const ResNetOptions& o) {
  return build_resnet(ResNetBlock::Bottleneck, {3, 4, 23, 3}, o);
}

}  // namespace accel::vision::models
