// pytorch/examples vae/main.py, ported: the variational auto-encoder of Kingma & Welling and its
// loss, callable from the program (examples/vae.cc) and from its PyTorch twin test
// (tests/examples/test_vae.cc).
//
//   encode: fc1 784->400, ReLU, then fc21 400->20 (mu) and fc22 400->20 (logvar)
//   reparameterize: z = mu + eps * exp(0.5 logvar), eps ~ N(0, 1)
//   decode: fc3 20->400, ReLU, fc4 400->784, sigmoid
//   loss: binary_cross_entropy(recon, x, sum) - 0.5 sum(1 + logvar - mu^2 - exp(logvar))
#pragma once

#include <memory>
#include <optional>
#include <tuple>

#include "accel.h"

namespace accel::examples::vae {

class VAE : public nn::Module {
 public:
  VAE()
      : fc1(register_module("fc1", std::make_shared<nn::Linear>(784, 400))),
        fc21(register_module("fc21", std::make_shared<nn::Linear>(400, 20))),
        fc22(register_module("fc22", std::make_shared<nn::Linear>(400, 20))),
        fc3(register_module("fc3", std::make_shared<nn::Linear>(20, 400))),
        fc4(register_module("fc4", std::make_shared<nn::Linear>(400, 784))) {}

  // x: (B, 784) -> (mu, logvar), each (B, 20)
  std::tuple<Tensor, Tensor> encode(const Tensor& x) {
    const Tensor h1 = relu(fc1->forward(x));
    return {fc21->forward(h1), fc22->forward(h1)};
  }

  // eps: the standard normal noise (B, 20); drawn here when not given (the twin test gives
  // PyTorch's).
  Tensor reparameterize(const Tensor& mu, const Tensor& logvar,
                        const std::optional<Tensor>& noise = std::nullopt) {
    const Tensor std = exp(mul(logvar, 0.5));
    const Tensor eps = noise ? *noise : randn_like(std);
    return add(mu, mul(eps, std));
  }

  // z: (B, 20) -> pixels in (0, 1), (B, 784)
  Tensor decode(const Tensor& z) {
    const Tensor h3 = relu(fc3->forward(z));
    return sigmoid(fc4->forward(h3));
  }

  // x: (B, 1, 28, 28) or (B, 784) in [0, 1] -> (reconstruction (B, 784), mu, logvar)
  std::tuple<Tensor, Tensor, Tensor> forward3(const Tensor& x,
                                              const std::optional<Tensor>& noise = std::nullopt) {
    auto [mu, logvar] = encode(x.reshape({-1, 784}));
    const Tensor z = reparameterize(mu, logvar, noise);
    return {decode(z), mu, logvar};
  }
  Tensor forward(const Tensor& x) override { return std::get<0>(forward3(x)); }

  nn::Child<nn::Linear> fc1, fc21, fc22, fc3, fc4;
};

// Reconstruction + KL divergence losses summed over all elements and batch.
inline Tensor loss_function(const Tensor& recon_x, const Tensor& x, const Tensor& mu,
                            const Tensor& logvar) {
  const Tensor BCE = binary_cross_entropy(recon_x, x.reshape({-1, 784}), Tensor(), Reduction::Sum);
  // see Appendix B from VAE paper: Kingma and Welling. Auto-Encoding Variational Bayes. ICLR, 2014
  // 0.5 * sum(1 + log(sigma^2) - mu^2 - sigma^2)
  const Tensor KLD = mul(sum(sub(sub(add(logvar, 1.0), pow(mu, 2.0)), exp(logvar))), -0.5);
  return add(BCE, KLD);
}

// One step of train(): returns the batch's summed loss.
inline double train_step(VAE& model, optim::Optimizer& optimizer, const Tensor& data,
                         const std::optional<Tensor>& noise = std::nullopt) {
  optimizer.zero_grad();
  auto [recon_batch, mu, logvar] = model.forward3(data, noise);
  const Tensor loss = loss_function(recon_batch, data, mu, logvar);
  loss.backward();
  optimizer.step();
  return loss.item();
}

}  // namespace accel::examples::vae
