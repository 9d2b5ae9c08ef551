#include "dist/gloo/process_group_gloo.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/context.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>

#include "core/error.h"
#include "dist/fingerprint.h"
#include "dist/reduce_kernels.h"

namespace accel::dist {

namespace {

using Clock = std::chrono::steady_clock;

// Our own slots, far from Gloo's collective prefixes (0x01..0x08 in the top byte).
constexpr uint64_t kSlotReduceScatter = uint64_t(0xA1) << 56;
constexpr uint64_t kSlotP2PHeader = uint64_t(0xA2) << 56;
constexpr uint64_t kSlotP2PData = uint64_t(0xA3) << 56;
constexpr uint64_t kSlotP2PAck = uint64_t(0xA4) << 56;
constexpr uint32_t kP2PMagic = 0x50325041;  // "AP2P"

uint64_t p2p_slot(uint64_t prefix, int tag) { return prefix | (uint64_t(uint32_t(tag)) << 8); }

std::atomic<int> g_group_counter{0};

// Gloo's TCP transport writes with writev(), which raises SIGPIPE when a peer has died; the
// default action would kill this rank instead of letting it report the failure. Installed only
// when the program left SIGPIPE at its default, so a program's own handler is respected.
void ignore_sigpipe() {
  struct sigaction old_action {};
  if (sigaction(SIGPIPE, nullptr, &old_action) == 0 && old_action.sa_handler == SIG_DFL) {
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGPIPE, &ign, nullptr);
  }
}

class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  explicit GlooStoreAdapter(std::shared_ptr<dist::Store> s) : s_(std::move(s)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    s_->set(key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    std::string v = s_->get(key);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { s_->wait(keys); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    s_->wait(keys, timeout);
  }

 private:
  std::shared_ptr<dist::Store> s_;
};

void check_cpu_contiguous(const char* op, const Tensor& t, const char* what) {
  ACCEL_CHECK(t.defined(), ValueError, op, what, " is an undefined tensor");
  ACCEL_CHECK(t.device().is_cpu(), DeviceError, op, "the gloo backend needs CPU tensors, ", what,
              " is on ", t.device());
  ACCEL_CHECK(t.is_contiguous(), ValueError, op, what, " must be contiguous, got shape ",
              t.shape_str(), " with non-contiguous strides");
}

// Creates unbound buffers typed by element size (Gloo only uses the size).
template <typename Opts>
void set_output_bytes(Opts& o, void* p, size_t elems, size_t esize) {
  switch (esize) {
    case 1: o.template setOutput<uint8_t>(static_cast<uint8_t*>(p), elems); break;
    case 2: o.template setOutput<uint16_t>(static_cast<uint16_t*>(p), elems); break;
    case 4: o.template setOutput<uint32_t>(static_cast<uint32_t*>(p), elems); break;
    case 8: o.template setOutput<uint64_t>(static_cast<uint64_t*>(p), elems); break;
    default: ACCEL_INTERNAL_ASSERT(false);
  }
}
template <typename Opts>
void set_input_bytes(Opts& o, void* p, size_t elems, size_t esize) {
  switch (esize) {
    case 1: o.template setInput<uint8_t>(static_cast<uint8_t*>(p), elems); break;
    case 2: o.template setInput<uint16_t>(static_cast<uint16_t*>(p), elems); break;
    case 4: o.template setInput<uint32_t>(static_cast<uint32_t*>(p), elems); break;
    case 8: o.template setInput<uint64_t>(static_cast<uint64_t*>(p), elems); break;
    default: ACCEL_INTERNAL_ASSERT(false);
  }
}

std::string op_name_str(OpKind k) { return std::string(op_kind_name(k)); }

}  // namespace

std::unique_ptr<gloo::rendezvous::Store> make_gloo_store(std::shared_ptr<Store> store) {
  return std::make_unique<GlooStoreAdapter>(std::move(store));
}

std::shared_ptr<gloo::Context> connect_gloo_context(const std::shared_ptr<Store>& store, int rank,
                                                    int size, const std::string& hostname,
                                                    Milliseconds timeout) {
  gloo::transport::tcp::attr attr;
  attr.hostname = hostname;
  try {
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    ctx->setTimeout(timeout);
    GlooStoreAdapter adapter(store);
    ctx->connectFullMesh(adapter, device);
    return ctx;
  } catch (const DistError& e) {
    ACCEL_THROW(DistError, "init", "rank ", rank, " of ", size,
                ": rendezvous failed (did every rank start?): ", e.what());
  } catch (const std::exception& e) {
    ACCEL_THROW(DistError, "init", "rank ", rank, " of ", size, ": connecting gloo on '",
                hostname, "' failed: ", e.what());
  }
}

// =========================== construction ===========================

ProcessGroupGloo::ProcessGroupGloo(std::shared_ptr<Store> store, int rank, int size,
                                   ProcessGroupOptions options)
    : ProcessGroup(rank, size), options_(std::move(options)) {
  ACCEL_CHECK(size >= 1 && rank >= 0 && rank < size, DistError, "init", "invalid rank ", rank,
              " for world size ", size);
  ACCEL_CHECK(options_.fingerprint_every >= 0, DistError, "init",
              "fingerprint_every must be >= 0, got ", options_.fingerprint_every);
  timeout_ = options_.timeout;
  // Every process counts its groups; ranks create groups in the same order.
  int id = g_group_counter.fetch_add(1);
  std::string name = options_.name.empty() ? "pg" + std::to_string(id) : options_.name;
  if (size > 1) {
    ignore_sigpipe();
    ACCEL_CHECK(store != nullptr, DistError, "init", "a store is needed for world size ", size);
    store_ = std::make_shared<PrefixStore>(name, std::move(store));
    store_->set_timeout(options_.timeout);
    ctx_ = connect_gloo_context(store_, rank, size, options_.hostname, options_.timeout);
    control_ = std::make_unique<ControlPlane>(store_, rank, size, options_.hostname,
                                              options_.timeout);
    if (options_.shm)
      shm_ = ShmAllReduce::create(store_, rank, size, options_.shm_slot_bytes, options_.timeout);
  }
  worker_ = std::thread([this] { worker_loop(); });
}

ProcessGroupGloo::~ProcessGroupGloo() {
  {
    std::lock_guard<std::mutex> g(queue_mu_);
    stop_ = true;
  }
  queue_cv_.notify_all();
  if (worker_.joinable()) worker_.join();  // runs what was queued: handles always complete
  ctx_.reset();
}

ProcessGroupPtr new_gloo_group(std::shared_ptr<Store> store, int rank, int size,
                               ProcessGroupOptions options) {
  return std::make_shared<ProcessGroupGloo>(std::move(store), rank, size, std::move(options));
}

// =========================== worker ===========================

void ProcessGroupGloo::mark_broken(const std::string& msg) {
  {
    std::lock_guard<std::mutex> g(broken_mu_);
    if (!broken_.empty()) return;
    broken_ = msg;
  }
  // Closing our connections turns the failure into an immediate error on the peers that wait on
  // us, instead of each of them running into its own timeout; the abort notice tells those that
  // read the control channel next why.
  if (control_) control_->abort("rank " + std::to_string(rank_) + ": " + msg);
  if (shm_) shm_->abort(msg);
  if (ctx_) {
    try {
      ctx_->closeConnections();
    } catch (...) {
    }
  }
}

std::string ProcessGroupGloo::broken_message() const {
  std::lock_guard<std::mutex> g(broken_mu_);
  return broken_;
}

// Note [inline execution]
// A handle whose task is still at the head of the queue while nothing runs is executed by the
// thread that waits on it, instead of handing it to the worker and sleeping: two thread wakeups
// fewer per synchronous collective (they cost more than a small all-reduce on loopback). Order
// is unchanged: only the head task is taken, and only when the worker is idle.
class GlooWork : public Work {
 public:
  GlooWork(ProcessGroupGloo* pg, OpKind kind, uint64_t seq) : Work(kind, seq), pg_(pg) {}
  void wait() override {
    // An unfinished handle implies a live group: its destructor drains the queue first.
    if (!is_completed()) pg_->try_run_inline(this);
    Work::wait();
  }

