// NCCL backend: CUDA tensors, one communicator per group on a dedicated high-priority stream.
// Compiled only when the CUDA backend is (cuda_enabled); it registers itself as backend "nccl"
// for init_process_group. Other builds compile process_group_nccl_stub.cc instead.
//
// - The NCCL unique id travels through the store (key "nccl/uid" under the group's prefix).
// - Collectives are queued on the group's stream after an event from the caller's current
//   stream, so they see the values computed before the call; wait() makes the caller's current
//   stream wait for the collective and blocks the host until it finished or the timeout passed.
//   Tensors used by a collective are marked as used on the group's stream for the allocator.
// - The communicator is non-blocking; a collective that does not finish within the timeout, or
//   an asynchronous NCCL error, aborts the communicator (ncclCommAbort) and raises DistError
//   naming the op and its sequence number; the group is unusable afterwards.
// - Fingerprints (comm/gloo/process_group_gloo.h) are compared over the CPU control channel
//   before each collective is queued.
// - send/recv are plain ncclSend/ncclRecv (no header check: sizes must match).
#pragma once

#include "comm/process_group.h"

namespace accel::dist {

// Creates an NCCL group on the calling thread's current CUDA device. In a build without NCCL
// (comm/nccl/process_group_nccl_stub.cc) it raises DistError saying so (kNoNcclBuild).
ProcessGroupPtr new_nccl_group(std::shared_ptr<Store> store, int rank, int size,
                               ProcessGroupOptions options = {});
// Whether this build has the NCCL backend (false: the stub).
bool nccl_available();

}  // namespace accel::dist
