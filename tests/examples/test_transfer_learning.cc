// examples/transfer_learning.h against its PyTorch twin (tests/examples/torch_transfer_learning.py,
// which wrote transfer_learning_resnet18.pth with torch.save and transfer_learning_fixture.
// safetensors): the .pth read by io::read_pt into torchvision's resnet18 (strict), fc removed and
// frozen, a new Linear(512, 2) head from the same initial weights (twin.h) trained in float64 with
// Adam on the same images in the same order; every step's loss, every epoch's accuracy and test
// figures and the final head agree to 1e-10, and the backbone does not move. Then the same with
// every parameter trained (--finetune-all), and the loader's and the model's error paths.
#include <doctest.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "accel.h"
#include "examples/transfer_learning.h"
#include "tests/examples/twin.h"

using namespace accel;
using namespace accel::examples;
namespace tl = accel::examples::transfer_learning;

namespace {

bool close(double got, double want, double tol = 1e-10) {
  return std::abs(got - want) <= tol * std::max(1.0, std::abs(want));
}

// The twin's images: imagenet_folder/train through the example's transform, in float64.
std::pair<Tensor, Tensor> fixture_images(int64_t size) {
  const data::ImageFolder folder(twin::fixture_path("imagenet_folder") + "/train",
                                 tl::transform(size, kFloat64));
  std::vector<Tensor> xs, ys;
  for (int64_t i = 0; i < folder.size(); ++i) {
    const data::Example e = folder.get(i);
    xs.push_back(e["image"]);
    ys.push_back(e["label"]);
  }
  return {stack(xs), stack(ys)};
}

std::shared_ptr<tl::TransferNet> fixture_model(bool finetune_all) {
  auto model = std::make_shared<tl::TransferNet>(
      tl::load_backbone(tl::read_state_dict(twin::fixture_path("transfer_learning_resnet18.pth"))),
      2, finetune_all);
  model->to(kFloat64);
  twin::det_init(*model->lin);
  return model;
}

double buffers_checksum(nn::Module& m) {
  double s = 0;
  for (const auto& [name, b] : m.named_buffers())
    if (b.is_floating_point()) s += sum(b).item() + sum(b * b).item();
  return s;
}

}  // namespace

TEST_CASE("transfer_learning: the frozen resnet18 and its new head match PyTorch") {
  const twin::Fixture fx("transfer_learning_fixture.safetensors");
  const int64_t epochs = std::stoll(fx.meta("epochs")), B = std::stoll(fx.meta("batch"));
  const auto [images, labels] = fixture_images(std::stoll(fx.meta("size")));
  const int64_t n = labels.size(0);
  auto model = fixture_model(false);
  const double backbone = twin::checksum(*model->net);
  CHECK(close(backbone, std::stod(fx.meta("backbone_checksum")), 1e-12));
  for (const Tensor& p : model->net->parameters()) CHECK_FALSE(p.requires_grad());
  const double buffers = buffers_checksum(*model->net);
  optim::Adam optimizer(model->trainable_parameters(), {.lr = std::stod(fx.meta("lr"))});
  CHECK(model->trainable_parameters().size() == 2);

  int64_t step = 0;
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    model->train();
    CHECK_FALSE(model->net->is_training());  // frozen: BatchNorm keeps its statistics
    const Tensor order = fx["orders"][epoch];
    int64_t correct = 0;
    for (int64_t s = 0; s < n; s += B, ++step) {
      const Tensor idx = order.narrow(0, s, B);
      const tl::StepResult r = tl::train_step(*model, optimizer, index_select(images, 0, idx),
                                              index_select(labels, 0, idx));
      INFO("step ", step, ": ours ", r.loss, ", torch ", fx.at("losses", step));
      CHECK(close(r.loss, fx.at("losses", step)));
      correct += r.correct;
    }
    CHECK(double(correct) / double(n) == fx.at("accuracy", epoch));
    model->eval();
    double loss = 0, hits = 0;
    for (int64_t s = 0; s < n; s += B) {
      const tl::TestRows rows =
          tl::test_rows(*model, images.narrow(0, s, B), labels.narrow(0, s, B));
      loss += sum(rows.loss).item();
      hits += sum(rows.hit).item();
    }
    CHECK(close(loss / double(n), fx["test"][epoch][0].item()));
    CHECK(hits / double(n) == fx["test"][epoch][1].item());
  }
  const Tensor dw = (model->lin->weight - fx["lin_weight"]).abs().max();
  const Tensor db = (model->lin->bias - fx["lin_bias"]).abs().max();
  CHECK(dw.item() <= 1e-10 * std::max(1.0, fx["lin_weight"].abs().max().item()));
  CHECK(db.item() <= 1e-10 * std::max(1.0, fx["lin_bias"].abs().max().item()));
  // the backbone did not move: parameters, running statistics, no gradients
  CHECK(twin::checksum(*model->net) == backbone);
  CHECK(buffers_checksum(*model->net) == buffers);
  for (const Tensor& p : model->net->parameters()) CHECK_FALSE(p.grad().defined());
}

