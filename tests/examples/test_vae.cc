// examples/vae.h against its PyTorch twin (tests/examples/torch_vae.py, which wrote
// vae_fixture.safetensors): main.py's VAE in float64 from the same initial weights (twin.h), the
// same Fashion-MNIST batches and reparameterisation noise, Adam steps; every step's loss and the
// final weights agree to 1e-10.
#include <doctest.h>

#include <cmath>
#include <string>

#include "accel.h"
#include "examples/vae.h"
#include "tests/examples/twin.h"

using namespace accel;
using namespace accel::examples;

TEST_CASE("vae: Adam steps on BCE + KLD match PyTorch's main.py") {
  const twin::Fixture fx("vae_fixture.safetensors");
  const int64_t steps = std::stoll(fx.meta("steps")), B = std::stoll(fx.meta("batch"));

  vae::VAE model;
  twin::det_init(model);
  CHECK(twin::checksum(model) ==
        doctest::Approx(std::stod(fx.meta("init_checksum"))).epsilon(1e-12));
  optim::Adam optimizer(model.parameters(), optim::AdamOptions{});
  for (int64_t s = 0; s < steps; ++s) {
    const Tensor data = div(fx["images"].narrow(0, s * B, B).to(kFloat64), 255.0);  // ToTensor()
    const double loss = vae::train_step(model, optimizer, data, fx["eps"][s]);
    const double want = fx.at("losses", s);
    INFO("step ", s, ": ours ", loss, ", torch ", want);
    CHECK(std::abs(loss - want) <= 1e-10 * std::max(1.0, std::abs(want)));
  }
  const double want = std::stod(fx.meta("final_checksum"));
  CHECK(std::abs(twin::checksum(model) - want) <= 1e-10 * std::abs(want));
}

TEST_CASE("vae: shapes, the noise path and the loss's two terms") {
  manual_seed(3);
  vae::VAE model;
  const Tensor x = rand({4, 1, 28, 28});
  auto [recon, mu, logvar] = model.forward3(x);
  CHECK(recon.sizes() == Shape{4, 784});
  CHECK(mu.sizes() == Shape{4, 20});
  CHECK(logvar.sizes() == Shape{4, 20});
  CHECK(min(recon).item() > 0);
  CHECK(max(recon).item() < 1);
  // Without given noise, two passes sample different z; with it, the same.
  CHECK(max(abs(sub(model.forward(x), model.forward(x)))).item() > 0);
  const Tensor eps = randn({4, 20});
  CHECK(max(abs(sub(std::get<0>(model.forward3(x, eps)), std::get<0>(model.forward3(x, eps)))))
            .item() == 0);
  // mu = 0, logvar = 0: the KL term vanishes and the loss is the BCE alone.
  const Tensor zeros = zeros_like(mu);
  const Tensor bce = binary_cross_entropy(recon, x.reshape({-1, 784}), Tensor(), Reduction::Sum);
  CHECK(vae::loss_function(recon, x, zeros, zeros).item() == doctest::Approx(bce.item()));
  // mu = 1, logvar = 0: KL = 0.5 * sum(mu^2) = 0.5 per element.
  CHECK(vae::loss_function(recon, x, add(zeros, 1.0), zeros).item() ==
        doctest::Approx(bce.item() + 0.5 * 4 * 20));
}
