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

namespace {

using Clock = std::chrono::steady_clock;

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

std::string op_name_str(OpKind k) { return std::string(op_kind_name(k)); }

}  // namespace

std::unique_ptr<gloo::rendezvous::Store> make_gloo_store(std::shared_ptr<Store> store) {
  return std::make_unique<GlooStoreAdapter>(std::move(store));
}

namespace {

// Finding the TCP socket of Gloo's pair to a peer, for TCP_INFO (Note [progress watchdog]). The
// Debian Gloo package does not install the headers a subclass of its TCP pair needs, so the
// socket is found by its addresses: the pair connected either to the peer's published pair
// address (we were the connecting side) or from it to ours (we listened, and the accepted socket
// keeps our pair's address as its local one). Only getsockname/getpeername/getsockopt are called
// on it; the descriptor stays Gloo's, and is checked again before each use.
struct PairEndpoints {
  std::string mine;    // our pair's listening address for this peer, "ip:port"
  std::string theirs;  // the peer's pair address for us
};

std::string socket_name(int fd, bool peer) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  int rc = peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len)
                : getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  if (rc != 0 || (ss.ss_family != AF_INET && ss.ss_family != AF_INET6)) return {};
  return format_sockaddr(reinterpret_cast<sockaddr*>(&ss), true);
}

bool is_pair_socket(int fd, const PairEndpoints& e) {
  int type = 0;
  socklen_t len = sizeof(type);
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) return false;
  const std::string remote = socket_name(fd, true);
  if (remote.empty()) return false;  // not connected (a listener)
  return remote == e.theirs || socket_name(fd, false) == e.mine;
}

int find_pair_socket(const PairEndpoints& e) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int found = -1;
  const int self = dirfd(d);
  while (dirent* ent = readdir(d)) {
    char* end = nullptr;
    long fd = std::strtol(ent->d_name, &end, 10);
    if (!end || *end != '\0' || fd < 0 || fd == self) continue;
    if (is_pair_socket(int(fd), e)) {
      found = int(fd);
      break;
    }
  }
  closedir(d);
  return found;
}

// Note [gloo connect timeout]
// Gloo (this version) waits up to 5x the pair timeout for a pair's initial connection, and a
// rank on the listening side of a pair waits for a peer that may never come: with the 5-minute
// collective timeout a rank whose peer failed to connect hung for 25 minutes. The pairs here get
// a fifth of the timeout, so the connect wait is bounded by the timeout itself, and each step
// names the peer and its address when it fails. (The pair timeout only bounds the connect and
// Gloo's sync mode; collectives pass their own timeout.) A peer lost meanwhile (the heartbeat,
// through the InitGuard) closes the pairs, which ends the wait at once.
class BoundedGlooContext : public gloo::Context {
 public:
  BoundedGlooContext(int rank, int size) : gloo::Context(rank, size) {}

