// pytorch/examples imagenet/main.py, ported: the models (--arch), the transforms, the step, the
// accuracy and meters and the checkpoint, callable from the program (examples/imagenet.cc) and
// from its PyTorch twin test (tests/examples/test_imagenet.cc).
//
//   model: vision::models.<arch>(num_classes) (resnet18 by default), torchvision's weights from a
//          file with --pretrained FILE;  loss: cross_entropy;  SGD(lr 0.1, momentum 0.9,
//          weight decay 1e-4), StepLR(30, 0.1) stepped once per epoch.
//   train images: RandomResizedCrop(crop) + RandomHorizontalFlip + ToTensor + Normalize
//   val images:   Resize(resize) + CenterCrop(crop) + ToTensor + Normalize      -> (3, crop, crop)
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "accel.h"
#include "optim/torch_state.h"
#include "data/data.h"
#include "vision/vision.h"

namespace accel::examples::imagenet {

namespace tf = data::transforms;
namespace vm = vision::models;

// ImageNet's channel statistics (main.py's Normalize).
inline const std::vector<double> kMean{0.485, 0.456, 0.406}, kStd{0.229, 0.224, 0.225};

// --arch's choices, sorted as main.py lists torchvision's builders (the zoo of docs/vision.md).
inline std::vector<std::string> model_names() {
  return {"alexnet",
          "efficientnet_b0",
          "mobilenet_v2",
          "mobilenet_v3_large",
          "mobilenet_v3_small",
          "resnet101",
          "resnet18",
          "resnet34",
          "resnet50",
          "squeezenet1_0",
          "squeezenet1_1",
          "vgg11",
          "vgg11_bn",
          "vgg16",
          "vgg16_bn",
          "vit_b_16"};
}

// models.__dict__[arch](num_classes=...), with `weights` (a torchvision state-dict file, .pth or
// safetensors; empty: torchvision's random initialisation) loaded strictly. vit_b_16 is built for
// image_size x image_size inputs. ValueError for an unknown arch.
inline std::shared_ptr<nn::Module> create_model(const std::string& arch, int64_t num_classes = 1000,
                                                const std::string& weights = {},
                                                int64_t image_size = 224) {
  auto opts = [&]<typename O>(O o) {
    o.weights = weights;
    o.num_classes = num_classes;
    return o;
  };
  if (arch == "resnet18") return vm::resnet18(opts(vm::ResNetOptions{}));
  if (arch == "resnet34") return vm::resnet34(opts(vm::ResNetOptions{}));
  if (arch == "resnet50") return vm::resnet50(opts(vm::ResNetOptions{}));
  if (arch == "resnet101") return vm::resnet101(opts(vm::ResNetOptions{}));
  if (arch == "vgg11") return vm::vgg11(opts(vm::VGGOptions{}));
  if (arch == "vgg11_bn") return vm::vgg11_bn(opts(vm::VGGOptions{}));
  if (arch == "vgg16") return vm::vgg16(opts(vm::VGGOptions{}));
  if (arch == "vgg16_bn") return vm::vgg16_bn(opts(vm::VGGOptions{}));
  if (arch == "mobilenet_v2") return vm::mobilenet_v2(opts(vm::MobileNetV2Options{}));
  if (arch == "mobilenet_v3_small") return vm::mobilenet_v3_small(opts(vm::MobileNetV3Options{}));
  if (arch == "mobilenet_v3_large") return vm::mobilenet_v3_large(opts(vm::MobileNetV3Options{}));
  if (arch == "efficientnet_b0") return vm::efficientnet_b0(opts(vm::EfficientNetOptions{}));
  if (arch == "alexnet") return vm::alexnet(opts(vm::AlexNetOptions{}));
  if (arch == "squeezenet1_0") return vm::squeezenet1_0(opts(vm::SqueezeNetOptions{}));
  if (arch == "squeezenet1_1") return vm::squeezenet1_1(opts(vm::SqueezeNetOptions{}));
  if (arch == "vit_b_16") {
    vm::VisionTransformerOptions o = opts(vm::VisionTransformerOptions{});
    o.image_size = image_size;
    return vm::vit_b_16(o);
  }
  ACCEL_THROW(ValueError, "imagenet", "unknown --arch '", arch, "'");
}

// The image sizes of main.py's transforms (224 and 256 there), as options so that a small run
// is possible. Note [imagenet antialias]: main.py resizes PIL images, which PIL always
// antialiases; the port decodes to uint8 tensors and uses torchvision's tensor path, so it asks
// for antialias to stay close to PIL's result (torchvision 0.14's tensor default is false).
struct Sizes {
  int64_t crop = 224;
  int64_t resize = 256;
  bool antialias = true;
};

// ToTensor, then (when dtype is not float32: the float64 twin test) a conversion, then Normalize.
inline std::vector<tf::AnyTransform> to_input_transforms(DType dtype) {
  std::vector<tf::AnyTransform> t{tf::ToTensor()};
  if (dtype != kFloat32)
    t.emplace_back(tf::Lambda([dtype](const Tensor& x) { return x.to(dtype); }));
  t.emplace_back(tf::Normalize(kMean, kStd));
  return t;
}

inline tf::Compose train_transform(const Sizes& s, DType dtype = kFloat32) {
  std::vector<tf::AnyTransform> t{
      tf::RandomResizedCrop(s.crop, {0.08, 1.0}, {3.0 / 4.0, 4.0 / 3.0},
                            tf::InterpolationMode::kBilinear, s.antialias),
      tf::RandomHorizontalFlip()};
  for (auto& x : to_input_transforms(dtype)) t.push_back(x);
  return tf::Compose(std::move(t));
}

inline tf::Compose val_transform(const Sizes& s, DType dtype = kFloat32) {
  std::vector<tf::AnyTransform> t{
      tf::Resize(s.resize, tf::InterpolationMode::kBilinear, std::nullopt, s.antialias),
      tf::CenterCrop(s.crop)};
  for (auto& x : to_input_transforms(dtype)) t.push_back(x);
  return tf::Compose(std::move(t));
}

// train_transform's result for given random draws: the crop box RandomResizedCrop::get_params
// drew and whether RandomHorizontalFlip flipped. image: uint8 (H, W, 3) -> (3, crop, crop).
inline Tensor train_image(const Tensor& image, const tf::RandomResizedCrop::Box& box, bool flip,
                          const Sizes& s, DType dtype = kFloat32) {
  Tensor x = tf::resized_crop(image, box.top, box.left, box.height, box.width, s.crop, s.crop,
                              tf::InterpolationMode::kBilinear, s.antialias);
  if (flip) x = tf::hflip(x);
  x = tf::to_tensor(x);
  if (dtype != kFloat32) x = x.to(dtype);
  return tf::normalize(x, kMean, kStd);
}

// main.py's accuracy(): for each k, the percentage of rows whose target is among the k largest
// logits. output (B, C), target (B). A k larger than C counts every row (torch's topk would
// refuse; main.py always has C = 1000).
inline std::vector<double> accuracy(const Tensor& output, const Tensor& target,
                                    const std::vector<int64_t>& topk) {
  NoGradGuard ng;
  ACCEL_CHECK(output.dim() == 2 && target.dim() == 1 && target.size(0) == output.size(0),
              ShapeError, "imagenet accuracy", "expects output (B, C) and target (B), got ",
              output.shape_str(), " and ", target.shape_str());
  const int64_t maxk = std::min(*std::max_element(topk.begin(), topk.end()), output.size(1));
  const Tensor pred = std::get<1>(accel::topk(output, maxk, 1, true, true));  // (B, maxk)
  const Tensor correct = eq(pred, target.view({-1, 1}).expand({pred.size(0), maxk}));
  std::vector<double> res;
  for (int64_t k : topk) {
    const double hits = sum(correct.narrow(1, 0, std::min(k, maxk)).to(kFloat64)).item();
    res.push_back(hits * (100.0 / double(target.size(0))));
  }
  return res;
}

// main.py's AverageMeter and ProgressMeter: the same lines ("Epoch: [0][ 1/10]\tTime  0.512 (
// 0.512)\tData ...", " *   Acc@1 50.000 Acc@5 100.000"). fmt is printf's form of main.py's
// format spec (':6.3f' -> "%6.3f").
enum class Summary { kNone, kAverage, kSum, kCount };

class AverageMeter {
 public:
  AverageMeter(std::string name, std::string fmt, Summary summary = Summary::kAverage)
      : name(std::move(name)), fmt_(std::move(fmt)), summary_type_(summary) {}
  void reset() { val = avg = sum = 0, count = 0; }
  void update(double v, double n = 1) {
    val = v;
    sum += v * n;
    count += n;
    avg = sum / count;
  }
  std::string str() const {
    return name + " " + format(fmt_.c_str(), val) + " (" + format(fmt_.c_str(), avg) + ")";
  }
  std::string summary() const {
    switch (summary_type_) {
      case Summary::kNone: return "";
      case Summary::kAverage: return name + " " + format("%.3f", avg);
      case Summary::kSum: return name + " " + format("%.3f", sum);
      case Summary::kCount: return name + " " + format("%.3f", count);
    }
    return "";
  }

