// The initialisation loops torchvision's model constructors run over self.modules() (private to
// vision/models).
#pragma once

#include "nn/init.h"
#include "nn/module.h"

namespace accel::vision::models::detail {

// Conv2d weights kaiming_normal_(mode="fan_out", nonlinearity), biases zero.
void init_convs_kaiming_fan_out(nn::Module& model, const char* nonlinearity = "leaky_relu");
// BatchNorm2d and GroupNorm weights one, biases zero.
void init_norms(nn::Module& model);
// Linear weights normal_(0, std), biases zero.
void init_linears_normal(nn::Module& model, double std);

}  // namespace accel::vision::models::detail
