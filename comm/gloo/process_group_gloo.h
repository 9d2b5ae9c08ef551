// Gloo backend: CPU tensors over Gloo's TCP transport.
#pragma once

#include <array>
#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <thread>

#include "comm/control_plane.h"
#include "comm/fingerprint.h"
#include "comm/heartbeat.h"
#include "comm/init_guard.h"
#include "comm/process_group.h"
#include "comm/shm_allreduce.h"

namespace gloo {
class Context;
namespace rendezvous {
class Store;
}
namespace transport {
class Device;
}
}  // namespace gloo

namespace accel::dist {

// Lets Gloo's rendezvous (connectFullMesh) run over our store.
std::unique_ptr<gloo::rendezvous::Store> make_gloo_store(std::shared_ptr<Store> store);

// A fully connected Gloo context for `size` ranks (size > 1), keys under `store`.
// Throws DistError when the peers do not show up within `timeout`, or as soon as `guard` (when
// given) fails (Note [init guard]).
std::shared_ptr<gloo::Context> connect_gloo_context(const std::shared_ptr<Store>& store, int rank,
                                                    int size, const std::string& hostname,
                                                    Milliseconds timeout,
                                                    InitGuard* guard = nullptr);
// The TCP socket of a context made by connect_gloo_context to `peer`, or -1 (for TCP_INFO:
// Note [progress watchdog]; the descriptor stays Gloo's).
int gloo_socket_fd(gloo::Context& ctx, int peer);
// Fails every pending send/receive of `ctx` at once and closes its connections.
void abort_gloo_context(gloo::Context& ctx);

class ProcessGroupGloo final : public ProcessGroup {
 public:
  ProcessGroupGloo(std::shared_ptr<Store> store, int rank, int size, ProcessGroupOptions options);
  ~ProcessGroupGloo() override;

  std::string_view backend() const override { return "gloo"; }
  WorkPtr all_reduce_async(const Tensor& t, ReduceOp op) override;
  WorkPtr broadcast_async(const Tensor& t, int root) override;
  WorkPtr all_gather_async(const Tensor& out, const Tensor& in) override;
  WorkPtr reduce_scatter_async(const Tensor& out, const Tensor& in, ReduceOp op) override;
  WorkPtr barrier_async() override;
  void all_reduce(const Tensor& t, ReduceOp op) override;
  void broadcast(const Tensor& t, int root) override;
  void all_gather(const Tensor& out, const Tensor& in) override;
  void reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) override;
  void barrier() override;
  WorkPtr send_async(const Tensor& t, int dst, int tag) override;
  WorkPtr recv_async(const Tensor& t, int src, int tag) override;
  uint64_t next_seq() const override { return seq_.load(); }
  std::shared_ptr<Store> group_store() const override { return store_; }
  // A Gloo group of `members` (Note [subgroups] in comm/subgroups.cc), keys under store_name in
  // this group's store.
  ProcessGroupPtr form_subgroup(const std::vector<int>& members, const std::string& store_name,
                                ProcessGroupOptions options) override;

  // Whether all_reduce goes through shared memory (every rank on one host).
  bool uses_shm() const { return shm_ != nullptr; }
  // The underlying context (null for size 1), e.g. for a raw-Gloo baseline in benchmarks.
  const std::shared_ptr<gloo::Context>& context() const { return ctx_; }
  // Time the worker spent checking fingerprints: the comparison where the fingerprint rides a
  // collective's own arrival or message, the whole exchange where it needs one of its own.
  double fingerprint_seconds() const { return fingerprint_ns_.load() * 1e-9; }
  int64_t fingerprint_checks() const { return fingerprint_checks_.load(); }
  // Why the group failed (a lost peer, a timeout, ...), empty while it is healthy.
  std::string failure_message() const override { return broken_message(); }
  // The heartbeat, or null (size 1, or disabled).
  const Heartbeat* heartbeat() const { return heartbeat_.get(); }
  // One pass of the progress watchdog (Note [progress watchdog]); the heartbeat thread runs it
  // every interval. Public for tests.
  void check_progress();

