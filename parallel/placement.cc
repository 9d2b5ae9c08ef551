#include "parallel/placement.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace accel::dist {

Placement Placement::shard(int64_t dim, int64_t chunks, int64_t unit) {
  ACCEL_CHECK(dim >= 0 && dim <= INT32_MAX && chunks >= 1 && chunks <= INT32_MAX && unit >= 1 &&
                  unit <= INT32_MAX,
              ValueError, "Placement", "Shard(", dim, ", chunks=", chunks, ", unit=", unit,
              ") needs a dimension >= 0, chunks >= 1 and unit >= 1");
  return {Kind::Shard, int32_t(dim), int32_t(chunks), int32_t(unit)};
}

std::string Placement::str() const {
  switch (kind) {
    case Kind::Replicate: return "Replicate";
    case Kind::Flat: return "Flat";
    case Kind::Partial: return "Partial";
    case Kind::Stage: return "Stage";
    case Kind::Shard:
      return "Shard(" + std::to_string(dim) +
             (chunks > 1 ? ", chunks=" + std::to_string(chunks) : std::string()) +
             (unit > 1 ? ", unit=" + std::to_string(unit) : std::string()) + ")";
  }
  return "?";
}

Chunk shard_chunk(int64_t size, int64_t n, int64_t i) {
  ACCEL_CHECK(size >= 0 && n >= 1 && i >= 0 && i < n, ValueError, "shard_chunk", "piece ", i,
              " of ", n, " over ", size, " elements");
  const int64_t chunk = (size + n - 1) / n;
  const int64_t begin = std::min(size, i * chunk);
  const int64_t end = std::min(size, begin + chunk);
  return {begin, end - begin};
}

// ---------------- Region ----------------

Region Region::whole(const Shape& global) {
  Region r;
  r.global_ = global;
  r.dims_.resize(global.size());
  for (size_t d = 0; d < global.size(); ++d) {
    ACCEL_CHECK(global[d] >= 0, ShapeError, "Region", "negative size in ", global);
    if (global[d] > 0) r.dims_[d].push_back({0, 0, global[d]});
  }
  return r;
}

namespace {
int64_t seg_total(const std::vector<Segment>& segs) {
  int64_t n = 0;
  for (const Segment& s : segs) n += s.length;
  return n;
}
// Appends a segment, merged into the last one when contiguous in both orders.
void push_segment(std::vector<Segment>& out, Segment s) {
  if (s.length == 0) return;
  if (!out.empty()) {
    Segment& b = out.back();
    if (b.local + b.length == s.local && b.global + b.length == s.global) {
      b.length += s.length;
      return;
    }
  }
  out.push_back(s);
}
}  // namespace

Shape Region::box_shape() const {
  Shape s(global_.size());
  for (size_t d = 0; d < dims_.size(); ++d) s[d] = seg_total(dims_[d]);
  return s;
}

Shape Region::local_shape() const {
  if (is_flat()) return Shape{flat_hi_ - flat_lo_};
  return box_shape();
}

int64_t Region::numel() const {
  if (is_flat()) return flat_hi_ - flat_lo_;
  int64_t n = 1;
  for (const auto& segs : dims_) n *= seg_total(segs);
  return n;
}

