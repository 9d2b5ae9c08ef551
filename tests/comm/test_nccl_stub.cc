// A build without CUDA links the NCCL backend's functions (comm/nccl/process_group_nccl_stub.cc)
// and says, when asked for a group, what the build lacks and how to get it.
#include <memory>
#include <string>

#include <doctest/doctest.h>

#include "comm/nccl/process_group_nccl.h"
#include "comm/process_group.h"

using namespace accel;
using namespace accel::dist;

TEST_CASE("nccl stub: no NCCL in this build, and the error says how to get it") {
  CHECK_FALSE(nccl_available());
  std::string msg;
  try {
    new_nccl_group(std::make_shared<MemoryStore>(), 0, 1);
  } catch (const DistError& e) {
    msg = e.what();
  }
  CHECK(msg.find("[nccl]") != std::string::npos);
  CHECK(msg.find("-Dcuda=enabled") != std::string::npos);
  CHECK(msg.find("rank 0 of 1") != std::string::npos);
}
