// accel data: datasets, samplers, the DataLoader and readers for real formats.
#pragma once

#include "data/batch_split.h"
#include "data/csv.h"
#include "data/dataloader.h"
#include "data/dataset.h"
#include "data/idx.h"
#include "data/image.h"
#include "data/image_folder.h"
#include "data/io.h"
#include "data/iterable.h"
#include "data/sampler.h"
#include "data/tokens.h"
#include "data/transforms.h"
