// Heartbeat: detects a peer that is stopped (SIGSTOP), frozen, or cut off by the network well
// before a collective timeout would, independently of the data transport and of the control
// plane (which are busy or idle depending on what the program does).
//
// Each rank of a group binds a UDP socket on its selected address, publishes it in the group's
// store ("hb/<rank>") and runs one thread that sends a small datagram to every peer each
// `interval` and reads theirs. A peer from which nothing arrived for `timeout` is reported once
// through `on_lost`. A rank that shuts down normally sends "bye" first, so peers stop watching
// it instead of failing while they are still finishing (a departed peer only matters if a later
// collective needs it, and that collective then fails on the closed connection).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dist/store.h"

namespace accel::dist {

class Heartbeat {
 public:
  // peer rank, its address, seconds since its last datagram (or since the start).
  using LostFn = std::function<void(int rank, const std::string& address, double silent_s)>;

  // Collective over the group: every rank constructs one with the same store. `setup_timeout`
  // bounds the address exchange. interval is clamped to at most timeout / 4.
  Heartbeat(const std::shared_ptr<Store>& store, int rank, int size, const std::string& hostname,
            Milliseconds interval, Milliseconds timeout, Milliseconds setup_timeout,
            LostFn on_lost);
  // Sends "bye" to every peer and stops the thread.
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  Milliseconds interval() const { return interval_; }
  Milliseconds timeout() const { return timeout_; }
  // Datagrams received from peers so far (for tests and diagnostics).
  int64_t beats_received() const { return received_.load(); }

  // The message a lost peer produces (also used by tests to find it).
  static std::string lost_message(int rank, const std::string& address, double silent_s);

 private:
  struct Peer {
    std::string address;     // as published: host
    std::string key;         // "host:port" as recvfrom reports it, to check datagram sources
    std::vector<char> dest;  // where to send (a sockaddr)
    std::chrono::steady_clock::time_point last_seen;
    bool departed = false;
    bool reported = false;
  };
  void loop();
  void send_all(uint32_t type);

  const int rank_, size_;
  Milliseconds interval_, timeout_;
  LostFn on_lost_;
  int fd_ = -1;
  int wake_[2] = {-1, -1};   // self-pipe: the destructor wakes the thread
  std::vector<Peer> peers_;  // indexed by rank; this rank's entry unused
  std::atomic<int64_t> received_{0};
  std::thread thread_;
};

}  // namespace accel::dist
