// pytorch/examples fast_neural_style, ported (neural_style/transformer_net.py, vgg.py, utils.py
// and the training step of neural_style.py): Johnson et al.'s image transformation network
// trained with perceptual losses from a frozen VGG16, callable from the program
// (examples/fast_neural_style.cc: train(), stylize() and the stand-in data below) and from its
// PyTorch twin test (tests/examples/test_fast_neural_style.cc).
//
//   TransformerNet  x (B, 3, H, W) in [0, 255] -> (B, 3, H, W) (H, W multiples of 4 keep the
//                   size): ConvLayer 9x9 3->32, 3x3 stride 2 ->64, ->128 (InstanceNorm2d affine
//                   + ReLU after each), 5 ResidualBlocks of 128, two UpsampleConvLayers (nearest
//                   x2, 3x3) 128->64->32 (InstanceNorm + ReLU), ConvLayer 9x9 32->3. A ConvLayer
//                   pads by kernel_size // 2 with reflection, then convolves without padding.
//   Vgg16           the loss network: torchvision vgg16's `features` 0..22 in four frozen slices
//                   ending at relu1_2 (64 channels, full size), relu2_2 (128, /2), relu3_3 (256,
//                   /4) and relu4_3 (512, /8).
//   train_step      y = TransformerNet(x); content loss = content_weight * mse(relu2_2 of y and
//                   of x); style loss = style_weight * sum over the four outputs of mse(gram(y),
//                   gram(style)); both images normalised by ImageNet's mean / std first
//                   (normalize_batch); Adam step on the total.
#pragma once

#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <system_error>
#include <vector>

#include "accel.h"

namespace accel::examples::fast_neural_style {

// ---- transformer_net.py ----

// Reflection padding of kernel_size // 2, then an unpadded convolution.
class ConvLayer : public nn::Module {
 public:
  ConvLayer(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride)
      : reflection_pad(register_module("reflection_pad",
                                       std::make_shared<nn::ReflectionPad2d>(kernel_size / 2))),
        conv2d(register_module("conv2d", std::make_shared<nn::Conv2d>(in_channels, out_channels,
                                                                      kernel_size, stride))) {}
  Tensor forward(const Tensor& x) override { return conv2d->forward(reflection_pad->forward(x)); }

  nn::Child<nn::ReflectionPad2d> reflection_pad;
  nn::Child<nn::Conv2d> conv2d;
};

// x + in2(conv2(relu(in1(conv1(x))))), channels kept (https://arxiv.org/abs/1512.03385, the
// architecture of http://torch.ch/blog/2016/02/04/resnets.html).
class ResidualBlock : public nn::Module {
 public:
  explicit ResidualBlock(int64_t channels)
      : conv1(register_module("conv1", std::make_shared<ConvLayer>(channels, channels, 3, 1))),
        in1(register_module("in1", instance_norm(channels))),
        conv2(register_module("conv2", std::make_shared<ConvLayer>(channels, channels, 3, 1))),
        in2(register_module("in2", instance_norm(channels))),
        relu(register_module("relu", std::make_shared<nn::ReLU>())) {}
  Tensor forward(const Tensor& x) override {
    const Tensor& residual = x;
    Tensor out = relu->forward(in1->forward(conv1->forward(x)));
    out = in2->forward(conv2->forward(out));
    return add(out, residual);
  }
  // torch.nn.InstanceNorm2d(channels, affine=True)
  static std::shared_ptr<nn::InstanceNorm2d> instance_norm(int64_t channels) {
    return std::make_shared<nn::InstanceNorm2d>(channels, 1e-5, 0.1, /*affine=*/true);
  }

  nn::Child<ConvLayer> conv1;
  nn::Child<nn::InstanceNorm2d> in1;
  nn::Child<ConvLayer> conv2;
  nn::Child<nn::InstanceNorm2d> in2;
  nn::Child<nn::ReLU> relu;
};

// Nearest-neighbour upsampling by `upsample` (0: none), then a ConvLayer's reflection pad and
// convolution: better than ConvTranspose2d (http://distill.pub/2016/deconv-checkerboard/).
class UpsampleConvLayer : public nn::Module {
 public:
  UpsampleConvLayer(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride,
                    int64_t upsample = 0)
      : upsample(upsample),
        reflection_pad(register_module("reflection_pad",
                                       std::make_shared<nn::ReflectionPad2d>(kernel_size / 2))),
        conv2d(register_module("conv2d", std::make_shared<nn::Conv2d>(in_channels, out_channels,
                                                                      kernel_size, stride))) {}
  Tensor forward(const Tensor& x) override {
    Tensor x_in = x;
    if (upsample) x_in = interpolate(x_in, {}, {double(upsample)}, "nearest");
    return conv2d->forward(reflection_pad->forward(x_in));
  }

