// Collective fingerprints: what every rank compares before a collective moves data, so that
// mismatched calls raise a clear error on every rank instead of hanging or corrupting memory.
// See Note [collective fingerprint] in fingerprint.cc.
#pragma once

#include <cstdint>
#include <string>

#include "comm/control_plane.h"
#include "comm/process_group.h"

namespace accel::dist {

struct Fingerprint {
  uint8_t kind = 0;    // OpKind
  uint8_t dtype = 0;   // DType
  uint8_t reduce = 0;  // ReduceOp, 0 when not a reduction
  uint8_t pad = 0;
  int32_t root = -1;  // broadcast root, else -1
  int64_t numel = 0;  // elements of the per-rank input
  uint64_t seq = 0;
  uint64_t running = 0;  // hash of every fingerprint before this one (filled by the history)
  // "all_reduce(sum, float32, 1000 elements) seq 7"
  std::string describe() const;
  bool same_call(const Fingerprint& o) const {
    return kind == o.kind && dtype == o.dtype && reduce == o.reduce && root == o.root &&
           numel == o.numel && seq == o.seq;
  }
};
static_assert(sizeof(Fingerprint) == 32);

Fingerprint make_fingerprint(OpKind kind, DType dtype, ReduceOp reduce, int root, int64_t numel);

// The running hash of one group's collectives, on the thread that runs them in order.
class FingerprintHistory {
 public:
  // A collective that is not exchanged (fingerprint_every > 1) still enters the hash.
  void record(const Fingerprint& fp);
  // fp with `running` set to the hash of everything before it; records fp. What a rank
  // publishes for a collective (over the control plane or with its shared-memory arrival).
  Fingerprint stamp(const Fingerprint& fp);
  // Compares every rank's stamped fingerprint (`all`, rank order, `size` of them; `mine` is
  // this rank's, from stamp()). Throws DistError naming both sides on a mismatch; every rank
  // sees the same table, so every rank raises the same text, and the history is
  // re-synchronised from the table (the group stays usable).
  void verify(const Fingerprint* all, int size, const Fingerprint& mine);
  // stamp(), an all-gather over `control`, verify(). PeerError when a peer does not answer.
  void check(ControlPlane& control, const Fingerprint& fp, Milliseconds timeout);

 private:
  uint64_t running_ = 0;
};

}  // namespace accel::dist
