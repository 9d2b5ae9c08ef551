// accel::vision::models against torchvision 0.14 (tests/vision/models_fixture.*, written by
// make_models_fixture.py; no Python at test time). For each model: the state dict's names, order
// (parameters and buffers apart), shapes and dtypes equal torchvision's exactly, a strict load of
// torchvision's keys works, and with every entry set by the fixture's formula the float64 logits
// equal torchvision's to 1e-10 (relative to the logits' scale). Training-mode cases check
// BatchNorm's batch statistics, its running-statistic update and gradients. The test cases are
// split by family so that meson runs them in parallel (tests/vision/meson.build).
#include <doctest/doctest.h>

#include <cmath>

#include "tests/vision/models_fixture.h"

using namespace accel;
using namespace accel::testing;

namespace {

// max |a - b| / max(1, max |b|): logits run up to ~30 in the fixture.
double scaled_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.sizes() == b.sizes());
  const double scale = std::max(1.0, max(abs(b)).item<double>());
  return max(abs(sub(a, b))).item<double>() / scale;
}

// Builds the spec's model without drawing its initial values (nn::DeferredInit: the formula
// fills every entry), in float64.
std::shared_ptr<nn::Module> deferred_model(const ModelSpec& spec) {
  std::shared_ptr<nn::Module> m;
  {
    nn::DeferredInit deferred;
    m = build_model(spec.builder, spec.kwargs);
  }
  return m;
}

// Names in order, dtypes and shapes of parameters and buffers equal the spec's.
void check_names(const ModelSpec& spec, nn::Module& m) {
  std::vector<const EntrySpec*> params, bufs;
  for (const EntrySpec& e : spec.entries) (e.parameter ? params : bufs).push_back(&e);
  const auto np = m.named_parameters();
  const auto nb = m.named_buffers();
  REQUIRE_MESSAGE(np.size() == params.size(), spec.name, ": ", np.size(),
                  " parameters, torchvision has ", params.size());
  REQUIRE_MESSAGE(nb.size() == bufs.size(), spec.name, ": ", nb.size(),
                  " buffers, torchvision has ", bufs.size());
  int bad = 0;
  auto check = [&](const std::string& name, const Tensor& t, const EntrySpec& e) {
    if (name == e.key && t.sizes() == e.shape && t.dtype() == e.dtype) return;
    if (++bad <= 5)
      FAIL_CHECK(spec.name, ": ", name, " ", t.sizes(), " ", std::string(dtype_name(t.dtype())),
                 " where torchvision has ", e.key, " ", e.shape, " ",
                 std::string(dtype_name(e.dtype)));
  };
  for (size_t i = 0; i < np.size(); ++i) check(np[i].first, np[i].second, *params[i]);
  for (size_t i = 0; i < nb.size(); ++i) check(nb[i].first, nb[i].second, *bufs[i]);
  CHECK_MESSAGE(bad == 0, spec.name, ": ", bad, " entries differ from torchvision's");
}

// The fixture model, checked by name, loaded strictly with the formula's values, in float64.
std::shared_ptr<nn::Module> fixture_model(const ModelSpec& spec) {
  auto m = deferred_model(spec);
  check_names(spec, *m);
  m->to(kFloat64);
  m->load_state_dict(formula_state(spec), /*strict=*/true);
  return m;
}

void check_names_only(const std::string& name) {
  const ModelSpec& spec = model_spec(name);
  CAPTURE(name);
  REQUIRE(spec.mode == "names");
  check_names(spec, *deferred_model(spec));
}

void check_eval(const std::string& name) {
  const ModelSpec& spec = model_spec(name);
  CAPTURE(name);
  REQUIRE(spec.mode == "eval");
  auto m = fixture_model(spec);
  m->eval();
  NoGradGuard no_grad;
  const Tensor logits = m->forward(formula(spec.input, -1));
  const double d = scaled_diff(logits, fixture_tensor(name + ".logits"));
  MESSAGE(name, ": logits differ from torchvision's by ", d, " (relative)");
  CHECK(d < 1e-10);
}