  int64_t upsample;
  nn::Child<nn::ReflectionPad2d> reflection_pad;
  nn::Child<nn::Conv2d> conv2d;
};

class TransformerNet : public nn::Module {
 public:
  TransformerNet() {
    auto conv = [](int64_t in, int64_t out, int64_t k, int64_t stride) {
      return std::make_shared<ConvLayer>(in, out, k, stride);
    };
    auto norm = [](int64_t c) { return ResidualBlock::instance_norm(c); };
    // Initial convolution layers
    conv1 = register_module("conv1", conv(3, 32, 9, 1));
    in1 = register_module("in1", norm(32));
    conv2 = register_module("conv2", conv(32, 64, 3, 2));
    in2 = register_module("in2", norm(64));
    conv3 = register_module("conv3", conv(64, 128, 3, 2));
    in3 = register_module("in3", norm(128));
    // Residual layers
    res1 = register_module("res1", std::make_shared<ResidualBlock>(128));
    res2 = register_module("res2", std::make_shared<ResidualBlock>(128));
    res3 = register_module("res3", std::make_shared<ResidualBlock>(128));
    res4 = register_module("res4", std::make_shared<ResidualBlock>(128));
    res5 = register_module("res5", std::make_shared<ResidualBlock>(128));
    // Upsampling Layers
    deconv1 = register_module("deconv1", std::make_shared<UpsampleConvLayer>(128, 64, 3, 1, 2));
    in4 = register_module("in4", norm(64));
    deconv2 = register_module("deconv2", std::make_shared<UpsampleConvLayer>(64, 32, 3, 1, 2));
    in5 = register_module("in5", norm(32));
    deconv3 = register_module("deconv3", conv(32, 3, 9, 1));
    // Non-linearities
    relu = register_module("relu", std::make_shared<nn::ReLU>());
  }

  // X (B, 3, H, W) -> (B, 3, H', W'); H' = H when H is a multiple of 4.
  Tensor forward(const Tensor& X) override {
    Tensor y = relu->forward(in1->forward(conv1->forward(X)));
    y = relu->forward(in2->forward(conv2->forward(y)));
    y = relu->forward(in3->forward(conv3->forward(y)));
    y = res1->forward(y);
    y = res2->forward(y);
    y = res3->forward(y);
    y = res4->forward(y);
    y = res5->forward(y);
    y = relu->forward(in4->forward(deconv1->forward(y)));
    y = relu->forward(in5->forward(deconv2->forward(y)));
    return deconv3->forward(y);
  }

  nn::Child<ConvLayer> conv1, conv2, conv3;
  nn::Child<nn::InstanceNorm2d> in1, in2, in3, in4, in5;
  nn::Child<ResidualBlock> res1, res2, res3, res4, res5;
  nn::Child<UpsampleConvLayer> deconv1, deconv2;
  nn::Child<ConvLayer> deconv3;
  nn::Child<nn::ReLU> relu;
};

// ---- vgg.py ----

// vgg.py's VggOutputs namedtuple.
struct VggOutputs {
  Tensor relu1_2, relu2_2, relu3_3, relu4_3;
  std::array<Tensor, 4> all() const { return {relu1_2, relu2_2, relu3_3, relu4_3}; }
};

// The loss network: entries 0..3, 4..8, 9..15 and 16..22 of a torchvision vgg16 `features`
// (shared, not copied) as the Sequentials slice1..slice4, each entry under its index in
// `features` (slice2.5.weight is features.5.weight), as vgg.py builds them. Parameters are frozen
// unless requires_grad.
class Vgg16 : public nn::Module {
 public:
  explicit Vgg16(const nn::Sequential& features, bool requires_grad = false) {
    ACCEL_CHECK(features.size() >= 23, ValueError, "Vgg16",
                "needs torchvision vgg16's features (31 entries; relu4_3 is entry 22), got ",
                features.size(), " entries");
    const int64_t bounds[5] = {0, 4, 9, 16, 23};
    nn::Child<nn::Sequential>* slices[4] = {&slice1, &slice2, &slice3, &slice4};
    for (int s = 0; s < 4; ++s) {
      auto seq = std::make_shared<nn::Sequential>();
      for (int64_t x = bounds[s]; x < bounds[s + 1]; ++x)
        seq->push_back(std::to_string(x), features[size_t(x)]);
      *slices[s] = register_module("slice" + std::to_string(s + 1), seq);
    }
    if (!requires_grad)
      for (Tensor p : parameters()) p.requires_grad_(false);
  }

