// ProcessGroup: collectives over a fixed set of ranks, with async work handles.
//
// Semantics shared by every backend (see docs/dist.md):
// - Collectives run in issue order on one worker per group, so async handles complete in the
//   order they were issued on every rank and results are deterministic.
// - Each collective gets a sequence number (0, 1, 2, ...), the same on every rank. Before it
//   moves data, a fingerprint (op, dtype, element count, root, seq) is compared across ranks
//   (every `fingerprint_every` collectives); a mismatch raises DistError on every rank naming
//   both sides, instead of a hang or corrupted memory.
// - Every collective has a timeout (default 5 minutes). A peer that died, or stopped answering,
//   becomes a DistError naming the op and its sequence number on every surviving rank. After
//   such a failure the group is unusable: later calls fail at once with the first error.
// - Tensors are modified in place and must stay alive until the handle completes (the handle
//   keeps a reference, so this holds unless the caller resizes storage underneath).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"
#include "comm/store.h"

namespace accel::dist {

enum class ReduceOp : uint8_t { Sum, Avg, Max, Min };
std::string_view reduce_op_name(ReduceOp op);

enum class OpKind : uint8_t {
  AllReduce,
  Broadcast,
  AllGather,
  ReduceScatter,
  Barrier,
  Send,
  Recv,
};
std::string_view op_kind_name(OpKind k);

constexpr Milliseconds kDefaultCollectiveTimeout{std::chrono::minutes(5)};
// Heartbeat defaults: every rank raises within ~15 s of a peer stopping, far below the
// collective timeout, with 15 missed beats of slack for a loaded machine.
constexpr Milliseconds kDefaultHeartbeatTimeout{std::chrono::seconds(15)};
constexpr Milliseconds kDefaultHeartbeatInterval{std::chrono::seconds(1)};

struct ProcessGroupOptions {
  Milliseconds timeout = kDefaultCollectiveTimeout;
  // Bound on forming the group (every step together: addresses, connections, shared memory);
  // 0: `timeout`. When init_deadline is set, the formation ends by it instead (init_process_group
  // passes its own deadline, so that reaching the store and forming the group share one timeout),
  // and messages still name init_timeout (or timeout).
  Milliseconds init_timeout{0};
  std::chrono::steady_clock::time_point init_deadline{};
  // Compare collective fingerprints across ranks before every k-th collective (1 = all of
  // them, 0 = never). With k > 1 the check also covers the skipped ones through a running
  // hash, but a mismatch in between can no longer be stopped before it moves data.
  int fingerprint_every = 1;
  // Gloo: the address this rank's transport, control channel and heartbeat bind and advertise.
  // init_process_group picks it from the environment (comm/net.h: select_bind_address).
  std::string hostname = "127.0.0.1";
  // Heartbeat (comm/heartbeat.h): a peer silent for heartbeat_timeout marks the group failed,
  // so in-flight and later collectives raise naming it, long before `timeout`; it runs from the
  // start of the group's formation, so a peer lost meanwhile ends that too. It also drives the
  // progress watchdog (Note [progress watchdog]): a connection to a peer whose outstanding data
  // has not been acknowledged for heartbeat_timeout fails the group. 0 disables both.
  // Env ACCEL_HEARTBEAT_TIMEOUT (seconds) sets it for init_process_group.
  Milliseconds heartbeat_timeout = kDefaultHeartbeatTimeout;
  Milliseconds heartbeat_interval = kDefaultHeartbeatInterval;  // at most heartbeat_timeout / 4
  // Gloo ring all-reduce segment size in bytes (0: Gloo's default, 1 MiB). Each segment costs a
  // send/receive rendezvous, so larger segments cut per-message overhead on slow-wakeup hosts.
  size_t gloo_segment_bytes = size_t(4) << 20;
  // All-reduce, all-gather and reduce-scatter through shared memory when every rank maps the
  // same segment (one host); see comm/shm_allreduce.h. Env ACCEL_DIST_SHM=0 turns it off for
  // init_process_group.
  bool shm = true;
  size_t shm_slot_bytes = size_t(4) << 20;  // per rank; tensors are reduced in chunks of this
  // Keys of this group live under "<name>/" in the store; empty picks "pg<N>", N counting
  // groups created in this process (equal on every rank when ranks create groups in the
  // same order, which collectives require anyway).
  std::string name;
  // Groups made by new_group / split (Note [subgroups] in comm/subgroups.cc) may use shared
  // memory when their own ranks share a host, even where this group cannot (ranks on several
  // hosts); init_process_group sets it false when the user turned shared memory off.
  bool shm_subgroups = true;
  // Set by new_group / split for the groups they form (leave them empty otherwise): the group's
  // name in messages ("world/sub0[0,2]") and the world rank of each of its ranks, in group rank
  // order. Empty: the name is `name` (or "pg<N>"), and group ranks are world ranks.
  std::string label;
  std::vector<int> world_ranks;
};

// Handle of an issued operation.
class Work {
 public:
  Work(OpKind kind, uint64_t seq) : kind_(kind), seq_(seq) {}
  virtual ~Work() = default;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // Blocks until the operation finished; rethrows its DistError. May be called repeatedly.
  virtual void wait();
  bool is_completed() const;
  OpKind kind() const { return kind_; }
  uint64_t seq() const { return seq_; }

