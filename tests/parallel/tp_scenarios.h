// Scenarios of tp_worker defined outside tp_worker.cc (tp_dropout.cc: dropout under tensor
// parallelism), and the check they share.
#pragma once

#include "comm/process_group.h"
#include "tests/common/tensors.h"
#include "tests/common/worker_check.h"

#define EXPECT_CLOSE_TP(a, b, tol, what)                                                           \
  do {                                                                                             \
    const double d_ = ::accel::test::max_abs_diff((a), (b));                                       \
    WCHECK(d_ <= (tol), what << ": max difference " << d_ << " (shapes " << (a).sizes() << " and " \
                             << (b).sizes() << ")");                                               \
  } while (0)

void scenario_dropout(const accel::dist::ProcessGroupPtr& world);
void scenario_train_dropout(const accel::dist::ProcessGroupPtr& world);
void scenario_resume_dropout(const accel::dist::ProcessGroupPtr& world);