  // X (B, 3, H, W), normalised; H, W >= 8.
  VggOutputs outputs(const Tensor& X) {
    VggOutputs out;
    out.relu1_2 = slice1->forward(X);
    out.relu2_2 = slice2->forward(out.relu1_2);
    out.relu3_3 = slice3->forward(out.relu2_2);
    out.relu4_3 = slice4->forward(out.relu3_3);
    return out;
  }
  // relu4_3 alone.
  Tensor forward(const Tensor& X) override { return outputs(X).relu4_3; }

  nn::Child<nn::Sequential> slice1, slice2, slice3, slice4;
};

// torchvision vgg16's features with torchvision's initialisation (Kaiming-normal fan_out
// convolution weights, zero biases), built without the classifier's 120M parameters: random
// weights for tests and for a stand-in loss network where no pretrained file exists.
inline std::shared_ptr<nn::Sequential> random_vgg16_features() {
  std::shared_ptr<vision::models::VGG> vgg;
  {
    nn::DeferredInit deferred;
    vgg = vision::models::vgg16({.init_weights = false});
  }
  // Drawn straight into new tensors that load_state_dict allocates the deferred parameters with
  // (materializing first would draw every weight twice).
  nn::TensorDict init;
  for (const auto& [name, t] : vgg->features->state_handles()) {
    Tensor v = empty(t.sizes());
    if (t.dim() == 4)
      nn::init::kaiming_normal_(v, 0.0, nn::init::FanMode::FanOut, "relu");
    else
      nn::init::zeros_(v);
    init[name] = v;
  }
  vgg->features->load_state_dict(init);
  return vgg->features;
}

// vgg.py's models.vgg16(weights=...).features from a file the user has (the original downloads
// IMAGENET1K_V1): a torchvision vgg16 state dict (torch.save .pth, e.g. vgg16-397923af.pth, or
// safetensors) whose features.* entries load strictly (every one present, none unknown, shapes
// equal); classifier.* entries are not needed and may be absent. Values convert to float32.
inline std::shared_ptr<Vgg16> load_vgg16(const std::string& path) {
  nn::TensorDict state = vision::models::load_state_dict_file(path);
  for (auto it = state.begin(); it != state.end();)
    it = it->first.rfind("classifier.", 0) == 0 ? state.erase(it) : std::next(it);
  std::shared_ptr<vision::models::VGG> vgg;
  {
    nn::DeferredInit deferred;  // no memory until the file's values arrive
    vgg = vision::models::vgg16({.init_weights = false});
  }
  vgg->classifier = std::make_shared<nn::Sequential>();
  try {
    vgg->load_state_dict(state, /*strict=*/true);
  } catch (const ValueError& e) {
    ACCEL_THROW(ValueError, "fast_neural_style", "'", path,
                "' is not a torchvision vgg16 state dict: ", e.what());
  }
  return std::make_shared<Vgg16>(*vgg->features);
}

// ---- utils.py ----

// (B, C, H, W) -> (B, C, C): features times their transpose over the H*W positions, divided by
// C*H*W.
inline Tensor gram_matrix(const Tensor& y) {
  ACCEL_CHECK(y.dim() == 4, ValueError, "gram_matrix", "expects (B, C, H, W), got ", y.sizes());
  const int64_t b = y.size(0), ch = y.size(1), h = y.size(2), w = y.size(3);
  const Tensor features = y.view({b, ch, w * h});
  const Tensor features_t = features.transpose(1, 2);
  return div(bmm(features, features_t), double(ch * h * w));
}

// A batch (B, 3, H, W) in [0, 255] -> (batch / 255 - mean) / std with ImageNet's mean and std.
// (utils.py divides the caller's tensor in place; this returns a new one.)
inline Tensor normalize_batch(const Tensor& batch) {
  const TensorOptions o(batch.dtype());
  const Tensor mean = tensor(std::vector<double>{0.485, 0.456, 0.406}, {3, 1, 1}, o);
  const Tensor std = tensor(std::vector<double>{0.229, 0.224, 0.225}, {3, 1, 1}, o);
  return div(sub(div(batch, 255.0), mean), std);
}

// The style targets: gram matrices of the four outputs for a batch of style images (in [0, 255]).
inline std::array<Tensor, 4> style_grams(Vgg16& vgg, const Tensor& style) {
  NoGradGuard ng;
  const std::array<Tensor, 4> features_style = vgg.outputs(normalize_batch(style)).all();
  std::array<Tensor, 4> gram_style;
  for (int k = 0; k < 4; ++k) gram_style[size_t(k)] = gram_matrix(features_style[size_t(k)]);
  return gram_style;
}

// ---- neural_style.py's training step ----

struct StepResult {
  double content_loss, style_loss, total_loss;
};

// One batch of train(): x (n, 3, H, W) in [0, 255]; gram_style from style_grams() on at least n
// copies of the style image.
inline StepResult train_step(TransformerNet& transformer, Vgg16& vgg, optim::Optimizer& optimizer,
                             const Tensor& x_in, const std::array<Tensor, 4>& gram_style,
                             double content_weight, double style_weight) {
  const int64_t n_batch = x_in.size(0);
  ACCEL_CHECK(n_batch <= gram_style[0].size(0), ValueError, "train_step", "a batch of ", n_batch,
              " images needs as many copies of the style image, got ", gram_style[0].size(0));
  optimizer.zero_grad();

  Tensor y = transformer.forward(x_in);

  y = normalize_batch(y);
  const Tensor x = normalize_batch(x_in);

  const VggOutputs features_y = vgg.outputs(y);
  VggOutputs features_x;
  {
    NoGradGuard ng;  // nothing of x's path needs a gradient
    features_x = vgg.outputs(x);
  }

  const Tensor content_loss = mul(mse_loss(features_y.relu2_2, features_x.relu2_2), content_weight);

  Tensor style_loss;
  const std::array<Tensor, 4> fy = features_y.all();
  for (size_t k = 0; k < 4; ++k) {
    const Tensor gm_y = gram_matrix(fy[k]);
    const Tensor l = mse_loss(gm_y, gram_style[k].narrow(0, 0, n_batch));
    style_loss = k == 0 ? l : add(style_loss, l);
  }
  style_loss = mul(style_loss, style_weight);

  const Tensor total_loss = add(content_loss, style_loss);
  total_loss.backward();
  optimizer.step();
  return {content_loss.item(), style_loss.item(), total_loss.item()};
}

// ---- utils.py's image files ----

// utils.load_image: the file as RGB (H, W, 3) uint8; with `size` resized to (size, size), else
// with `scale` to (int(H / scale), int(W / scale)). utils.py resizes with PIL's ANTIALIAS
// (Lanczos), which torchvision's tensor path does not have: bicubic with antialias here.
inline Tensor load_image(const std::string& filename, std::optional<int64_t> size = std::nullopt,
                         std::optional<double> scale = std::nullopt) {
  using data::transforms::InterpolationMode;
  const Tensor img = data::read_image(filename);
  if (size) {
    ACCEL_CHECK(*size > 0, ValueError, "load_image", "size must be positive, got ", *size);
    return data::transforms::resize(img, *size, *size, InterpolationMode::kBicubic, true);
  }
  if (scale) {
    ACCEL_CHECK(*scale > 0, ValueError, "load_image", "scale must be positive, got ", *scale);
    const int64_t h = int64_t(double(img.size(0)) / *scale);
    const int64_t w = int64_t(double(img.size(1)) / *scale);
    ACCEL_CHECK(h >= 1 && w >= 1, ValueError, "load_image", "scale ", *scale, " makes '", filename,
                "' (", img.size(0), "x", img.size(1), ") smaller than one pixel");
    return data::transforms::resize(img, h, w, InterpolationMode::kBicubic, true);
  }
  return img;
}

// transforms.Compose([ToTensor(), Lambda(lambda x: x.mul(255))]): (H, W, 3) uint8 ->
// (3, H, W) float32 in [0, 255].
inline Tensor to_tensor_255(const Tensor& image) {
  return mul(data::transforms::to_tensor(image), 255.0);
}

// The training images' transform: Resize(image_size) (the shorter side; bilinear with
// antialias, as PIL always resizes), CenterCrop(image_size), ToTensor(), mul(255).
inline data::transforms::Compose dataset_transform(int64_t image_size) {
  using namespace data::transforms;
  ACCEL_CHECK(image_size > 0, ValueError, "fast_neural_style", "image size must be positive, got ",
              image_size);
  return Compose({Resize(image_size, InterpolationMode::kBilinear, std::nullopt, true),
                  CenterCrop(image_size), ToTensor(),
                  Lambda([](const Tensor& x) { return mul(x, 255.0); })});
}

// utils.save_image: data (3, H, W) clamped to [0, 255] and truncated to uint8 (numpy's astype),
// written as PNG or JPEG (quality 75, PIL's default) by the file's extension.
inline void save_image(const std::string& filename, const Tensor& data) {
  std::string ext = std::filesystem::path(filename).extension().string();
  for (char& c : ext) c = char(std::tolower(static_cast<unsigned char>(c)));
  const bool png = ext == ".png", jpeg = ext == ".jpg" || ext == ".jpeg";
  ACCEL_CHECK(png || jpeg, ValueError, "save_image", "unknown file extension '", ext, "' of '",
              filename, "': use .png, .jpg or .jpeg");
  ACCEL_CHECK(data.dim() == 3 && data.size(0) == 3, ShapeError, "save_image",
              "expects an image (3, H, W), got ", data.sizes());
  const Tensor img = clamp(data.detach().to(kCPU, kFloat64), 0.0, 255.0).contiguous();
  const int64_t h = img.size(1), w = img.size(2);
  Tensor hwc = empty({h, w, 3}, kUInt8);
  const double* src = img.data<double>();
  uint8_t* dst = hwc.data<uint8_t>();
  for (int64_t c = 0; c < 3; ++c)
    for (int64_t i = 0; i < h * w; ++i) {
      const double v = src[c * h * w + i];
      dst[i * 3 + c] = v >= 0 ? uint8_t(v) : uint8_t(0);  // NaN -> 0
    }
  if (png)
    data::write_png(hwc, filename);
  else
    data::write_jpeg(hwc, filename, 75);
}

// Python's str(float), for the model's file name (epoch_2_..._100000.0_10000000000.0.model):
// the shortest digits that read back, fixed notation for exponents -4..15, else d.ddde+XX.
inline std::string python_float_str(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  const std::string sci(buf, r.ptr);  // "-1.2345e+05"
  const size_t e_pos = sci.find('e');
  std::string mant = sci.substr(0, e_pos);
  const int exp10 = std::stoi(sci.substr(e_pos + 1));
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out = neg ? "-" : "";
  if (exp10 >= -4 && exp10 < 16) {
    const int point = exp10 + 1;  // digits before the decimal point
    if (point <= 0) {
      out.append("0.").append(size_t(-point), '0').append(digits);
    } else if (size_t(point) >= digits.size()) {
      out.append(digits).append(size_t(point) - digits.size(), '0').append(".0");
    } else {
      out.append(digits, 0, size_t(point)).append(".").append(digits, size_t(point));
    }
  } else {
    out.append(digits, 0, 1);
    if (digits.size() > 1) out.append(".").append(digits, 1);
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out.append(e);
  }
  return out;
}

// time.ctime(): "Sun Jun  2 20:03:52 2024".
inline std::string ctime_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%a %b %e %H:%M:%S %Y", &tm);
  return buf;
}

