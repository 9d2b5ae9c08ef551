#include "comm/fingerprint.h"

#include <algorithm>
#include <sstream>
#include <utility>
#include <vector>

#include "core/error.h"

// Note [collective fingerprint]
// Before a collective moves data, each rank contributes a 32-byte Fingerprint (op, dtype,
// element count, root, reduce op, sequence number, and a running hash of all fingerprints so
// far) and every rank compares all of them (verify). How the fingerprints travel is the
// transport's business (Note [fingerprint paths] in comm/gloo/process_group_gloo.cc): on the
// shared-memory segment with the all-reduce's own arrival, or in the first bytes of a control
// channel message. Every rank receives the same table whatever the mismatch, so every rank
// raises the same DistError naming both sides. Mismatched sizes never reach Gloo (whose TCP
// transport aborts the process on a size mismatch). With fingerprint_every = k > 1 only every
// k-th collective is compared; the running hash still reveals a divergence in between, but only
// after the fact. Cost: a few loads and compares per checked collective where the fingerprint
// rides the collective; one small message to every peer where it needs its own exchange (large
// collectives on TCP); measured in docs/dist.md.

namespace accel::dist {

namespace {
uint64_t mix(uint64_t h, uint64_t v) {
  // splitmix64-style combine: cheap and order sensitive.
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h ^= h >> 31;
  h *= 0xbf58476d1ce4e5b9ull;
  return h ^ (h >> 29);
}
uint64_t hash_core(const Fingerprint& f) {
  uint64_t h = mix(0, uint64_t(f.kind) | uint64_t(f.dtype) << 8 | uint64_t(f.reduce) << 16);
  h = mix(h, uint64_t(uint32_t(f.root)));
  h = mix(h, uint64_t(f.numel));
  return mix(h, f.seq);
}

std::string rank_list(const std::vector<int>& ranks) {
  std::ostringstream os;
  os << (ranks.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
  return os.str();
}

}  // namespace

Fingerprint make_fingerprint(OpKind kind, DType dtype, ReduceOp reduce, int root, int64_t numel) {
  Fingerprint f;
  f.kind = uint8_t(kind);
  f.dtype = uint8_t(dtype);
  f.reduce = uint8_t(reduce);
  f.root = root;
  f.numel = numel;
  return f;
}

std::string Fingerprint::describe() const {
  std::ostringstream os;
  auto k = OpKind(kind);
  os << op_kind_name(k) << "(";
  switch (k) {
    case OpKind::AllReduce:
      os << reduce_op_name(ReduceOp(reduce)) << ", " << DType(dtype) << ", " << numel
         << " elements";
      break;
    case OpKind::ReduceScatter:
      os << reduce_op_name(ReduceOp(reduce)) << ", " << DType(dtype) << ", " << numel
         << " elements in";
      break;
    case OpKind::Broadcast:
      os << "root " << root << ", " << DType(dtype) << ", " << numel << " elements";
      break;
    case OpKind::AllGather: os << DType(dtype) << ", " << numel << " elements per rank"; break;
    case OpKind::Barrier: break;
    case OpKind::Send:
    case OpKind::Recv: os << DType(dtype) << ", " << numel << " elements"; break;
  }
  os << ") seq " << seq;
  return os.str();
}

void FingerprintHistory::record(const Fingerprint& fp) { running_ = mix(running_, hash_core(fp)); }

Fingerprint FingerprintHistory::stamp(const Fingerprint& fp) {
  Fingerprint mine = fp;
  mine.running = running_;
  record(fp);
  return mine;
}

void FingerprintHistory::check(ControlPlane& control, const Fingerprint& fp, Milliseconds timeout) {
  const Fingerprint mine = stamp(fp);
  std::vector<Fingerprint> all(static_cast<size_t>(control.size()));
  control.all_gather(&mine, all.data(), sizeof(Fingerprint), timeout);  // PeerError on failure
  verify(all.data(), control.size(), mine);
}

void FingerprintHistory::verify(const Fingerprint* all, int size, const Fingerprint& fp_in) {
  bool same = true, same_history = true;
  for (int r = 0; r < size; ++r) {
    const Fingerprint& f = all[r];
    same = same && f.same_call(all[0]);
    same_history = same_history && f.running == all[0].running;
  }
  if (same && same_history) return;
  // Group ranks by what they called, in rank order: identical text on every rank.
  std::vector<std::pair<const Fingerprint*, std::vector<int>>> groups;
  for (int r = 0; r < size; ++r) {
    auto& f = all[r];
    auto it = std::find_if(groups.begin(), groups.end(), [&](auto& g) {
      return g.first->same_call(f) && g.first->running == f.running;
    });
    if (it == groups.end()) {
      groups.push_back({&f, {r}});
    } else {
      it->second.push_back(r);
    }
  }
  std::ostringstream os;
  std::string op(op_kind_name(OpKind(fp_in.kind)));
  if (same) {
    os << "collective sequences diverged before seq " << fp_in.seq
       << " (calls between fingerprint checks differ; run with fingerprint_every = 1 to find "
          "the first one): ";
    for (size_t i = 0; i < groups.size(); ++i)
      os << (i ? "; " : "") << rank_list(groups[i].second) << " history " << std::hex
         << groups[i].first->running << std::dec;
  } else {
    os << "collective mismatch at seq " << fp_in.seq << ": ";
    for (size_t i = 0; i < groups.size(); ++i)
      os << (i ? "; " : "") << rank_list(groups[i].second) << " called "
         << groups[i].first->describe();
  }
  // Every rank saw the same table: restart the running hash from it so that the group stays
  // in step for the next checks (the mismatch is reported, the data path was never touched).
  uint64_t h = 0;
  for (int r = 0; r < size; ++r) h = mix(h, mix(hash_core(all[r]), all[r].running));
  running_ = h;
  ACCEL_THROW(DistError, op.c_str(), os.str());
}

}  // namespace accel::dist
