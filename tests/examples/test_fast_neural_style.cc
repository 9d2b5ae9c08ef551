// examples/fast_neural_style.h against its PyTorch twin (tests/examples/torch_fast_neural_style.py,
// which wrote fast_neural_style_fixture.safetensors): transformer_net.py's TransformerNet and
// vgg.py's Vgg16 (slices of torchvision vgg16's features) in float64 from the same initial
// weights (twin.h's det_init on both: the VGG slices are 61 MB in float64), the same images
// through the original's dataset transform and an ImageFolder, neural_style.py's step (content
// weight 1e5, style weight 1e10, Adam lr 1e-3): every step's content / style / total loss and
// the final weights agree to 1e-10. Then the shapes and names, the train / eval programs on tiny
// data, the stand-in writer and the error paths.
#include <doctest.h>
#include <stdlib.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include "accel.h"
#include "examples/fast_neural_style.h"
#include "tests/examples/twin.h"

using namespace accel;
using namespace accel::examples;
namespace fns = accel::examples::fast_neural_style;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "accel_fns_XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
  fs::path path;
};

// What a function printed to a FILE*.
struct Captured {
  Captured() : file(std::tmpfile()) { REQUIRE(file != nullptr); }
  ~Captured() { std::fclose(file); }
  std::string text() const {
    std::fflush(file);
    std::rewind(file);
    std::string s;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, file)) > 0) s.append(buf, n);
    return s;
  }
  std::FILE* file;
};

// A random torchvision-style vgg16 state dict (features.* only, float16: 29 MB) written once and
// shared by the test cases that need VGG weights.
struct VggFile {
  TempDir dir;
  std::string path = dir / "vgg16.pth";
  nn::TensorDict state;
};
const VggFile& vgg_file() {
  static const VggFile* f = [] {
    auto* v = new VggFile;
    manual_seed(0);
    fns::write_random_vgg16(v->path, kFloat16);
    v->state = io::load_pt(v->path);
    return v;
  }();
  return *f;
}

bool close(double got, double want) {
  return std::abs(got - want) <= 1e-10 * std::max(1.0, std::abs(want));
}

}  // namespace