// ---- neural_style.py's train() and stylize() ----

// The `train` subcommand's options, the original's defaults.
struct TrainArgs {
  int64_t epochs = 2;
  int64_t batch_size = 4;
  std::string dataset;  // an ImageFolder root: a folder of folders of images
  std::string style_image = "images/style-images/mosaic.jpg";
  std::string save_model_dir;
  std::string checkpoint_model_dir;  // empty: no checkpoints
  int64_t image_size = 256;
  std::optional<int64_t> style_size;  // none: the style image's own size
  uint64_t seed = 42;
  double content_weight = 1e5;
  double style_weight = 1e10;
  double lr = 1e-3;
  int64_t log_interval = 500;
  int64_t checkpoint_interval = 2000;
  std::string vgg_weights;  // a torchvision vgg16 state dict (the original downloads it)
};

// check_paths: creates save_model_dir and checkpoint_model_dir.
inline void check_paths(const TrainArgs& args) {
  for (const std::string& dir : {args.save_model_dir, args.checkpoint_model_dir}) {
    if (dir.empty()) continue;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    ACCEL_CHECK(!ec && std::filesystem::is_directory(dir), IoError, "fast_neural_style",
                "cannot create directory '", dir, "': ", ec.message());
  }
}

// The model as torch.save(transformer.state_dict(), path) writes it (PyTorch loads it).
inline void save_model(const TransformerNet& transformer, const std::string& path) {
  io::save_pt(path, transformer.state_dict());
}

