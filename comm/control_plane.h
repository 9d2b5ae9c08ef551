// ControlPlane: small control messages between the ranks of a process group over plain TCP
// (a full mesh, set up through the store), apart from the data transport. The collective
// fingerprint exchange runs here because one message on a blocking socket costs a fraction of a
// message through Gloo's event loop (two thread hops and a rendezvous per message); it also
// names the rank that did not answer, and carries abort notices so that peers learn why a group
// failed. Used by one thread at a time (the group's worker or an inline waiter).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "comm/store.h"

namespace accel::dist {

// A peer died, stopped answering or aborted: the group is unusable afterwards.
class PeerError : public DistError {
 public:
  using DistError::DistError;
};

class InitGuard;

class ControlPlane {
 public:
  // Collective: every rank of the group constructs one with the same store (keys "ctl/<rank>").
  // Every wait is bounded by `timeout`, or with a `guard` by the guard's deadline, and ends
  // within 100 ms once the guard failed (Note [init guard]).
  ControlPlane(const std::shared_ptr<Store>& store, int rank, int size, const std::string& hostname,
               Milliseconds timeout, const InitGuard* guard = nullptr);
  ~ControlPlane();
  ControlPlane(const ControlPlane&) = delete;
  ControlPlane& operator=(const ControlPlane&) = delete;

  // All-gather of `bytes` per rank: out[r * bytes, (r + 1) * bytes) = rank r's `mine`.
  // Throws PeerError naming the rank(s) that did not answer in time, closed their connection,
  // or sent an abort notice.
  void all_gather(const void* mine, void* out, size_t bytes, Milliseconds timeout);
  // All-gather of messages of any size up to max_bytes: out[r] = rank r's message (this rank's
  // is `mine`, n bytes). A larger message from a peer is a PeerError (nothing is sized from it).
  void all_gather_v(const void* mine, size_t n, std::vector<std::string>& out, size_t max_bytes,
                    Milliseconds timeout);
  // Best effort: tells every peer why this rank gives up, then closes all connections.
  void abort(const std::string& reason);

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The connection to `peer` (-1 for this rank or once closed), for TCP_INFO (Note [progress
  // watchdog]); the descriptor stays owned by the control plane.
  int socket_fd(int peer) const { return peer >= 0 && peer < size_ ? fds_[size_t(peer)] : -1; }

 private:
  int rank_, size_;
  std::vector<int> fds_;  // per peer; -1 for this rank and after close
};

}  // namespace accel::dist
