// pytorch/examples cpp/transfer-learning, ported: a torchvision resnet18 read from a state-dict
// file, its fc removed (convert.py), frozen, and a new Linear(512, classes) head trained on an
// image folder (dogs vs cats in the original) with Adam(lr 1e-3) on nll_loss(log_softmax). The
// model and the step, callable from the program (examples/transfer_learning.cc) and from its
// PyTorch twin test (tests/examples/test_transfer_learning.cc).
//
//   TransferNet: net = resnet18 with fc = Identity   (B, 3, S, S) -> features (B, 512)
//                lin = Linear(512, classes)           features -> logits (B, classes)
//   frozen (the default): net's parameters do not require grad, net stays in eval mode and runs
//   under no_grad; finetune_all: every parameter trains and net follows train() / eval().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "accel.h"
#include "data/data.h"
#include "vision/vision.h"

namespace accel::examples::transfer_learning {

namespace tf = data::transforms;
namespace vm = vision::models;

constexpr int64_t kFeatures = 512;  // resnet18's fc.in_features
inline const std::vector<double> kMean{0.485, 0.456, 0.406}, kStd{0.229, 0.224, 0.225};

// Note [transfer-learning images]: the original reads each image with OpenCV (BGR), resizes it
// to 224 x 224 with cv::resize (its INTER_CUBIC lands in the fx argument, so the resize is
// bilinear) and feeds the raw 0-255 values. The port reads RGB, resizes to size x size
// (bilinear, antialiased: torchvision's tensor path) and normalises with ImageNet's statistics,
// which is what torchvision's pretrained resnet18 expects. uint8 (H, W, 3) -> (3, size, size).
inline tf::Compose transform(int64_t size, DType dtype = kFloat32) {
  std::vector<tf::AnyTransform> t{
      tf::Resize(size, size, tf::InterpolationMode::kBilinear, /*antialias=*/true), tf::ToTensor()};
  if (dtype != kFloat32)
    t.emplace_back(tf::Lambda([dtype](const Tensor& x) { return x.to(dtype); }));
  t.emplace_back(tf::Normalize(kMean, kStd));
  return tf::Compose(std::move(t));
}

// The state dict of a file: a torch.save file (.pth / .pt) holding a state dict or a training
// checkpoint with one under 'state_dict' (the imagenet example's checkpoint.pth.tar and
// model_best.pth.tar), or a .safetensors file. The readers' IoError names a malformed file.
inline nn::TensorDict read_state_dict(const std::string& path) {
  if (path.ends_with(".safetensors")) return nn::load_safetensors(path);
  const io::PtValue v = io::read_pt(path);
  if (v.is_dict() && v.contains("state_dict"))
    return io::to_tensor_dict(v.at("state_dict"), path + "['state_dict']");
  return io::to_tensor_dict(v, path);
}

// convert.py: torchvision's resnet18 loaded strictly from `state` (its head's class count taken
// from fc.weight), then fc replaced by Identity. ValueError for a state dict that is not a
// resnet18's (load_state_dict's report of missing / unexpected keys and shapes).
inline std::shared_ptr<vm::ResNet> load_backbone(const nn::TensorDict& state) {
  auto fc = state.find("fc.weight");
  ACCEL_CHECK(fc != state.end() && fc->second.dim() == 2, ValueError, "transfer_learning",
              "the state dict has no resnet18 fc.weight (", state.size(), " tensors)");
  std::shared_ptr<vm::ResNet> net;
  {
    nn::DeferredInit deferred;  // no memory, no initialisation: the values come from `state`
    net = vm::resnet18({.num_classes = fc->second.size(0)});
  }
  net->load_state_dict(state, /*strict=*/true);
  net->fc = std::make_shared<nn::Identity>();
  return net;
}

class TransferNet : public nn::Module {
 public:
  TransferNet(std::shared_ptr<vm::ResNet> backbone, int64_t num_classes, bool finetune_all = false)
      : net(register_module("net", std::move(backbone))),
        lin(register_module("lin", std::make_shared<nn::Linear>(kFeatures, num_classes))),
        finetune_all_(finetune_all) {
    if (!finetune_all_) {
      for (Tensor& p : net->parameters()) p.requires_grad_(false);  // convert.py
      net->eval();
    }
  }

  // images (B, 3, S, S) normalised -> logits (B, classes)
  Tensor forward(const Tensor& images) override {
    Tensor features;
    if (finetune_all_) {
      features = net->forward(images);
    } else {
      NoGradGuard ng;  // a frozen extractor keeps no graph
      features = net->forward(images);
    }
    return lin->forward(features.view({features.size(0), -1}));
  }

  // The frozen backbone stays in eval mode: its BatchNorm statistics are part of what is frozen.
  Module& train(bool on = true) override {
    Module::train(on);
    if (!finetune_all_) net->eval();
    return *this;
  }

  bool finetune_all() const { return finetune_all_; }
  // The parameters the optimizer trains: lin's, or every one with finetune_all.
  std::vector<Tensor> trainable_parameters() {
    return finetune_all_ ? parameters() : lin->parameters();
  }
  // The whole model as torchvision's resnet18(num_classes=classes): net's keys, fc = lin.
  nn::TensorDict torchvision_state_dict() {
    nn::TensorDict sd = net->state_dict();
    for (const auto& [k, v] : lin->state_dict()) sd["fc." + k] = v;
    return sd;
  }

  nn::Child<vm::ResNet> net;
  nn::Child<nn::Linear> lin;

 private:
  bool finetune_all_;
};

// One batch of the original's train(): zero_grad, forward, nll_loss(log_softmax), backward,
// step; the loss and the number of rows whose arg-max is the target. `backward` (empty:
// loss.backward()) lets the program use Accelerator::backward.
struct StepResult {
  double loss = 0;
  int64_t correct = 0;
};

template <typename Optimizer>
StepResult train_step(TransferNet& model, Optimizer& optimizer, const Tensor& images,
                      const Tensor& target,
                      const std::function<void(const Tensor&)>& backward = {}) {
  optimizer.zero_grad();
  const Tensor output = model.forward(images);
  const Tensor loss = nll_loss(log_softmax(output, 1), target);
  if (backward)
    backward(loss);
  else
    loss.backward();
  optimizer.step();
  return {loss.item(), int64_t(sum(eq(argmax(output.detach(), 1), target)).item())};
}

// test()'s per-image values of one batch (eval mode, no gradients): loss (B) and hit (B), float64.
struct TestRows {
  Tensor loss, hit;
};

inline TestRows test_rows(TransferNet& model, const Tensor& images, const Tensor& target) {
  NoGradGuard ng;
  const Tensor output = model.forward(images);
  return {nll_loss(log_softmax(output, 1), target, -100, Reduction::None).to(kFloat64),
          eq(argmax(output, 1), target).to(kFloat64)};
}

}  // namespace accel::examples::transfer_learning