 private:
  // A collective small enough to travel with its fingerprint over the control plane (TCP
  // groups only, Note [fingerprint paths]): what this rank sends, and how the received
  // messages (rank order, fingerprint stripped) become the result.
  struct Small {
    const void* payload = nullptr;
    size_t bytes = 0;
    std::function<void(const std::vector<std::string>& messages)> combine;
  };
  struct Task {
    WorkPtr work;
    Fingerprint fp;
    Milliseconds timeout;
    std::function<void(uint64_t seq, Milliseconds timeout)> body;
    Small small;  // combine set: runs instead of body
  };
  // Queues a task and wakes the worker, except inside a blocking call, whose caller waits at
  // once and runs it inline when it is next (Note [inline execution]).
  WorkPtr enqueue(Fingerprint fp, std::function<void(uint64_t, Milliseconds)> body, Small small);
  WorkPtr enqueue(Fingerprint fp, std::function<void(uint64_t, Milliseconds)> body);
  // Whether a collective of `bytes` per rank goes over the control plane (Small).
  bool small_path(size_t bytes) const;
  // The control-plane exchange of run_task on a TCP group: fingerprints (and Small payloads).
  void exchange_control(Task& task, bool checked);
  void worker_loop();
  void run_task(Task& task);
  // Records the first transport failure; afterwards every operation fails with it.
  void mark_broken(const std::string& msg);
  // The heartbeat lost a peer, or a peer said it failed: ends the group's formation while it
  // runs (init_guard_), marks the group failed after.
  void on_peer_lost(int peer, const std::string& message);
  // A subgroup's message with the group and its world ranks added, unless it names the group.
  std::string with_group(const std::string& msg) const;
  std::string broken_message() const;
  // `symptom`, preceded by the group's recorded failure when there is one.
  std::string cause_of(const std::string& symptom) const;

  // Collective bodies (worker thread).
  void ring_reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op, uint64_t seq,
                           Milliseconds timeout);

  // Runs w's task in the calling thread when it is next and nothing runs; false otherwise.
  bool try_run_inline(const Work* w);

  friend class GlooP2PWork;
  friend class GlooWork;

  ProcessGroupOptions options_;
  std::shared_ptr<Store> store_;
  std::shared_ptr<gloo::transport::Device> device_;
  // Before the members its hooks touch, so that it outlives them (Note [init guard]).
  InitGuard init_guard_;
  std::atomic<bool> initialized_{false};
  std::shared_ptr<gloo::Context> ctx_;
  std::unique_ptr<ControlPlane> control_;  // fingerprints, barrier, abort notices
  std::unique_ptr<ShmAllReduce> shm_;      // same-host all-reduce; null: Gloo's TCP ring
  std::unique_ptr<Heartbeat> heartbeat_;   // null: size 1 or disabled
  // Progress watchdog (heartbeat thread only): per peer and socket (Gloo, control), the bytes
  // acknowledged when last seen and since when they have not moved while data was outstanding.
  struct Flow {
    uint64_t acked = 0;
    std::chrono::steady_clock::time_point since{};
    bool stalled = false;
  };
  std::vector<std::array<Flow, 2>> flows_;
  std::chrono::steady_clock::time_point last_progress_check_{};

  std::atomic<uint64_t> seq_{0};
  FingerprintHistory history_;  // worker thread only
  // The running task's stamped fingerprint, and whether its shared-memory all-reduce compares
  // it (Note [fingerprint paths]); worker thread (or inline waiter) only.
  Fingerprint stamp_;
  bool stamp_check_ = false;
  // With stamp_check_: compares the stamps of a shared-memory collective's first arrival.
  const ShmAllReduce::StampCheck* shm_check();
  ShmAllReduce::StampCheck shm_verify_;
  std::vector<uint8_t> scratch_;  // worker thread only

  mutable std::mutex broken_mu_;
  std::string broken_;

  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<Task> queue_;
  bool stop_ = false;
  bool busy_ = false;  // a task is running (on the worker or inline in a waiter)
  std::thread worker_;

  std::mutex p2p_mu_;
  std::map<std::pair<int, int>, uint64_t> send_count_, recv_count_;  // (peer, tag) -> n

  std::atomic<int64_t> fingerprint_ns_{0};
  std::atomic<int64_t> fingerprint_checks_{0};
};

}  // namespace accel::dist
