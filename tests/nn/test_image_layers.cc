// Image-model layers against PyTorch: outputs and every gradient in float64 to 1e-10,
// from the fixture tests/nn/image_layers_fixture.safetensors written by
// make_image_layers_fixture.py with python3-torch (no Python at test time); PyTorch's parameter
// names load unchanged. Also parameter shapes and initialisation, running statistics, Dropout2d,
// and the errors of bad arguments.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <map>
#include <sstream>

#include "accel.h"
#include "tests/common/check.h"
#include "tests/common/tensors.h"

using namespace accel;
using accel::test::close_to;
using accel::test::leaf;

namespace {

struct Fixture {
  io::TensorDict t;
  std::vector<std::string> cases;
  Fixture() {
    io::Metadata meta;
    t = io::load_safetensors(
        std::string(ACCEL_SOURCE_ROOT) + "/tests/nn/image_layers_fixture.safetensors", &meta);
    std::stringstream all(meta.at("cases"));
    std::string name;
    while (std::getline(all, name, ';')) cases.push_back(name);
  }
  const Tensor& at(const std::string& k) const {
    auto it = t.find(k);
    REQUIRE_MESSAGE(it != t.end(), "fixture lacks ", k);
    return it->second;
  }
  // name.weight / name.bias: the module's PyTorch state_dict.
  io::TensorDict state(const std::string& name) const {
    io::TensorDict sd;
    for (const char* p : {"weight", "bias"}) {
      auto it = t.find(name + "." + p);
      if (it != t.end()) sd[p] = it->second;
    }
    return sd;
  }
};

const Fixture& fixture() {
  static Fixture f;
  return f;
}

using Fwd = std::function<Tensor(nn::Module&, const Tensor&)>;
struct Case {
  std::function<std::shared_ptr<nn::Module>()> make;
  Fwd fwd;  // empty: m.forward(x)
};

template <typename M, typename... A>
std::function<std::shared_ptr<nn::Module>()> mk(A... a) {
  return [=] { return std::make_shared<M>(a...); };
}

// The modules of make_image_layers_fixture.py, built with the same arguments.
std::map<std::string, Case> cases() {
  using nn::Size2;
  std::map<std::string, Case> c;
  c["ct_s2_p1_op1"] = {mk<nn::ConvTranspose2d>(3, 4, Size2(3), Size2(2), Size2(1), Size2(1)), {}};
  c["ct_g2_d21"] = {mk<nn::ConvTranspose2d>(4, 6, Size2(2, 3), Size2(1, 2), Size2(0, 1),
                                            Size2(0, 1), 2, true, Size2(2, 1)),
                    {}};
  c["ct_s3_p2_op2_nobias"] = {
      mk<nn::ConvTranspose2d>(2, 3, Size2(4), Size2(3), Size2(2), Size2(2), 1, false), {}};
  c["ct_dcgan"] = {mk<nn::ConvTranspose2d>(5, 3, Size2(4), Size2(2), Size2(1), Size2(0), 1, false),
                   {}};
  c["ct_output_size"] = {mk<nn::ConvTranspose2d>(3, 2, Size2(3), Size2(2), Size2(1)),
                         [](nn::Module& m, const Tensor& x) {
                           return dynamic_cast<nn::ConvTranspose2d&>(m).forward(x, {8, 10});
                         }};
  c["ct_op2_dil3"] = {
      mk<nn::ConvTranspose2d>(2, 3, Size2(2), Size2(1), Size2(0), Size2(2, 1), 1, true, Size2(3)),
      {}};
  c["ct_unbatched"] = {mk<nn::ConvTranspose2d>(2, 2, Size2(2), Size2(2)), {}};
  c["c1_s2_p1"] = {mk<nn::Conv1d>(3, 4, 3, 2, 1), {}};
  c["c1_g2_d2_nobias"] = {mk<nn::Conv1d>(4, 6, 2, 1, 0, 2, 2, false), {}};
  c["ct1_s2_p1_op1"] = {mk<nn::ConvTranspose1d>(3, 2, 3, 2, 1, 1), {}};
  c["gn_2_4"] = {mk<nn::GroupNorm>(2, 4), {}};
  c["gn_3_6_noaffine"] = {mk<nn::GroupNorm>(3, 6, 1e-3, false), {}};
  c["gn_1_3_large_mean"] = {mk<nn::GroupNorm>(1, 3),
                            [](nn::Module& m, const Tensor& x) { return m.forward(x + 10.0); }};
  c["in_affine"] = {mk<nn::InstanceNorm2d>(3, 1e-5, 0.1, true), {}};
  c["in_track"] = {mk<nn::InstanceNorm2d>(3, 1e-5, 0.2, false, true), {}};
  c["aap_3x4"] = {mk<nn::AdaptiveAvgPool2d>(Size2(3, 4)), {}};
  c["aap_2x3_even"] = {mk<nn::AdaptiveAvgPool2d>(Size2(2, 3)), {}};
  c["amp_3x4"] = {mk<nn::AdaptiveMaxPool2d>(Size2(3, 4), true), {}};
  c["amp_1x1"] = {mk<nn::AdaptiveMaxPool2d>(Size2(1), true), {}};
  c["up_bilinear_size"] = {mk<nn::Upsample>(Shape{5, 7}, std::vector<double>{}, "bilinear", false),
                           {}};
  c["up_bilinear_ac_scale"] = {
      mk<nn::Upsample>(Shape{}, std::vector<double>{1.5, 0.5}, "bilinear", true), {}};
  c["up_bilinear_scale2"] = {mk<nn::Upsample>(Shape{}, std::vector<double>{2.0}, "bilinear"), {}};
  c["up_bilinear_down"] = {mk<nn::Upsample>(Shape{3, 2}, std::vector<double>{}, "bilinear"), {}};
  c["up_nearest_size"] = {mk<nn::Upsample>(Shape{7, 3}), {}};
  c["up_nearest_scale"] = {mk<nn::Upsample>(Shape{}, std::vector<double>{1.7}), {}};
  c["pad_reflect"] = {mk<nn::ReflectionPad2d>(nn::Pad4(2, 1, 1, 3)), {}};
  c["pad_replicate"] = {mk<nn::ReplicationPad2d>(nn::Pad4(2, 3, 1, 0)), {}};
  c["pad_zero"] = {mk<nn::ZeroPad2d>(nn::Pad4(1, 0, 2, 1)), {}};
  c["pad_constant_crop"] = {mk<nn::ConstantPad2d>(nn::Pad4(1, 2, -1, 1), 0.5), {}};
  c["pad_circular"] = {mk<nn::Identity>(), [](nn::Module&, const Tensor& x) {
                         return pad(x, {1, 2, 2, 1}, "circular");
                       }};
  c["pixel_shuffle"] = {mk<nn::PixelShuffle>(2), {}};
  c["pixel_unshuffle"] = {mk<nn::PixelUnshuffle>(2), {}};
  c["leaky_relu"] = {mk<nn::LeakyReLU>(0.2), {}};
  c["elu"] = {mk<nn::ELU>(1.5), {}};
  c["softmax"] = {mk<nn::Softmax>(1), {}};
  c["log_softmax"] = {mk<nn::LogSoftmax>(-1), {}};
  return c;
}

}  // namespace