  void connect_full_mesh(Store& store, const std::shared_ptr<gloo::transport::Device>& dev,
                         const std::string& hostname, Milliseconds timeout, InitGuard* guard) {
    // With a guard, the formation's deadline, and its configured timeout in messages.
    const auto deadline = guard ? guard->deadline() : Clock::now() + timeout;
    if (guard) timeout = guard->timeout();
    const Milliseconds left = std::max(
        Milliseconds(1), std::chrono::duration_cast<Milliseconds>(deadline - Clock::now()));
    const std::string who = "rank " + std::to_string(rank) + " of " + std::to_string(size);
    std::shared_ptr<gloo::transport::Context> tctx = dev->createContext(rank, size);
    tctx->setTimeout(std::max(Milliseconds(1), (left + Milliseconds(4)) / 5));
    std::string mine;
    size_t addr_size = 0;
    endpoints_.assign(size_t(size), {});
    for (int i = 0; i < size; ++i) {
      if (i == rank) continue;
      auto bytes = tctx->createPair(i)->address().bytes();
      addr_size = bytes.size();
      mine.append(bytes.begin(), bytes.end());
      endpoints_[size_t(i)].mine = format_sockaddr(
          reinterpret_cast<const sockaddr*>(&gloo::transport::tcp::Address(bytes).getSockaddr()),
          true);
    }
    // Pair::close() is Gloo's "hard close", safe from another thread; a connect waiting on the
    // listening side then returns (a closed pair counts as past connecting), and each connect
    // below is followed by a look at the guard.
    InitGuard::Hook hook;
    if (guard)
      hook = guard->on_fail([tctx, n = size, me = rank](const std::string&) {
        for (int i = 0; i < n; ++i)
          if (i != me) tctx->getPair(i)->close();
      });
    store.set("gloo/" + std::to_string(rank), mine);
    for (int i = 0; i < size; ++i) {
      if (i == rank) continue;
      const std::string key = "gloo/" + std::to_string(i);
      wait_peer_key(store, key, i, deadline, timeout, who, "Gloo address");
      std::string all = store.get(key);
      // Rank i listed one address per peer in rank order, skipping itself.
      const size_t index = size_t(rank < i ? rank : rank - 1);
      ACCEL_CHECK(all.size() == addr_size * size_t(size - 1), DistError, "init", who, ": rank ", i,
                  " published a malformed address list (", all.size(), " bytes, expected ",
                  addr_size * size_t(size - 1), ")");
      std::vector<char> addr(all.begin() + long(index * addr_size),
                             all.begin() + long((index + 1) * addr_size));
      std::string where = format_sockaddr(
          reinterpret_cast<const sockaddr*>(&gloo::transport::tcp::Address(addr).getSockaddr()),
          true);
      endpoints_[size_t(i)].theirs = where;
      if (guard) guard->check(who);
      const auto step_start = Clock::now();
      try {
        tctx->getPair(i)->connect(addr);
      } catch (const std::exception& e) {
        if (guard) guard->check(who);  // closed by the guard: its reason, not Gloo's
        // "within" only when it waited; a refused connection fails at once.
        const bool waited = Clock::now() - step_start >= left / 2;
        ACCEL_THROW(DistError, "init", who, ": could not connect to rank ", i, " at ", where,
                    waited ? " within " + std::to_string(timeout.count()) + " ms" : "",
                    " (gloo, this rank at ", hostname, "): ", e.what(),
                    " (an address the peer cannot reach? choose the interface with "
                    "ACCEL_SOCKET_IFNAME)");
      }
      // A pair closed by the guard "connects" (Gloo counts closed as past connecting).
      if (guard) guard->check(who);
    }
    device_ = dev;
    transportContext_ = std::move(tctx);
    sockets_.assign(size_t(size), -1);
  }

  // The pair's socket to `peer`, or -1 (Note [progress watchdog]). Called by one thread (the
  // heartbeat's).
  int socket_fd(int peer) {
    if (peer < 0 || size_t(peer) >= sockets_.size() || peer == rank) return -1;
    int& fd = sockets_[size_t(peer)];
    if (fd >= 0 && is_pair_socket(fd, endpoints_[size_t(peer)])) return fd;
    fd = find_pair_socket(endpoints_[size_t(peer)]);
    return fd;
  }

 private:
  std::vector<PairEndpoints> endpoints_;
  std::vector<int> sockets_;
};

}  // namespace

std::shared_ptr<gloo::Context> connect_gloo_context(const std::shared_ptr<Store>& store, int rank,
                                                    int size, const std::string& hostname,
                                                    Milliseconds timeout, InitGuard* guard) {
  gloo::transport::tcp::attr attr;
  attr.hostname = hostname;
  std::shared_ptr<gloo::transport::Device> device;
  try {
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    ACCEL_THROW(DistError, "init", "rank ", rank, " of ", size,
                ": cannot create the Gloo device on '", hostname,
                "' (is it an address of this "
                "host? see ACCEL_SOCKET_IFNAME): ",
                e.what());
  }
  auto ctx = std::make_shared<BoundedGlooContext>(rank, size);
  ctx->setTimeout(timeout);
  ctx->connect_full_mesh(*store, device, hostname, timeout, guard);
  return ctx;
}

