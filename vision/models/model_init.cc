#include "vision/models/model_init.h"

#include "nn/batchnorm.h"
#include "nn/conv.h"
#include "nn/linear.h"
#include "nn/norm.h"

namespace accel::vision::models::detail {

// named_modules(), not modules(): these run inside constructors, before a shared_ptr owns the
// model.
void init_convs_kaiming_fan_out(nn::Module& model, const char* nonlinearity) {
  for (auto& [name, m] : model.named_modules()) {
    if (auto* conv = dynamic_cast<nn::Conv2d*>(m)) {
      nn::init::kaiming_normal_(conv->weight, 0.0, nn::init::FanMode::FanOut, nonlinearity);
      if (conv->bias.defined()) nn::init::zeros_(conv->bias);
    }
  }
}

void init_norms(nn::Module& model) {
  for (auto& [name, m] : model.named_modules()) {
    if (auto* bn = dynamic_cast<nn::BatchNormBase*>(m); bn && bn->affine) {
      nn::init::ones_(bn->weight);
      nn::init::zeros_(bn->bias);
    } else if (auto* gn = dynamic_cast<nn::GroupNorm*>(m); gn && gn->weight.defined()) {
      nn::init::ones_(gn->weight);
      nn::init::zeros_(gn->bias);
    }
  }
}

void init_linears_normal(nn::Module& model, double std) {
  for (auto& [name, m] : model.named_modules()) {
    if (auto* lin = dynamic_cast<nn::Linear*>(m)) {
      nn::init::normal_(lin->weight, 0.0, std);
      if (lin->bias.defined()) nn::init::zeros_(lin->bias);
    }
  }
}

}  // namespace accel::vision::models::detail
