// accel::vision beyond the torchvision fixture: the builders' options (num_classes, weights files,
// replaceable heads, zero_init_residual, dilation), torchvision's initialisation, the
// torchvision.ops blocks (Conv2dNormActivation, SqueezeExcitation, MLP, stochastic_depth),
// training-mode backward of every family, deferred construction, and the errors.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "tests/vision/models_fixture.h"
#include "tests/common/check.h"
#include "tests/common/util.h"

using namespace accel;
using namespace accel::testing;
using accel::test::contains;
using accel::test::error_of;
using accel::test::TempDir;
namespace vm = accel::vision::models;
namespace vops = accel::vision::ops;
namespace fs = std::filesystem;

namespace {

double std_of(const Tensor& t) { return std::sqrt(var(t.to(kFloat64)).item<double>()); }
double absmax(const Tensor& t) { return max(abs(t)).item<double>(); }

// The fixture's state dict of `name` in float32 (as a torchvision checkpoint holds it).
nn::TensorDict float32_state(const std::string& name) {
  nn::TensorDict sd = formula_state(model_spec(name));
  for (auto& [k, v] : sd)
    if (v.dtype() == kFloat64) v = v.to(kFloat32);
  return sd;
}

}  // namespace

TEST_CASE("resnet18: replaceable fc, num_classes, torchvision's init") {
  manual_seed(0);
  auto net = vm::resnet18({.num_classes = 10});
  CHECK(net->fc->as<nn::Linear>()->out_features == 10);
  // torchvision's init: convolutions Kaiming-normal over fan_out (gain sqrt(2)), norms 1 / 0;
  // fc keeps Linear's default (U(+-1/sqrt(512))).
  CHECK(std_of(net->conv1->weight) == doctest::Approx(std::sqrt(2.0 / (64 * 49))).epsilon(0.05));
  CHECK(std_of(net->layer4->at<vm::BasicBlock>(1)->conv2->weight) ==
        doctest::Approx(std::sqrt(2.0 / (512 * 9))).epsilon(0.05));
  CHECK(absmax(sub(net->parameter("layer1.0.bn2.weight"), 1.0)) == 0.0);
  CHECK(absmax(net->parameter("fc.weight")) <= 1.0 / std::sqrt(512.0));

  // model.fc = nn.Linear(512, 2): the new head is what forward, parameters and state_dict see.
  auto head = std::make_shared<nn::Linear>(512, 2);
  net->fc = head;
  CHECK(net->parameter("fc.weight").sizes() == Shape{2, 512});
  CHECK(net->state_dict().at("fc.bias").sizes() == Shape{2});
  net->eval();
  NoGradGuard no_grad;
  const Tensor x = randn({2, 3, 32, 32});
  CHECK(net->forward(x).sizes() == Shape{2, 2});
  // Any module may replace it (a torch user's nn.Sequential(nn.Dropout(), nn.Linear(...))).
  net->fc = std::make_shared<nn::Sequential>(std::make_shared<nn::Dropout>(0.5),
                                             std::make_shared<nn::Linear>(512, 3));
  CHECK(net->forward(x).sizes() == Shape{2, 3});
  CHECK(net->parameter("fc.1.weight").sizes() == Shape{3, 512});
  // A block without downsample has a None entry that an assignment fills.
  auto block = net->layer1->at<vm::BasicBlock>(0);
  CHECK(block->downsample == nullptr);
  block->downsample = std::make_shared<nn::Identity>();
  CHECK(block->named_children().back().first == "downsample");
}

