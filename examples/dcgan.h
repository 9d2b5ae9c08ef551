// pytorch/examples dcgan/main.py, ported: the DCGAN generator and discriminator of Radford et
// al. for 64x64 images, their initialisation and one training iteration, callable from the
// program (examples/dcgan.cc) and from its PyTorch twin test (tests/examples/test_dcgan.cc).
//
//   Generator     z (B, nz, 1, 1) -> ConvTranspose2d 4x4 stride 1 (4x4), then four ConvTranspose2d
//                 4x4 stride 2 pad 1 (8, 16, 32, 64), BatchNorm2d + ReLU between, Tanh at the end
//                 -> (B, nc, 64, 64); channels ngf*8, ngf*4, ngf*2, ngf, nc
//   Discriminator x (B, nc, 64, 64) -> four Conv2d 4x4 stride 2 pad 1 (32, 16, 8, 4) with
//                 LeakyReLU(0.2) (BatchNorm2d from the second), Conv2d 4x4 -> 1x1, Sigmoid -> (B)
//   step: D on real (label 1) and on G(noise) detached (label 0), Adam step; G through D with
//         label 1, Adam step; BCELoss. Adam(lr 2e-4, betas (0.5, 0.999)) for both.
#pragma once

#include <memory>

#include "accel.h"

