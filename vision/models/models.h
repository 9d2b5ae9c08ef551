// accel::vision::models: torchvision 0.14's classification models with its names, architectures,
// parameter names and initialisation (docs/vision.md):
//   resnet18 / 34 / 50 / 101, vgg11 / 16 (_bn), mobilenet_v2, mobilenet_v3_small / large,
//   efficientnet_b0, vit_b_16, alexnet, squeezenet1_0 / 1_1.
#pragma once

#include "vision/models/efficientnet.h"
#include "vision/models/mobilenet.h"
#include "vision/models/resnet.h"
#include "vision/models/small.h"
#include "vision/models/vgg.h"
#include "vision/models/vit.h"
#include "vision/models/weights.h"