TEST_CASE("image layers match PyTorch: outputs and input / parameter gradients (float64)") {
  const Fixture& fx = fixture();
  const std::map<std::string, Case> all = cases();
  CHECK(fx.cases.size() == all.size());
  for (const std::string& name : fx.cases) {
    INFO("case ", name);
    auto it = all.find(name);
    REQUIRE_MESSAGE(it != all.end(), "no module for fixture case ", name);
    std::shared_ptr<nn::Module> m = it->second.make();
    m->to(kFloat64);
    // Strict: PyTorch's names and shapes. A module without parameters (its buffers start as
    // torch's) loads nothing.
    const io::TensorDict sd = fx.state(name);
    if (!sd.empty()) m->load_state_dict(sd);
    Tensor x = leaf(fx.at(name + ".input"));
    Tensor y;
    if (name.rfind("amp_", 0) == 0) {
      auto [v, idx] = dynamic_cast<nn::AdaptiveMaxPool2d&>(*m).forward_with_indices(x);
      CHECK(equal(idx, fx.at(name + ".indices")));
      y = v;
    } else {
      y = it->second.fwd ? it->second.fwd(*m, x) : m->forward(x);
    }
    CHECK(close_to(y, fx.at(name + ".out"), 1e-10));
    sum(y * fx.at(name + ".w_out")).backward();
    CHECK(close_to(x.grad(), fx.at(name + ".grad.input"), 1e-10));
    for (const auto& [pname, p] : m->named_parameters()) {
      INFO(name, ".", pname);
      CHECK(close_to(p.grad(), fx.at(name + ".grad." + pname), 1e-10));
    }
    if (name == "in_track") {
      auto& in = dynamic_cast<nn::InstanceNorm2d&>(*m);
      CHECK(close_to(in.running_mean, fx.at(name + ".running_mean"), 1e-10));
      CHECK(close_to(in.running_var, fx.at(name + ".running_var"), 1e-10));
      CHECK(in.num_batches_tracked.item<int64_t>() == 1);
      in.eval();
      CHECK(close_to(in.forward(fx.at(name + ".input2")), fx.at(name + ".out_eval"), 1e-10));
    }
  }
}

