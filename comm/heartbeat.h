// Heartbeat: detects a peer that is stopped (SIGSTOP), frozen, killed, or cut off by the network
// well before a collective timeout would, independently of the data transport and of the control
// plane (which are busy or idle depending on what the program does).
//
// Each rank of a group binds a UDP socket on its selected address, starts one thread, and only
// then publishes the address in the group's store ("hb/<rank>"). The thread sends a small
// authenticated datagram to every peer it knows each `interval` and reads theirs (Note [heartbeat
// authentication] in heartbeat.cc). A peer becomes known when its address is read from the store
// or when an authenticated datagram from it arrives, so the watch starts during group formation,
// while the other ranks are still arriving (Note [heartbeat during init]). A known peer from
// which nothing valid arrived for `timeout`, whose heartbeat port is closed (ICMP port
// unreachable, twice), or which says its group failed, is reported once through `on_lost`. A rank
// that shuts down normally sends "bye" first, so peers stop watching it instead of failing while
// they are still finishing (a departed peer only matters if a later collective needs it, and that
// collective then fails on the closed connection); a rank whose group failed says so instead
// (fail()), and its peers fail too, naming it and why.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/store.h"

namespace accel::dist {

class InitGuard;

class Heartbeat {
 public:
  // The peer's rank and the message to report (lost_message, failed_message, closed_message).
  using LostFn = std::function<void(int rank, const std::string& message)>;

  // Collective over the group: every rank constructs one with the same store. Datagrams are
  // keyed by store->derive_key("heartbeat"). Waits up to `setup_timeout` (with a `guard`, until
  // the guard's deadline) for every peer's address (a DistError naming the peer otherwise).
  // interval is clamped to at most timeout / 4.
  Heartbeat(const std::shared_ptr<Store>& store, int rank, int size, const std::string& hostname,
            Milliseconds interval, Milliseconds timeout, Milliseconds setup_timeout, LostFn on_lost,
            const InitGuard* guard = nullptr);
  // Sends "bye" (or, after fail(), the failure) to every peer and stops the thread.
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // This rank's group failed: every later datagram to the peers says so, with `why` (the first
  // call's), and the destructor repeats it instead of saying bye. Thread-safe.
  void fail(const std::string& why);
  // Runs `fn` on the heartbeat thread about once per interval (the group's progress check,
  // Note [progress watchdog] in gloo/process_group_gloo.cc). Thread-safe; empty clears it, and
  // returns once a tick that was running has finished.
  void set_on_tick(std::function<void()> fn);

  Milliseconds interval() const { return interval_; }
  Milliseconds timeout() const { return timeout_; }
  // Authenticated datagrams received from peers so far (for tests and diagnostics).
  int64_t beats_received() const { return received_.load(); }
  // Datagrams ignored: not ours or not authentic (bad size, magic, ranks or MAC), and authentic
  // ones seen before (a replay, or reordered).
  int64_t forged_datagrams() const { return forged_.load(); }
  int64_t replayed_datagrams() const { return replayed_.load(); }
  // Datagrams from `peer` lost in the last complete window of kLossWindow intervals, as a
  // fraction of those it sent (0 while unknown), and a phrase for messages ("7 of 20 heartbeats
  // from it lost in the last 20.0 s"), empty when nothing was lost.
  double loss_fraction(int peer) const;
  std::string loss_report(int peer) const;
  // The peer's address as known (empty while unknown).
  std::string peer_address(int peer) const;

  // The messages a lost peer produces (also used by tests to find them).
  static std::string lost_message(int rank, const std::string& address, double silent_s);
  static std::string failed_message(int rank, const std::string& address, const std::string& why);
  static std::string closed_message(int rank, const std::string& address);
  static std::string unreachable_message(int rank, const std::string& address_port);

  // The datagram format (Note [heartbeat authentication]), for tests that forge or replay them.
  static std::string encode(const std::string& key, uint8_t type, int from, int to, int size,
                            uint64_t seq, const std::string& reason = {});
  static constexpr uint8_t kBeat = 1, kBye = 2, kFail = 3;

 private:
  struct Peer {
    std::string address;     // as published (host), or learned from a datagram
    std::string key;         // "host:port" of its socket, to match datagram sources
    std::vector<char> dest;  // where to send (a sockaddr); empty while unknown
    std::chrono::steady_clock::time_point last_seen;
    uint64_t last_seq = 0;                    // highest sequence number accepted from it
    uint64_t sent_seq = 0;                    // sequence numbers of datagrams to it
    int64_t window_got = 0, window_lost = 0;  // in the current loss window
    int64_t last_got = -1, last_lost = 0;     // the previous complete window
    int refused = 0;  // ICMP port unreachable in a row (its socket is closed)
    bool departed = false;
    bool reported = false;
    bool loss_warned = false;
    // The last datagrams (bye, or the failure after fail()), signed ahead of time with sequence
    // numbers above any other: the destructor only sends them, so it needs no cryptography
    // (it may run after libcrypto shut down, at process exit).
    std::vector<std::string> farewell;
  };
  void sign_farewell(int peer);  // mu_ held
  void loop();
  void send_all(uint8_t type);  // mu_ held
  void learn(int peer, const std::string& address, const std::string& port_or_key,
             const sockaddr* sa, size_t sa_len);      // mu_ held
  void report(int peer, const std::string& message);  // mu_ held; calls on_lost_ unlocked after
  void read_datagrams(std::vector<std::pair<int, std::string>>& reports);
  void read_errors(std::vector<std::pair<int, std::string>>& reports);

  const int rank_, size_;
  Milliseconds interval_, timeout_;
  LostFn on_lost_;
  std::string key_;  // 32 bytes
  int fd_ = -1;
  int wake_[2] = {-1, -1};   // self-pipe: the destructor wakes the thread
  mutable std::mutex mu_;    // peers_, failure_ (the thread and the constructor)
  std::vector<Peer> peers_;  // indexed by rank; this rank's entry unused
  std::string failure_;
  // Held while the tick runs, so that set_on_tick({}) returns only once no tick is running (the
  // group's destructor clears it before tearing down what the tick reads).
  std::mutex tick_mu_;
  std::function<void()> on_tick_;
  std::atomic<int64_t> received_{0}, forged_{0}, replayed_{0};
  std::thread thread_;
};

}  // namespace accel::dist
