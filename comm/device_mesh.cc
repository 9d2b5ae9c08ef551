#include "comm/device_mesh.h"

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace accel::dist {

namespace {

std::string join(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

bool valid_name(const std::string& n) {
  return !n.empty() && n.size() <= 64 &&
         n.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") == std::string::npos;
}

}  // namespace

DeviceMesh::DeviceMesh(std::vector<MeshDim> dims, int rank, int local_world_size)
    : dims_(std::move(dims)), rank_(rank), local_world_size_(local_world_size) {
  ACCEL_CHECK(!dims_.empty(), ValueError, "device_mesh", "a mesh needs at least one dimension");
  int64_t world = 1;
  for (size_t i = 0; i < dims_.size(); ++i) {
    const MeshDim& d = dims_[i];
    ACCEL_CHECK(valid_name(d.name), ValueError, "device_mesh", "dimension ", i, " is named '",
                d.name, "': use lower-case letters, digits and '_'");
    ACCEL_CHECK(d.size >= 1, ValueError, "device_mesh", "dimension '", d.name, "' has size ",
                d.size, ": sizes are >= 1");
    for (size_t j = 0; j < i; ++j)
      ACCEL_CHECK(dims_[j].name != d.name, ValueError, "device_mesh", "dimension '", d.name,
                  "' is given twice");
    world *= d.size;
    ACCEL_CHECK(world <= (int64_t(1) << 30), ValueError, "device_mesh", "the mesh ", describe(),
                " has more than 2^30 ranks");
  }
  world_ = int(world);
  ACCEL_CHECK(rank_ >= 0 && rank_ < world_, ValueError, "device_mesh", "rank ", rank_,
              " is not in the mesh ", describe(), " of ", world_, " ranks");
  ACCEL_CHECK(local_world_size_ >= 1, ValueError, "device_mesh", "local_world_size ",
              local_world_size_, ": processes per machine are >= 1");
  strides_.assign(dims_.size(), 1);
  for (size_t i = dims_.size() - 1; i > 0; --i) strides_[i - 1] = strides_[i] * dims_[i].size;
  for (size_t i = 0; i < dims_.size(); ++i)
    named_.push_back({dims_[i].name, dims_[i].size, {int(i)}, nullptr});
}

DeviceMesh::DeviceMesh(std::vector<MeshDim> dims, int rank, int local_world_size,
                       GroupFactory factory)
    : DeviceMesh(std::move(dims), rank, local_world_size) {
  ACCEL_CHECK(static_cast<bool>(factory), ValueError, "device_mesh",
              "the group factory is empty (use the constructor without one for a layout-only "
              "mesh)");
  factory_ = std::move(factory);
  for (Named& d : named_) make_groups(d);
}

void DeviceMesh::make_groups(Named& d) {
  // A flattened dimension over the same ranks as one made before (they differ only by dimensions
  // of size 1: "dp_cp" and "dp" at cp 1) shares its groups, decided alike on every rank (no rank
  // skips a collective another makes).
  auto spanned = [&](const Named& n) {
    std::vector<int> v;
    for (int i : n.over)
      if (dims_[size_t(i)].size > 1) v.push_back(i);
    return v;
  };
  for (const Named& e : named_) {
    if (d.over.size() < 2 || &e == &d || e.group == nullptr || spanned(e) != spanned(d)) continue;
    d.group = e.group;
    return;
  }
  // Note [mesh groups]: every group, in order, on every rank; this rank keeps its own.
  for (const std::vector<int>& ranks : groups_of(d)) {
    ProcessGroupPtr g = factory_(ranks);
    const auto it = std::find(ranks.begin(), ranks.end(), rank_);
    if (it == ranks.end()) continue;
    const int want_rank = int(it - ranks.begin());
    ACCEL_CHECK(g != nullptr, DistError, "device_mesh", "the group factory returned no group for ",
                d.name, " ranks {", join(ranks), "}, which hold rank ", rank_);
    ACCEL_CHECK(g->size() == int(ranks.size()) && g->rank() == want_rank, DistError, "device_mesh",
                "the group factory returned a group of size ", g->size(), " where rank ", rank_,
                " is ", g->rank(), " for ", d.name, " ranks {", join(ranks), "}: expected size ",
                ranks.size(), ", rank ", want_rank);
    d.group = std::move(g);
  }
}

const DeviceMesh::Named& DeviceMesh::find(std::string_view dim, const char* op) const {
  for (const Named& d : named_)
    if (d.name == dim) return d;
  std::string names;
  for (const Named& d : named_) names += (names.empty() ? "" : ", ") + d.name;
  ACCEL_THROW(ValueError, op, "the mesh ", describe(), " has no dimension '", dim, "' (it has ",
              names, ")");
}

void DeviceMesh::check_rank(int rank, const char* op) const {
  ACCEL_CHECK(rank >= 0 && rank < world_, ValueError, op, "rank ", rank, " is not in the mesh ",
              describe(), " of ", world_, " ranks");
}

bool DeviceMesh::has_dim(std::string_view dim) const {
  return std::any_of(named_.begin(), named_.end(), [&](const Named& d) { return d.name == dim; });
}

int DeviceMesh::size(std::string_view dim) const { return find(dim, "device_mesh.size").size; }

std::vector<int> DeviceMesh::coordinates(int rank) const {
  check_rank(rank, "device_mesh.coordinates");
  std::vector<int> c(dims_.size());
  for (size_t i = 0; i < dims_.size(); ++i) c[i] = (rank / strides_[i]) % dims_[i].size;
  return c;
}

int DeviceMesh::rank_at(const std::vector<int>& c) const {
  ACCEL_CHECK(c.size() == dims_.size(), ValueError, "device_mesh.rank_at", "got ", c.size(),
              " coordinates for the mesh ", describe(), " of ", dims_.size(), " dimensions");
  int r = 0;
  for (size_t i = 0; i < dims_.size(); ++i) {
    ACCEL_CHECK(c[i] >= 0 && c[i] < dims_[i].size, ValueError, "device_mesh.rank_at", "coordinate ",
                c[i], " along '", dims_[i].name, "' is outside [0, ", dims_[i].size, ")");
    r += c[i] * strides_[i];
  }
  return r;
}

int DeviceMesh::coordinate(std::string_view dim, int rank) const {
  const Named& d = find(dim, "device_mesh.coordinate");
  const std::vector<int> c = coordinates(rank);
  int index = 0;
  for (int i : d.over) index = index * dims_[size_t(i)].size + c[size_t(i)];
  return index;
}

std::vector<int> DeviceMesh::group_ranks(std::string_view dim, int rank) const {
  return group_ranks_of(find(dim, "device_mesh.group_ranks"), rank);
}

std::vector<std::vector<int>> DeviceMesh::groups(std::string_view dim) const {
  return groups_of(find(dim, "device_mesh.groups"));
}

std::vector<int> DeviceMesh::group_ranks_of(const Named& d, int rank) const {
  std::vector<int> c = coordinates(rank);
  for (int i : d.over) c[size_t(i)] = 0;
  // Row-major over the dimensions of `dim`: the outer one changes slowest, so ranks ascend.
  std::vector<int> ranks = {rank_at(c)};
  for (int i : d.over) {
    std::vector<int> next;
    next.reserve(ranks.size() * size_t(dims_[size_t(i)].size));
    for (int r : ranks)
      for (int k = 0; k < dims_[size_t(i)].size; ++k) next.push_back(r + k * strides_[size_t(i)]);
    ranks = std::move(next);
  }
  return ranks;
}

std::vector<std::vector<int>> DeviceMesh::groups_of(const Named& d) const {
  std::vector<std::vector<int>> out;
  for (int r = 0; r < world_; ++r) {
    const std::vector<int> c = coordinates(r);
    // A group's first rank has coordinate 0 along every dimension of `d`.
    if (std::all_of(d.over.begin(), d.over.end(), [&](int i) { return c[size_t(i)] == 0; }))
      out.push_back(group_ranks_of(d, r));
  }
  return out;
}

void DeviceMesh::flatten(const std::vector<std::string>& dims, std::string name) {
  ACCEL_CHECK(!dims.empty(), ValueError, "device_mesh.flatten", "no dimensions to flatten");
  Named n;
  int last = -1;
  for (const std::string& dim : dims) {
    const auto it =
        std::find_if(dims_.begin(), dims_.end(), [&](const MeshDim& m) { return m.name == dim; });
    ACCEL_CHECK(it != dims_.end(), ValueError, "device_mesh.flatten", "the mesh ", describe(),
                " has no dimension '", dim,
                "' to flatten (flattened dimensions cannot be "
                "flattened again)");
    const int i = int(it - dims_.begin());
    ACCEL_CHECK(i > last, ValueError, "device_mesh.flatten", "dimension '", dim,
                "' is out of mesh order or given twice: list the dimensions outermost first (",
                describe(), ")");
    last = i;
    n.over.push_back(i);
    n.size *= it->size;
  }
  if (name.empty())
    for (const std::string& dim : dims) name += (name.empty() ? "" : "_") + dim;
  ACCEL_CHECK(valid_name(name), ValueError, "device_mesh.flatten",
              "the flattened dimension is "
              "named '",
              name, "': use lower-case letters, digits and '_'");
  ACCEL_CHECK(!has_dim(name), ValueError, "device_mesh.flatten", "the mesh ", describe(),
              " has a dimension '", name, "' already");
  n.name = name;
  if (factory_) make_groups(n);
  named_.push_back(std::move(n));
}

const ProcessGroupPtr& DeviceMesh::group(std::string_view dim) const {
  const Named& d = find(dim, "device_mesh.group");
  ACCEL_CHECK(factory_ != nullptr, ValueError, "device_mesh.group", "the mesh ", describe(),
              " is a layout only (constructed without a group factory): it has no process group "
              "for '",
              dim, "'");
  return d.group;
}

std::vector<std::string> DeviceMesh::placement_warnings() const {
  // Note [mesh placement]
  std::vector<std::string> out;
  const int machines = (world_ + local_world_size_ - 1) / local_world_size_;
  if (machines <= 1) return out;
  bool outer_split = false;  // a dimension outside this one has more than one rank
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (outer_split && dims_[i].size > 1) {
      for (const std::vector<int>& g : groups(dims_[i].name)) {
        const int first = g.front() / local_world_size_, last = g.back() / local_world_size_;
        if (first == last) continue;
        out.push_back("the " + dims_[i].name + " groups of the mesh " + describe() +
                      " span machines of " + std::to_string(local_world_size_) +
                      " processes (LOCAL_WORLD_SIZE), e.g. ranks {" + join(g) + "} on machines " +
                      std::to_string(first) + " to " + std::to_string(last) +
                      ": their collectives cross the network. Sizes whose inner products divide "
                      "LOCAL_WORLD_SIZE keep them inside one machine");
        break;
      }
    }
    outer_split = outer_split || dims_[i].size > 1;
  }
  return out;
}

std::string DeviceMesh::describe() const {
  std::string s;
  for (const MeshDim& d : dims_)
    s += (s.empty() ? "" : " x ") + d.name + " " + std::to_string(d.size);
  return s;
}

std::vector<MeshDim> mesh_dims(const MeshSizes& sizes) {
  std::vector<MeshDim> dims;  // Note [parallel dimensions] in core/parallelism.h
  for (const ParallelDim& d : kParallelDims) dims.push_back({std::string(d.name), sizes.*d.size});
  return dims;
}

DeviceMesh parallelism_mesh(const MeshSizes& sizes, int rank, int local_world_size,
                            GroupFactory factory) {
  DeviceMesh mesh = factory
                        ? DeviceMesh(mesh_dims(sizes), rank, local_world_size, std::move(factory))
                        : DeviceMesh(mesh_dims(sizes), rank, local_world_size);
  // Note [context-parallel groups]: the ranks of one cp group hold the same pieces of every model
  // and each computes a partial gradient over its part of the sequence, so the data-parallel
  // engine runs over dp x cp (shards over dp_shard x cp), while the loader and the seeds read "dp".
  mesh.flatten({"dp_replicate", "dp_shard"}, "dp");
  mesh.flatten({"dp_shard", "cp"}, "dp_shard_cp");
  mesh.flatten({"dp_replicate", "dp_shard", "cp"}, "dp_cp");
  // The ranks of one pipeline stage (every rank at pp 1: the world's group): what they check
  // together concerns the same parameters (Note [pp step] in parallel/pp_step.cc).
  mesh.flatten({"dp_replicate", "dp_shard", "cp", "tp"}, "dp_cp_tp");
  return mesh;
}

}  // namespace accel::dist
