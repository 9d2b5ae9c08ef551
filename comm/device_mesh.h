// dist::DeviceMesh: the world's ranks arranged as an array with named dimensions (torch's
// DeviceMesh), the layout that hybrid sharding and tensor parallelism run on (docs/parallelism.md).
//
//   auto mesh = dist::parallelism_mesh({.dp_replicate = 2, .dp_shard = 2, .tp = 2}, env.rank,
//                                      env.local_world_size);
//   mesh.size("tp");              // 2
//   mesh.coordinate("dp_shard");  // this rank's index along dp_shard
//   mesh.group_ranks("tp");       // the world ranks of this rank's tp group: {6, 7} on rank 7
//   mesh.group_ranks("dp");       // flattened dp_replicate x dp_shard: {1, 3, 5, 7} on rank 7
//
// Note [mesh layout]
// Ranks fill the mesh in row-major order, the last dimension innermost: with dimensions
// (d0, ..., dk) of sizes (n0, ..., nk), rank = sum_i c_i * stride_i with stride_k = 1 and
// stride_i = stride_{i+1} * n_{i+1}. The ranks of one group along the innermost dimension are
// therefore consecutive. accel-run (and torchrun) number ranks machine by machine (machine m
// holds ranks [m * L, (m + 1) * L), L = LOCAL_WORLD_SIZE), so the innermost dimensions stay inside
// a machine: parallelism_mesh() orders dp_replicate, dp_shard, tp, and tp, whose collectives run
// in every layer, shares a machine first, then dp_shard (a reduce-scatter and an all-gather per
// unit), while dp_replicate (one all-reduce of a shard per step) crosses machines. Dimensions of
// size 1 are kept, so every name always exists.
//
// Note [mesh placement]
// A size that does not divide the machine (tp 3 on machines of 4 processes, or dp_shard x tp 8 on
// machines of 4 with dp_replicate 2) is allowed: the mesh is still correct, only slower, since
// some groups then span machines and their collectives cross the network. placement_warnings()
// says which dimension does so and an example group; the Accelerator prints them on the main
// process. A dimension is only reported when a dimension outside it has more than one rank (when
// the layout could have put that one across machines instead): dp_shard over the whole world of
// several machines, today's ZeRO, is not worth a warning.
//
// Note [mesh groups]
// The mesh constructed with a GroupFactory holds one process group per dimension: for every
// dimension in order (then every flattened one when it is flattened), it calls the factory once
// for every group along that dimension, in the order of groups(dim) (ascending first rank), on
// every rank alike, and keeps the group this rank belongs to. That is the order torch's
// new_group needs (every process calls it for every group); a factory whose groups are created
// by their members only returns null for the groups without this rank (the mesh ignores what it
// returns for those). Constructing such a mesh is therefore collective: every rank must construct
// it with the same dimensions, as every rank must call flatten() alike.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "comm/process_group.h"
#include "core/parallelism.h"

namespace accel::dist {

struct MeshDim {
  std::string name;  // [a-z0-9_]+, unique in the mesh
  int size = 1;      // >= 1
};

// The process group of `ranks` (world ranks, ascending); called by the mesh as Note [mesh groups]
// says. May return null for a group the calling rank is not in.
using GroupFactory = std::function<ProcessGroupPtr(const std::vector<int>& ranks)>;

class DeviceMesh {
 public:
  // Layout only: coordinates and the ranks of groups, no process groups (group() is an error).
  // `local_world_size`: processes per machine (DistEnv::local_world_size), for
  // placement_warnings(). The product of the sizes is the world size; `rank` lies in it.
  DeviceMesh(std::vector<MeshDim> dims, int rank, int local_world_size);
  // With the process group of every dimension from `factory` (Note [mesh groups]; collective).
  DeviceMesh(std::vector<MeshDim> dims, int rank, int local_world_size, GroupFactory factory);

  int world_size() const { return world_; }
  int rank() const { return rank_; }
  int local_world_size() const { return local_world_size_; }
  // The dimensions given at construction, outermost first (flattened ones are not among them).
  const std::vector<MeshDim>& dims() const { return dims_; }
  // A dimension given at construction or flattened.
  bool has_dim(std::string_view dim) const;
  int size(std::string_view dim) const;
  // This rank's (or `rank`'s) index along `dim`; along a flattened dimension the row-major index
  // over the dimensions it flattens.
  int coordinate(std::string_view dim) const { return coordinate(dim, rank_); }
  int coordinate(std::string_view dim, int rank) const;
  // One index per dimension of dims(), and back (Note [mesh layout]).
  std::vector<int> coordinates(int rank) const;
  int rank_at(const std::vector<int>& coordinates) const;
  // The world ranks of the group of this rank (or `rank`) along `dim`, ascending: the ranks whose
  // coordinates differ from its own along `dim` only (along the dimensions `dim` flattens).
  std::vector<int> group_ranks(std::string_view dim) const { return group_ranks(dim, rank_); }
  std::vector<int> group_ranks(std::string_view dim, int rank) const;
  // Every group along `dim`, ordered by first rank: they partition the world.
  std::vector<std::vector<int>> groups(std::string_view dim) const;
  // torch's mesh[dims]._flatten(name): a new dimension over `dims` (given in mesh order), of
  // their sizes' product; `name` empty: the names joined by '_'. With groups, collective (Note
  // [mesh groups]).
  void flatten(const std::vector<std::string>& dims, std::string name = "");
  // Whether the mesh holds process groups (constructed with a factory).
  bool has_groups() const { return static_cast<bool>(factory_); }
  // This rank's process group along `dim`; ValueError on a layout-only mesh.
  const ProcessGroupPtr& group(std::string_view dim) const;
  // Note [mesh placement]: one message per dimension whose groups span machines needlessly.
  std::vector<std::string> placement_warnings() const;
  // "dp_replicate 2 x dp_shard 2 x tp 2"
  std::string describe() const;

 private:
  struct Named {
    std::string name;
    int size = 1;
    std::vector<int> over;  // indices into dims_, ascending
    ProcessGroupPtr group;  // this rank's, when the mesh has groups
  };
  const Named& find(std::string_view dim, const char* op) const;
  void check_rank(int rank, const char* op) const;
  void make_groups(Named& d);
  std::vector<int> group_ranks_of(const Named& d, int rank) const;
  std::vector<std::vector<int>> groups_of(const Named& d) const;

  std::vector<MeshDim> dims_;
  std::vector<int> strides_;  // per dims_ entry
  std::vector<Named> named_;  // dims_ in order, then the flattened ones
  int rank_ = 0, world_ = 1, local_world_size_ = 1;
  GroupFactory factory_;
};

// The dimensions of a ParallelismConfig's mesh, outermost first: dp_replicate, dp_shard, tp
// (sizes of 1 kept).
std::vector<MeshDim> mesh_dims(const MeshSizes& sizes);
// That mesh with "dp" (dp_replicate x dp_shard: the ranks that see different data) flattened;
// layout only without a factory.
DeviceMesh parallelism_mesh(const MeshSizes& sizes, int rank, int local_world_size,
                            GroupFactory factory = {});

}  // namespace accel::dist
