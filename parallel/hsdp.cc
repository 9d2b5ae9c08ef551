// Note [hsdp] in parallel/hsdp.h.
#include "parallel/hsdp.h"

#include <algorithm>

#include "core/error.h"
#include "parallel/ddp.h"

namespace accel::dist::hsdp {

namespace {
std::string ranks_str(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ",") + std::to_string(r);
  return "{" + s + "}";
}
}  // namespace

void check_groups(const char* op, const ProcessGroup& shard, const ProcessGroupPtr& replicate) {
  if (!replicate) return;
  ACCEL_CHECK(replicate.get() != &shard, ValueError, op,
              "the replicate group is the shard group itself (", shard.group_name(),
              "): HSDP replicates each shard across the ranks holding the same shard coordinate "
              "(the mesh's dp_replicate group), not across the shard group");
  const std::vector<int>& a = shard.world_ranks();
  const std::vector<int>& b = replicate->world_ranks();
  int common = 0;
  for (int r : b) common += int(std::count(a.begin(), a.end(), r));
  ACCEL_CHECK(common == 1, ValueError, op, "the shard group ", shard.group_name(), " (world ranks ",
              ranks_str(a), ") and the replicate group ", replicate->group_name(), " (world ranks ",
              ranks_str(b), ") share ", common,
              " ranks; HSDP needs them to meet in this rank only (the dp_shard and dp_replicate "
              "groups of one mesh do)");
}

void broadcast_from_first_replica(const ProcessGroupPtr& replicate, const Tensor& t) {
  if (active(replicate)) replicate->broadcast(t, 0);
}

void broadcast_buffers(const ProcessGroupPtr& replicate, const nn::Module& module) {
  if (active(replicate)) broadcast_module_buffers(*replicate, module, 0);
}

void average_across_replicas(const ProcessGroupPtr& replicate, const Tensor& t) {
  if (!active(replicate) || !t.defined() || t.numel() == 0) return;
  NoGradGuard ng;
  if (t.dtype() == kFloat16) {  // divide first: a sum of R fp16 gradients may overflow
    Tensor x = t;               // a handle: divides the caller's tensor in place
    x.div_(double(replicate->size()));
    replicate->all_reduce(t, ReduceOp::Sum);
  } else {
    replicate->all_reduce(t, ReduceOp::Avg);
  }
}

}  // namespace accel::dist::hsdp
