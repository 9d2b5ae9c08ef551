// One rank of the format-2 checkpoint tests (test_checkpoint_format.cc, run by run_world):
//   ckpt_worker save <dir>       every rank's pieces of three tensors, save_pieces over the Gloo
//                                world: qkv [12, 4] Shard(0, chunks=3), rep [5] Replicate (rank 0
//                                primary), flat [7, 3] Flat; each element's value is its global
//                                offset (the test process reads the checkpoint back)
//   ckpt_worker save_fail <dir>  the same with a bad entry on rank 1: rank 1 raises its
//                                ValueError, rank 0 an IoError naming rank 1, no index.json
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "core/tensor.h"
#include "parallel/checkpoint/writer.h"
#include "tests/common/util.h"
#include "tests/common/worker_check.h"

using namespace accel;
using namespace accel::dist;
using accel::test::contains;
using accel::test::g_failures;
using accel::test::g_rank;

namespace {

// The local tensor of `region`: each element its global offset (float64).
Tensor offsets_of(const Region& region) {
  std::vector<double> v(size_t(region.numel()), -1.0);
  region.for_each_run([&](const Run& r) {
    for (int64_t k = 0; k < r.n; ++k) v[size_t(r.local + k)] = double(r.global + k);
  });
  return tensor(v, region.local_shape(), TensorOptions(kFloat64));
}

std::vector<ckpt::StateEntry> entries_of(int rank, int world, bool bad) {
  std::vector<ckpt::StateEntry> out;
  const Region qkv = Region::whole({12, 4}).shard(0, 3, world, rank);
  out.push_back({"qkv", qkv, offsets_of(qkv), true, "tp: Shard(0, chunks=3)"});
  const Region rep = Region::whole({5});
  out.push_back({"rep", rep, offsets_of(rep), rank == 0, "dp: Replicate"});
  const Chunk c = shard_chunk(21, world, rank);
  const Region flat = Region::whole({7, 3}).flat(c.begin, c.begin + c.length);
  out.push_back({"flat", flat, offsets_of(flat), true, "dp_shard: Flat"});
  if (bad) out.back().local = zeros({c.length + 1}, TensorOptions(kFloat64));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: ckpt_worker save|save_fail <dir>\n";
    return 2;
  }
  const std::string scenario = argv[1], dir = argv[2];
  try {
    InitOptions io;
    io.timeout = std::chrono::milliseconds(30000);
    auto pg = init_process_group(io);
    g_rank = pg->rank();
    const int w = pg->size(), r = pg->rank();
    if (scenario == "save") {
      const ckpt::Index idx =
          ckpt::save_pieces(dir, pg.get(), r, entries_of(r, w, false), {{"step", 3}});
      if (r == 0) {
        WCHECK(idx.files.size() == size_t(w), "files " << idx.files.size());
        WCHECK(idx.tensors.at("rep").pieces.size() == 1, "rep pieces");
      }
    } else if (scenario == "save_fail") {
      std::string msg = "no error";
      try {
        ckpt::save_pieces(dir, pg.get(), r, entries_of(r, w, r == 1), {{"step", 3}});
      } catch (const Error& e) {
        msg = e.what();
      }
      if (r == 0) WCHECK(contains(msg, "rank 1 could not write its pieces"), msg);
      if (r == 1) WCHECK(contains(msg, "the local tensor is"), msg);
      if (r == 2) WCHECK(msg == "no error", msg);
      pg->barrier();
      WCHECK(!std::filesystem::exists(dir + "/index.json"), "index.json written");
    } else {
      std::cerr << "unknown scenario " << scenario << "\n";
      return 2;
    }
    if (g_failures == 0) std::cout << "rank " << g_rank << " ok " << scenario << std::endl;
    pg->barrier();
    pg.reset();
    destroy_process_group();
  } catch (const std::exception& e) {
    std::cout << "rank " << g_rank << " unexpected exception: " << e.what() << std::endl;
    return 2;
  }
  return g_failures == 0 ? 0 : 1;
}