TEST_CASE("resnet options: zero_init_residual, dilation, groups, norm_layer, errors") {
  auto net = vm::resnet18({.num_classes = 4, .zero_init_residual = true});
  CHECK(absmax(net->parameter("layer2.1.bn2.weight")) == 0.0);
  CHECK(absmax(sub(net->parameter("layer2.1.bn1.weight"), 1.0)) == 0.0);
  auto wide = vm::resnet50({.num_classes = 3,
                            .zero_init_residual = true,
                            .groups = 2,
                            .width_per_group = 32,
                            .replace_stride_with_dilation = {false, true, true}});
  CHECK(absmax(wide->parameter("layer3.2.bn3.weight")) == 0.0);
  auto b = wide->layer4->at<vm::Bottleneck>(1);
  CHECK(b->conv2->dilation.h == 4);
  CHECK(b->conv2->groups == 2);
  // width int(512 * 32 / 64) * 2 = 512 channels in 2 groups
  CHECK(b->conv2->weight.sizes() == Shape{512, 256, 3, 3});
  wide->eval();
  {
    NoGradGuard no_grad;
    // Dilated stages keep the resolution: layer4 works on 4x4 for a 32x32 input.
    CHECK(wide->forward(randn({1, 3, 32, 32})).sizes() == Shape{1, 3});
  }
  // norm_layer: GroupNorm instead of BatchNorm2d (no running statistics).
  auto gn = vm::resnet18({.num_classes = 2, .norm_layer = [](int64_t c) {
                            return std::make_shared<nn::GroupNorm>(2, c);
                          }});
  CHECK(gn->named_buffers().empty());
  CHECK(contains(error_of<ValueError>([] {
                   vm::resnet18({.replace_stride_with_dilation = {false, false, true}});
                 }),
                 "[BasicBlock] dilation > 1 is not supported in BasicBlock, got 2"));
  CHECK(contains(error_of<ValueError>([] { vm::resnet34({.groups = 2}); }),
                 "[BasicBlock] BasicBlock only supports groups=1 and base_width=64"));
  CHECK(contains(error_of<ValueError>([] {
                   vm::ResNet(vm::ResNetBlock::Basic, {2, 2, 2});
                 }),
                 "[ResNet] layers must have 4 entries"));
  CHECK(contains(error_of<ValueError>([] { vm::resnet18({.num_classes = 0}); }),
                 "[ResNet] num_classes must be positive, got 0"));
  CHECK(contains(error_of<ShapeError>([&] {
                   net->forward(randn({2, 1, 32, 32}));
                 }),
                 "[ResNet] expected an input (N, 3, H, W), got (2, 1, 32, 32)"));
}

TEST_CASE("weights: a safetensors state dict loads strictly, without initialising first") {
  TempDir dir;
  const std::string path = dir.file("resnet18.safetensors");
  nn::save_safetensors(path, float32_state("resnet18"));
  auto net = vm::resnet18({.weights = path, .num_classes = 10});
  const nn::TensorDict sd = net->state_dict();
  const nn::TensorDict ref = float32_state("resnet18");
  CHECK(sd.size() == ref.size());
  for (const auto& [k, v] : ref) CHECK_MESSAGE(equal(sd.at(k), v), k);
  // Logits of the loaded float32 model, in float64, equal torchvision's (float64 values rounded
  // to float32 first: a looser bound).
  net->to(kFloat64).eval();
  NoGradGuard no_grad;
  const Tensor logits = net->forward(formula(model_spec("resnet18").input, -1));
  CHECK(allclose(logits, fixture_tensor("resnet18.logits"), 1e-5, 1e-5));
  // Loading into an existing model: load_weights / load_state_dict.
  auto again = vm::resnet18({.num_classes = 10});
  vm::load_weights(*again, path);
  CHECK(equal(again->parameter("layer3.0.conv1.weight"), ref.at("layer3.0.conv1.weight")));

  // The default 1000 classes against a 10-class file: torch's shape-mismatch report.
  CHECK(
      contains(error_of<ValueError>([&] { vm::resnet18({.weights = path}); }),
               "size mismatch for fc.weight: copying a param with shape (10, 512) from checkpoint, "
               "the shape in current model is (1000, 512)."));
  // Another architecture's file: every missing and unexpected key listed.
  const std::string msg =
      error_of<ValueError>([&] { vm::resnet34({.weights = path, .num_classes = 10}); });
  CHECK(contains(msg, "Missing key(s) in state_dict: "));
  CHECK(contains(msg, "\"layer1.2.conv1.weight\""));
  CHECK(contains(error_of<IoError>([&] { vm::vgg11({.weights = dir.file("absent.safetensors")}); }),
                 "absent.safetensors"));
}

