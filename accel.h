// accel: the umbrella header.
#pragma once

#include "autograd/checkpoint.h"
#include "autograd/distributions.h"
#include "autograd/function.h"
#include "autograd/nn/nn.h"
#include "autograd/ops.h"
#include "autograd/optim/optim.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/generator.h"
#include "core/profiler.h"
#include "core/shape.h"
#include "core/storage.h"
#include "core/tensor.h"
#include "data/data.h"
#include "accelerate/accelerator.h"
