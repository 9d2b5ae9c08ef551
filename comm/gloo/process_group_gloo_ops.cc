// ProcessGroupGloo's collectives and point-to-point transfers (construction, the worker thread
// and the progress watchdog are comm/gloo/process_group_gloo.cc).
#include "comm/gloo/process_group_gloo.h"

#include "comm/gloo/gloo_detail.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/context.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <dirent.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>

#include "core/error.h"
#include "comm/fingerprint.h"
#include "comm/init_guard.h"
#include "comm/net.h"
#include "comm/reduce_kernels.h"

namespace accel::dist {

using namespace gloo_detail;  // NOLINT: comm/gloo/gloo_detail.h

// =========================== collectives ===========================

WorkPtr ProcessGroupGloo::all_reduce_async(const Tensor& t, ReduceOp op) {
  check_cpu_contiguous("all_reduce", t, "tensor");
  check_reducible("all_reduce", t.dtype(), op);
  Fingerprint fp = make_fingerprint(OpKind::AllReduce, t.dtype(), op, -1, t.numel());
  count_sent(t.nbytes());
  Small small;
  if (small_path(t.nbytes())) {
    small.payload = t.data_ptr();
    small.bytes = t.nbytes();
    small.combine = [this, t, op](const std::vector<std::string>& all) {
      const size_t n = size_t(t.numel()), bytes = t.nbytes();
      for (int r = 0; r < size_; ++r) check_message(all[size_t(r)], bytes, r);
      if (n == 0) return;
      // Rank order on every rank: identical results everywhere.
      ReduceFn fn = reduce_function(t.dtype(), op == ReduceOp::Avg ? ReduceOp::Sum : op);
      void* dst = t.data_ptr();
      std::memcpy(dst, all[0].data(), bytes);
      for (int r = 1; r < size_; ++r) fn(dst, dst, all[size_t(r)].data(), n);
      if (op == ReduceOp::Avg) divide_inplace(dst, t.dtype(), n, size_);
    };
  }
  return enqueue(
      fp,
      [this, t, op](uint64_t seq, Milliseconds timeout) {
        size_t n = size_t(t.numel());
        if (n == 0) return;
        if (size_ > 1 && shm_) {
          // run_task stamped this collective (Note [fingerprint paths]); the check runs after every
          // rank arrived and before anything is reduced.
          shm_->all_reduce(t.data_ptr(), n, t.element_size(),
                           reduce_function(t.dtype(), op == ReduceOp::Avg ? ReduceOp::Sum : op),
                           timeout, &stamp_, shm_check());
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
      },
      std::move(small));
}

WorkPtr ProcessGroupGloo::broadcast_async(const Tensor& t, int root) {
  check_cpu_contiguous("broadcast", t, "tensor");
  ACCEL_CHECK(root >= 0 && root < size_, DistError, "broadcast", "root ", root, " is outside [0, ",
              size_, ") (roots are ranks of the group", group_context(), ")");
  Fingerprint fp = make_fingerprint(OpKind::Broadcast, t.dtype(), ReduceOp::Sum, root, t.numel());
  if (rank_ == root) count_sent(t.nbytes());
  Small small;
  if (small_path(t.nbytes())) {
    small.payload = t.data_ptr();
    small.bytes = rank_ == root ? t.nbytes() : 0;  // only the root's data travels
    small.combine = [this, t, root](const std::vector<std::string>& all) {
      for (int r = 0; r < size_; ++r) check_message(all[size_t(r)], r == root ? t.nbytes() : 0, r);
      if (rank_ != root && t.nbytes())
        std::memcpy(t.data_ptr(), all[size_t(root)].data(), t.nbytes());
    };
  }
  return enqueue(
      fp,
      [this, t, root](uint64_t seq, Milliseconds timeout) {
        if (size_ == 1 || t.numel() == 0) return;
        gloo::BroadcastOptions o(ctx_);
        set_output_bytes(o, t.data_ptr(), size_t(t.numel()), t.element_size());
        o.setRoot(root);
        o.setTag(uint32_t(seq));
        o.setTimeout(timeout);
        gloo::broadcast(o);
      },
      std::move(small));
}

WorkPtr ProcessGroupGloo::all_gather_async(const Tensor& out, const Tensor& in) {
  check_cpu_contiguous("all_gather", out, "output");
  check_cpu_contiguous("all_gather", in, "input");
  ACCEL_CHECK(out.dtype() == in.dtype(), DTypeError, "all_gather", "output dtype ", out.dtype(),
              " differs from input dtype ", in.dtype());
  ACCEL_CHECK(out.numel() == in.numel() * size_, ShapeError, "all_gather", "output ",
              out.shape_str(), " must hold world size ", size_, " x input ", in.shape_str(), " = ",
              in.numel() * size_, " elements");
  Fingerprint fp = make_fingerprint(OpKind::AllGather, in.dtype(), ReduceOp::Sum, -1, in.numel());
  count_sent(in.nbytes());
  Small small;
  if (small_path(in.nbytes())) {
    small.payload = in.data_ptr();
    small.bytes = in.nbytes();
    small.combine = [this, out, in](const std::vector<std::string>& all) {
      const size_t bytes = in.nbytes();
      for (int r = 0; r < size_; ++r) check_message(all[size_t(r)], bytes, r);
      // memmove: the input may be this rank's own chunk of the output (in place).
      char* o = static_cast<char*>(out.data_ptr());
      for (int r = 0; r < size_; ++r)
        if (bytes) std::memmove(o + size_t(r) * bytes, all[size_t(r)].data(), bytes);
    };
  }
  return enqueue(
      fp,
      [this, out, in](uint64_t seq, Milliseconds timeout) {
        size_t n = size_t(in.numel()), es = in.element_size();
        if (n == 0) return;
        char* slot = static_cast<char*>(out.data_ptr()) + size_t(rank_) * n * es;
        if (size_ == 1) {
          if (slot != in.data_ptr()) std::memmove(slot, in.data_ptr(), n * es);
          return;
        }
        if (shm_) {  // stamped by run_task (Note [fingerprint paths])
          shm_->all_gather(in.data_ptr(), out.data_ptr(), n, es, timeout, &stamp_, shm_check());
          return;
        }
        gloo::AllgatherOptions o(ctx_);
        // In place (ZeRO gathers into a buffer whose own chunk is the input): no input buffer.
        if (slot != in.data_ptr()) set_input_bytes(o, in.data_ptr(), n, es);
        set_output_bytes(o, out.data_ptr(), n * size_t(size_), es);
        o.setTag(uint32_t(seq));
        o.setTimeout(timeout);
        gloo::allgather(o);
      },
      std::move(small));
}

WorkPtr ProcessGroupGloo::reduce_scatter_async(const Tensor& out, const Tensor& in, ReduceOp op) {
  check_cpu_contiguous("reduce_scatter", out, "output");
  check_cpu_contiguous("reduce_scatter", in, "input");
  ACCEL_CHECK(out.dtype() == in.dtype(), DTypeError, "reduce_scatter", "output dtype ", out.dtype(),
              " differs from input dtype ", in.dtype());
  ACCEL_CHECK(in.numel() == out.numel() * size_, ShapeError, "reduce_scatter", "input ",
              in.shape_str(), " must hold world size ", size_, " x output ", out.shape_str(), " = ",
              out.numel() * size_, " elements");
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
  count_sent(in.nbytes());
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
  } else if (shm_) {  // stamped by run_task (Note [fingerprint paths])
    shm_->reduce_scatter(inp, outp, k, es,
                         reduce_function(in.dtype(), op == ReduceOp::Avg ? ReduceOp::Sum : op),
                         timeout, &stamp_, shm_check());
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
//
// Note [p2p drain limit]
// The header comes from the peer: its element count and dtype are checked (a known dtype, a
// count >= 0) before anything is sized from them, and on a mismatch the payload is drained only
// when it is at most kMaxP2PDrainBytes. A larger one is refused: the verdict says so, and both
// sides mark the group failed, because the sender's payload can then never be delivered (a later
// receive on the same slot would otherwise take it).
constexpr uint8_t kVerdictMismatch = 0;  // drained and dropped; the group stays usable
constexpr uint8_t kVerdictAccepted = 1;
constexpr uint8_t kVerdictRefused = 2;  // not drained; the group is failed
constexpr size_t kMaxP2PDrainBytes = size_t(64) << 20;

struct P2PHeader {
  uint32_t magic = kP2PMagic;
  uint8_t dtype = 0;
  uint8_t ok = kVerdictAccepted;  // the receiver's verdict
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
        os << '[' << op_kind_name(kind_) << "] " << describe(mine_)
           << (kind_ == OpKind::Send ? " to" : " from") << " rank " << peer_ << " tag " << tag_
           << " failed on rank " << pg_->rank_ << pg_->group_context() << " (timeout "
           << timeout_.count() << " ms): "
           << pg_->cause_of(std::string("the peer died or stopped answering: ") + e.what());
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
  // Fails the group (both sides' pending payloads are then dropped) and raises `msg`.
  [[noreturn]] void fail_group(const std::string& msg) {
    pg_->mark_broken(msg);
    throw DistError(msg);
  }
  std::string side() const {
    std::ostringstream os;
    os << '[' << op_kind_name(kind_) << "] rank " << pg_->rank_ << " of " << pg_->size_
       << pg_->group_context();
    return os.str();
  }
  void wait_send() {
    hdr_->waitSend(timeout_);
    // The verdict first: a refused payload is never received, so waiting for it would hang.
    ack_->waitRecv(timeout_);
    if (ack_buf_.magic != kP2PMagic || ack_buf_.ok > kVerdictRefused)
      fail_group(side() + ": corrupt verdict from rank " + std::to_string(peer_));
    if (ack_buf_.ok == kVerdictRefused) {
      std::ostringstream os;
      os << side() << " sent " << describe(mine_) << " to rank " << peer_ << " tag " << tag_
         << " but rank " << peer_ << " posted recv " << describe(ack_buf_)
         << "; the payload is too large to drain, so the group is unusable now";
      fail_group(os.str());
    }
    if (data_) data_->waitSend(timeout_);
    ACCEL_CHECK(ack_buf_.ok == kVerdictAccepted, DistError, "send", "rank ", pg_->rank_, " sent ",
                describe(mine_), " to rank ", peer_, " tag ", tag_, " but rank ", peer_,
                " posted recv ", describe(ack_buf_));
  }
  void wait_recv() {
    hdr_->waitRecv(timeout_);
    P2PHeader theirs = hdr_buf_;
    // Nothing is sized from the peer's header before it is validated (Note [p2p drain limit]).
    const bool known_dtype = theirs.dtype < kNumDTypes;
    if (theirs.magic != kP2PMagic || !known_dtype || theirs.numel < 0) {
      std::ostringstream os;
      os << side() << ": corrupt header from rank " << peer_ << " tag " << tag_ << " (magic 0x"
         << std::hex << theirs.magic << std::dec << ", dtype code " << int(theirs.dtype) << ", "
         << theirs.numel << " elements)";
      fail_group(os.str());
    }
    const size_t esize = dtype_size(DType(theirs.dtype));
    const bool fits = uint64_t(theirs.numel) <= kMaxP2PDrainBytes / esize;
    const bool ok =
        theirs.dtype == mine_.dtype && theirs.numel == mine_.numel && theirs.count == mine_.count;
    ack_buf_ = mine_;
    ack_buf_.ok = ok ? kVerdictAccepted : fits ? kVerdictMismatch : kVerdictRefused;
    ack_ = pg_->ctx_->createUnboundBuffer(&ack_buf_, sizeof(P2PHeader));
    ack_->send(peer_, p2p_slot(kSlotP2PAck, tag_));
    if (!ok && !fits) {
      // Best effort: let the verdict reach the sender before the group is failed.
      try {
        ack_->waitSend(std::min(timeout_, Milliseconds(1000)));
      } catch (const std::exception&) {
      }
      std::ostringstream os;
      os << side() << " posted recv " << describe(mine_) << " from rank " << peer_ << " tag "
         << tag_ << " but rank " << peer_ << " sent " << describe(theirs) << ", more than the "
         << kMaxP2PDrainBytes
         << " bytes a mismatched message may take to drain; the group is unusable now";
      fail_group(os.str());
    }
    const size_t their_bytes = size_t(theirs.numel) * esize;
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
              " must be another rank in [0, ", size_, "), this is rank ", rank_, group_context());
  ACCEL_CHECK(tag >= 0, DistError, "send", "tag must be >= 0, got ", tag);
  std::string broken = broken_message();
  ACCEL_CHECK(broken.empty(), DistError, "send", "the process group", group_context(),
              " failed earlier: ", broken);
  uint64_t count;
  {
    std::lock_guard<std::mutex> g(p2p_mu_);
    count = send_count_[{dst, tag}]++;
  }
  auto w = std::make_shared<GlooP2PWork>(this, OpKind::Send, t, dst, tag, timeout_);
  count_sent(t.nbytes());
  w->post(count);
  return w;
}

WorkPtr ProcessGroupGloo::recv_async(const Tensor& t, int src, int tag) {
  check_cpu_contiguous("recv", t, "tensor");
  ACCEL_CHECK(src >= 0 && src < size_ && src != rank_, DistError, "recv", "source ", src,
              " must be another rank in [0, ", size_, "), this is rank ", rank_, group_context());
  ACCEL_CHECK(tag >= 0, DistError, "recv", "tag must be >= 0, got ", tag);
  std::string broken = broken_message();
  ACCEL_CHECK(broken.empty(), DistError, "recv", "the process group", group_context(),
              " failed earlier: ", broken);
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