TEST_CASE("weights: torch.save files (.pth), as torchvision users have them") {
  TempDir dir;
  // Written by accel's torch.save writer (io::save_pt) from the fixture's float64 values.
  const std::string pth = dir.file("resnet18.pth");
  io::save_pt(pth, formula_state(model_spec("resnet18")));
  auto net = vm::resnet18({.weights = pth, .num_classes = 10});
  CHECK(net->parameter("conv1.weight").dtype() == kFloat32);  // converted as load_state_dict does
  net->to(kFloat64);
  vm::load_weights(*net, pth);  // into a float64 model: torchvision's float64 logits
  net->eval();
  NoGradGuard no_grad;
  CHECK(allclose(net->forward(formula(model_spec("resnet18").input, -1)),
                 fixture_tensor("resnet18.logits"), 1e-10, 1e-10));
  // Written by torch.save in Python (make_models_fixture.py): squeezenet1_1's state dict in
  // float16; float16 -> float32 -> float64 is exact, so the logits are torchvision's to 1e-10.
  auto sq = vm::squeezenet1_1(
      {.weights = std::string(ACCEL_SOURCE_ROOT) + "/tests/vision/squeezenet1_1_f16.pth",
       .num_classes = 10});
  sq->to(kFloat64).eval();
  const Tensor logits = sq->forward(formula({2, 3, 66, 66}, -1));
  CHECK(allclose(logits, fixture_tensor("squeezenet1_1_pth.logits"), 1e-10, 1e-10));
  // A torch.save file is recognised by its bytes whatever its name; a damaged one is the torch
  // reader's IoError naming the file.
  const std::string renamed = dir.file("resnet18.weights");
  fs::copy_file(pth, renamed);
  CHECK(vm::load_state_dict_file(renamed).size() == model_spec("resnet18").entries.size());
  const std::string bad = dir.file("bad.pth");
  std::ofstream(bad, std::ios::binary) << std::string("PK\x03\x04", 4) << std::string(64, '\0');
  CHECK(contains(error_of<IoError>([&] { vm::alexnet({.weights = bad}); }), bad));
}

TEST_CASE("vgg / mobilenet / efficientnet / squeezenet: torchvision's init and heads") {
  manual_seed(1);
  // VGG's classifier holds 120M parameters whatever the input (the one slow construction here).
  auto vgg = vm::vgg11({.num_classes = 5, .dropout = 0.25});
  CHECK(vgg->classifier->at<nn::Dropout>(2)->p == 0.25);
  CHECK(std_of(vgg->classifier->at<nn::Linear>(0)->weight) == doctest::Approx(0.01).epsilon(0.02));
  CHECK(absmax(vgg->classifier->at<nn::Linear>(6)->bias) == 0.0);
  CHECK(absmax(vgg->features->at<nn::Conv2d>(0)->bias) == 0.0);
  // model.classifier[6] = nn.Linear(4096, 2)
  vgg->classifier->set(6, std::make_shared<nn::Linear>(4096, 2));
  CHECK(vgg->parameter("classifier.6.weight").sizes() == Shape{2, 4096});

  auto v2 = vm::mobilenet_v2({.num_classes = 7, .width_mult = 0.5});
  CHECK(v2->last_channel == 1280);
  CHECK(v2->parameter("features.0.0.weight").sizes() == Shape{16, 3, 3, 3});  // 32 * 0.5
  CHECK(std_of(v2->parameter("classifier.1.weight")) == doctest::Approx(0.01).epsilon(0.05));

  auto v3 = vm::mobilenet_v3_small({.num_classes = 3});
  auto* bn = v3->features->at<vops::Conv2dNormActivation>(0)->at<nn::BatchNorm2d>(1).get();
  CHECK(bn->eps == 1e-3);
  CHECK(*bn->momentum == 0.01);
  CHECK(v3->features->at<vops::Conv2dNormActivation>(0)->at<nn::Hardswish>(2)->inplace);
  auto v3r = vm::mobilenet_v3_large({.reduced_tail = true, .dilated = true});
  CHECK(v3r->parameter("classifier.0.weight").sizes() == Shape{640, 480});  // 1280 / 2, 6 * 80
  auto* dw = v3r->features->at<vm::mobilenetv3::InvertedResidual>(14)
                 ->block->at<vops::Conv2dNormActivation>(1)
                 ->at<nn::Conv2d>(0)
                 .get();
  CHECK(dw->dilation.h == 2);
  CHECK(dw->padding.h == 4);

  auto eff = vm::efficientnet_b0({.num_classes = 4, .stochastic_depth_prob = 0.4});
  // Block i of 16 drops with probability 0.4 i / 16.
  auto last = eff->features->at<nn::Sequential>(7)->at<vm::MBConv>(0);
  CHECK(last->stochastic_depth->p == doctest::Approx(0.4 * 15 / 16));
  CHECK(absmax(eff->parameter("classifier.1.weight")) <= 1.0 / std::sqrt(4.0));

  auto sq = vm::squeezenet1_1({.num_classes = 6});
  CHECK(std_of(sq->classifier->at<nn::Conv2d>(1)->weight) < 0.02);
  CHECK(absmax(sq->parameter("features.3.squeeze.bias")) == 0.0);
  CHECK(contains(error_of<ValueError>([] { vm::SqueezeNet("1_2"); }),
                 "[SqueezeNet] unsupported SqueezeNet version 1_2: 1_0 or 1_1 expected"));
}