Region Region::shard(int64_t dim, int64_t chunks, int64_t n, int64_t i, int64_t unit) const {
  ACCEL_CHECK(!is_flat(), ShapeError, "Region.shard", "a flat range is the last step of a layout");
  const int64_t nd = int64_t(global_.size());
  ACCEL_CHECK(dim >= 0 && dim < nd, ShapeError, "Region.shard", "dimension ", dim,
              " out of range for ", global_);
  ACCEL_CHECK(chunks >= 1 && unit >= 1 && n >= 1 && i >= 0 && i < n, ValueError, "Region.shard",
              "piece ", i, " of ", n, " (chunks ", chunks, ", unit ", unit, ")");
  const std::vector<Segment>& old = dims_[size_t(dim)];
  const int64_t len = seg_total(old);
  ACCEL_CHECK(len % (chunks * unit) == 0, ShapeError, "Region.shard", "dimension ", dim,
              " of length ", len, " (global ", global_, ") is not ", chunks,
              " equal blocks of whole units of ", unit);
  const int64_t block = len / chunks;
  const Chunk u = shard_chunk(block / unit, n, i);
  const Chunk c{u.begin * unit, u.length * unit};
  std::vector<Segment> out;
  int64_t cursor = 0;  // the new local index
  for (int64_t b = 0; b < chunks; ++b) {
    const int64_t lo = b * block + c.begin, hi = lo + c.length;  // old local range
    for (const Segment& s : old) {
      const int64_t a = std::max(lo, s.local), e = std::min(hi, s.local + s.length);
      if (a >= e) continue;
      push_segment(out, {cursor, s.global + (a - s.local), e - a});
      cursor += e - a;
    }
  }
  Region r = *this;
  r.dims_[size_t(dim)] = std::move(out);
  return r;
}

Region Region::flat(int64_t lo, int64_t hi) const {
  ACCEL_CHECK(!is_flat(), ShapeError, "Region.flat", "a layout has at most one flat range");
  const int64_t n = numel();
  ACCEL_CHECK(0 <= lo && lo <= hi && hi <= n, ShapeError, "Region.flat", "range [", lo, ", ", hi,
              ") outside a piece of ", n, " elements");
  Region r = *this;
  r.flat_lo_ = lo;
  r.flat_hi_ = hi;
  return r;
}

void Region::for_each_run(const std::function<void(const Run&)>& fn) const {
  const size_t nd = global_.size();
  Run pending;
  auto emit = [&](int64_t local, int64_t global, int64_t n) {
    if (is_flat()) {  // clip to [flat_lo, flat_hi) of the box's order, shifted to 0
      const int64_t a = std::max(local, flat_lo_), e = std::min(local + n, flat_hi_);
      if (a >= e) return;
      global += a - local;
      n = e - a;
      local = a - flat_lo_;
    }
    if (pending.n > 0 && pending.local + pending.n == local &&
        pending.global + pending.n == global) {
      pending.n += n;
      return;
    }
    if (pending.n > 0) fn(pending);
    pending = {local, global, n};
  };
  if (nd == 0) {  // a scalar
    emit(0, 0, 1);
    if (pending.n > 0) fn(pending);
    return;
  }
  const Shape box = box_shape();
  for (size_t d = 0; d < nd; ++d)
    if (box[d] == 0) return;
  // Trailing dimensions held whole fold into the runs of the last dimension that is not.
  size_t k = nd - 1;
  auto whole_dim = [&](size_t d) {
    return dims_[d].size() == 1 && dims_[d][0].global == 0 && dims_[d][0].length == global_[d];
  };
  while (k > 0 && whole_dim(k)) --k;
  std::vector<int64_t> lstride(nd, 1), gstride(nd, 1);
  for (size_t d = nd - 1; d > 0; --d) {
    lstride[d - 1] = lstride[d] * box[d];
    gstride[d - 1] = gstride[d] * global_[d];
  }
  // Odometer over the local indices of dimensions [0, k), tracking the segment of each.
  std::vector<size_t> seg(k, 0);
  std::vector<int64_t> off(k, 0);  // index within the current segment
  const int64_t flat_end = is_flat() ? flat_hi_ : INT64_MAX;
  for (bool done = false; !done;) {
    int64_t lbase = 0, gbase = 0;
    for (size_t d = 0; d < k; ++d) {
      const Segment& s = dims_[d][seg[d]];
      lbase += (s.local + off[d]) * lstride[d];
      gbase += (s.global + off[d]) * gstride[d];
    }
    if (lbase >= flat_end) break;  // ascending: nothing further lies in the flat range
    for (const Segment& s : dims_[k])
      emit(lbase + s.local * lstride[k], gbase + s.global * gstride[k], s.length * lstride[k]);
    // The next local index of dimensions [0, k), last fastest.
    for (size_t d = k;;) {
      if (d == 0) {
        done = true;
        break;
      }
      --d;
      if (++off[d] < dims_[d][seg[d]].length) break;
      off[d] = 0;
      if (++seg[d] < dims_[d].size()) break;
      seg[d] = 0;
    }
  }
  if (pending.n > 0) fn(pending);
}