 private:
  ProcessGroupGloo* pg_;
};

bool ProcessGroupGloo::try_run_inline(const Work* w) {
  Task task;
  {
    std::lock_guard<std::mutex> g(queue_mu_);
    if (busy_ || queue_.empty() || queue_.front().work.get() != w) return false;
    task = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
  }
  run_task(task);
  {
    std::lock_guard<std::mutex> g(queue_mu_);
    busy_ = false;
  }
  queue_cv_.notify_all();
  return true;
}

namespace {
// Set while a blocking collective issues its task: the caller is about to wait and run it.
thread_local bool t_sync_call = false;
struct SyncScope {
  SyncScope() { t_sync_call = true; }
  ~SyncScope() { t_sync_call = false; }
};
}  // namespace

void ProcessGroupGloo::all_reduce(const Tensor& t, ReduceOp op) {
  WorkPtr w;
  {
    SyncScope sync;
    w = all_reduce_async(t, op);
  }
  w->wait();
}
void ProcessGroupGloo::broadcast(const Tensor& t, int root) {
  WorkPtr w;
  {
    SyncScope sync;
    w = broadcast_async(t, root);
  }
  w->wait();
}
void ProcessGroupGloo::all_gather(const Tensor& out, const Tensor& in) {
  WorkPtr w;
  {
    SyncScope sync;
    w = all_gather_async(out, in);
  }
  w->wait();
}
void ProcessGroupGloo::reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) {
  WorkPtr w;
  {
    SyncScope sync;
    w = reduce_scatter_async(out, in, op);
  }
  w->wait();
}
void ProcessGroupGloo::barrier() {
  WorkPtr w;
  {
    SyncScope sync;
    w = barrier_async();
  }
  w->wait();
}