int gloo_socket_fd(gloo::Context& ctx, int peer) {
  auto* b = dynamic_cast<BoundedGlooContext*>(&ctx);
  return b ? b->socket_fd(peer) : -1;
}

void abort_gloo_context(gloo::Context& ctx) {
  // Note [waking gloo waiters]: closeConnections() closes the sockets but does not wake this
  // process's own pending sends and receives (they would sit out their timeout). A receive wait
  // that times out makes Gloo signal every pair, which fails all pending operations at once; a
  // 1 ms wait on a buffer nobody sends to is the public way to trigger that.
  try {
    char dummy = 0;
    auto ub = ctx.createUnboundBuffer(&dummy, 1);
    ub->waitRecv(std::chrono::milliseconds(1));
  } catch (...) {
  }
  try {
    ctx.closeConnections();
  } catch (...) {
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
  set_identity(options_, name);
  if (size > 1) {
    ignore_sigpipe();
    ACCEL_CHECK(store != nullptr, DistError, "init", "a store is needed for world size ", size);
    store_ = std::make_shared<PrefixStore>(name, std::move(store));
    store_->set_timeout(options_.timeout);
    // One deadline for the whole formation; the heartbeat first, so that a peer lost during any
    // later step ends it (Note [init guard], Note [heartbeat during init]).
    const Milliseconds init_timeout =
        options_.init_timeout.count() > 0 ? options_.init_timeout : options_.timeout;
    init_guard_.set_deadline(init_timeout, options_.init_deadline);
    const std::string who =
        "rank " + std::to_string(rank) + " of " + std::to_string(size) + group_context();
    try {
      InitGuard::Hook interrupt_store =
          init_guard_.on_fail([this](const std::string& why) { store_->interrupt(why); });
      if (options_.heartbeat_timeout.count() > 0) {
        heartbeat_ = std::make_unique<Heartbeat>(
            store_, rank, size, options_.hostname, options_.heartbeat_interval,
            options_.heartbeat_timeout, init_timeout,
            [this](int peer, const std::string& message) { on_peer_lost(peer, message); },
            &init_guard_);
      }
      ctx_ =
          connect_gloo_context(store_, rank, size, options_.hostname, init_timeout, &init_guard_);
      init_guard_.check(who);
      control_ = std::make_unique<ControlPlane>(store_, rank, size, options_.hostname, init_timeout,
                                                &init_guard_);
      init_guard_.check(who);
      if (options_.shm) {
        try {
          shm_ =
              ShmAllReduce::create(store_, rank, size, options_.shm_slot_bytes, init_guard_.left());
          // A subgroup's peers by their world rank, as the heartbeat names them.
          if (shm_ && is_subgroup()) shm_->label_ranks(world_ranks(), group_name());
        } catch (const DistError& e) {
          init_guard_.check(who);
          ACCEL_THROW(DistError, "init", who, ": shared-memory setup failed within ",
                      init_timeout.count(), " ms: ", e.what());
        }
      }
      init_guard_.check(who);
    } catch (const std::exception& e) {
      // The guard's reason (a lost peer) explains whatever error the interrupted step raised.
      std::string why = init_guard_.failed() ? "[init] " + who + ": " + init_guard_.failure() +
                                                   " (while the process group was forming)"
                                             : with_group(e.what());
      // Peers still forming the group learn it now, not at their own timeout.
      if (heartbeat_) heartbeat_->fail(why);
      store_->clear_interrupt();
      throw DistError(why);
    }
    store_->clear_interrupt();
    initialized_ = true;
    // A loss reported between the last check and now: the group is unusable (first collective
    // raises it).
    if (init_guard_.failed()) mark_broken(init_guard_.failure());
    flows_.assign(size_t(size), {});
    if (heartbeat_) heartbeat_->set_on_tick([this] { check_progress(); });
  }
  worker_ = std::thread([this] { worker_loop(); });
}

ProcessGroupGloo::~ProcessGroupGloo() {
  if (heartbeat_) heartbeat_->set_on_tick({});
  {
    std::lock_guard<std::mutex> g(queue_mu_);
    stop_ = true;
  }
  queue_cv_.notify_all();
  if (worker_.joinable()) worker_.join();  // runs what was queued: handles always complete
  // After the queue drained (peers still need our beats until then): says bye, so that peers
  // finishing after us do not take our exit for a failure.
  heartbeat_.reset();
  ctx_.reset();
}

ProcessGroupPtr ProcessGroupGloo::form_subgroup(const std::vector<int>& members,
                                                const std::string& store_name,
                                                ProcessGroupOptions options) {
  const auto me = std::find(members.begin(), members.end(), rank_);
  ACCEL_CHECK(me != members.end(), DistError, "new_group", "rank ", rank_, group_context(),
              " is not among the members");
  ProcessGroupOptions o = inherit_options(options_, timeout_, options);
  o.name = store_name;
  const int size = int(members.size());
  // Keys under this group's prefix; the new group's heartbeat, control plane, Gloo pairs and
  // shared memory are its own (Note [subgroups] in comm/subgroups.cc).
  return std::make_shared<ProcessGroupGloo>(size > 1 ? store_ : nullptr, int(me - members.begin()),
                                            size, std::move(o));
}

ProcessGroupPtr new_gloo_group(std::shared_ptr<Store> store, int rank, int size,
                               ProcessGroupOptions options) {
  return std::make_shared<ProcessGroupGloo>(std::move(store), rank, size, std::move(options));
}

// =========================== worker ===========================

void ProcessGroupGloo::on_peer_lost(int peer, const std::string& message) {
  // A subgroup's heartbeat numbers peers in the group; the message says which world rank it is.
  std::string msg = message;
  if (is_subgroup() && peer >= 0 && peer < size_)
    msg = "group " + group_name() + ", whose rank " + std::to_string(peer) + " is world rank " +
          std::to_string(world_ranks()[size_t(peer)]) + ": " + message;
  init_guard_.fail(msg);
  if (initialized_.load()) mark_broken(msg);
}

std::string ProcessGroupGloo::with_group(const std::string& msg) const {
  if (!is_subgroup() || msg.find(group_name()) != std::string::npos) return msg;
  return msg + " (on rank " + std::to_string(rank_) + group_context() + ")";
}

void ProcessGroupGloo::mark_broken(const std::string& msg) {
  {
    std::lock_guard<std::mutex> g(broken_mu_);
    if (!broken_.empty()) return;
    broken_ = msg;
  }
  // Peers learn it from the heartbeat too (the control channel may be what is broken).
  if (heartbeat_) heartbeat_->fail("rank " + std::to_string(rank_) + ": " + msg);
  // Closing our connections turns the failure into an immediate error on the peers that wait on
  // us, instead of each of them running into its own timeout; the abort notice tells those that
  // read the control channel next why.
  if (control_) control_->abort("rank " + std::to_string(rank_) + ": " + msg);
  if (shm_) shm_->abort(msg);
  if (ctx_) abort_gloo_context(*ctx_);
}

// Note [progress watchdog]
// Gloo owns its sockets and reports nothing until an operation's timeout (5 minutes by default);
// the heartbeat only knows that datagrams arrive. On a link that loses 30 % of its packets both
// are content: beats keep arriving (7 in 10), while TCP retransmits with exponential backoff and a
// collective can sit without moving a byte for tens of seconds, then crawl. The watchdog runs on
// the heartbeat thread every interval and asks the kernel (TCP_INFO, comm/net.h: tcp_progress)
// about every connection of the group to each peer: Gloo's pair socket (ObservedPair) and the
// control channel's. A connection that has data in flight (unacked > 0) and whose acknowledged
// byte count has not moved for heartbeat_timeout is stalled: the peer's kernel has not confirmed
// a single byte for that long, which a live host on a working path always does within a few
// round trips (a peer that is busy or stopped still acknowledges what its buffers can take; a
// full buffer shows as a zero window, with nothing in flight). The group is then marked failed
// naming the peer, its address, the retransmissions, and what the heartbeat saw of the loss, and
// the failure reaches the peer through the heartbeat (Heartbeat::fail), whose datagrams still
// get through most of the time.
// What it can detect: a path that drops everything or nearly everything in one direction for
// heartbeat_timeout (a lossy link whose retransmissions keep failing, a link cut while data
// was in flight, a dead or unplugged peer host), on either side of the connection that has data
// to send; a peer whose own watchdog fired, through its heartbeat. What it cannot: a link that
// is slow but moving (bytes acknowledged now and then: a 30 % loss link often crawls rather
// than stalls; the heartbeat logs its loss rate once it passes 20 % of beats in a window, and
// training goes on, slowly); a side that only waits to receive, with nothing of its own in
// flight (the sending side detects it and tells it); shared-memory groups (no sockets; a
// stopped or dead peer is the heartbeat's and pidfd's); NCCL (its own transport); with the
// heartbeat disabled (ACCEL_HEARTBEAT_TIMEOUT=0), nothing.
void ProcessGroupGloo::check_progress() {
  if (!initialized_.load() || size_ == 1 || !heartbeat_ || !broken_message().empty()) return;
  const auto now = Clock::now();
  const Milliseconds stall = options_.heartbeat_timeout;
  // This thread did not run for that long (the process was stopped or starved): what did not
  // move meanwhile says nothing about the network. Judge afresh from now on.
  const bool starved =
      last_progress_check_ != Clock::time_point{} && now - last_progress_check_ > stall;
  last_progress_check_ = now;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    const int fds[2] = {ctx_ ? gloo_socket_fd(*ctx_, peer) : -1,
                        control_ ? control_->socket_fd(peer) : -1};
    for (int k = 0; k < 2; ++k) {
      Flow& f = flows_[size_t(peer)][size_t(k)];
      TcpProgress t = tcp_progress(fds[k]);
      if (!t.ok || t.unacked == 0 || t.bytes_acked != f.acked || f.since == Clock::time_point{} ||
          starved) {
        f.acked = t.bytes_acked;
        f.since = now;
        continue;
      }
      if (now - f.since < stall) continue;
      std::ostringstream os;
      os.setf(std::ios::fixed);
      os.precision(1);
      std::string address = heartbeat_->peer_address(peer);
      std::string loss = heartbeat_->loss_report(peer);
      os << "no progress on the " << (k == 0 ? "Gloo" : "control") << " connection to rank " << peer
         << (address.empty() ? "" : " at " + address) << " for "
         << std::chrono::duration<double>(now - f.since).count() << " s: " << t.unacked
         << " segment(s) unacknowledged, " << t.retransmits << " retransmission(s) in a row, "
         << t.total_retrans << " in all" << (loss.empty() ? "" : "; " + loss)
         << ": the network path to rank " << peer << " is losing packets or down";
      mark_broken(os.str());
      return;
    }
  }
}

