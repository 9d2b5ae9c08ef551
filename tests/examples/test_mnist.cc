// examples/mnist.h against its PyTorch twin (tests/examples/torch_mnist.py, which wrote
// mnist_fixture.safetensors): the same Net in float64 from the same initial weights (twin.h),
// dropout off, the same Fashion-MNIST batches through mnist::normalize, Adadelta and StepLR
// stepped as main.py does; every step's loss and the final weights agree to 1e-10.
#include <doctest.h>

#include <cmath>
#include <string>

#include "accel.h"
#include "examples/mnist.h"
#include "tests/examples/twin.h"

using namespace accel;
using namespace accel::examples;

TEST_CASE("mnist: Adadelta + StepLR steps match PyTorch's main.py") {
  const twin::Fixture fx("mnist_fixture.safetensors");
  const int64_t steps = std::stoll(fx.meta("steps")), B = std::stoll(fx.meta("batch"));
  const int64_t epoch_steps = std::stoll(fx.meta("epoch_steps"));

  mnist::Net model;
  twin::det_init(model);
  model.dropout1->p = model.dropout2->p = 0.0;
  CHECK(twin::checksum(model) ==
        doctest::Approx(std::stod(fx.meta("init_checksum"))).epsilon(1e-12));
  optim::Adadelta optimizer(model.parameters(), optim::AdadeltaOptions{});
  optim::StepLR scheduler(optimizer, 1, 0.7);
  for (int64_t s = 0; s < steps; ++s) {
    const Tensor x = mnist::normalize(fx["images"].narrow(0, s * B, B), kFloat64);
    const Tensor y = fx["labels"].narrow(0, s * B, B);
    const double loss = mnist::train_step(model, optimizer, x, y);
    const double want = fx.at("losses", s);
    INFO("step ", s, ": ours ", loss, ", torch ", want);
    CHECK(std::abs(loss - want) <= 1e-10 * std::max(1.0, std::abs(want)));
    if ((s + 1) % epoch_steps == 0) scheduler.step();
  }
  CHECK(optimizer.lr() == doctest::Approx(0.49).epsilon(1e-12));
  const double want = std::stod(fx.meta("final_checksum"));
  CHECK(std::abs(twin::checksum(model) - want) <= 1e-10 * std::abs(want));
}

TEST_CASE("mnist: shapes and normalisation") {
  manual_seed(0);
  mnist::Net model;
  CHECK(model.num_parameters() == 1199882);  // main.py's Net
  const Tensor out = model.forward(randn({2, 1, 28, 28}));
  CHECK(out.sizes() == Shape{2, 10});
  // log_softmax rows: exp sums to 1
  CHECK(sum(exp(out), {1}).sub(1.0).abs().max().item() < 1e-5);
  const Tensor px = tensor(std::vector<int64_t>{0, 255}, {2}).to(kUInt8);
  const Tensor n = mnist::normalize(px, kFloat64);
  CHECK(n[0].item() == doctest::Approx(-mnist::kMean / mnist::kStd));
  CHECK(n[1].item() == doctest::Approx((1 - mnist::kMean) / mnist::kStd));
  CHECK_THROWS_AS(model.forward(randn({2, 1, 27, 27})), ShapeError);
}