WorkPtr ProcessGroupGloo::enqueue(Fingerprint fp,
                                  std::function<void(uint64_t, Milliseconds)> body) {
  fp.seq = seq_.fetch_add(1);
  auto work = std::make_shared<GlooWork>(this, OpKind(fp.kind), fp.seq);
  {
    std::lock_guard<std::mutex> g(queue_mu_);
    ACCEL_CHECK(!stop_, DistError, op_name_str(OpKind(fp.kind)).c_str(),
                "process group is shutting down");
    queue_.push_back(Task{work, fp, timeout_, std::move(body)});
  }
  if (!t_sync_call) queue_cv_.notify_one();
  return work;
}

void ProcessGroupGloo::worker_loop() {
  std::unique_lock<std::mutex> lk(queue_mu_);
  while (true) {
    // One task at a time, whoever runs it (Note [inline execution]).
    queue_cv_.wait(lk, [&] { return !busy_ && (stop_ || !queue_.empty()); });
    if (queue_.empty()) return;  // stop_ and drained
    Task task = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lk.unlock();
    run_task(task);
    lk.lock();
    busy_ = false;
  }
}

void ProcessGroupGloo::run_task(Task& task) {
  task.work->mark_started();
  const Fingerprint& fp = task.fp;
  std::string op = op_name_str(OpKind(fp.kind));
  std::exception_ptr err;
  try {
    std::string broken = broken_message();
    ACCEL_CHECK(broken.empty(), DistError, op.c_str(), fp.describe(), " on rank ", rank_,
                ": the process group failed earlier: ", broken);
    int every = options_.fingerprint_every;
    // A barrier always exchanges fingerprints: that exchange is the barrier.
    bool check = every > 0 && fp.seq % uint64_t(every) == 0;
    if (size_ > 1 && (check || OpKind(fp.kind) == OpKind::Barrier)) {
      auto t0 = Clock::now();
      history_.check(*control_, fp, task.timeout);
      fingerprint_ns_ +=
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
      ++fingerprint_checks_;
    } else {
      history_.record(fp);
    }
    task.body(fp.seq, task.timeout);
  } catch (const PeerError& e) {
    std::ostringstream os;
    os << '[' << op << "] " << fp.describe() << " failed on rank " << rank_ << " of " << size_
       << " (timeout " << task.timeout.count() << " ms): " << e.what();
    mark_broken(os.str());
    err = std::make_exception_ptr(DistError(os.str()));
  } catch (const DistError&) {
    err = std::current_exception();  // ours: mismatch, or an earlier failure; already worded
  } catch (const std::exception& e) {
    // Gloo (IoException on a timeout or a closed connection, EnforceNotMet) and anything else.
    std::ostringstream os;
    os << '[' << op << "] " << fp.describe() << " failed on rank " << rank_ << " of " << size_
       << " (timeout " << task.timeout.count()
       << " ms): a peer died or stopped answering: " << e.what();
    mark_broken(os.str());
    err = std::make_exception_ptr(DistError(os.str()));
  }
  task.work->finish(err);
}