// train(args): prints the original's lines to `out` (plus the mean step time on each log line);
// returns the path of the saved model.
inline std::string train(const TrainArgs& args, std::FILE* out = stdout) {
  ACCEL_CHECK(!args.vgg_weights.empty(), ValueError, "fast_neural_style",
              "--vgg-weights is required: a torchvision vgg16 state dict (.pth), e.g. "
              "vgg16-397923af.pth (the original downloads it)");
  ACCEL_CHECK(args.batch_size > 0 && args.epochs > 0 && args.log_interval > 0 &&
                  args.checkpoint_interval > 0,
              ValueError, "fast_neural_style", "batch size, epochs and intervals must be positive");
  check_paths(args);
  std::fprintf(out, "Using device: cpu\n");

  manual_seed(args.seed);

  auto train_dataset =
      std::make_shared<data::ImageFolder>(args.dataset, dataset_transform(args.image_size));
  data::DataLoaderOptions lo;
  lo.batch_size = args.batch_size;
  data::DataLoader train_loader(train_dataset, lo);

  TransformerNet transformer;
  optim::Adam optimizer(transformer.parameters(), optim::AdamOptions(args.lr));

  std::shared_ptr<Vgg16> vgg = load_vgg16(args.vgg_weights);
  Tensor style = to_tensor_255(load_image(args.style_image, args.style_size));
  style = style.unsqueeze(0).repeat({args.batch_size, 1, 1, 1});
  const std::array<Tensor, 4> gram_style = style_grams(*vgg, style);

  double step_secs = 0;
  int64_t steps = 0;
  for (int64_t e = 0; e < args.epochs; ++e) {
    transformer.train();
    train_loader.set_epoch(e);
    double agg_content_loss = 0, agg_style_loss = 0;
    int64_t count = 0, batch_id = 0;
    for (auto& batch : train_loader) {
      const Tensor& x = batch["image"];
      count += x.size(0);
      const auto t0 = std::chrono::steady_clock::now();
      const StepResult r = train_step(transformer, *vgg, optimizer, x, gram_style,
                                      args.content_weight, args.style_weight);
      step_secs += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      ++steps;
      agg_content_loss += r.content_loss;
      agg_style_loss += r.style_loss;

      if ((batch_id + 1) % args.log_interval == 0) {
        const double n = double(batch_id + 1);
        std::fprintf(out,
                     "%s\tEpoch %lld:\t[%lld/%lld]\tcontent: %.6f\tstyle: %.6f\ttotal: %.6f"
                     "\t[%.0f ms/step]\n",
                     ctime_now().c_str(), static_cast<long long>(e + 1),
                     static_cast<long long>(count), static_cast<long long>(train_dataset->size()),
                     agg_content_loss / n, agg_style_loss / n,
                     (agg_content_loss + agg_style_loss) / n, 1000 * step_secs / double(steps));
        std::fflush(out);
      }

      if (!args.checkpoint_model_dir.empty() && (batch_id + 1) % args.checkpoint_interval == 0) {
        transformer.eval();
        const std::string ckpt_model_filename = "ckpt_epoch_" + std::to_string(e) + "_batch_id_" +
                                                std::to_string(batch_id + 1) + ".pth";
        save_model(
            transformer,
            (std::filesystem::path(args.checkpoint_model_dir) / ckpt_model_filename).string());
        transformer.train();
      }
      ++batch_id;
    }
  }

  // save model
  transformer.eval();
  char timestamp[32];
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  std::strftime(timestamp, sizeof timestamp, "%Y-%m-%d_%H-%M-%S", &tm);
  const std::string save_model_filename = "epoch_" + std::to_string(args.epochs) + "_" + timestamp +
                                          "_" + python_float_str(args.content_weight) + "_" +
                                          python_float_str(args.style_weight) + ".model";
  const std::string save_model_path =
      (std::filesystem::path(args.save_model_dir) / save_model_filename).string();
  save_model(transformer, save_model_path);

  std::fprintf(out, "\nDone, trained model saved at %s\n", save_model_path.c_str());
  return save_model_path;
}

