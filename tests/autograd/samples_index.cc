// Gradcheck samples: embedding, index_select, gather, scatter_add, index_add.
#include "samples.h"

using namespace accel;
using accel::testing::rnd;

namespace {
Tensor idx(std::vector<int64_t> v, const Shape& shape) { return tensor(v, shape); }
}  // namespace

GRAD_SAMPLE("embedding", "repeated indices", (rnd({5, 3})),
            { return embedding(x[0], idx({1, 3, 1, 0, 4, 1}, {2, 3})); });
GRAD_SAMPLE("embedding", "int32 indices", (rnd({4, 2})),
            { return embedding(x[0], tensor(std::vector<int32_t>{3, 3, 0}, {3})); });
GRAD_SAMPLE("index_select", "dim 0, repeats", (rnd({4, 3})),
            { return index_select(x[0], 0, idx({2, 0, 2}, {3})); });
GRAD_SAMPLE("index_select", "dim 1", (rnd({2, 4, 3})),
            { return index_select(x[0], 1, idx({3, 1}, {2})); });
GRAD_SAMPLE("gather", "dim 1", (rnd({3, 4})),
            { return gather(x[0], 1, idx({0, 3, 1, 1, 2, 0}, {3, 2})); });
GRAD_SAMPLE("gather", "dim 0, smaller index", (rnd({3, 4})),
            { return gather(x[0], 0, idx({2, 0, 1, 1, 0, 2}, {2, 3})); });
GRAD_SAMPLE("scatter_add", "dim 0, duplicates", (rnd({3, 4}), rnd({2, 3})),
            { return scatter_add(x[0], 0, idx({0, 2, 0, 0, 1, 0}, {2, 3}), x[1]); });
GRAD_SAMPLE("scatter_add", "dim 1, source larger than index", (rnd({2, 3}), rnd({2, 4})),
            { return scatter_add(x[0], 1, idx({2, 2, 0, 1}, {2, 2}), x[1]); });
GRAD_SAMPLE("index_add", "dim 0, duplicates", (rnd({4, 3}), rnd({3, 3})),
            { return index_add(x[0], 0, idx({1, 3, 1}, {3}), x[1]); });
GRAD_SAMPLE("index_add", "dim 1", (rnd({2, 3}), rnd({2, 2})),
            { return index_add(x[0], 1, idx({2, 0}, {2}), x[1]); });