// =========================== collectives ===========================

WorkPtr ProcessGroupGloo::all_reduce_async(const Tensor& t, ReduceOp op) {
  check_cpu_contiguous("all_reduce", t, "tensor");
  check_reducible("all_reduce", t.dtype(), op);
  Fingerprint fp = make_fingerprint(OpKind::AllReduce, t.dtype(), op, -1, t.numel());
  return enqueue(fp, [this, t, op](uint64_t seq, Milliseconds timeout) {
    size_t n = size_t(t.numel());
    if (n == 0) return;
    if (size_ > 1 && shm_) {
      shm_->all_reduce(t.data_ptr(), n, t.element_size(),
                       reduce_function(t.dtype(), op == ReduceOp::Avg ? ReduceOp::Sum : op),
                       timeout);
    } else if (size_ > 1) {
      gloo::AllreduceOptions o(ctx_);
      set_output_bytes(o, t.data_ptr(), n, t.element_size());
      o.setReduceFunction(reduce_function(t.dtype(), op == ReduceOp::Avg ? ReduceOp::Sum : op));
      if (options_.gloo_segment_bytes > 0) o.setMaxSegmentSize(options_.gloo_segment_bytes);
      o.setTag(uint32_t(seq));
      o.setTimeout(timeout);
      gloo::allreduce(o);
    }
    if (op == ReduceOp::Avg) divide_inplace(t.data_ptr(), t.dtype(), n, size_);
  });
}

WorkPtr ProcessGroupGloo::broadcast_async(const Tensor& t, int root) {
  check_cpu_contiguous("broadcast", t, "tensor");
  ACCEL_CHECK(root >= 0 && root < size_, DistError, "broadcast", "root ", root,
              " is outside [0, ", size_, ")");
  Fingerprint fp = make_fingerprint(OpKind::Broadcast, t.dtype(), ReduceOp::Sum, root, t.numel());
  return enqueue(fp, [this, t, root](uint64_t seq, Milliseconds timeout) {
    if (size_ == 1 || t.numel() == 0) return;
    gloo::BroadcastOptions o(ctx_);
    set_output_bytes(o, t.data_ptr(), size_t(t.numel()), t.element_size());
    o.setRoot(root);
    o.setTag(uint32_t(seq));
    o.setTimeout(timeout);
    gloo::broadcast(o);
  });
}

WorkPtr ProcessGroupGloo::all_gather_async(const Tensor& out, const Tensor& in) {
  check_cpu_contiguous("all_gather", out, "output");
  check_cpu_contiguous("all_gather", in, "input");
  ACCEL_CHECK(out.dtype() == in.dtype(), DTypeError, "all_gather", "output dtype ", out.dtype(),
              " differs from input dtype ", in.dtype());
  ACCEL_CHECK(out.numel() == in.numel() * size_, ShapeError, "all_gather", "output ",
              out.shape_str(), " must hold world size ", size_, " x input ", in.shape_str(),
              " = ", in.numel() * size_, " elements");
  Fingerprint fp = make_fingerprint(OpKind::AllGather, in.dtype(), ReduceOp::Sum, -1, in.numel());
  return enqueue(fp, [this, out, in](uint64_t seq, Milliseconds timeout) {
    size_t n = size_t(in.numel()), es = in.element_size();
    if (n == 0) return;
    char* slot = static_cast<char*>(out.data_ptr()) + size_t(rank_) * n * es;
    if (size_ == 1) {
      if (slot != in.data_ptr()) std::memmove(slot, in.data_ptr(), n * es);
      return;
    }
    gloo::AllgatherOptions o(ctx_);
    // In place (ZeRO gathers into a buffer whose own chunk is the input): no input buffer.
    if (slot != in.data_ptr()) set_input_bytes(o, in.data_ptr(), n, es);
    set_output_bytes(o, out.data_ptr(), n * size_t(size_), es);
    o.setTag(uint32_t(seq));
    o.setTimeout(timeout);
    gloo::allgather(o);
  });
}

