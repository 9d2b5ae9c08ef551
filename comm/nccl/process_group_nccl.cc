#include "comm/nccl/process_group_nccl.h"

#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "comm/control_plane.h"
#include "comm/env.h"
#include "comm/fingerprint.h"
#include "kernels/cuda/device.h"

namespace accel::dist {

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void throw_nccl(ncclResult_t r, const char* call, const char* file, int line) {
  ACCEL_THROW(DistError, "nccl", call, " failed: ", ncclGetErrorString(r), " (", file, ":", line,
              ")");
}
// ncclInProgress is the normal answer of a non-blocking communicator.
#define ACCEL_NCCL_CHECK(expr)                                           \
  do {                                                                   \
    ncclResult_t accel_nccl_r_ = (expr);                                 \
    if (accel_nccl_r_ != ncclSuccess && accel_nccl_r_ != ncclInProgress) \
      throw_nccl(accel_nccl_r_, #expr, __FILE__, __LINE__);              \
  } while (0)

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::Float32: return ncclFloat32;
    case DType::Float64: return ncclFloat64;
    case DType::Float16: return ncclFloat16;
    case DType::BFloat16: return ncclBfloat16;
    case DType::Int32: return ncclInt32;
    case DType::Int64: return ncclInt64;
    case DType::UInt8: return ncclUint8;
    case DType::Bool: return ncclUint8;
  }
  ACCEL_THROW(DTypeError, "nccl", "unsupported dtype ", t);
}

ncclRedOp_t nccl_op(ReduceOp op, DType t) {
  if (t == DType::Bool) return op == ReduceOp::Min ? ncclMin : ncclMax;  // and / or
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  return ncclSum;
}

void check_cuda_contiguous(const char* op, const Tensor& t, int device, const char* what) {
  ACCEL_CHECK(t.defined(), ValueError, op, what, " is an undefined tensor");
  ACCEL_CHECK(t.device().is_cuda() && t.device().index == device, DeviceError, op,
              "the nccl backend needs tensors on cuda:", device, ", ", what, " is on ", t.device());
  ACCEL_CHECK(t.is_contiguous(), ValueError, op, what, " must be contiguous, got shape ",
              t.shape_str());
}

class ProcessGroupNccl;

class NcclWork : public Work {
 public:
  NcclWork(ProcessGroupNccl* pg, OpKind kind, uint64_t seq, Fingerprint fp, Milliseconds timeout)
      : Work(kind, seq), pg_(pg), fp_(fp), timeout_(timeout) {}
  void wait() override;

  cuda::Event done_event;
  std::vector<Tensor> keep;  // alive until the stream passed them

 private:
  ProcessGroupNccl* pg_;
  Fingerprint fp_;
  Milliseconds timeout_;
  std::mutex wait_mu_;
};