// The `eval` subcommand's options.
struct EvalArgs {
  std::string content_image;
  std::optional<double> content_scale;
  std::string output_image;
  std::string model;  // a state dict of TransformerNet (.pth / .model as train() saves it)
};

// Whether re.search(r'in\d+\.running_(mean|var)$', key) matches (stylize()'s test).
inline bool is_deprecated_instance_norm_key(const std::string& key) {
  size_t end = std::string::npos;
  for (const std::string suffix : {".running_mean", ".running_var"})
    if (key.size() > suffix.size() &&
        key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0)
      end = key.size() - suffix.size();
  if (end == std::string::npos) return false;
  size_t digits = end;
  while (digits > 0 && std::isdigit(static_cast<unsigned char>(key[digits - 1]))) --digits;
  return digits < end && digits >= 2 && key.compare(digits - 2, 2, "in") == 0;
}

// A TransformerNet from a saved state dict (torch.save or safetensors). As stylize() does, the
// in*.running_mean / running_var entries that InstanceNorm2d saved in old PyTorch versions (the
// original's downloadable models have them) are dropped; the rest loads strictly.
inline std::shared_ptr<TransformerNet> load_transformer(const std::string& path) {
  auto name_ends = [&](const char* ext) {
    const std::string e(ext);
    return path.size() >= e.size() && path.compare(path.size() - e.size(), e.size(), e) == 0;
  };
  ACCEL_CHECK(!name_ends(".onnx"), ValueError, "fast_neural_style", "'", path,
              "': ONNX models are not supported; give the state dict (.pth / .model)");
  nn::TensorDict state_dict = vision::models::load_state_dict_file(path);
  // remove saved deprecated running_* keys in InstanceNorm from the checkpoint
  for (auto it = state_dict.begin(); it != state_dict.end();)
    it = is_deprecated_instance_norm_key(it->first) ? state_dict.erase(it) : std::next(it);
  std::shared_ptr<TransformerNet> style_model;
  {
    nn::DeferredInit deferred;  // no initial values: the file gives them all (a strict load)
    style_model = std::make_shared<TransformerNet>();
  }
  style_model->load_state_dict(state_dict);
  style_model->eval();
  return style_model;
}