std::string ProcessGroupGloo::broken_message() const {
  std::lock_guard<std::mutex> g(broken_mu_);
  return broken_;
}

std::string ProcessGroupGloo::cause_of(const std::string& symptom) const {
  // When another thread (the heartbeat, a failed p2p wait) marked the group failed, the error an
  // in-flight operation sees is only the consequence (a closed connection, an abort notice from
  // ourselves): the recorded failure is the cause and comes first.
  // (The symptom itself then misleads: our own abort reads as "rank N closed its connection".)
  std::string prior = broken_message();
  return prior.empty() ? symptom : prior;
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

const ShmAllReduce::StampCheck* ProcessGroupGloo::shm_check() {
  if (!stamp_check_) return nullptr;
  if (!shm_verify_)
    shm_verify_ = [this](const void* stamps) {
      const auto t0 = Clock::now();
      history_.verify(static_cast<const Fingerprint*>(stamps), size_, stamp_);
      fingerprint_ns_ +=
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
    };
  return &shm_verify_;
}

WorkPtr ProcessGroupGloo::enqueue(Fingerprint fp,
                                  std::function<void(uint64_t, Milliseconds)> body) {
  return enqueue(fp, std::move(body), Small());
}

WorkPtr ProcessGroupGloo::enqueue(Fingerprint fp, std::function<void(uint64_t, Milliseconds)> body,
                                  Small small) {
  fp.seq = seq_.fetch_add(1);
  auto work = std::make_shared<GlooWork>(this, OpKind(fp.kind), fp.seq);
  {
    std::lock_guard<std::mutex> g(queue_mu_);
    ACCEL_CHECK(!stop_, DistError, op_name_str(OpKind(fp.kind)).c_str(),
                "process group is shutting down");
    queue_.push_back(Task{work, fp, timeout_, std::move(body), std::move(small)});
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
                group_context(), ": the process group failed earlier: ", broken);
    int every = options_.fingerprint_every;
    // A barrier always exchanges fingerprints: that exchange is the barrier.
    const bool check = every > 0 && fp.seq % uint64_t(every) == 0;
    const bool exchange = size_ > 1 && (check || OpKind(fp.kind) == OpKind::Barrier);
    // Note [fingerprint paths]: a non-empty all-reduce through shared memory carries the
    // stamped fingerprint on its own first arrival and compares it there, before it reduces;
    // any other exchange goes through the shared-memory segment when there is one (one arrival:
    // no syscall) and over the control plane otherwise.
    stamp_ = history_.stamp(fp);
    stamp_check_ = false;
    const OpKind kind = OpKind(fp.kind);
    const bool rides_shm =
        shm_ && size_ > 1 && fp.numel > 0 &&
        (kind == OpKind::AllReduce || kind == OpKind::AllGather || kind == OpKind::ReduceScatter);
    if (rides_shm) {
      stamp_check_ = exchange;
      if (exchange) ++fingerprint_checks_;
    } else if (size_ > 1 && !shm_ && (exchange || task.small.combine)) {
      exchange_control(task, exchange);
      if (task.small.combine) {
        task.work->finish(nullptr);
        return;
      }
    } else if (exchange) {
      auto t0 = Clock::now();
      std::vector<Fingerprint> all(static_cast<size_t>(size_));
      shm_->exchange(&stamp_, all.data(), task.timeout);  // PeerError on failure
      history_.verify(all.data(), size_, stamp_);
      if (OpKind(fp.kind) != OpKind::Barrier) {  // a barrier's exchange is the barrier itself
        fingerprint_ns_ +=
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
        ++fingerprint_checks_;
      }
    }
    task.body(fp.seq, task.timeout);
  } catch (const PeerError& e) {
    std::ostringstream os;
    os << '[' << op << "] " << fp.describe() << " failed on rank " << rank_ << " of " << size_
       << group_context() << " (timeout " << task.timeout.count() << " ms): " << cause_of(e.what());
    mark_broken(os.str());
    err = std::make_exception_ptr(DistError(os.str()));
  } catch (const DistError& e) {
    // Ours: mismatch, or an earlier failure; already worded (a subgroup's name added).
    err = is_subgroup() ? std::make_exception_ptr(DistError(with_group(e.what())))
                        : std::current_exception();
  } catch (const std::exception& e) {
    // Gloo (IoException on a timeout or a closed connection, EnforceNotMet) and anything else.
    std::ostringstream os;
    os << '[' << op << "] " << fp.describe() << " failed on rank " << rank_ << " of " << size_
       << group_context() << " (timeout " << task.timeout.count()
       << " ms): " << cause_of(std::string("a peer died or stopped answering: ") + e.what());
    mark_broken(os.str());
    err = std::make_exception_ptr(DistError(os.str()));
  }
  task.work->finish(err);
}

