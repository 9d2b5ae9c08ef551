// InitGuard: ends every blocked step of a group's formation as soon as one failure is known.
//
// Note [init guard]
// Forming a group waits on several things in turn: the store (peers' addresses), Gloo's pair
// connects, the control channel's connects and accepts, the shared-memory setup. Each is bounded
// by the init deadline, but a peer that dies or stops meanwhile should not cost the rest of it.
// The heartbeat runs from the start of formation (Note [heartbeat during init]); when it loses a
// peer, or a peer says it failed, it calls fail(why): the guard records the reason and runs the
// cancel hooks the current step registered (interrupt the store's waits, close Gloo's pairs), and
// the control channel polls failed() between short slices. The step then ends with some error of
// its own; the group's constructor reports the guard's reason instead, which names the peer.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "core/error.h"

namespace accel::dist {

class InitGuard {
 public:
  using Clock = std::chrono::steady_clock;
  // The formation's bound: every step ends by `deadline`; messages name `timeout`, the bound
  // as configured (not what was left of it when the step began).
  void set_deadline(std::chrono::milliseconds timeout, Clock::time_point deadline = {}) {
    timeout_ = timeout;
    deadline_ = deadline == Clock::time_point{} ? Clock::now() + timeout : deadline;
  }
  std::chrono::milliseconds timeout() const { return timeout_; }
  Clock::time_point deadline() const { return deadline_; }
  // What is left until the deadline, at least 1 ms.
  std::chrono::milliseconds left() const {
    return std::max(
        std::chrono::milliseconds(1),
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now()));
  }

  // Records the first failure and runs the cancel hooks with it. Any thread; the hooks run under
  // the guard's lock (so none runs after its Hook is gone) and must be quick and must not call
  // back into the guard.
  void fail(const std::string& why) {
    std::lock_guard<std::mutex> g(mu_);
    if (!failure_.empty()) return;
    failure_ = why.empty() ? std::string("initialisation cancelled") : why;
    for (auto& [id, hook] : hooks_) hook(failure_);
  }
  bool failed() const {
    std::lock_guard<std::mutex> g(mu_);
    return !failure_.empty();
  }
  std::string failure() const {
    std::lock_guard<std::mutex> g(mu_);
    return failure_;
  }
  // Throws DistError("[init] <who>: <failure>") when the guard failed.
  void check(const std::string& who) const {
    std::string f = failure();
    ACCEL_CHECK(f.empty(), DistError, "init", who, ": ", f);
  }

  // A cancel hook, removed when this handle goes (RAII). Runs at once when the guard has failed.
  class Hook {
   public:
    Hook() = default;
    Hook(InitGuard* g, int id) : guard_(g), id_(id) {}
    Hook(Hook&& o) noexcept : guard_(std::exchange(o.guard_, nullptr)), id_(o.id_) {}
    Hook& operator=(Hook&& o) noexcept {
      reset();
      guard_ = std::exchange(o.guard_, nullptr);
      id_ = o.id_;
      return *this;
    }
    ~Hook() { reset(); }
    void reset() {
      if (!guard_) return;
      std::lock_guard<std::mutex> g(guard_->mu_);
      guard_->hooks_.erase(id_);
      guard_ = nullptr;
    }

   private:
    InitGuard* guard_ = nullptr;
    int id_ = 0;
  };
  using HookFn = std::function<void(const std::string& why)>;
  [[nodiscard]] Hook on_fail(HookFn hook) {
    std::lock_guard<std::mutex> g(mu_);
    if (!failure_.empty()) {
      hook(failure_);
      return Hook();
    }
    int id = next_id_++;
    hooks_.emplace(id, std::move(hook));
    return Hook(this, id);
  }

 private:
  std::chrono::milliseconds timeout_{0};
  Clock::time_point deadline_{};
  mutable std::mutex mu_;
  std::string failure_;
  std::map<int, HookFn> hooks_;
  int next_id_ = 0;
};

}  // namespace accel::dist