// stylize(args): the content image through the saved model, written to output_image.
inline void stylize(const EvalArgs& args, std::FILE* out = stdout) {
  std::fprintf(out, "Using device: cpu\n");
  Tensor content_image =
      to_tensor_255(load_image(args.content_image, std::nullopt, args.content_scale));
  content_image = content_image.unsqueeze(0);
  std::shared_ptr<TransformerNet> style_model = load_transformer(args.model);
  NoGradGuard ng;
  const Tensor output = style_model->forward(content_image);
  save_image(args.output_image, output[0]);
}

// ---- stand-in data for a run without ImageNet / COCO, a style image or pretrained VGG16 ----

// A mosaic-like style image (H, W, 3) uint8: Voronoi cells of saturated colours with dark
// grout, drawn from `seed`.
inline Tensor mosaic_image(int64_t size, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const int cells = 60;
  std::vector<double> cy(cells), cx(cells);
  std::vector<std::array<uint8_t, 3>> colour(cells);
  for (int k = 0; k < cells; ++k) {
    cy[size_t(k)] = u(rng) * double(size);
    cx[size_t(k)] = u(rng) * double(size);
    // HSV (hue uniform, saturation 0.7-1, value 0.6-1) to RGB
    const double hue = u(rng) * 6, s = 0.7 + 0.3 * u(rng), v = 0.6 + 0.4 * u(rng);
    const int i = int(hue) % 6;
    const double f = hue - std::floor(hue), p = v * (1 - s), q = v * (1 - s * f),
                 t = v * (1 - s * (1 - f));
    const double rgb[6][3] = {{v, t, p}, {q, v, p}, {p, v, t}, {p, q, v}, {t, p, v}, {v, p, q}};
    for (int c = 0; c < 3; ++c) colour[size_t(k)][size_t(c)] = uint8_t(rgb[i][c] * 255.0);
  }
  Tensor img = empty({size, size, 3}, kUInt8);
  uint8_t* px = img.data<uint8_t>();
  for (int64_t y = 0; y < size; ++y)
    for (int64_t x = 0; x < size; ++x) {
      double d1 = 1e300, d2 = 1e300;
      int best = 0;
      for (int k = 0; k < cells; ++k) {
        const double dy = double(y) - cy[size_t(k)], dx = double(x) - cx[size_t(k)];
        const double d = std::sqrt(dy * dy + dx * dx);
        if (d < d1) {
          d2 = d1;
          d1 = d;
          best = k;
        } else if (d < d2) {
          d2 = d;
        }
      }
      const bool grout = d2 - d1 < 2.0;
      for (int c = 0; c < 3; ++c)
        px[(y * size + x) * 3 + c] = grout ? uint8_t(40) : colour[size_t(best)][size_t(c)];
    }
  return img;
}