TEST_CASE("fast_neural_style: training steps match PyTorch's neural_style.py") {
  const twin::Fixture fx("fast_neural_style_fixture.safetensors");
  const int64_t image_size = std::stoll(fx.meta("image_size"));
  const int64_t B = std::stoll(fx.meta("batch"));
  const double content_weight = std::stod(fx.meta("content_weight"));
  const double style_weight = std::stod(fx.meta("style_weight"));

  // The images as an ImageFolder (two classes; files sorted as torchvision sorts them), read
  // through the program's own transform and a DataLoader without shuffling, as train() does.
  TempDir dir;
  const Tensor& sizes = fx["sizes"];
  const int64_t n = sizes.size(0);
  int64_t offset = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t h = int64_t(sizes[i][0].item()), w = int64_t(sizes[i][1].item());
    const Tensor img = fx["images"].narrow(0, offset, h * w * 3).view({h, w, 3});
    offset += h * w * 3;
    const fs::path cls = dir.path / (i < 3 ? "a" : "b");
    fs::create_directories(cls);
    data::write_png(img.contiguous(), (cls / (std::to_string(i) + ".png")).string());
  }
  auto dataset =
      std::make_shared<data::ImageFolder>(dir.path.string(), fns::dataset_transform(image_size));
  data::DataLoaderOptions lo;
  lo.batch_size = B;
  data::DataLoader loader(dataset, lo);
  std::vector<Tensor> batches;
  for (auto& batch : loader) batches.push_back(batch["image"]);
  REQUIRE(batches.size() == 3);
  // Resize (antialias) + CenterCrop + ToTensor + mul(255) equal torchvision's, float32 bits.
  CHECK(max(abs(sub(cat(batches, 0), fx["batches"]))).item() == 0.0);

  fns::TransformerNet transformer;
  twin::det_init(transformer);
  CHECK(twin::checksum(transformer) ==
        doctest::Approx(std::stod(fx.meta("init_checksum"))).epsilon(1e-12));
  std::shared_ptr<vision::models::VGG> vgg16;
  {
    nn::DeferredInit deferred;  // the values come from det_init
    vgg16 = vision::models::vgg16({.init_weights = false});
  }
  fns::Vgg16 vgg(*vgg16->features);
  nn::materialize(vgg);
  twin::det_init(vgg);
  CHECK(twin::checksum(vgg) == doctest::Approx(std::stod(fx.meta("vgg_checksum"))).epsilon(1e-12));

  // style_transform, repeated over the batch; the original size (style_size None).
  const Tensor style =
      fns::to_tensor_255(fx["style"]).to(kFloat64).unsqueeze(0).repeat({B, 1, 1, 1});
  const std::array<Tensor, 4> gram_style = fns::style_grams(vgg, style);
  for (int k = 0; k < 4; ++k) {
    INFO("gram ", k);
    CHECK(close(sum(gram_style[size_t(k)][0]).item(), fx.at("gram_sums", k)));
  }

  optim::Adam optimizer(transformer.parameters(), optim::AdamOptions(std::stod(fx.meta("lr"))));
  transformer.train();
  const std::string names[] = {"content", "style", "total"};
  for (size_t s = 0; s < batches.size(); ++s) {
    const fns::StepResult r = fns::train_step(transformer, vgg, optimizer, batches[s].to(kFloat64),
                                              gram_style, content_weight, style_weight);
    const double got[] = {r.content_loss, r.style_loss, r.total_loss};
    for (int k = 0; k < 3; ++k) {
      const double want = fx["results"][int64_t(s)][k].item();
      INFO("step ", s, " ", names[k], " loss: ours ", got[k], ", torch ", want, ", relative error ",
           std::abs(got[k] - want) / std::abs(want));
      CHECK(close(got[k], want));  // measured: <= 3.1e-13
    }
    if (s == 0) {
      double g = 0;
      for (const Tensor& p : transformer.parameters())
        g += sum(p.grad()).item() + sum(p.grad() * p.grad()).item();
      const double want = std::stod(fx.meta("grad_checksum"));
      INFO("first step's gradients: ours ", g, ", torch ", want);
      CHECK(close(g, want));
    }
  }
  // The trained network computes the same function: its output on every batch.
  {
    NoGradGuard ng;
    for (size_t s = 0; s < batches.size(); ++s) {
      const Tensor y = transformer.forward(batches[s].to(kFloat64));
      INFO("output on batch ", s);
      CHECK(close(sum(y).item(), fx["final_outputs"][int64_t(s)][0].item()));
      CHECK(close(sum(y * y).item(), fx["final_outputs"][int64_t(s)][1].item()));
    }
  }
  // Note [noise-driven Adam updates]: the final weights agree to 2e-9 (measured 4.5e-10), not
  // 1e-10. Instance norm is blind to a per-channel shift, so the biases of the convolutions
  // feeding an InstanceNorm2d, the residual blocks' in2.bias and the in*.bias of a channel whose
  // ReLU passes everything have gradients that are zero in exact arithmetic and rounding noise
  // (1e-17 to 1e-12) in each framework, different noise in each. Adam moves a parameter by
  // lr * g / (|g| + eps) with eps = 1e-8, so such noise becomes steps of up to 1e-7 that do not
  // change the network's function (the losses and outputs above agree to 1e-10) but do show in
  // the weights.
  const double want = std::stod(fx.meta("final_checksum")), got = twin::checksum(transformer);
  INFO("final checksum: ours ", got, ", torch ", want, ", relative error ",
       std::abs(got - want) / std::abs(want));
  CHECK(std::abs(got - want) <= 2e-9 * std::abs(want));  // measured 4.0e-10 to 4.5e-10
}