  std::string name;
  double val = 0, avg = 0, sum = 0, count = 0;

 private:
  static std::string format(const char* fmt, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, fmt, v);
    return buf;
  }
  std::string fmt_;
  Summary summary_type_;
};

class ProgressMeter {
 public:
  ProgressMeter(int64_t num_batches, std::vector<const AverageMeter*> meters, std::string prefix)
      : meters_(std::move(meters)), prefix_(std::move(prefix)) {
    const int digits = int(std::to_string(num_batches).size());
    char buf[64];
    std::snprintf(buf, sizeof buf, "%*lld", digits, static_cast<long long>(num_batches));
    digits_ = digits;
    total_ = buf;
  }
  std::string line(int64_t batch) const {
    char buf[64];
    std::snprintf(buf, sizeof buf, "[%*lld/%s]", digits_, static_cast<long long>(batch),
                  total_.c_str());
    std::string s = prefix_ + buf;
    for (const AverageMeter* m : meters_) {
      s += '\t';
      s += m->str();
    }
    return s;
  }
  std::string summary_line() const {
    std::string s = " *";
    for (const AverageMeter* m : meters_) {
      s += ' ';
      s += m->summary();
    }
    return s;
  }

 private:
  std::vector<const AverageMeter*> meters_;
  std::string prefix_, total_;
  int digits_ = 1;
};