// A torchvision vgg16 state dict of random_vgg16_features() (features.* only), as torch.save
// writes it, in `dtype`: what load_vgg16() reads where no pretrained file exists.
inline void write_random_vgg16(const std::string& path, DType dtype = kFloat32) {
  const std::shared_ptr<nn::Sequential> features = random_vgg16_features();
  nn::TensorDict state;
  for (const auto& [name, t] : features->state_dict()) state["features." + name] = t.to(dtype);
  io::save_pt(path, state);
}

struct StandInArgs {
  std::string out;        // folder to write into (created)
  int64_t images = 2000;  // Fashion-MNIST training images to write
  std::string fashion_dir = data::kFashionMnistDir;
  uint64_t seed = 0;  // the mosaic and the VGG16 weights
  bool vgg = true;    // write vgg16_random.pth
};

// Writes <out>/fashion/<class>/<index>.png (the first `images` Fashion-MNIST training images,
// 28x28 grey, an ImageFolder root for --dataset), <out>/mosaic.png (256x256, for
// --style-image) and <out>/vgg16_random.pth (torchvision vgg16's features.* with torchvision's
// random initialisation, float32, for --vgg-weights: no pretrained weights here).
inline void write_stand_in(const StandInArgs& args, std::FILE* out = stdout) {
  static const char* const kClasses[10] = {"T-shirt_top", "Trouser",   "Pullover", "Dress",
                                           "Coat",        "Sandal",    "Shirt",    "Sneaker",
                                           "Bag",         "Ankle_boot"};
  namespace fs = std::filesystem;
  ACCEL_CHECK(args.images > 0, ValueError, "fast_neural_style", "--images must be positive");
  data::MnistOptions mo;
  mo.dtype = kUInt8;
  const auto mnist = data::load_mnist(args.fashion_dir, mo);
  const Tensor& images = mnist->tensors()[0];  // (N, 28, 28) uint8
  const Tensor& labels = mnist->tensors()[1];
  const int64_t n = std::min(args.images, images.size(0));
  const fs::path root = fs::path(args.out) / "fashion";
  for (int64_t i = 0; i < n; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "%05lld.png", static_cast<long long>(i));
    const fs::path cls = root / kClasses[int64_t(labels[i].item())];
    fs::create_directories(cls);  // only the classes that get images (ImageFolder wants files)
    data::write_png(images[i].contiguous(), (cls / name).string());
  }
  std::fprintf(out, "wrote %lld Fashion-MNIST images under %s\n", static_cast<long long>(n),
               root.string().c_str());
  const std::string style = (fs::path(args.out) / "mosaic.png").string();
  data::write_png(mosaic_image(256, args.seed), style);
  std::fprintf(out, "wrote %s\n", style.c_str());
  if (args.vgg) {
    manual_seed(args.seed);
    const std::string path = (fs::path(args.out) / "vgg16_random.pth").string();
    write_random_vgg16(path);
    std::fprintf(out, "wrote %s (random weights: a stand-in for vgg16-397923af.pth)\n",
                 path.c_str());
  }
}

}  // namespace accel::examples::fast_neural_style