// Note [fingerprint paths]
// Where a rank's fingerprint travels, so that the check adds no round trip of its own:
// * shared memory, all-reduce, all-gather, reduce-scatter: on the collective's first arrival
//   (Note [shm stamps]); every rank compares all stamps after that barrier, before anything is
//   read from a peer.
// * shared memory, anything else (broadcast, barrier, an empty collective): one arrival through the
// segment carrying the stamp (no syscall), then Gloo.
//   All collectives of a group arrive through the same counters, so an all-reduce on one rank
//   against a broadcast on another meet there and both raise.
// * TCP, a collective of at most kSmallControlBytes per rank (all-reduce, broadcast,
//   all-gather): the data itself travels over the control plane in one message per peer,
//   fingerprint first, and each rank combines the messages locally (in rank order, so every rank
//   gets identical bits): the check rides the only round trip the collective makes. The
//   fingerprints are compared before anything is combined, always (a message of another size
//   must not be read as ours), and against the history too when this one is checked.
// * TCP, anything larger: the fingerprint all-gather over the control plane, then Gloo (a
//   round trip that a large collective amortises).
// A mismatch between two paths (a small all-reduce against a large one) still meets on the
// control plane: every TCP exchange is an all_gather_v whose messages start with the stamp.
constexpr size_t kSmallControlBytes = size_t(16) << 10;