TEST_CASE("ConvTranspose2d / Conv1d / ConvTranspose1d: parameter shapes and torch's init bounds") {
  manual_seed(3);
  nn::ConvTranspose2d ct(4, 6, nn::Size2(3, 2), 2, 1, 1, 2);
  CHECK(ct.weight.sizes() == Shape{4, 3, 3, 2});  // (C_in, C_out / groups, kH, kW)
  CHECK(ct.bias.sizes() == Shape{6});
  // fan_in = weight.size(1) kH kW = 3 * 6 = 18: both bounds 1 / sqrt(18).
  const double bound = 1.0 / std::sqrt(18.0);
  CHECK(max(abs(ct.weight)).item<double>() <= bound);
  CHECK(max(abs(ct.bias)).item<double>() <= bound);
  CHECK(max(abs(ct.weight)).item<double>() > 0.8 * bound);
  auto names = ct.named_parameters();
  CHECK(names.size() == 2);
  CHECK(names[0].first == "weight");
  CHECK(names[1].first == "bias");
  const Tensor y = ct.forward(randn({2, 4, 5, 4}));
  CHECK(y.sizes() == Shape{2, 6, 10, 7});  // (5 - 1) 2 - 2 + 2 + 1 + 1, (4 - 1) 2 - 2 + 1 + 1 + 1
  nn::Conv1d c1(4, 6, 3, 1, 0, 1, 2, false);
  CHECK(c1.weight.sizes() == Shape{6, 2, 3});
  CHECK(!c1.bias.defined());
  nn::ConvTranspose1d ct1(4, 6, 3);
  CHECK(ct1.weight.sizes() == Shape{4, 6, 3});
  CHECK(ct1.forward(randn({4, 5})).sizes() == Shape{6, 7});  // unbatched
  CHECK(ct.extra_repr() ==
        "4, 6, kernel_size=(3, 2), stride=(2, 2), padding=(1, 1), output_padding=(1, 1), groups=2");
}

