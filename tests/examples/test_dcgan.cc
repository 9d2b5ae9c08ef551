// examples/dcgan.h against its PyTorch twin (tests/examples/torch_dcgan.py, which wrote
// dcgan_fixture.safetensors): main.py's Generator and Discriminator (nz 8, ngf = ndf = 4) in
// float64 from the same initial weights (twin.h), the same Fashion-MNIST batches through
// dcgan::to_dcgan_images and the same noise, main.py's iteration (D on real and detached fake, G
// through D, BCELoss, Adam(2e-4, (0.5, 0.999))); every iteration's errD, errG, D(x), D(G(z))
// and the final weights agree to 1e-10. Then the shapes and weights_init.
#include <doctest.h>

#include <cmath>
#include <string>

#include "accel.h"
#include "examples/dcgan.h"
#include "tests/examples/twin.h"

using namespace accel;
using namespace accel::examples;

TEST_CASE("dcgan: training iterations match PyTorch's main.py") {
  const twin::Fixture fx("dcgan_fixture.safetensors");
  auto meta = [&](const char* k) { return std::stoll(fx.meta(k)); };
  const int64_t steps = meta("steps"), B = meta("batch");
  dcgan::Generator netG(meta("nz"), meta("ngf"), 1);
  dcgan::Discriminator netD(meta("ndf"), 1);
  twin::det_init(netG);
  twin::det_init(netD);
  CHECK(twin::checksum(netG) ==
        doctest::Approx(std::stod(fx.meta("init_checksum_g"))).epsilon(1e-12));
  CHECK(twin::checksum(netD) ==
        doctest::Approx(std::stod(fx.meta("init_checksum_d"))).epsilon(1e-12));
  optim::AdamOptions ao;
  ao.lr(0.0002);
  ao.betas({0.5, 0.999});
  optim::Adam optimizerD(netD.parameters(), ao), optimizerG(netG.parameters(), ao);
  const char* names[] = {"errD", "errG", "D_x", "D_G_z1", "D_G_z2"};
  for (int64_t s = 0; s < steps; ++s) {
    const Tensor real =
        dcgan::to_dcgan_images(div(fx["images"].narrow(0, s * B, B).to(kFloat64), 255.0));
    REQUIRE(real.sizes() == Shape{B, 1, 64, 64});
    const dcgan::StepResult r =
        dcgan::train_step(netG, netD, optimizerG, optimizerD, real, fx["noise"][s]);
    const double got[] = {r.errD, r.errG, r.D_x, r.D_G_z1, r.D_G_z2};
    for (int k = 0; k < 5; ++k) {
      const double want = fx["results"][s][k].item();
      INFO("iteration ", s, " ", names[k], ": ours ", got[k], ", torch ", want);
      CHECK(std::abs(got[k] - want) <= 1e-10 * std::max(1.0, std::abs(want)));
    }
  }
  for (auto [net, key] : {std::pair<nn::Module*, const char*>{&netG, "final_checksum_g"},
                          {&netD, "final_checksum_d"}}) {
    const double want = std::stod(fx.meta(key));
    INFO(key);
    CHECK(std::abs(twin::checksum(*net) - want) <= 1e-10 * std::abs(want));
  }
}

TEST_CASE("dcgan: shapes and weights_init") {
  manual_seed(7);
  dcgan::Generator netG(100, 8, 1);
  dcgan::Discriminator netD(8, 1);
  netG.apply(dcgan::weights_init);
  netD.apply(dcgan::weights_init);
  const Tensor fake = netG.forward(randn({2, 100, 1, 1}));
  CHECK(fake.sizes() == Shape{2, 1, 64, 64});
  CHECK(max(abs(fake)).item() <= 1.0);  // tanh
  const Tensor p = netD.forward(fake);
  CHECK(p.sizes() == Shape{2});
  // Conv weights N(0, 0.02), BatchNorm weights N(1, 0.02) and biases 0.
  const Tensor w = netG.main->at<nn::ConvTranspose2d>(3)->weight;  // (64, 32, 4, 4)
  CHECK(std::abs(mean(w).item()) < 0.002);
  CHECK(std_dev(w).item() == doctest::Approx(0.02).epsilon(0.05));
  const auto bn = netD.main->at<nn::BatchNorm2d>(3);
  CHECK(std::abs(mean(bn->weight).item() - 1.0) < 0.02);
  CHECK(max(abs(bn->bias)).item() == 0.0);
  // Fashion-MNIST pixels in [0, 1] -> 64x64 in [-1, 1].
  const Tensor img = dcgan::to_dcgan_images(rand({3, 1, 28, 28}));
  CHECK(img.sizes() == Shape{3, 1, 64, 64});
  CHECK(min(img).item() >= -1.0);
  CHECK(max(img).item() <= 1.0);
}