bool ProcessGroupGloo::small_path(size_t bytes) const {
  return size_ > 1 && !shm_ && bytes <= kSmallControlBytes;
}

void ProcessGroupGloo::exchange_control(Task& task, bool checked) {
  auto t0 = Clock::now();
  const size_t fp_bytes = sizeof(Fingerprint);
  std::string mine(fp_bytes + task.small.bytes, '\0');
  std::memcpy(mine.data(), &stamp_, fp_bytes);
  if (task.small.bytes) std::memcpy(mine.data() + fp_bytes, task.small.payload, task.small.bytes);
  std::vector<std::string> all;
  control_->all_gather_v(mine.data(), mine.size(), all, fp_bytes + kSmallControlBytes,
                         task.timeout);  // PeerError on failure
  std::vector<Fingerprint> fps(static_cast<size_t>(size_));
  bool same_calls = true;
  for (int r = 0; r < size_; ++r) {
    std::string& m = all[size_t(r)];
    if (m.size() < fp_bytes)
      throw PeerError("rank " + std::to_string(r) + " sent a " + std::to_string(m.size()) +
                      "-byte fingerprint message");
    std::memcpy(&fps[size_t(r)], m.data(), fp_bytes);
    m.erase(0, fp_bytes);
    same_calls = same_calls && fps[size_t(r)].same_call(stamp_);
  }
  // Timed: with a Small payload the exchange is the collective itself, not the check's cost,
  // and a barrier's exchange is the barrier.
  const bool own_exchange = !task.small.combine && OpKind(task.fp.kind) != OpKind::Barrier;
  if (checked || !same_calls) {
    const auto t1 = Clock::now();
    history_.verify(fps.data(), size_, stamp_);
    if (OpKind(task.fp.kind) != OpKind::Barrier)
      fingerprint_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(
                             Clock::now() - (own_exchange ? t0 : t1))
                             .count();
  }
  if (checked && OpKind(task.fp.kind) != OpKind::Barrier) ++fingerprint_checks_;
  if (task.small.combine) task.small.combine(all);
}

}  // namespace accel::dist
