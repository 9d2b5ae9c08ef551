// Everything in accel::optim: optimizers and learning-rate schedulers.
#pragma once

#include "autograd/optim/adadelta.h"
#include "autograd/optim/adagrad.h"
#include "autograd/optim/adam.h"
#include "autograd/optim/lbfgs.h"
#include "autograd/optim/lr_scheduler.h"
#include "autograd/optim/optimizer.h"
#include "autograd/optim/rmsprop.h"
#include "autograd/optim/sgd.h"
#include "autograd/optim/torch_state.h"
