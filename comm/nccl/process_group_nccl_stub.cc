// The NCCL backend of a build without CUDA (-Dcuda=disabled, or no toolkit found): the same
// functions as comm/nccl/process_group_nccl.cc, so a program that names the backend links in
// every build and learns at run time, in words, what its build lacks. It registers no backend:
// init_process_group(backend "nccl") says the same (kNoNcclBuild).
#include "comm/nccl/process_group_nccl.h"

#include "core/error.h"

namespace accel::dist {

bool nccl_available() { return false; }

ProcessGroupPtr new_nccl_group(std::shared_ptr<Store> store, int rank, int size,
                               ProcessGroupOptions options) {
  (void)store;
  (void)options;
  ACCEL_THROW(DistError, "nccl", "cannot create a group for rank ", rank, " of ", size, ": ",
              kNoNcclBuild);
}

}  // namespace accel::dist
