// accel::vision: torchvision's counterpart. models (vision/models/models.h) and the building
// blocks of torchvision.ops they use (vision/ops/misc.h).
#pragma once

#include "vision/models/models.h"
#include "vision/ops/misc.h"