void check_train(const std::string& name, const std::vector<std::string>& grads,
                 const std::vector<std::string>& stats) {
  const ModelSpec& spec = model_spec(name);
  CAPTURE(name);
  REQUIRE(spec.mode == "train");
  auto m = fixture_model(spec);
  m->train();
  Tensor x = formula(spec.input, -1);
  x.requires_grad_();
  const Tensor logits = m->forward(x);
  const double dl = scaled_diff(logits.detach(), fixture_tensor(name + ".logits"));
  MESSAGE(name, ": training-mode logits differ by ", dl);
  CHECK(dl < 1e-10);
  sum(mul(logits, formula(logits.sizes(), -2))).backward();
  const double dx = scaled_diff(x.grad().narrow(0, 0, 1), fixture_tensor(name + ".grad.input"));
  MESSAGE(name, ": input gradient differs by ", dx);
  CHECK(dx < 1e-10);
  for (const std::string& key : grads) {
    CAPTURE(key);
    CHECK(scaled_diff(m->parameter(key).grad(), fixture_tensor(name + ".grad." + key)) < 1e-10);
  }
  const nn::TensorDict sd = m->state_dict();
  for (const std::string& key : stats) {
    CAPTURE(key);
    const Tensor& ref = fixture_tensor(name + ".after." + key);
    if (ref.dtype() == kInt64) {
      CHECK(sd.at(key).item<int64_t>() == ref.item<int64_t>());
    } else {
      CHECK(scaled_diff(sd.at(key), ref) < 1e-12);
    }
  }
}

}  // namespace

TEST_CASE("fixture formula: u(i, k) is the script's, bit for bit") {
  // r(i, 0) = (i W1 + W2) mod P, u = (2 r - P) 2^-31; values computed by hand.
  const Tensor u = formula({3}, 0);
  CHECK(u.data<double>()[0] == double(2 * 1103515245LL - 2147483647LL) * 0x1p-31);
  CHECK(u.data<double>()[1] ==
        double(2 * ((1327217885LL + 1103515245LL) % 2147483647LL) - 2147483647LL) * 0x1p-31);
  CHECK(formula({2}, -1).data<double>()[0] == -2147483647.0 * 0x1p-31);
  // k = -2: (k + 1) W2 is negative, taken mod P as Python's % does.
  CHECK(formula({1}, -2).data<double>()[0] ==
        double(2 * (2147483647LL - 1103515245LL) - 2147483647LL) * 0x1p-31);
}

TEST_CASE("every torchvision model of the fixture has a builder") {
  CHECK(model_specs().size() == 18);
  for (const ModelSpec& s : model_specs()) {
    CAPTURE(s.name);
    CHECK(!s.entries.empty());
  }
}

TEST_CASE("resnet18 / resnet34 against torchvision") {
  check_eval("resnet18");
  check_eval("resnet34");
}
TEST_CASE("resnet50 / resnet101 against torchvision") {
  check_eval("resnet50");
  check_eval("resnet101");
}
// Configurations A and D each run once, one with BatchNorm, one without; the other two
// combinations are checked by name (VGG's classifier alone is 120M parameters).
TEST_CASE("vgg11 / vgg11_bn against torchvision") {
  check_eval("vgg11");
  check_names_only("vgg11_bn");
}
TEST_CASE("vgg16 / vgg16_bn against torchvision") {
  check_names_only("vgg16");
  check_eval("vgg16_bn");
}
TEST_CASE("mobilenet_v2 / mobilenet_v3_small / mobilenet_v3_large against torchvision") {
  check_eval("mobilenet_v2");
  check_eval("mobilenet_v3_small");
  check_eval("mobilenet_v3_large");
}
TEST_CASE("efficientnet_b0 against torchvision") { check_eval("efficientnet_b0"); }
TEST_CASE("vit_b_16 (image_size 32) against torchvision") { check_eval("vit_b_16"); }
TEST_CASE("alexnet / squeezenet1_0 / squeezenet1_1 against torchvision") {
  check_eval("alexnet");
  check_eval("squeezenet1_0");
  check_eval("squeezenet1_1");  // 66x66: every ceil-mode pool rounds up
}

TEST_CASE("resnet18 training step against torchvision: batch statistics, running stats, grads") {
  check_train("resnet18_train",
              {"conv1.weight", "bn1.weight", "layer3.1.bn2.bias", "layer4.0.downsample.1.weight",
               "fc.weight", "fc.bias"},
              {"bn1.running_mean", "bn1.running_var", "layer4.1.bn2.running_var",
               "layer4.1.bn2.num_batches_tracked"});
}

TEST_CASE("mobilenet_v2 training step against torchvision (dropout 0)") {
  check_train("mobilenet_v2_train",
              {"features.0.0.weight", "features.1.conv.0.0.weight", "features.17.conv.1.1.weight",
               "classifier.1.weight"},
              {"features.0.1.running_mean", "features.18.1.running_var"});
}