// One iteration of main.py's train(): output, loss, Acc@1 / Acc@5, zero_grad, backward, step.
// `backward` (empty: loss.backward()) lets the program use Accelerator::backward; Optimizer is
// an optim::Optimizer or an AcceleratedOptimizer.
struct StepResult {
  double loss = 0, acc1 = 0, acc5 = 0;
};

template <typename Optimizer>
StepResult train_step(nn::Module& model, Optimizer& optimizer, const Tensor& images,
                      const Tensor& target,
                      const std::function<void(const Tensor&)>& backward = {}) {
  const Tensor output = model.forward(images);
  const Tensor loss = cross_entropy(output, target);
  const std::vector<double> acc = accuracy(output, target, {1, 5});
  optimizer.zero_grad();
  if (backward)
    backward(loss);
  else
    loss.backward();
  optimizer.step();
  return {loss.item(), acc[0], acc[1]};
}

// validate()'s per-sample values of one batch, so that a distributed run can gather them:
// cross-entropy loss, and 1 / 0 for a top-1 / top-5 hit, each (B) float64. Call in eval mode,
// without gradients.
struct EvalRows {
  Tensor loss, top1, top5;
};

inline EvalRows eval_rows(nn::Module& model, const Tensor& images, const Tensor& target) {
  const Tensor output = model.forward(images);
  const int64_t maxk = std::min<int64_t>(5, output.size(1));
  const Tensor pred = std::get<1>(accel::topk(output, maxk, 1, true, true));  // (B, maxk)
  const Tensor correct = eq(pred, target.view({-1, 1}).expand({pred.size(0), maxk})).to(kFloat64);
  return {cross_entropy(output, target, -100, Reduction::None).to(kFloat64),
          correct.narrow(1, 0, 1).sum({1}), correct.sum({1})};
}

// ---- checkpoints (main.py's save_checkpoint and --resume) ----
// Note [imagenet checkpoints]: main.py's dictionary, written with io::save_pt as torch.save
// writes it: {'epoch', 'arch', 'state_dict' (torchvision's keys), 'best_acc1', 'optimizer' (torch's
// SGD state_dict: optim::torch_state), 'scheduler' (torch's StepLR state_dict)}, so main.py's
// --resume reads ours and ours reads main.py's (its 'module.' prefix of DataParallel models is
// dropped; its best_acc1 is a tensor).

// torch 1.13's StepLR.state_dict() for `s` (its __dict__ without the optimizer).
inline io::PtValue step_lr_torch_state(const optim::LRScheduler& s, int64_t step_size,
                                       double gamma) {
  std::vector<io::PtValue> base, last;
  for (double v : s.base_lrs()) base.emplace_back(v);
  for (double v : s.get_last_lr()) last.emplace_back(v);
  return io::PtValue::dict({{"step_size", step_size},
                            {"gamma", gamma},
                            {"base_lrs", io::PtValue::list(base)},
                            {"last_epoch", s.last_epoch()},
                            {"_step_count", s.last_epoch() + 1},
                            {"verbose", false},
                            {"_get_lr_called_within_step", false},
                            {"_last_lr", io::PtValue::list(last)}});
}