TEST_CASE("fast_neural_style: shapes, names and frozen VGG") {
  manual_seed(3);
  fns::TransformerNet net;
  CHECK(net.num_parameters() == 1679235);  // torch: sum(p.numel()) of transformer_net.py's
  const nn::TensorDict sd = net.state_dict();
  for (const char* k : {"conv1.conv2d.weight", "in1.weight", "in5.bias", "res3.conv2.conv2d.bias",
                        "res5.in2.weight", "deconv1.conv2d.weight", "deconv3.conv2d.bias"})
    CHECK_MESSAGE(sd.count(k) == 1, k);
  CHECK(sd.at("conv1.conv2d.weight").sizes() == Shape{32, 3, 9, 9});
  CHECK(sd.at("deconv2.conv2d.weight").sizes() == Shape{32, 64, 3, 3});
  CHECK(sd.size() == 62);  // no running statistics: InstanceNorm2d(affine=True) tracks none
  // A multiple of 4 keeps the size; torch gives (40, 44) for 38 x 42.
  CHECK(net.forward(rand({2, 3, 32, 36})).sizes() == Shape{2, 3, 32, 36});
  CHECK(net.forward(rand({1, 3, 38, 42})).sizes() == Shape{1, 3, 40, 44});

  const std::shared_ptr<fns::Vgg16> vgg_ptr = fns::load_vgg16(vgg_file().path);
  fns::Vgg16& vgg = *vgg_ptr;
  const nn::TensorDict vsd = vgg.state_dict();
  CHECK(vsd.size() == 20);  // conv 0, 2 | 5, 7 | 10, 12, 14 | 17, 19, 21
  CHECK(vsd.count("slice2.5.weight") == 1);
  CHECK(vsd.count("slice4.21.bias") == 1);
  for (const auto& [name, p] : vgg.named_parameters()) CHECK_MESSAGE(!p.requires_grad(), name);
  const fns::VggOutputs o = vgg.outputs(rand({1, 3, 16, 24}));
  CHECK(o.relu1_2.sizes() == Shape{1, 64, 16, 24});
  CHECK(o.relu2_2.sizes() == Shape{1, 128, 8, 12});
  CHECK(o.relu3_3.sizes() == Shape{1, 256, 4, 6});
  CHECK(o.relu4_3.sizes() == Shape{1, 512, 2, 3});
  CHECK(min(o.relu4_3).item() >= 0.0);
  // gram_matrix: (B, C, C), features @ features^T / (C H W).
  const Tensor y = rand({2, 3, 4, 5});
  const Tensor g = fns::gram_matrix(y);
  CHECK(g.sizes() == Shape{2, 3, 3});
  const Tensor f = y.reshape({2, 3, 20});
  CHECK(max(abs(sub(g, div(matmul(f, f.transpose(1, 2)), 60.0)))).item() < 1e-6);
  // normalize_batch: 255 * mean maps to 0.
  const Tensor m = mul(tensor({0.485f, 0.456f, 0.406f}).view({1, 3, 1, 1}), 255.0);
  CHECK(max(abs(fns::normalize_batch(m.expand({1, 3, 2, 2})))).item() < 1e-5);
  CHECK_THROWS_WITH_AS(fns::gram_matrix(rand({3, 4, 5})), doctest::Contains("[gram_matrix]"),
                       ValueError);
  nn::Sequential short_features(std::make_shared<nn::ReLU>());
  CHECK_THROWS_WITH_AS(fns::Vgg16{short_features}, doctest::Contains("got 1 entries"), ValueError);
}

TEST_CASE("fast_neural_style: python_float_str and the deprecated InstanceNorm keys") {
  CHECK(fns::python_float_str(1e5) == "100000.0");
  CHECK(fns::python_float_str(1e10) == "10000000000.0");
  CHECK(fns::python_float_str(1e15) == "1000000000000000.0");
  CHECK(fns::python_float_str(1e16) == "1e+16");
  CHECK(fns::python_float_str(2.5e17) == "2.5e+17");
  CHECK(fns::python_float_str(0.0001) == "0.0001");
  CHECK(fns::python_float_str(1.5e-5) == "1.5e-05");
  CHECK(fns::python_float_str(0.1) == "0.1");
  CHECK(fns::python_float_str(-2.5) == "-2.5");
  CHECK(fns::python_float_str(0.0) == "0.0");
  CHECK(fns::python_float_str(123456.789) == "123456.789");
  CHECK(fns::is_deprecated_instance_norm_key("in1.running_mean"));
  CHECK(fns::is_deprecated_instance_norm_key("res2.in12.running_var"));
  CHECK_FALSE(fns::is_deprecated_instance_norm_key("in.running_mean"));
  CHECK_FALSE(fns::is_deprecated_instance_norm_key("in1.running_meanx"));
  CHECK_FALSE(fns::is_deprecated_instance_norm_key("in1.num_batches_tracked"));
  CHECK_FALSE(fns::is_deprecated_instance_norm_key("conv1.running_mean"));
}