  // Backends: mark done (with an error or not) and wake waiters.
  void finish(std::exception_ptr error = nullptr);
  // When the operation started moving data and when it finished (for overlap statistics);
  // default-constructed until then.
  using TimePoint = std::chrono::steady_clock::time_point;
  void mark_started() { started_at_ = std::chrono::steady_clock::now(); }
  TimePoint started_at() const { return started_at_; }
  TimePoint finished_at() const;

 protected:
  const OpKind kind_;
  const uint64_t seq_;
  std::atomic<TimePoint> started_at_{TimePoint{}};
  TimePoint finished_at_{};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};
using WorkPtr = std::shared_ptr<Work>;

class ProcessGroup;
using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

class ProcessGroup {
 public:
  ProcessGroup(int rank, int size) : rank_(rank), size_(size) {
    for (int r = 0; r < size; ++r) world_ranks_.push_back(r);
  }
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual std::string_view backend() const = 0;

  // t: any shape, in place. Avg needs a floating dtype.
  virtual WorkPtr all_reduce_async(const Tensor& t, ReduceOp op = ReduceOp::Sum) = 0;
  // t: same shape on every rank; root's values land everywhere.
  virtual WorkPtr broadcast_async(const Tensor& t, int root) = 0;
  // in: n elements; out: size() * n elements, rank r's input at [r * n, (r + 1) * n).
  virtual WorkPtr all_gather_async(const Tensor& out, const Tensor& in) = 0;
  // in: size() * n elements; out: n elements, the reduction of everyone's chunk rank().
  virtual WorkPtr reduce_scatter_async(const Tensor& out, const Tensor& in,
                                       ReduceOp op = ReduceOp::Sum) = 0;
  virtual WorkPtr barrier_async() = 0;
  // Point to point. Posted at once (not queued behind collectives), so symmetric exchanges
  // do not deadlock; matched in order per (peer, tag). The receiver checks dtype and element
  // count against the sender's and both sides raise on a mismatch.
  virtual WorkPtr send_async(const Tensor& t, int dst, int tag = 0) = 0;
  virtual WorkPtr recv_async(const Tensor& t, int src, int tag = 0) = 0;

  // Blocking forms. Virtual so a backend can run them without a thread handoff.
  virtual void all_reduce(const Tensor& t, ReduceOp op = ReduceOp::Sum) {
    all_reduce_async(t, op)->wait();
  }
  virtual void broadcast(const Tensor& t, int root) { broadcast_async(t, root)->wait(); }
  virtual void all_gather(const Tensor& out, const Tensor& in) {
    all_gather_async(out, in)->wait();
  }
  virtual void reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op = ReduceOp::Sum) {
    reduce_scatter_async(out, in, op)->wait();
  }
  virtual void barrier() { barrier_async()->wait(); }
  void send(const Tensor& t, int dst, int tag = 0) { send_async(t, dst, tag)->wait(); }
  void recv(const Tensor& t, int src, int tag = 0) { recv_async(t, src, tag)->wait(); }

