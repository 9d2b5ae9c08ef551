// pytorch/examples mnist/main.py, ported: the model and the per-batch work, callable from the
// program (examples/mnist.cc) and from its PyTorch twin test (tests/examples/test_mnist.cc).
//
//   Net: conv1 1->32 3x3, ReLU, conv2 32->64 3x3, ReLU, max_pool 2, dropout1 0.25, flatten,
//        fc1 9216->128, ReLU, dropout2 0.5, fc2 128->10, log_softmax      (B,1,28,28) -> (B,10)
//   loss nll_loss, Adadelta(lr 1.0), StepLR(step_size 1, gamma 0.7) stepped once per epoch.
#pragma once

#include <cstdint>
#include <memory>

#include "accel.h"
#include "data/data.h"

namespace accel::examples::mnist {

// Fashion-MNIST's pixel mean and standard deviation (the original normalises MNIST with its own
// 0.1307 / 0.3081).
constexpr double kMean = 0.2860, kStd = 0.3530;

class Net : public nn::Module {
 public:
  Net()
      : conv1(register_module("conv1", std::make_shared<nn::Conv2d>(1, 32, 3, 1))),
        conv2(register_module("conv2", std::make_shared<nn::Conv2d>(32, 64, 3, 1))),
        dropout1(register_module("dropout1", std::make_shared<nn::Dropout>(0.25))),
        dropout2(register_module("dropout2", std::make_shared<nn::Dropout>(0.5))),
        fc1(register_module("fc1", std::make_shared<nn::Linear>(9216, 128))),
        fc2(register_module("fc2", std::make_shared<nn::Linear>(128, 10))) {}

  // x: (B, 1, 28, 28) normalised -> log-probabilities (B, 10)
  Tensor forward(const Tensor& input) override {
    Tensor x = relu(conv1->forward(input));  // (B, 32, 26, 26)
    x = relu(conv2->forward(x));             // (B, 64, 24, 24)
    x = max_pool2d(x, {2, 2});               // (B, 64, 12, 12)
    x = dropout1->forward(x);
    x = x.flatten(1);  // (B, 9216)
    x = relu(fc1->forward(x));
    x = dropout2->forward(x);
    x = fc2->forward(x);
    return log_softmax(x, 1);
  }

  nn::Child<nn::Conv2d> conv1, conv2;
  nn::Child<nn::Dropout> dropout1, dropout2;
  nn::Child<nn::Linear> fc1, fc2;
};

// transforms.ToTensor() then Normalize((kMean,), (kStd,)): pixels in [0, 1] (any float dtype)
// or uint8 -> (x - mean) / std in `dtype`.
inline Tensor normalize(const Tensor& images, DType dtype = kFloat32) {
  Tensor x = images.to(dtype);
  if (images.dtype() == kUInt8) x = div(x, 255.0);
  return div(sub(x, kMean), kStd);
}

// One step of train(): the batch's mean nll_loss, backward, optimizer step. Returns the loss.
inline double train_step(Net& model, optim::Optimizer& optimizer, const Tensor& data,
                         const Tensor& target) {
  optimizer.zero_grad();
  const Tensor output = model.forward(data);
  const Tensor loss = nll_loss(output, target);
  loss.backward();
  optimizer.step();
  return loss.item();
}

struct TestResult {
  double loss = 0;  // mean over the samples
  int64_t correct = 0, total = 0;
};

// test(): summed nll_loss and arg-max hits over the loader, without gradients, in eval mode.
inline TestResult test(Net& model, data::DataLoader& loader) {
  model.eval();
  NoGradGuard ng;
  TestResult r;
  double loss_sum = 0;
  for (auto& batch : loader) {
    const Tensor output = model.forward(batch[0]);
    loss_sum += nll_loss(output, batch[1], -100, Reduction::Sum).item();
    r.correct += int64_t(sum(eq(argmax(output, 1), batch[1])).item());
    r.total += batch[1].numel();
  }
  r.loss = r.total ? loss_sum / double(r.total) : 0;
  model.train();
  return r;
}

}  // namespace accel::examples::mnist