TEST_CASE("fast_neural_style: train and eval on tiny data") {
  TempDir dir;
  data::ShapesOptions so;
  so.per_class = 1;
  so.size = 36;
  data::write_shapes_folder(dir / "data", so);  // 4 images: batches of 2 and 2
  data::write_png(fns::mosaic_image(40, 1), dir / "style.png");

  fns::TrainArgs args;
  args.dataset = dir / "data";
  args.style_image = dir / "style.png";
  args.style_size = 24;
  args.save_model_dir = dir / "models";
  args.checkpoint_model_dir = dir / "ckpt";
  args.vgg_weights = vgg_file().path;
  args.epochs = 1;
  args.batch_size = 2;
  args.image_size = 32;
  args.log_interval = 1;
  args.checkpoint_interval = 2;
  Captured log;
  const std::string model = fns::train(args, log.file);
  const std::string text = log.text();
  INFO(text);
  CHECK(text.rfind("Using device: cpu\n", 0) == 0);
  CHECK(text.find("\tEpoch 1:\t[2/4]\tcontent: ") != std::string::npos);
  CHECK(text.find("\tEpoch 1:\t[4/4]\tcontent: ") != std::string::npos);
  CHECK(text.find("\nDone, trained model saved at " + model + "\n") != std::string::npos);
  CHECK(fs::exists(dir / "ckpt/ckpt_epoch_0_batch_id_2.pth"));
  CHECK_FALSE(fs::exists(dir / "ckpt/ckpt_epoch_0_batch_id_1.pth"));
  const std::string file = fs::path(model).filename().string();
  CHECK(file.rfind("epoch_1_", 0) == 0);
  CHECK(file.find("_100000.0_10000000000.0.model") == file.size() - 29);
  // torch.save format: the TransformerNet's 62 entries.
  const nn::TensorDict saved = io::load_pt(model);
  CHECK(saved.size() == 62);

  // eval: the content image scaled down by 2 (44 x 56 -> 22 x 28), stylized, PNG and JPEG.
  data::write_png(fns::mosaic_image(44, 2).narrow(1, 0, 40).contiguous(), dir / "content.png");
  fns::EvalArgs eargs;
  eargs.content_image = dir / "content.png";
  eargs.content_scale = 2.0;
  eargs.model = model;
  eargs.output_image = dir / "out.png";
  Captured elog;
  fns::stylize(eargs, elog.file);
  const Tensor out = data::read_image(dir / "out.png");
  CHECK(out.sizes() == Shape{24, 20, 3});  // 22 x 20 -> the net's multiple of 4 above
  // The output equals the model's forward clamped and truncated.
  {
    auto net = fns::load_transformer(model);
    NoGradGuard ng;
    const Tensor in = fns::to_tensor_255(fns::load_image(dir / "content.png", {}, 2.0));
    const Tensor y = clamp(net->forward(in.unsqueeze(0))[0], 0.0, 255.0);
    CHECK(max(abs(sub(out.permute({2, 0, 1}).to(kFloat32), y))).item() < 1.0);
  }
  eargs.output_image = dir / "out.JPG";
  fns::stylize(eargs, elog.file);
  CHECK(data::read_image(dir / "out.JPG").sizes() == Shape{24, 20, 3});

  // Old checkpoints carry in*.running_mean / running_var: dropped, as the original does.
  nn::TensorDict old = saved;
  old["in1.running_mean"] = zeros({32});
  old["res1.in2.running_var"] = ones({128});
  io::save_pt(dir / "old.pth", old);
  CHECK(fns::load_transformer(dir / "old.pth")->state_dict().size() == 62);
  old["in1.num_batches_tracked"] = zeros({1}, kInt64);
  io::save_pt(dir / "bad.pth", old);
  CHECK_THROWS_WITH_AS(fns::load_transformer(dir / "bad.pth"),
                       doctest::Contains("in1.num_batches_tracked"), ValueError);
  CHECK_THROWS_WITH_AS(fns::load_transformer(dir / "m.onnx"), doctest::Contains("ONNX"),
                       ValueError);
  eargs.output_image = dir / "out.bmp";
  CHECK_THROWS_WITH_AS(fns::stylize(eargs, elog.file), doctest::Contains("unknown file extension"),
                       ValueError);
  eargs.content_scale = 100.0;
  eargs.output_image = dir / "out.png";
  CHECK_THROWS_WITH_AS(fns::stylize(eargs, elog.file), doctest::Contains("smaller than one pixel"),
                       ValueError);
}