WorkPtr ProcessGroupGloo::reduce_scatter_async(const Tensor& out, const Tensor& in, ReduceOp op) {
  check_cpu_contiguous("reduce_scatter", out, "output");
  check_cpu_contiguous("reduce_scatter", in, "input");
  ACCEL_CHECK(out.dtype() == in.dtype(), DTypeError, "reduce_scatter", "output dtype ",
              out.dtype(), " differs from input dtype ", in.dtype());
  ACCEL_CHECK(in.numel() == out.numel() * size_, ShapeError, "reduce_scatter", "input ",
              in.shape_str(), " must hold world size ", size_, " x output ", out.shape_str(),
              " = ", out.numel() * size_, " elements");
  check_reducible("reduce_scatter", in.dtype(), op);
  {
    // The ring reads the input while writing the output: they must not overlap.
    auto* ib = static_cast<const char*>(in.data_ptr());
    auto* ob = static_cast<const char*>(out.data_ptr());
    bool overlap = ob < ib + in.nbytes() && ib < ob + out.nbytes();
    ACCEL_CHECK(!overlap || out.numel() == 0, ValueError, "reduce_scatter",
                "output must not overlap the input");
  }
  Fingerprint fp = make_fingerprint(OpKind::ReduceScatter, in.dtype(), op, -1, in.numel());
  return enqueue(fp, [this, out, in, op](uint64_t seq, Milliseconds timeout) {
    ring_reduce_scatter(out, in, op, seq, timeout);
  });
}

void ProcessGroupGloo::ring_reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op,
                                           uint64_t seq, Milliseconds timeout) {
  // in: (N * k) elements as N chunks of k; out: k elements = reduction of chunk rank() over all
  // ranks. Ring: at step s rank r sends its running partial of chunk (r - s - 1) to r + 1 and
  // receives the partial of chunk (r - s - 2) from r - 1, adding its own contribution; after
  // N - 1 steps the chunk it received last is chunk r, complete.
  const size_t k = size_t(out.numel()), es = out.element_size(), bytes = k * es;
  const int n = size_;
  auto* inp = static_cast<uint8_t*>(in.data_ptr());
  auto* outp = static_cast<uint8_t*>(out.data_ptr());
  if (k == 0) return;
  if (n == 1) {
    std::memcpy(outp, inp, bytes);
  } else {
    ReduceFn fn = reduce_function(in.dtype(), op == ReduceOp::Avg ? ReduceOp::Sum : op);
    scratch_.resize(2 * bytes);
    uint8_t* recv_buf = scratch_.data();
    uint8_t* send_buf = scratch_.data() + bytes;
    auto ub_in = ctx_->createUnboundBuffer(inp, in.nbytes());
    auto ub_recv = ctx_->createUnboundBuffer(recv_buf, bytes);
    auto ub_send = ctx_->createUnboundBuffer(send_buf, bytes);
    const int next = (rank_ + 1) % n, prev = (rank_ + n - 1) % n;
    const uint64_t slot = kSlotReduceScatter | ((seq & 0xffffffffull) << 8);
    for (int s = 0; s < n - 1; ++s) {
      const size_t send_idx = size_t((rank_ - s - 1 + 2 * n) % n);
      const size_t recv_idx = size_t((rank_ - s - 2 + 2 * n) % n);
      ub_recv->recv(prev, slot, 0, bytes);
      gloo::transport::UnboundBuffer* sender = s == 0 ? ub_in.get() : ub_send.get();
      sender->send(next, slot, s == 0 ? send_idx * bytes : 0, bytes);
      ub_recv->waitRecv(timeout);
      sender->waitSend(timeout);
      uint8_t* dst = s == n - 2 ? outp : send_buf;
      fn(dst, recv_buf, inp + recv_idx * bytes, k);
    }
  }
  if (op == ReduceOp::Avg) divide_inplace(outp, out.dtype(), k, n);
}