  Milliseconds timeout() const { return timeout_; }
  // Applies to collectives issued afterwards.
  void set_timeout(Milliseconds t);
  // Number of collectives issued so far (the next one gets this sequence number).
  virtual uint64_t next_seq() const = 0;
  // Payload bytes this rank has handed to operations issued on this group so far: an all-reduce
  // counts its tensor, a broadcast its tensor on the root (0 elsewhere), an all-gather and a
  // reduce-scatter their input, a send its tensor; receives and barriers count nothing. It is
  // what the caller asked to move, not the wire bytes of the algorithm (a ring all-reduce of b
  // bytes puts 2 (n - 1) / n * b on each link). One relaxed atomic add per operation; HSDP's
  // cross-replica traffic is read from it (docs/parallelism.md).
  uint64_t bytes_sent() const { return bytes_sent_.load(std::memory_order_relaxed); }

  // ---- identity and subgroups (Note [subgroups] in comm/subgroups.cc) ----
  // "world" for init_process_group's group, "world/sub0[0,2]" for a group made by new_group or
  // split (the parent's name, the creation number, the world ranks in group order).
  const std::string& group_name() const { return group_name_; }
  // The world rank of each rank of this group, in group rank order (0..size-1 unless this group
  // was made by new_group / split).
  const std::vector<int>& world_ranks() const { return world_ranks_; }
  bool is_subgroup() const { return subgroup_; }
  // For messages: empty for a top-level group, " of group world/sub0[0,2] (its ranks 0,1 are
  // world ranks 0,2)" for a subgroup.
  std::string group_context() const;

  // As MPI_Comm_split: collective over this group, every rank calls it. Ranks passing the same
  // color >= 0 form one new group, ranked by key, then by their rank here; color < 0 joins no
  // group and gets null. Same backend, timeout, fingerprint checks and heartbeat as this group.
  ProcessGroupPtr split(int color, int key);

  // Why the group failed (a lost peer, a timeout, ...); empty while it is healthy, or when the
  // backend does not track it.
  virtual std::string failure_message() const { return {}; }
  // This group's store (its keys under its prefix), null for a group of one rank. new_group and
  // split meet there (Note [subgroup rendezvous]).
  virtual std::shared_ptr<Store> group_store() const { return nullptr; }
  // Backend hook of new_group and split: forms the group of `members` (ranks of this group, in
  // the new group's rank order; this rank among them), with keys under `store_name` in this
  // group's store and `options` merged with this group's (inherit_options). Collective over the
  // members. The default raises DistError: the backend cannot make subgroups.
  virtual ProcessGroupPtr form_subgroup(const std::vector<int>& members,
                                        const std::string& store_name, ProcessGroupOptions options);
  // new_group / split calls made on this group so far (the next one's number; equal on every
  // rank when they make them in the same order, which both require). Used by those two only.
  uint64_t take_subgroup_number() { return subgroups_made_++; }

 protected:
  // Backends call it as each operation is issued (bytes_sent()).
  void count_sent(size_t bytes) { bytes_sent_.fetch_add(bytes, std::memory_order_relaxed); }
  // Backends call it from their constructor with their options (label, world_ranks).
  void set_identity(const ProcessGroupOptions& options, const std::string& default_name);

  const int rank_;
  const int size_;
  Milliseconds timeout_ = kDefaultCollectiveTimeout;

 private:
  std::string group_name_;
  std::vector<int> world_ranks_;
  bool subgroup_ = false;
  std::atomic<uint64_t> subgroups_made_{0};
  std::atomic<uint64_t> bytes_sent_{0};
};