inline io::PtValue make_checkpoint(int64_t epoch, const std::string& arch,
                                   const nn::TensorDict& state_dict, double best_acc1,
                                   const optim::Optimizer& optimizer,
                                   const optim::LRScheduler& scheduler, int64_t step_size,
                                   double gamma) {
  return io::PtValue::dict({{"epoch", epoch},
                            {"arch", arch},
                            {"state_dict", io::to_pt_value(state_dict)},
                            {"best_acc1", best_acc1},
                            {"optimizer", optim::torch_state(optimizer)},
                            {"scheduler", step_lr_torch_state(scheduler, step_size, gamma)}});
}

// main.py's save_checkpoint: `filename`, copied to model_best.pth.tar (beside it) when is_best.
inline void save_checkpoint(const io::PtValue& state, bool is_best,
                            const std::string& filename = "checkpoint.pth.tar") {
  io::save_pt(filename, state);
  if (is_best) {
    const auto best = std::filesystem::path(filename).parent_path() / "model_best.pth.tar";
    io::save_pt(best.string(), state);  // atomic, as every save_pt (shutil.copyfile is not)
  }
}

struct Resumed {
  int64_t epoch = 0;  // the epoch to start from
  double best_acc1 = 0;
};

// Loads a checkpoint of make_checkpoint's form (ours or main.py's) into model, optimizer and
// scheduler. ValueError naming what is missing or does not fit.
inline Resumed load_checkpoint(const std::string& path, nn::Module& model,
                               optim::Optimizer& optimizer, optim::LRScheduler& scheduler) {
  const io::PtValue ckpt = io::read_pt(path);
  ACCEL_CHECK(ckpt.is_dict(), ValueError, "imagenet", "'", path,
              "' is not a checkpoint dictionary: it holds a ", ckpt.type_name());
  nn::TensorDict sd = io::to_tensor_dict(ckpt.at("state_dict"), "state_dict");
  bool prefixed = !sd.empty();
  for (const auto& [k, v] : sd) prefixed = prefixed && k.rfind("module.", 0) == 0;
  if (prefixed) {  // saved from a DataParallel / DistributedDataParallel model
    nn::TensorDict plain;
    for (auto& [k, v] : sd) plain[k.substr(7)] = v;
    sd = std::move(plain);
  }
  const io::PtValue& best = ckpt.at("best_acc1");
  Resumed r;
  r.epoch = ckpt.at("epoch").to_int();
  r.best_acc1 = best.is_tensor() ? best.to_tensor().item() : best.to_double();
  const io::PtValue& sched = ckpt.at("scheduler");
  std::vector<double> base, last;
  for (const io::PtValue& v : sched.at("base_lrs").items()) base.push_back(v.to_double());
  for (const io::PtValue& v : sched.at("_last_lr").items()) last.push_back(v.to_double());
  const int64_t n = int64_t(base.size());
  ACCEL_CHECK(int64_t(last.size()) == n, ValueError, "imagenet", "'", path, "': the scheduler has ",
              n, " base_lrs and ", last.size(), " _last_lr values");
  model.load_state_dict(sd);
  optim::load_torch_state(optimizer, ckpt.at("optimizer"));
  scheduler.load_state_dict({{"last_epoch", scalar_tensor(sched.at("last_epoch").to_int(), kInt64)},
                             {"base_lrs", tensor(base, Shape{n})},
                             {"last_lrs", tensor(last, Shape{n})}});
  return r;
}

// torchvision.datasets.FakeData(size, (3, crop, crop), num_classes, ToTensor()) for --dummy:
// example i is a uniform image in [0, 1) and a label, drawn from a generator seeded by i.
class FakeData final : public data::Dataset {
 public:
  FakeData(int64_t size, int64_t crop, int64_t num_classes, uint64_t seed)
      : size_(size), crop_(crop), classes_(num_classes), seed_(seed) {}
  int64_t size() const override { return size_; }
  data::Example get(int64_t index) const override {
    Generator g(data::mix_seed(seed_, uint64_t(index)));
    const Tensor image = rand({3, crop_, crop_}, {}, &g);
    const Tensor label = scalar_tensor(int64_t(g.next_u64() % uint64_t(classes_)), kInt64);
    return data::Example({image, label}, {"image", "label"});
  }

 private:
  int64_t size_, crop_, classes_;
  uint64_t seed_;
};

}  // namespace accel::examples::imagenet
