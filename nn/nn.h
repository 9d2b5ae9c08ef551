// Everything in accel::nn: Module, layers, losses, initialisers, gradient clipping and
// safetensors checkpoints.
#pragma once

#include "nn/activation.h"
#include "nn/attention.h"
#include "nn/batchnorm.h"
#include "nn/container.h"
#include "nn/conv.h"
#include "nn/dropout.h"
#include "nn/init.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/module.h"
#include "nn/norm.h"
#include "nn/resample.h"
#include "nn/rnn.h"
#include "io/safetensors.h"
#include "io/torch_format.h"
#include "nn/transformer.h"
#include "nn/utils.h"