// ---- subgroups (Note [subgroups] in comm/subgroups.cc; docs/dist.md "Subgroups") ----
// As torch.distributed.new_group: collective over the default group, every rank of the world
// calls it with the same list of world ranks (empty: every rank), in the same order as its other
// new_group calls. Members get the new group (group rank i is world rank ranks[i]); every other
// rank gets null. Options left at their defaults take the world group's values (its timeout,
// heartbeat, bind address, shared memory), so `{}` gives a group that behaves as the world does.
// Throws ValueError naming new_group and the list for ranks outside the world or repeated, and
// DistError naming both lists when the ranks passed different lists; a rank that never calls it
// makes the others raise DistError within the world's timeout.
ProcessGroupPtr new_group(const std::vector<int>& ranks, ProcessGroupOptions options = {});
// The options a subgroup of `parent` gets from the caller's `user` options: every field the
// caller left at its default takes the parent's value (timeout: the parent's current one).
ProcessGroupOptions inherit_options(const ProcessGroupOptions& parent, Milliseconds parent_timeout,
                                    const ProcessGroupOptions& user);

// Gloo backend (CPU tensors). `store` is shared by all ranks; size 1 needs no peers.
ProcessGroupPtr new_gloo_group(std::shared_ptr<Store> store, int rank, int size,
                               ProcessGroupOptions options = {});

// In-process store (tests, single process).
class MemoryStore : public Store {
 public:
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, Milliseconds timeout) override;
  void interrupt(const std::string& why) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  int64_t num_keys() override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<std::string, std::string> data_;
};

// When several processes of the job share this host and OMP_NUM_THREADS is not set, caps this
// process's OpenMP team at (CPUs it may run on) / local_world_size, at least 1 (Note
// [oversubscribed OpenMP]). Returns the thread count set, 0 when nothing changed.
// init_process_group calls it.
int fit_omp_threads_to_host(int local_world_size);

// ---- the default group, from the environment (comm/env.h) ----
struct InitOptions {
  std::string backend = "gloo";  // "gloo", or "nccl" when built with CUDA
  // The one timeout of initialisation and of every collective (AcceleratorConfig::timeout sets
  // it): init_process_group as a whole (reaching the store, every rank's arrival, connections)
  // is bounded by it, and so is every store request and collective afterwards.
  Milliseconds timeout = kDefaultCollectiveTimeout;
  int fingerprint_every = 1;
  // See ProcessGroupOptions; env ACCEL_HEARTBEAT_TIMEOUT (seconds, 0 disables) overrides it.
  Milliseconds heartbeat_timeout = kDefaultHeartbeatTimeout;
};
// Reads RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT; rank 0 serves the store. With no variables set
// this is a single process (world size 1) and needs no network. Calling it twice is an error;
// init, destroy, init in one process is fine (a new generation of the store each time, Note
// [store generations]). A rank that never arrives, leaves or dies while the group forms is
// named in the DistError (Note [init guard]).
// The bind address comes from select_bind_address (comm/net.h); shared memory is used only when
// all ranks are on this host (LOCAL_WORLD_SIZE == WORLD_SIZE).
ProcessGroupPtr init_process_group(const InitOptions& options = {});
bool is_initialized();
// Throws DistError when init_process_group has not run.
ProcessGroupPtr default_group();
// The store of the default group (rank 0's TcpStore, or a MemoryStore in a single process).
std::shared_ptr<Store> default_store();
void destroy_process_group();

// What a build without NCCL says when asked for it (comm/nccl/process_group_nccl_stub.cc).
inline constexpr const char* kNoNcclBuild =
    "this build of accel has no NCCL backend: configure it with -Dcuda=enabled on a machine "
    "with the CUDA toolkit and NCCL (the CPU backend is gloo)";

namespace detail {
// Backends compiled only in some builds (NCCL) register a factory from their own file.
using BackendFactory =
    std::function<ProcessGroupPtr(std::shared_ptr<Store>, int rank, int size, ProcessGroupOptions)>;
bool register_backend(const std::string& name, BackendFactory factory);
}  // namespace detail

}  // namespace accel::dist