TEST_CASE("every family trains: forward and backward in training mode") {
  manual_seed(2);
  const Tensor x = randn({2, 3, 32, 32});
  std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>> models = {
      {"mobilenet_v3_small", vm::mobilenet_v3_small({.num_classes = 3})},
      {"efficientnet_b0", vm::efficientnet_b0({.num_classes = 3, .stochastic_depth_prob = 0.5})},
      {"squeezenet1_0", vm::squeezenet1_0({.num_classes = 3})},
      {"vit",
       std::make_shared<vm::VisionTransformer>(
           32, 16, 2, 4, 16, 32, vm::VisionTransformerOptions{.num_classes = 3, .dropout = 0.1})},
  };
  for (auto& [name, m] : models) {
    CAPTURE(name);
    m->train();
    Tensor xi = x.clone();
    xi.requires_grad_();
    const Tensor y = m->forward(xi);
    CHECK(y.sizes() == Shape{2, 3});
    sum(mul(y, y)).backward();
    CHECK(std::isfinite(sum(abs(xi.grad())).item<double>()));
    for (const auto& [pn, p] : m->named_parameters())
      CHECK_MESSAGE(p.grad().defined(), pn, " has no gradient");
  }
}

TEST_CASE("vision transformer: heads, init, image size, deferred materialization") {
  manual_seed(3);
  vm::VisionTransformer vit(32, 16, 2, 2, 8, 16, {.num_classes = 5, .representation_size = 6});
  CHECK(absmax(vit.class_token) == 0.0);
  CHECK(absmax(vit.parameter("heads.head.weight")) == 0.0);
  CHECK(vit.parameter("heads.pre_logits.weight").sizes() == Shape{6, 8});
  CHECK(vit.encoder->pos_embedding.sizes() == Shape{1, 5, 8});
  CHECK(absmax(vit.parameter("encoder.layers.encoder_layer_1.mlp.3.bias")) < 1e-4);
  CHECK(absmax(vit.parameter("encoder.layers.encoder_layer_0.self_attention.in_proj_bias")) == 0.0);
  CHECK(vit.encoder->layers->named_children()[1].first == "encoder_layer_1");
  CHECK(vit.forward(randn({3, 3, 32, 32})).sizes() == Shape{3, 5});
  CHECK(contains(error_of<ShapeError>([&] {
                   vit.forward(randn({1, 3, 48, 48}));
                 }),
                 "[VisionTransformer] wrong image size: expected 32x32, got 48x48"));
  CHECK(contains(error_of<ValueError>([] { vm::VisionTransformer(30, 16, 1, 1, 8, 8); }),
                 "[VisionTransformer] input shape indivisible by patch size"));
  // Built deferred, then materialized: the model's own parameters have reset_parameters.
  std::shared_ptr<vm::VisionTransformer> d;
  {
    nn::DeferredInit deferred;
    d = std::make_shared<vm::VisionTransformer>(16, 8, 1, 2, 8, 8);
  }
  nn::materialize(*d);
  CHECK(absmax(d->class_token) == 0.0);
  CHECK(std_of(d->encoder->pos_embedding) > 0.0);
  CHECK(d->forward(randn({1, 3, 16, 16})).sizes() == Shape{1, 1000});
}