namespace accel::examples::dcgan {

// weights_init: Conv* weights N(0, 0.02); BatchNorm weights N(1, 0.02), biases 0.
inline void weights_init(nn::Module& m) {
  if (auto* c = dynamic_cast<nn::Conv2d*>(&m)) {
    nn::init::normal_(c->weight, 0.0, 0.02);
  } else if (auto* t = dynamic_cast<nn::ConvTranspose2d*>(&m)) {
    nn::init::normal_(t->weight, 0.0, 0.02);
  } else if (auto* b = dynamic_cast<nn::BatchNorm2d*>(&m)) {
    nn::init::normal_(b->weight, 1.0, 0.02);
    nn::init::zeros_(b->bias);
  }
}

class Generator : public nn::Module {
 public:
  Generator(int64_t nz, int64_t ngf, int64_t nc) {
    using nn::BatchNorm2d, nn::ConvTranspose2d, nn::ReLU;
    auto convt = [](int64_t in, int64_t out, int64_t stride, int64_t pad) {
      return std::make_shared<ConvTranspose2d>(in, out, 4, stride, pad, 0, 1, /*bias=*/false);
    };
    main = register_module(
        "main",
        std::make_shared<nn::Sequential>(
            // input is Z, going into a convolution
            convt(nz, ngf * 8, 1, 0), std::make_shared<BatchNorm2d>(ngf * 8),
            std::make_shared<ReLU>(),
            // state size. (ngf*8) x 4 x 4
            convt(ngf * 8, ngf * 4, 2, 1), std::make_shared<BatchNorm2d>(ngf * 4),
            std::make_shared<ReLU>(),
            // state size. (ngf*4) x 8 x 8
            convt(ngf * 4, ngf * 2, 2, 1), std::make_shared<BatchNorm2d>(ngf * 2),
            std::make_shared<ReLU>(),
            // state size. (ngf*2) x 16 x 16
            convt(ngf * 2, ngf, 2, 1), std::make_shared<BatchNorm2d>(ngf), std::make_shared<ReLU>(),
            // state size. (ngf) x 32 x 32
            convt(ngf, nc, 2, 1), std::make_shared<nn::Tanh>()
            // state size. (nc) x 64 x 64
            ));
  }
  Tensor forward(const Tensor& input) override { return main->forward(input); }
  nn::Child<nn::Sequential> main;
};

class Discriminator : public nn::Module {
 public:
  Discriminator(int64_t ndf, int64_t nc) {
    using nn::BatchNorm2d, nn::LeakyReLU;
    auto conv = [](int64_t in, int64_t out, int64_t stride, int64_t pad) {
      return std::make_shared<nn::Conv2d>(in, out, 4, stride, pad, 1, 1, /*bias=*/false);
    };
    main = register_module("main",
                           std::make_shared<nn::Sequential>(
                               // input is (nc) x 64 x 64
                               conv(nc, ndf, 2, 1), std::make_shared<LeakyReLU>(0.2),
                               // state size. (ndf) x 32 x 32
                               conv(ndf, ndf * 2, 2, 1), std::make_shared<BatchNorm2d>(ndf * 2),
                               std::make_shared<LeakyReLU>(0.2),
                               // state size. (ndf*2) x 16 x 16
                               conv(ndf * 2, ndf * 4, 2, 1), std::make_shared<BatchNorm2d>(ndf * 4),
                               std::make_shared<LeakyReLU>(0.2),
                               // state size. (ndf*4) x 8 x 8
                               conv(ndf * 4, ndf * 8, 2, 1), std::make_shared<BatchNorm2d>(ndf * 8),
                               std::make_shared<LeakyReLU>(0.2),
                               // state size. (ndf*8) x 4 x 4
                               conv(ndf * 8, 1, 1, 0), std::make_shared<nn::Sigmoid>()));
  }
  // (B, nc, 64, 64) -> probabilities of "real" (B)
  Tensor forward(const Tensor& input) override {
    return main->forward(input).view({-1, 1}).squeeze(1);
  }
  nn::Child<nn::Sequential> main;
};

struct StepResult {
  double errD, errG;           // BCE of D (real + fake) and of G
  double D_x, D_G_z1, D_G_z2;  // mean D output on real, on fake before and after D's step
};

// One iteration of the training loop on a batch of real images (B, nc, 64, 64) in [-1, 1] and
// noise (B, nz, 1, 1).
inline StepResult train_step(Generator& netG, Discriminator& netD, optim::Optimizer& optimizerG,
                             optim::Optimizer& optimizerD, const Tensor& real_cpu,
                             const Tensor& noise) {
  constexpr double real_label = 1, fake_label = 0;
  StepResult r{};
  ////////////////////////////
  // (1) Update D network: maximize log(D(x)) + log(1 - D(G(z)))
  ///////////////////////////
  // train with real
  netD.zero_grad();
  const int64_t batch_size = real_cpu.size(0);
  Tensor label = full({batch_size}, real_label, TensorOptions(real_cpu.dtype()));
  Tensor output = netD.forward(real_cpu);
  const Tensor errD_real = binary_cross_entropy(output, label);
  errD_real.backward();
  r.D_x = mean(output).item();

  // train with fake
  const Tensor fake = netG.forward(noise);
  label = full({batch_size}, fake_label, TensorOptions(real_cpu.dtype()));
  output = netD.forward(fake.detach());
  const Tensor errD_fake = binary_cross_entropy(output, label);
  errD_fake.backward();
  r.D_G_z1 = mean(output).item();
  r.errD = errD_real.item() + errD_fake.item();
  optimizerD.step();

  ////////////////////////////
  // (2) Update G network: maximize log(D(G(z)))
  ///////////////////////////
  netG.zero_grad();
  label = full({batch_size}, real_label, TensorOptions(real_cpu.dtype()));  // fake labels are
                                                                            // real for G cost
  output = netD.forward(fake);
  const Tensor errG = binary_cross_entropy(output, label);
  errG.backward();
  r.D_G_z2 = mean(output).item();
  r.errG = errG.item();
  optimizerG.step();
  return r;
}

// Fashion-MNIST (N, 1, 28, 28) in [0, 1] -> (N, 1, 64, 64) in [-1, 1]: transforms.Resize(64)
// (bilinear) and Normalize((0.5,), (0.5,)).
inline Tensor to_dcgan_images(const Tensor& images) {
  const Tensor x = interpolate(images, {64, 64}, {}, "bilinear", false);
  return div(sub(x, 0.5), 0.5);
}

}  // namespace accel::examples::dcgan