class ProcessGroupNccl final : public ProcessGroup {
 public:
  ProcessGroupNccl(std::shared_ptr<Store> store, int rank, int size, ProcessGroupOptions options)
      : ProcessGroup(rank, size), options_(std::move(options)) {
    timeout_ = options_.timeout;
    ACCEL_CHECK(cuda::is_available(), DeviceError, "init",
                "the nccl backend needs a GPU: ", cuda::unavailable_reason());
    device_ = cuda::current_device();
    cuda::DeviceGuard guard(device_);
    std::string name = options_.name.empty() ? "nccl" : options_.name + "/nccl";
    set_identity(options_, options_.name.empty() ? "nccl" : options_.name);
    store_ = std::make_shared<PrefixStore>(name, std::move(store));
    store_->set_timeout(options_.timeout);
    ncclUniqueId id;
    if (rank == 0) {
      ACCEL_NCCL_CHECK(ncclGetUniqueId(&id));
      store_->set("uid", std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
    } else {
      std::string v = store_->get("uid");
      ACCEL_CHECK(v.size() == sizeof(id), DistError, "init", "bad NCCL unique id of ", v.size(),
                  " bytes in the store");
      std::memcpy(&id, v.data(), sizeof(id));
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // so that a hung init or collective can be aborted
    ACCEL_NCCL_CHECK(ncclCommInitRankConfig(&comm_, size, id, rank, &config));
    wait_comm_ready("ncclCommInitRankConfig", Clock::now() + options_.timeout);
    stream_ = cuda::new_stream(device_, /*high_priority=*/true);
    if (size > 1)
      control_ =
          std::make_unique<ControlPlane>(store_, rank, size, options_.hostname, options_.timeout);
  }

  ~ProcessGroupNccl() override {
    if (!comm_ || comm_aborted_) return;
    if (broken()) {
      ncclCommAbort(comm_);
    } else {
      try {
        stream_.synchronize();
      } catch (...) {
      }
      ncclCommDestroy(comm_);
    }
  }

  std::string_view backend() const override { return "nccl"; }
  uint64_t next_seq() const override { return seq_; }
  std::shared_ptr<Store> group_store() const override { return store_; }
  std::string failure_message() const override {
    std::lock_guard<std::mutex> g(mu_);
    return broken_;
  }

  // An NCCL communicator of `members` on this group's device, from a fresh unique id that
  // travels through the store under the subgroup's prefix (Note [subgroups] in
  // comm/subgroups.cc): ncclCommSplit would need every rank of this group, members or not, to
  // take part, which new_group does not ask of non-members.
  ProcessGroupPtr form_subgroup(const std::vector<int>& members, const std::string& store_name,
                                ProcessGroupOptions options) override {
    const auto me = std::find(members.begin(), members.end(), rank_);
    ACCEL_CHECK(me != members.end(), DistError, "new_group", "rank ", rank_, group_context(),
                " is not among the members");
    ProcessGroupOptions o = inherit_options(options_, timeout_, options);
    o.name = store_name;
    cuda::DeviceGuard guard(device_);
    return std::make_shared<ProcessGroupNccl>(store_, int(me - members.begin()),
                                              int(members.size()), std::move(o));
  }

  WorkPtr all_reduce_async(const Tensor& t, ReduceOp op) override {
    check_cuda_contiguous("all_reduce", t, device_, "tensor");
    if (op == ReduceOp::Avg)
      ACCEL_CHECK(is_floating(t.dtype()), DTypeError, "all_reduce",
                  "avg needs a floating dtype, got ", t.dtype());
    count_sent(t.nbytes());
    return launch(
        make_fingerprint(OpKind::AllReduce, t.dtype(), op, -1, t.numel()), {t},
        [&](cudaStream_t s) {
          ACCEL_NCCL_CHECK(ncclAllReduce(t.data_ptr(), t.data_ptr(), size_t(t.numel()),
                                         nccl_type(t.dtype()), nccl_op(op, t.dtype()), comm_, s));
        });
  }
  WorkPtr broadcast_async(const Tensor& t, int root) override {
    check_cuda_contiguous("broadcast", t, device_, "tensor");
    ACCEL_CHECK(root >= 0 && root < size_, DistError, "broadcast", "root ", root,
                " is outside [0, ", size_, ")");
    if (rank_ == root) count_sent(t.nbytes());
    return launch(make_fingerprint(OpKind::Broadcast, t.dtype(), ReduceOp::Sum, root, t.numel()),
                  {t}, [&](cudaStream_t s) {
                    ACCEL_NCCL_CHECK(ncclBroadcast(t.data_ptr(), t.data_ptr(), size_t(t.numel()),
                                                   nccl_type(t.dtype()), root, comm_, s));
                  });
  }
  WorkPtr all_gather_async(const Tensor& out, const Tensor& in) override {
    check_cuda_contiguous("all_gather", out, device_, "output");
    check_cuda_contiguous("all_gather", in, device_, "input");
    ACCEL_CHECK(out.dtype() == in.dtype(), DTypeError, "all_gather", "output dtype ", out.dtype(),
                " differs from input dtype ", in.dtype());
    ACCEL_CHECK(out.numel() == in.numel() * size_, ShapeError, "all_gather", "output ",
                out.shape_str(), " must hold world size ", size_, " x input ", in.shape_str());
    count_sent(in.nbytes());
    return launch(
        make_fingerprint(OpKind::AllGather, in.dtype(), ReduceOp::Sum, -1, in.numel()), {out, in},
        [&](cudaStream_t s) {
          ACCEL_NCCL_CHECK(ncclAllGather(in.data_ptr(), out.data_ptr(), size_t(in.numel()),
                                         nccl_type(in.dtype()), comm_, s));
        });
  }
  WorkPtr reduce_scatter_async(const Tensor& out, const Tensor& in, ReduceOp op) override {
    check_cuda_contiguous("reduce_scatter", out, device_, "output");
    check_cuda_contiguous("reduce_scatter", in, device_, "input");
    ACCEL_CHECK(out.dtype() == in.dtype(), DTypeError, "reduce_scatter", "output dtype ",
                out.dtype(), " differs from input dtype ", in.dtype());
    ACCEL_CHECK(in.numel() == out.numel() * size_, ShapeError, "reduce_scatter", "input ",
                in.shape_str(), " must hold world size ", size_, " x output ", out.shape_str());
    if (op == ReduceOp::Avg)
      ACCEL_CHECK(is_floating(in.dtype()), DTypeError, "reduce_scatter",
                  "avg needs a floating dtype, got ", in.dtype());
    count_sent(in.nbytes());
    return launch(make_fingerprint(OpKind::ReduceScatter, in.dtype(), op, -1, in.numel()),
                  {out, in}, [&](cudaStream_t s) {
                    ACCEL_NCCL_CHECK(ncclReduceScatter(in.data_ptr(), out.data_ptr(),
                                                       size_t(out.numel()), nccl_type(in.dtype()),
                                                       nccl_op(op, in.dtype()), comm_, s));
                  });
  }
  WorkPtr barrier_async() override {
    // The fingerprint exchange (always done for a barrier) syncs the hosts; the one-element
    // all-reduce orders the barrier after earlier work on every rank's stream.
    Tensor one = zeros({1}, TensorOptions(kFloat32, Device::cuda(device_)));
    return launch(
        make_fingerprint(OpKind::Barrier, DType::UInt8, ReduceOp::Sum, -1, 0), {one},
        [&](cudaStream_t s) {
          ACCEL_NCCL_CHECK(
              ncclAllReduce(one.data_ptr(), one.data_ptr(), 1, ncclFloat32, ncclSum, comm_, s));
        },
        /*force_check=*/true);
  }
  WorkPtr send_async(const Tensor& t, int dst, int tag) override {
    check_cuda_contiguous("send", t, device_, "tensor");
    ACCEL_CHECK(dst >= 0 && dst < size_ && dst != rank_, DistError, "send", "destination ", dst,
                " must be another rank in [0, ", size_, ")");
    (void)tag;  // NCCL matches point-to-point messages by order per peer only
    count_sent(t.nbytes());
    return launch_p2p(OpKind::Send, t, [&](cudaStream_t s) {
      ACCEL_NCCL_CHECK(
          ncclSend(t.data_ptr(), size_t(t.numel()), nccl_type(t.dtype()), dst, comm_, s));
    });
  }
  WorkPtr recv_async(const Tensor& t, int src, int tag) override {
    check_cuda_contiguous("recv", t, device_, "tensor");
    ACCEL_CHECK(src >= 0 && src < size_ && src != rank_, DistError, "recv", "source ", src,
                " must be another rank in [0, ", size_, ")");
    (void)tag;
    return launch_p2p(OpKind::Recv, t, [&](cudaStream_t s) {
      ACCEL_NCCL_CHECK(
          ncclRecv(t.data_ptr(), size_t(t.numel()), nccl_type(t.dtype()), src, comm_, s));
    });
  }

  // Called by NcclWork::wait: host-waits for the event, watching for async errors and the
  // deadline; aborts the communicator on either.
  void wait_event(const cuda::Event& ev, const Fingerprint& fp, Milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    while (!ev.query()) {
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress)
        fail(fp, std::string("asynchronous NCCL error: ") + ncclGetErrorString(async));
      if (Clock::now() > deadline)
        fail(fp, "did not finish within " + std::to_string(timeout.count()) +
                     " ms: a peer died or stopped answering");
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  [[noreturn]] void fail(const Fingerprint& fp, const std::string& why) {
    std::ostringstream os;
    os << '[' << op_kind_name(OpKind(fp.kind)) << "] " << fp.describe() << " failed on rank "
       << rank_ << " of " << size_ << group_context() << ": " << why;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (broken_.empty()) {
        broken_ = os.str();
        ncclCommAbort(comm_);  // unblocks the kernels of every rank's communicator
        comm_aborted_ = true;
        if (control_) control_->abort("rank " + std::to_string(rank_) + ": " + broken_);
      }
    }
    throw DistError(os.str());
  }

 private:
  bool broken() const {
    std::lock_guard<std::mutex> g(mu_);
    return !broken_.empty();
  }

  void wait_comm_ready(const char* what, Clock::time_point deadline) {
    ncclResult_t state = ncclInProgress;
    while (true) {
      ACCEL_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
      if (state != ncclInProgress) break;
      if (Clock::now() > deadline) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        ACCEL_THROW(DistError, "init", what, " did not complete within ", options_.timeout.count(),
                    " ms (did every rank start?)");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (state != ncclSuccess) throw_nccl(state, what, __FILE__, __LINE__);
  }

  template <typename F>
  WorkPtr launch(Fingerprint fp, std::vector<Tensor> tensors, F&& enqueue,
                 bool force_check = false) {
    std::string op(op_kind_name(OpKind(fp.kind)));
    {
      std::lock_guard<std::mutex> g(mu_);
      ACCEL_CHECK(broken_.empty(), DistError, op.c_str(),
                  "the process group failed earlier: ", broken_);
    }
    fp.seq = seq_++;
    const int every = options_.fingerprint_every;
    try {
      if (control_ && (force_check || (every > 0 && fp.seq % uint64_t(every) == 0))) {
        history_.check(*control_, fp, timeout_);
      } else {
        history_.record(fp);
      }
    } catch (const PeerError& e) {
      fail(fp, e.what());
    }
    auto work = std::make_shared<NcclWork>(this, OpKind(fp.kind), fp.seq, fp, timeout_);
    cuda::DeviceGuard guard(device_);
    // The collective must see what the caller's stream computed so far.
    cuda::Event ready;
    ready.record(cuda::current_stream(device_));
    ready.block(stream_);
    enqueue(stream_.handle());
    for (auto& t : tensors) cuda::record_stream(t, stream_);
    work->done_event.record(stream_);
    work->keep = std::move(tensors);
    work->mark_started();
    return work;
  }

  template <typename F>
  WorkPtr launch_p2p(OpKind kind, const Tensor& t, F&& enqueue) {
    Fingerprint fp = make_fingerprint(kind, t.dtype(), ReduceOp::Sum, -1, t.numel());
    {
      std::lock_guard<std::mutex> g(mu_);
      ACCEL_CHECK(broken_.empty(), DistError, op_kind_name(kind).data(),
                  "the process group failed earlier: ", broken_);
    }
    auto work = std::make_shared<NcclWork>(this, kind, 0, fp, timeout_);
    cuda::DeviceGuard guard(device_);
    cuda::Event ready;
    ready.record(cuda::current_stream(device_));
    ready.block(stream_);
    ACCEL_NCCL_CHECK(ncclGroupStart());
    enqueue(stream_.handle());
    ACCEL_NCCL_CHECK(ncclGroupEnd());
    cuda::record_stream(t, stream_);
    work->done_event.record(stream_);
    work->keep = {t};
    work->mark_started();
    return work;
  }

  friend class NcclWork;

  ProcessGroupOptions options_;
  std::shared_ptr<Store> store_;
  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  bool comm_aborted_ = false;
  cuda::Stream stream_;
  std::unique_ptr<ControlPlane> control_;
  FingerprintHistory history_;
  uint64_t seq_ = 0;
  mutable std::mutex mu_;
  std::string broken_;
};

void NcclWork::wait() {
  std::lock_guard<std::mutex> g(wait_mu_);
  if (!is_completed()) {
    std::exception_ptr err;
    try {
      pg_->wait_event(done_event, fp_, timeout_);
      // Later work on the caller's stream is ordered after the collective.
      done_event.block(cuda::current_stream(pg_->device_));
    } catch (...) {
      err = std::current_exception();
    }
    keep.clear();
    finish(err);
  }
  Work::wait();
}

// Registered as backend "nccl" for init_process_group: the device is LOCAL_RANK's GPU.
const bool g_registered = detail::register_backend(
    "nccl", [](std::shared_ptr<Store> store, int rank, int size, ProcessGroupOptions options) {
      DistEnv env = read_dist_env();
      int n = cuda::device_count();
      ACCEL_CHECK(n > 0, DeviceError, "init_process_group",
                  "backend nccl needs a GPU: ", cuda::unavailable_reason());
      cuda::set_device(env.local_rank % n);
      return ProcessGroupPtr(
          std::make_shared<ProcessGroupNccl>(std::move(store), rank, size, std::move(options)));
    });

}  // namespace

bool nccl_available() { return true; }

ProcessGroupPtr new_nccl_group(std::shared_ptr<Store> store, int rank, int size,
                               ProcessGroupOptions options) {
  return std::make_shared<ProcessGroupNccl>(std::move(store), rank, size, std::move(options));
}

}  // namespace accel::dist