TEST_CASE("torchvision.ops blocks: Conv2dNormActivation, SqueezeExcitation, MLP") {
  vops::Conv2dNormActivation a(3, 8, 5, 2);
  CHECK(a.size() == 3);
  CHECK(a.at<nn::Conv2d>(0)->padding.h == 2);
  CHECK(!a.at<nn::Conv2d>(0)->bias.defined());  // a norm follows: no bias
  vops::Conv2dNormActivation b(3, 8, {3, 5}, 1, std::nullopt, 1, nullptr, nullptr, 2);
  CHECK(b.size() == 1);
  CHECK(b.at<nn::Conv2d>(0)->padding.w == 4);
  CHECK(b.at<nn::Conv2d>(0)->bias.defined());

  vops::SqueezeExcitation se(6, 2);
  std::vector<std::string> names;
  for (const auto& [n, p] : se.named_parameters()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"});
  const Tensor x = randn({2, 6, 4, 4}, TensorOptions(kFloat64));
  se.to(kFloat64);
  const Tensor scale = sigmoid(se.fc2->forward(relu(se.fc1->forward(mean(x, {2, 3}, true)))));
  CHECK(allclose(se.forward(x), mul(x, scale), 1e-12, 1e-12));

  vops::MLP mlp(4, {8, 8, 3}, vops::layer_norm(), vops::activation<nn::ReLU>(), false, true, 0.1);
  CHECK(mlp.size() == 10);  // (Linear, LayerNorm, ReLU, Dropout) x 2, Linear, Dropout
  CHECK(mlp.at<nn::LayerNorm>(5) != nullptr);
  CHECK(contains(error_of<ValueError>([] { vops::MLP(4, {}); }), "[MLP] hidden_channels is empty"));
}

TEST_CASE("stochastic_depth: rows or the batch, scaled survivors, identity in eval") {
  const Tensor x = ones({64, 3, 2});
  CHECK(equal(vops::stochastic_depth(x, 0.5, "row", false), x));
  CHECK(equal(vops::stochastic_depth(x, 0.0, "row", true), x));
  Generator g(7);
  const Tensor y = vops::stochastic_depth(x, 0.25, "row", true, &g);
  int64_t kept = 0;
  for (int64_t i = 0; i < 64; ++i) {
    const Tensor row = y.select(0, i);
    const double v = row.flatten().data<float>()[0];
    CHECK((v == 0.0 || v == doctest::Approx(1.0 / 0.75)));
    CHECK(equal(row, full_like(row, v)));
    kept += v != 0.0;
  }
  CHECK(kept > 32);
  CHECK(kept < 64);
  const Tensor z = vops::stochastic_depth(x, 0.5, "batch", true, &g);
  const double v0 = z.flatten().data<float>()[0];
  CHECK(equal(z, full_like(z, v0)));
  CHECK(equal(vops::stochastic_depth(x, 1.0, "row", true), zeros_like(x)));
  vops::StochasticDepth sd(0.2, "row");
  CHECK(sd.repr() == "StochasticDepth(p=0.2, mode=row)");
  sd.eval();
  CHECK(equal(sd.forward(x), x));
  CHECK(contains(error_of<ValueError>([&] { vops::stochastic_depth(x, 1.5, "row"); }),
                 "[stochastic_depth] drop probability has to be between 0 and 1, but got 1.5"));
  CHECK(contains(error_of<ValueError>([] { vops::StochasticDepth(0.1, "col"); }),
                 "[StochasticDepth] mode has to be either 'batch' or 'row', but got 'col'"));
}
