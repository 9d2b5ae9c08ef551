#include "core/sharded_random.h"

#include <utility>

#include "core/error.h"

namespace accel {

namespace {
thread_local ShardedRegion t_region;
thread_local DrawSite t_site = DrawSite::Elements;
thread_local uint64_t t_draws = 0;

std::string describe(const ShardedRegion& r) {
  std::string s = r.source ? *r.source : std::string("a tensor-parallel style");
  s += " (this rank holds ";
  if (r.dim >= 0) {
    s += std::to_string(r.length) + " of " + std::to_string(r.length * r.ways) + " along dim " +
         std::to_string(r.dim) + " of " + std::to_string(r.ndim) + "-D activations)";
  } else {
    s += std::to_string(r.length) + " of " + std::to_string(r.length * r.ways) +
         " features along dim " + std::to_string(r.dim) + ")";
  }
  return s;
}
}  // namespace

const ShardedRegion& sharded_region() { return t_region; }
void set_sharded_region(ShardedRegion region) { t_region = std::move(region); }
DrawSite draw_site() { return t_site; }
uint64_t sharded_draw_count() { return t_draws; }

ShardedRegionGuard::ShardedRegionGuard(ShardedRegion region) : saved_(std::move(t_region)) {
  t_region = std::move(region);
}
ShardedRegionGuard::~ShardedRegionGuard() { t_region = std::move(saved_); }

DrawSiteGuard::DrawSiteGuard(DrawSite site) : saved_(t_site) { t_site = site; }
DrawSiteGuard::~DrawSiteGuard() { t_site = saved_; }

ShardLayout draw_layout(const char* op, const Shape& shape) {
  ++t_draws;
  const ShardedRegion& r = t_region;
  if (r.ways <= 1) return {};
  ACCEL_CHECK(!r.uneven, ValueError, op, "input ", shape,
              " lies where tensor parallelism holds uneven pieces (", describe(r),
              "; a size tp does not divide), where random draws equal to one process's are not "
              "supported: make the sharded size divisible by tp, or apply it outside the region");
  const int64_t nd = int64_t(shape.size());
  if (t_site == DrawSite::AttentionWeights) {
    ACCEL_CHECK(r.heads && nd == 4, ValueError, op, "attention weights ", shape,
                " are drawn for where activations are sharded over tensor parallelism by ",
                describe(r),
                r.heads ? ", but they are not 4-D (B, H, L, S) with this rank's heads on dim 1"
                        : ", which splits no heads: attention over sharded activations has no "
                          "one-process equivalent; split its heads with colwise / rowwise");
    return {1, r.ways, r.index, 1};
  }
  const int64_t d = r.dim >= 0 ? r.dim : nd + r.dim;
  const bool fits = (r.dim < 0 || nd == r.ndim) && d >= 0 && d < nd && shape[size_t(d)] == r.length;
  ACCEL_CHECK(fits, ValueError, op, "input ", shape,
              " lies where activations are sharded over tensor parallelism by ", describe(r),
              ", but its shape does not show where its elements sit in the full tensor, so its "
              "random draws cannot be those of one process (and each rank needs its own): apply "
              "it to the activations in that layout, or outside the sharded region");
  return {d, r.ways, r.index, r.chunks};
}

}  // namespace accel