std::vector<Run> Region::runs() const {
  std::vector<Run> out;
  for_each_run([&](const Run& r) { out.push_back(r); });
  return out;
}

nlohmann::json Region::to_json() const {
  nlohmann::json dims = nlohmann::json::array();
  for (const auto& segs : dims_) {
    nlohmann::json d = nlohmann::json::array();
    for (const Segment& s : segs) d.push_back({s.local, s.global, s.length});
    dims.push_back(std::move(d));
  }
  nlohmann::json j = {{"dims", std::move(dims)}};
  if (is_flat()) j["flat"] = {flat_lo_, flat_hi_};
  return j;
}

Region Region::from_json(const nlohmann::json& j, const Shape& global, const std::string& where) {
  auto fail = [&](const std::string& what) {
    ACCEL_THROW(IoError, "checkpoint", where, ": region ", what);
  };
  auto as_int = [&](const nlohmann::json& v) -> int64_t {
    if (!v.is_number_integer()) fail("holds a non-integer");
    return v.get<int64_t>();
  };
  if (!j.is_object() || !j.contains("dims") || !j["dims"].is_array()) fail("has no \"dims\" array");
  const auto& dims = j["dims"];
  if (dims.size() != global.size())
    fail("has " + std::to_string(dims.size()) + " dimensions for a tensor of shape " +
         shape_str(global));
  Region r;
  r.global_ = global;
  r.dims_.resize(global.size());
  for (size_t d = 0; d < dims.size(); ++d) {
    if (!dims[d].is_array()) fail("dimension " + std::to_string(d) + " is not a list");
    int64_t local = 0, global_end = 0;
    for (const auto& t : dims[d]) {
      if (!t.is_array() || t.size() != 3) fail("segment is not [local, global, length]");
      const Segment s{as_int(t[0]), as_int(t[1]), as_int(t[2])};
      if (s.local != local || s.length <= 0 || s.global < global_end ||
          s.global > global[d] - s.length)
        fail("dimension " + std::to_string(d) + " segment [" + std::to_string(s.local) + ", " +
             std::to_string(s.global) + ", " + std::to_string(s.length) +
             "] is not dense, ascending and inside size " + std::to_string(global[d]));
      r.dims_[d].push_back(s);
      local += s.length;
      global_end = s.global + s.length;
    }
  }
  if (j.contains("flat")) {
    const auto& f = j["flat"];
    if (!f.is_array() || f.size() != 2) fail("\"flat\" is not [lo, hi]");
    const int64_t lo = as_int(f[0]), hi = as_int(f[1]);
    int64_t n = 1;
    for (const auto& segs : r.dims_) n *= seg_total(segs);
    if (lo < 0 || lo > hi || hi > n)
      fail("flat range [" + std::to_string(lo) + ", " + std::to_string(hi) + ") outside a box of " +
           std::to_string(n) + " elements");
    r.flat_lo_ = lo;
    r.flat_hi_ = hi;
  }
  return r;
}

std::string Region::str() const {
  std::ostringstream os;
  os << "global " << shape_str(global_) << ", box " << shape_str(box_shape());
  if (is_flat()) os << ", flat [" << flat_lo_ << ", " << flat_hi_ << ")";
  return os.str();
}