WorkPtr ProcessGroupGloo::barrier_async() {
  Fingerprint fp = make_fingerprint(OpKind::Barrier, DType::UInt8, ReduceOp::Sum, -1, 0);
  // The body is empty: run_task's fingerprint exchange, done for every barrier, is an
  // all-to-all over the control channel, so no rank leaves before all have arrived.
  return enqueue(fp, [](uint64_t, Milliseconds) {});
}

// =========================== point to point ===========================

// Note [p2p handshake]
// send posts three operations at once: a 32-byte header (dtype, numel, per-(peer, tag) message
// number), the payload, and a receive for the receiver's 32-byte verdict. recv posts the header
// receive at once; its wait() checks the header against its own tensor, sends the verdict, then
// receives the payload (into a scratch buffer on a mismatch, so the sender is not left hanging)
// and raises. Both sides therefore raise on a mismatch, naming both tensors.
struct P2PHeader {
  uint32_t magic = kP2PMagic;
  uint8_t dtype = 0;
  uint8_t ok = 1;  // verdict: 1 accepted
  uint16_t pad = 0;
  int64_t numel = 0;
  uint64_t count = 0;
  uint64_t pad2 = 0;
};
static_assert(sizeof(P2PHeader) == 32);

class GlooP2PWork : public Work {
 public:
  GlooP2PWork(ProcessGroupGloo* pg, OpKind kind, Tensor t, int peer, int tag, Milliseconds timeout)
      : Work(kind, 0), pg_(pg), t_(std::move(t)), peer_(peer), tag_(tag), timeout_(timeout) {}

  void post(uint64_t count) {
    mine_.dtype = uint8_t(t_.dtype());
    mine_.numel = t_.numel();
    mine_.count = count;
    auto& ctx = pg_->ctx_;
    hdr_ = ctx->createUnboundBuffer(&hdr_buf_, sizeof(P2PHeader));
    if (kind_ == OpKind::Send) {
      hdr_buf_ = mine_;
      ack_ = ctx->createUnboundBuffer(&ack_buf_, sizeof(P2PHeader));
      hdr_->send(peer_, p2p_slot(kSlotP2PHeader, tag_));
      ack_->recv(peer_, p2p_slot(kSlotP2PAck, tag_));
      if (t_.nbytes() > 0) {
        data_ = ctx->createUnboundBuffer(t_.data_ptr(), t_.nbytes());
        data_->send(peer_, p2p_slot(kSlotP2PData, tag_));
      }
    } else {
      hdr_->recv(peer_, p2p_slot(kSlotP2PHeader, tag_));
    }
  }

  void wait() override {
    std::lock_guard<std::mutex> g(wait_mu_);
    if (!is_completed()) {
      std::exception_ptr err;
      try {
        kind_ == OpKind::Send ? wait_send() : wait_recv();
      } catch (const DistError&) {
        err = std::current_exception();
      } catch (const std::exception& e) {
        std::ostringstream os;
        os << '[' << op_kind_name(kind_) << "] " << describe(mine_) << (kind_ == OpKind::Send ? " to" : " from")
           << " rank " << peer_ << " tag " << tag_ << " failed on rank " << pg_->rank_
           << " (timeout " << timeout_.count() << " ms): the peer died or stopped answering: "
           << e.what();
        pg_->mark_broken(os.str());
        err = std::make_exception_ptr(DistError(os.str()));
      }
      finish(err);
    }
    Work::wait();
  }