TEST_CASE("transfer_learning: --finetune-all trains every parameter as PyTorch does") {
  const twin::Fixture fx("transfer_learning_fixture.safetensors");
  const int64_t B = std::stoll(fx.meta("batch")), steps = std::stoll(fx.meta("steps_all"));
  const auto [images, labels] = fixture_images(std::stoll(fx.meta("size")));
  auto model = fixture_model(true);
  model->train();
  CHECK(model->net->is_training());
  optim::Adam optimizer(model->trainable_parameters(), {.lr = std::stod(fx.meta("lr"))});
  CHECK(model->trainable_parameters().size() == model->parameters().size());
  for (int64_t s = 0; s < steps; ++s) {
    const Tensor idx = fx["order_all"].narrow(0, s * B, B);
    const tl::StepResult r = tl::train_step(*model, optimizer, index_select(images, 0, idx),
                                            index_select(labels, 0, idx));
    INFO("step ", s, ": ours ", r.loss, ", torch ", fx.at("losses_all", s));
    CHECK(close(r.loss, fx.at("losses_all", s)));
  }
  CHECK(close(twin::checksum(*model->net) + twin::checksum(*model->lin),
              std::stod(fx.meta("checksum_all"))));
}

TEST_CASE("transfer_learning: state-dict files, the saved model and errors") {
  const auto dir = std::filesystem::temp_directory_path() / "accel_test_transfer_learning";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string pth = twin::fixture_path("transfer_learning_resnet18.pth");
  const nn::TensorDict sd = tl::read_state_dict(pth);
  CHECK(sd.size() == 122);  // torchvision resnet18: 62 parameters, 60 buffers
  // a training checkpoint holding it (the imagenet example's), and safetensors
  io::save_pt((dir / "ckpt.pth.tar").string(),
              io::PtValue::dict({{"epoch", int64_t(3)}, {"state_dict", io::to_pt_value(sd)}}));
  nn::save_safetensors((dir / "sd.safetensors").string(), sd);
  for (const std::string f : {"ckpt.pth.tar", "sd.safetensors"}) {
    const nn::TensorDict again = tl::read_state_dict((dir / f).string());
    REQUIRE(again.size() == sd.size());
    for (const auto& [k, v] : sd) CHECK_MESSAGE(equal(again.at(k), v), f, " ", k);
  }

  manual_seed(0);
  tl::TransferNet model(tl::load_backbone(sd), 3);
  CHECK(model.lin->weight.sizes() == Shape{3, 512});
  const Tensor x = randn({2, 3, 32, 32});
  CHECK(model.forward(x).sizes() == Shape{2, 3});
  // the whole model as torchvision's resnet18(num_classes=3) state dict
  auto ref = vision::models::resnet18({.num_classes = 3});
  ref->load_state_dict(model.torchvision_state_dict());  // strict: the same keys and shapes
  ref->eval();
  model.eval();
  CHECK(allclose(ref->forward(x), model.forward(x), 1e-5, 1e-6));

  // frozen: one Adam step changes lin only
  const double before = twin::checksum(*model.net);
  optim::Adam opt(model.trainable_parameters(), {.lr = 1e-3});
  tl::train_step(model, opt, x, tensor(std::vector<int64_t>{0, 2}, {2}));
  CHECK(twin::checksum(*model.net) == before);

  // errors: not a resnet18, a missing or truncated file
  nn::TensorDict bad = sd;
  bad.erase("layer4.1.bn2.running_var");
  CHECK_THROWS_AS(tl::load_backbone(bad), ValueError);
  bad = sd;
  bad.erase("fc.weight");
  CHECK_THROWS_WITH_AS(
      tl::load_backbone(bad),
      doctest::Contains("[transfer_learning] the state dict has no resnet18 fc.weight"),
      ValueError);
  CHECK_THROWS_AS(tl::load_backbone(nn::Linear(4, 2).state_dict()), ValueError);
  CHECK_THROWS_AS(tl::read_state_dict((dir / "missing.pth").string()), IoError);
  io::save_pt((dir / "list.pth").string(), io::PtValue::list({int64_t(1), int64_t(2)}));
  CHECK_THROWS_AS(tl::read_state_dict((dir / "list.pth").string()), ValueError);
  CHECK(tl::transform(24)(data::ImageFolder(twin::fixture_path("imagenet_folder") + "/val").load(0))
            .sizes() == Shape{3, 24, 24});
  std::filesystem::remove_all(dir);
}