std::vector<Overlap> overlap(const Region& saved, const Region& wanted) {
  ACCEL_CHECK(saved.global_shape() == wanted.global_shape(), ShapeError, "overlap",
              "pieces of different tensors: global ", saved.global_shape(), " and ",
              wanted.global_shape());
  const std::vector<Run> a = saved.runs(), b = wanted.runs();
  std::vector<Overlap> out;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const int64_t lo = std::max(a[i].global, b[j].global);
    const int64_t ea = a[i].global + a[i].n, eb = b[j].global + b[j].n;
    const int64_t hi = std::min(ea, eb);
    if (lo < hi) {
      const Overlap o{a[i].local + (lo - a[i].global), b[j].local + (lo - b[j].global), hi - lo};
      if (!out.empty() && out.back().src + out.back().n == o.src &&
          out.back().dst + out.back().n == o.dst) {
        out.back().n += o.n;
      } else {
        out.push_back(o);
      }
    }
    if (ea <= eb) ++i;
    if (eb <= ea) ++j;
  }
  return out;
}

// ---------------- Layout ----------------

Layout Layout::whole(const Shape& global_shape, DType dtype) {
  Layout l;
  l.global_shape = global_shape;
  l.dtype = dtype;
  l.region = Region::whole(global_shape);
  return l;
}

Layout& Layout::then(const std::string& dim, Placement p, int size, int coordinate, int64_t flat_lo,
                     int64_t flat_hi) {
  ACCEL_CHECK(size >= 1 && coordinate >= 0 && coordinate < size, ValueError, "Layout",
              "coordinate ", coordinate, " along '", dim, "' of size ", size);
  if (p.kind == Placement::Kind::Shard) {
    region = region.shard(p.dim, p.chunks, size, coordinate, p.unit);
  } else if (p.kind == Placement::Kind::Flat) {
    region = region.flat(flat_lo, flat_hi);
  }
  steps.push_back({dim, p, size, coordinate});
  return *this;
}

bool Layout::primary() const {
  for (const MeshStep& s : steps)
    if (s.placement.kind == Placement::Kind::Replicate && s.coordinate != 0) return false;
  return true;
}

int64_t Layout::holders() const {
  int64_t n = 1;
  for (const MeshStep& s : steps)
    if (s.placement.kind == Placement::Kind::Replicate) n *= s.size;
  return n;
}

std::string Layout::str() const {
  std::string s;
  for (const MeshStep& m : steps) s += (s.empty() ? "" : ", ") + m.dim + ": " + m.placement.str();
  return s.empty() ? std::string("whole") : s;
}

void LayoutTable::set(const std::string& name, const Tensor& t, Layout layout) {
  ACCEL_CHECK(!index_.count(name), ValueError, "LayoutTable", "'", name, "' has a layout already");
  index_.emplace(name, entries_.size());
  if (t.defined()) by_tensor_.emplace(t.impl(), entries_.size());
  entries_.emplace_back(name, std::move(layout));
}

void LayoutTable::extend(const std::string& name, const Tensor& t, Layout layout) {
  const auto it = index_.find(name);
  if (it == index_.end()) return set(name, t, std::move(layout));
  Layout& old = entries_[it->second].second;
  for (const MeshStep& s : old.steps)
    ACCEL_CHECK(s.placement.kind == Placement::Kind::Stage, ValueError, "LayoutTable", "'", name,
                "' was cut along '", s.dim, "' (", s.placement.str(),
                ") before a later step recorded it");
  std::vector<MeshStep> steps = old.steps;
  steps.insert(steps.end(), layout.steps.begin(), layout.steps.end());
  layout.steps = std::move(steps);
  old = std::move(layout);
  if (t.defined()) by_tensor_[t.impl()] = it->second;
}

const Layout* LayoutTable::find(const Tensor& t) const {
  if (!t.defined()) return nullptr;
  auto it = by_tensor_.find(t.impl());
  return it == by_tensor_.end() ? nullptr : &entries_[it->second].second;
}

const Layout& LayoutTable::at(const std::string& name) const {
  auto it = index_.find(name);
  ACCEL_CHECK(it != index_.end(), IndexError, "LayoutTable", "no layout for '", name, "' (",
              entries_.size(), " tensors have one)");
  return entries_[it->second].second;
}

}  // namespace accel::dist