 private:
  static std::string describe(const P2PHeader& h) {
    std::ostringstream os;
    os << "(" << DType(h.dtype) << ", " << h.numel << " elements, message " << h.count << ")";
    return os.str();
  }
  void wait_send() {
    hdr_->waitSend(timeout_);
    if (data_) data_->waitSend(timeout_);
    ack_->waitRecv(timeout_);
    ACCEL_CHECK(ack_buf_.magic == kP2PMagic, DistError, "send", "corrupt verdict from rank ",
                peer_);
    ACCEL_CHECK(ack_buf_.ok == 1, DistError, "send", "rank ", pg_->rank_, " sent ",
                describe(mine_), " to rank ", peer_, " tag ", tag_, " but rank ", peer_,
                " posted recv ", describe(ack_buf_));
  }
  void wait_recv() {
    hdr_->waitRecv(timeout_);
    P2PHeader theirs = hdr_buf_;
    ACCEL_CHECK(theirs.magic == kP2PMagic, DistError, "recv", "corrupt header from rank ",
                peer_);
    bool ok = theirs.dtype == mine_.dtype && theirs.numel == mine_.numel &&
              theirs.count == mine_.count;
    ack_buf_ = mine_;
    ack_buf_.ok = ok ? 1 : 0;
    ack_ = pg_->ctx_->createUnboundBuffer(&ack_buf_, sizeof(P2PHeader));
    ack_->send(peer_, p2p_slot(kSlotP2PAck, tag_));
    size_t their_bytes = size_t(theirs.numel) * dtype_size(DType(theirs.dtype));
    if (their_bytes > 0) {
      std::vector<uint8_t> drain;
      void* dst = t_.data_ptr();
      if (!ok) {
        drain.resize(their_bytes);
        dst = drain.data();
      }
      data_ = pg_->ctx_->createUnboundBuffer(dst, their_bytes);
      data_->recv(peer_, p2p_slot(kSlotP2PData, tag_));
      data_->waitRecv(timeout_);
    }
    ack_->waitSend(timeout_);
    ACCEL_CHECK(ok, DistError, "recv", "rank ", pg_->rank_, " posted recv ", describe(mine_),
                " from rank ", peer_, " tag ", tag_, " but rank ", peer_, " sent ",
                describe(theirs));
  }

  ProcessGroupGloo* pg_;
  Tensor t_;
  int peer_, tag_;
  Milliseconds timeout_;
  P2PHeader mine_, hdr_buf_, ack_buf_;
  std::unique_ptr<gloo::transport::UnboundBuffer> hdr_, ack_, data_;
  std::mutex wait_mu_;
};

WorkPtr ProcessGroupGloo::send_async(const Tensor& t, int dst, int tag) {
  check_cpu_contiguous("send", t, "tensor");
  ACCEL_CHECK(dst >= 0 && dst < size_ && dst != rank_, DistError, "send", "destination ", dst,
              " must be another rank in [0, ", size_, "), this is rank ", rank_);
  ACCEL_CHECK(tag >= 0, DistError, "send", "tag must be >= 0, got ", tag);
  std::string broken = broken_message();
  ACCEL_CHECK(broken.empty(), DistError, "send", "the process group failed earlier: ", broken);
  uint64_t count;
  {
    std::lock_guard<std::mutex> g(p2p_mu_);
    count = send_count_[{dst, tag}]++;
  }
  auto w = std::make_shared<GlooP2PWork>(this, OpKind::Send, t, dst, tag, timeout_);
  w->post(count);
  return w;
}

WorkPtr ProcessGroupGloo::recv_async(const Tensor& t, int src, int tag) {
  check_cpu_contiguous("recv", t, "tensor");
  ACCEL_CHECK(src >= 0 && src < size_ && src != rank_, DistError, "recv", "source ", src,
              " must be another rank in [0, ", size_, "), this is rank ", rank_);
  ACCEL_CHECK(tag >= 0, DistError, "recv", "tag must be >= 0, got ", tag);
  std::string broken = broken_message();
  ACCEL_CHECK(broken.empty(), DistError, "recv", "the process group failed earlier: ", broken);
  uint64_t count;
  {
    std::lock_guard<std::mutex> g(p2p_mu_);
    count = recv_count_[{src, tag}]++;
  }
  auto w = std::make_shared<GlooP2PWork>(this, OpKind::Recv, t, src, tag, timeout_);
  w->post(count);
  return w;
}

}  // namespace accel::dist
