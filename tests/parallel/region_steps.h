// A piece of a global tensor as the steps that cut it, and its brute-force element map: the
// global row-major offset of each local element, computed by cutting a tensor of offsets with
// torch.chunk semantics (chunk / narrow / cat), independently of dist::Region (the tests of
// Region and of the checkpoint format check Region against it).
#pragma once

#include <algorithm>
#include <vector>

#include "accel.h"
#include "parallel/placement.h"

namespace accel::test {

struct Steps {
  struct Cut {
    int64_t dim, chunks, n, i;  // dim as `chunks` blocks, each cut in n, piece i
  };
  Shape global;
  std::vector<Cut> cuts;
  int64_t flat_lo = 0, flat_hi = -1;  // then this flat range (flat_hi < 0: none)

  dist::Region region() const {
    dist::Region r = dist::Region::whole(global);
    for (const Cut& c : cuts) r = r.shard(c.dim, c.chunks, c.n, c.i);
    if (flat_hi >= 0) r = r.flat(flat_lo, flat_hi);
    return r;
  }
  std::vector<int64_t> offsets() const {
    Tensor t = arange(shape_numel(global), TensorOptions(kInt64)).reshape(global);
    for (const Cut& c : cuts) {
      std::vector<Tensor> kept;
      for (const Tensor& block : t.chunk(c.chunks, c.dim)) {
        // torch.chunk: pieces of ceil(len / n); trailing pieces may be missing (empty).
        const int64_t len = block.size(c.dim), piece = (len + c.n - 1) / c.n;
        const int64_t b = std::min(len, c.i * piece), e = std::min(len, b + piece);
        kept.push_back(block.narrow(c.dim, b, e - b));
      }
      t = cat(kept, c.dim);
    }
    std::vector<int64_t> out = t.contiguous().reshape({-1}).to_vector<int64_t>();
    if (flat_hi >= 0) out = std::vector<int64_t>(out.begin() + flat_lo, out.begin() + flat_hi);
    return out;
  }
};

}  // namespace accel::test
