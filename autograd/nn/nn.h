// Everything in accel::nn: Module, layers, losses, initialisers, gradient clipping and
// safetensors checkpoints.
#pragma once

#include "autograd/nn/activation.h"
#include "autograd/nn/attention.h"
#include "autograd/nn/batchnorm.h"
#include "autograd/nn/container.h"
#include "autograd/nn/conv.h"
#include "autograd/nn/image.h"
#include "autograd/nn/init.h"
#include "autograd/nn/linear.h"
#include "autograd/nn/loss.h"
#include "autograd/nn/module.h"
#include "autograd/nn/norm.h"
#include "autograd/nn/rnn.h"
#include "autograd/nn/safetensors.h"
#include "autograd/nn/torch_format.h"
#include "autograd/nn/transformer.h"
#include "autograd/nn/utils.h"