TEST_CASE("InstanceNorm2d: no running statistics by default; eval uses them when tracked") {
  nn::InstanceNorm2d plain(3);
  CHECK(plain.named_parameters().empty());
  CHECK(plain.named_buffers().empty());
  Tensor x = randn({2, 3, 4, 4}, TensorOptions(kFloat64));
  plain.eval();  // not tracking: instance statistics in evaluation too
  CHECK(close_to(plain.forward(x), group_norm(x, 3), 1e-10));
  nn::InstanceNorm2d tracked(3, 1e-5, 0.1, false, true);
  tracked.to(kFloat64);
  tracked.eval();  // running mean 0, var 1: y = x / sqrt(1 + eps)
  CHECK(close_to(tracked.forward(x), x / std::sqrt(1 + 1e-5), 1e-10));
  CHECK(tracked.num_batches_tracked.item<int64_t>() == 0);
}

TEST_CASE("Dropout2d zeroes whole channels and scales the rest; identity in eval") {
  Generator g(5);
  nn::Dropout2d d(0.5, &g);
  const Tensor x = ones({8, 16, 3, 3});
  const Tensor y = d.forward(x);
  int kept = 0;
  for (int64_t n = 0; n < 8; ++n) {
    for (int64_t c = 0; c < 16; ++c) {
      const Tensor plane = y.select(0, n).select(0, c);
      const double lo = min(plane).item<double>(), hi = max(plane).item<double>();
      CHECK(lo == hi);  // the whole channel shares one mask value
      CHECK((lo == 0.0 || lo == 2.0));
      kept += lo == 2.0;
    }
  }
  CHECK(kept > 32);  // 128 channels at p = 0.5: far from all or none
  CHECK(kept < 96);
  d.eval();
  CHECK(equal(d.forward(x), x));
}

TEST_CASE("image ops: bad arguments name the op and the shapes") {
  const Tensor x = randn({1, 4, 5, 5});
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(message([&] {
          conv_transpose2d(x, randn({3, 2, 3, 3}));
        }).find("[conv_transpose2d]") != std::string::npos);
  CHECK_THROWS_AS(conv_transpose2d(x, randn({4, 2, 3, 3}), Tensor(), {1, 1}, {0, 0}, {1, 1}),
                  ValueError);  // output_padding 1 not below stride 1 or dilation 1
  CHECK_THROWS_AS(nn::ConvTranspose2d(4, 2, 3, 2, 0, 2), ValueError);
  CHECK_THROWS_AS(nn::ConvTranspose2d(4, 3, 3, 1, 0, 0, 2), ValueError);  // 3 % groups 2
  CHECK_THROWS_AS(group_norm(x, 3), ValueError);
  CHECK(message([&] { group_norm(x, 3); }).find("[group_norm]") != std::string::npos);
  CHECK_THROWS_AS(group_norm(x, 2, randn({3})), ShapeError);
  CHECK_THROWS_AS(pad(x, {5, 0}, "reflect"), ValueError);  // pad >= size 5
  CHECK_THROWS_AS(pad(x, {1, 1}, "mirror"), ValueError);
  CHECK_THROWS_AS(pad(x, {1}, "constant"), ValueError);
  CHECK_THROWS_AS(interpolate(x, {3, 3}, {2.0}), ValueError);  // both size and scale
  CHECK_THROWS_AS(interpolate(x, {3, 3}, {}, "bicubic"), ValueError);
  CHECK_THROWS_AS(interpolate(x, {3, 3}, {}, "nearest", true), ValueError);
  CHECK_THROWS_AS(adaptive_avg_pool2d(x, {0, 2}), ValueError);
  CHECK_THROWS_AS(adaptive_max_pool2d(randn({5, 5}), {2, 2}), ShapeError);
  CHECK_THROWS_AS(pixel_shuffle(x, 3), ShapeError);  // 4 channels not divisible by 9
  CHECK_THROWS_AS(nn::ConvTranspose2d(4, 2, 3, 2).forward(x, {20, 20}), ValueError);
  CHECK_THROWS_AS(nn::GroupNorm(3, 4), ValueError);
  CHECK_THROWS_AS(dropout2d(randn({4, 5}), 0.5), ShapeError);
}