TEST_CASE("fast_neural_style: VGG16 weights files and argument errors") {
  TempDir dir;
  nn::TensorDict state = vgg_file().state;
  CHECK(state.size() == 26);  // features.{0,2,5,...,28}.{weight,bias}
  CHECK(state.at("features.0.weight").dtype() == kFloat16);
  // He-normal fan_out weights as torchvision's VGG (std sqrt(2 / (512 * 9)) for entry 28).
  CHECK(std_dev(state.at("features.28.weight").to(kFloat32)).item() ==
        doctest::Approx(std::sqrt(2.0 / (512 * 9))).epsilon(0.02));
  CHECK(max(abs(state.at("features.28.bias"))).item() == 0.0);
  // A full torchvision state dict has classifier.* too: not needed, accepted.
  state["classifier.6.bias"] = zeros({1000}, kFloat16);
  io::save_pt(dir / "full.pth", state);
  const std::shared_ptr<fns::Vgg16> vgg = fns::load_vgg16(dir / "full.pth");
  CHECK(vgg->slice3->at<nn::Conv2d>(3)->weight.dtype() == kFloat32);  // entry 12
  CHECK(max(abs(sub(vgg->slice3->at<nn::Conv2d>(3)->weight,
                    state.at("features.12.weight").to(kFloat32))))
            .item() == 0.0);
  CHECK_FALSE(vgg->slice1->at<nn::Conv2d>(0)->weight.requires_grad());

  nn::TensorDict missing = state;
  missing.erase("features.28.bias");
  io::save_pt(dir / "missing.pth", missing);
  CHECK_THROWS_WITH_AS(fns::load_vgg16(dir / "missing.pth"), doctest::Contains("features.28.bias"),
                       ValueError);
  nn::TensorDict extra = state;
  extra["fc.weight"] = zeros({2, 2});
  io::save_pt(dir / "extra.pth", extra);
  CHECK_THROWS_WITH_AS(fns::load_vgg16(dir / "extra.pth"), doctest::Contains("fc.weight"),
                       ValueError);
  CHECK_THROWS_AS(fns::load_vgg16(dir / "absent.pth"), IoError);

  fns::TrainArgs args;
  args.dataset = dir.path.string();
  args.save_model_dir = dir / "m";
  CHECK_THROWS_WITH_AS(fns::train(args), doctest::Contains("--vgg-weights is required"),
                       ValueError);
  // A batch larger than the style targets.
  manual_seed(2);
  fns::TransformerNet net;
  optim::Adam opt(net.parameters());
  const std::array<Tensor, 4> grams = fns::style_grams(*vgg, mul(rand({1, 3, 16, 16}), 255.0));
  CHECK_THROWS_WITH_AS(fns::train_step(net, *vgg, opt, rand({2, 3, 16, 16}), grams, 1e5, 1e10),
                       doctest::Contains("2 images needs as many copies"), ValueError);
}

TEST_CASE("fast_neural_style: the stand-in writer") {
  const std::string fashion = data::kFashionMnistDir;
  if (!fs::exists(fashion + "/train-images-idx3-ubyte.gz")) {
    MESSAGE("skipped: " << fashion << " not installed (Debian package dataset-fashion-mnist)");
    return;
  }
  TempDir dir;
  fns::StandInArgs args;
  args.out = dir.path.string();
  args.images = 12;
  args.vgg = false;  // the VGG16 file is write_random_vgg16's, tested above
  Captured log;
  fns::write_stand_in(args, log.file);
  data::ImageFolder folder(dir / "fashion");
  CHECK(folder.size() == 12);
  CHECK(folder.classes().size() >= 2);  // the classes of the first 12 images
  CHECK(folder.load(0).sizes() == Shape{28, 28, 3});
  const Tensor style = data::read_image(dir / "mosaic.png");
  CHECK(style.sizes() == Shape{256, 256, 3});
  CHECK(std_dev(style.to(kFloat32)).item() > 20.0);  // coloured cells, not a flat image
}
