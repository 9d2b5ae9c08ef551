// The store's fuzz hook (detail::store_fuzz_one, tests/fuzz/fuzz_store.cc): a server fed bytes
// without a socket.
#include "comm/store_server_impl.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>

#include "core/error.h"
#include "comm/auth.h"

namespace accel::dist {

namespace detail {

namespace {
// Limits small enough that a fuzzer reaches them.
constexpr size_t kFuzzMaxMessage = size_t(1) << 16;
constexpr size_t kFuzzMaxKeys = 32;
constexpr size_t kFuzzMaxBytes = size_t(1) << 14;
constexpr int kFuzzMaxUnblocks = 4096;

std::string fuzz_frame_set(const std::string& key) {
  std::string body;
  put_u8(body, kSet);
  put_str(body, key);
  put_str(body, "1");
  return frame(body);
}

void fuzz_check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "store_fuzz_one: invariant broken: %s\n", what);
    std::abort();
  }
}
}  // namespace

size_t store_fuzz_one(const uint8_t* data, size_t size) {
  using Impl = TcpStoreServer::Impl;
  Impl s;
  s.max_message = kFuzzMaxMessage;
  s.max_keys = kFuzzMaxKeys;
  s.max_total_bytes = kFuzzMaxBytes;
  s.log_enabled = false;
  // Fixed server nonce (0x5a bytes), generation (0x01) and job secret (0x02), so that a seed
  // can complete the handshake: tests/fuzz/make_corpus.py computes the client proof.
  s.deterministic = true;
  s.generation = std::string(kGenerationBytes, '\x01');
  s.job_secret = std::string(kSecretBytes, '\x02');
  // Byte 0: bit 7 the token (none or "tok"); bit 6 starts the connection authenticated (as rank
  // 3), so that mutations reach the request handler without a valid proof; bits 0-5 the size of
  // the pieces the stream arrives in (0: all at once), so partial frames and frames split across
  // reads are exercised.
  if (size == 0) return 0;
  s.token = (data[0] & 0x80) ? "tok" : "";
  const bool pre_authed = (data[0] & 0x40) != 0;
  size_t piece = (data[0] & 0x3f) == 0 ? size : size_t(data[0] & 0x3f);
  const char* p = reinterpret_cast<const char*>(data) + 1;
  size_t left = size - 1;

  auto authenticate = [&](uint64_t id, int32_t member) {
    Impl::Conn& c = s.conns.at(id);
    c.authed = true;
    c.stage = Impl::kAuthenticated;
    c.member = member;
    s.unauthed.erase(id);
    s.member_joined(c);
  };
  uint64_t fuzz_id = s.add_conn(-1, "fuzz");
  s.counted_conn = fuzz_id;
  if (pre_authed) authenticate(fuzz_id, 3);
  // A second client that is already in (as rank 1) and sets the keys the first one waits for.
  uint64_t peer_id = s.add_conn(-1, "peer");
  authenticate(peer_id, 1);
  auto check_invariants = [&] {
    size_t bytes = 0;
    for (auto& [k, v] : s.data) bytes += k.size() + v.size();
    fuzz_check(bytes == s.total_bytes, "total_bytes matches the stored keys and values");
    fuzz_check(s.data.size() <= s.max_keys, "keys within max_keys");
    fuzz_check(s.total_bytes <= s.max_total_bytes, "bytes within max_total_bytes");
    for (auto& [id, c] : s.conns) {
      fuzz_check(c.in.size() <= s.max_message + 4, "input buffer within one frame");
      fuzz_check(c.authed != bool(s.unauthed.count(id)), "unauthenticated set in step");
      fuzz_check(c.authed == (c.stage == Impl::kAuthenticated), "stage in step with authed");
    }
    int open_members = 0;
    for (auto& [r, m] : s.members) {
      fuzz_check(m.conns >= 0, "member connection count >= 0");
      open_members += m.conns;
    }
    int authed_members = 0;
    for (auto& [id, c] : s.conns) authed_members += c.authed && c.member >= 0;
    fuzz_check(open_members == authed_members, "member counts match the open connections");
    for (auto& w : s.waiters) fuzz_check(s.conns.count(w.conn_id) == 1, "waiter has a conn");
  };
  // Resolves the first connection's pending request: alternately let the peer create the
  // missing keys (the reply path through on_key_created) or let the deadline pass.
  int unblocks = 0;
  auto unblock = [&] {
    ++unblocks;
    if (s.waiters.empty()) {
      fuzz_check(false, "a blocked connection has a waiter");
    }
    if (unblocks % 2 == 1) {
      std::vector<std::string> keys = s.waiters.front().keys;
      for (auto& k : keys) {
        if (s.data.count(k)) continue;
        auto pit = s.conns.find(peer_id);
        if (pit == s.conns.end()) break;
        std::string f = fuzz_frame_set(k);
        if (!s.on_bytes(pit->second, f.data(), f.size())) s.close_conn(peer_id);
        if (auto q = s.conns.find(peer_id); q != s.conns.end()) q->second.out.clear();
      }
    }
    if (!s.waiters.empty()) s.expire_waiters(Clock::time_point::max());
  };
  while (unblocks < kFuzzMaxUnblocks) {
    auto it = s.conns.find(fuzz_id);
    if (it == s.conns.end()) break;
    Impl::Conn& c = it->second;
    c.out.clear();  // the replies are not checked, only that producing them is sound
    size_t room = s.input_room(c);
    if (c.blocked && (room == 0 || left == 0)) {
      unblock();
    } else if (left == 0) {
      break;
    } else if (room == 0) {
      fuzz_check(false, "an unblocked connection always has room for a frame");
    } else {
      size_t n = std::min({piece, left, room});
      if (!s.on_bytes(c, p, n)) s.close_conn(fuzz_id);
      p += n;
      left -= n;
    }
    check_invariants();
  }
  return s.counted_frames;
}

}  // namespace detail

}  // namespace accel::dist
