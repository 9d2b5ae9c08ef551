// Everything in accel::optim: optimizers and learning-rate schedulers.
#pragma once

#include "optim/adadelta.h"
#include "optim/adagrad.h"
#include "optim/adam.h"
#include "optim/lbfgs.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"
#include "optim/rmsprop.h"
#include "optim/sgd.h"
#include "optim/torch_state.h"
