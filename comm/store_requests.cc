// TcpStoreServer: HELLO, AUTH and the key-value requests (Note [store protocol] in
// comm/store_protocol.h).
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

bool TcpStoreServer::Impl::handle_hello(Conn& c, Reader& r) {
  uint32_t magic = r.integer<uint32_t>();
  uint16_t version = r.integer<uint16_t>();
  if (magic != kMagic) throw ParseError{"bad magic (not an accel store client)"};
  if (version != kVersion)
    throw ParseError{"protocol version " + std::to_string(version) + ", this store speaks " +
                     std::to_string(kVersion) +
                     " (every rank must run the same accel; version 1 sent the token in clear)"};
  uint8_t flags = r.u8();
  std::string nc = r.bytes(kNonceBytes);
  int32_t member = r.integer<int32_t>();
  std::string joined = r.bytes(kGenerationBytes);
  r.finish();
  if (member < -1 || member >= kMaxMemberRank)
    throw ParseError{"rank " + std::to_string(member) + " is outside [-1, " +
                     std::to_string(kMaxMemberRank) + ")"};
  // Both sides must hold a token or neither: a client with a token that reaches a tokenless
  // store has found some other job's store (or rank 0 lacks the token). Whether the tokens are
  // equal is for the proofs (Note [store authentication]).
  const bool client_token = (flags & kFlagToken) != 0;
  if (client_token != !token.empty()) {
    return refuse(c,
                  token.empty()
                      ? "rendezvous token rejected: the client presented one, but rank 0's store "
                        "has none (ACCEL_RENDEZVOUS_TOKEN is set on this rank but not on rank 0, "
                        "or this is another job's store)"
                      : "rendezvous token rejected: the store requires one and the client "
                        "presented none (ACCEL_RENDEZVOUS_TOKEN is unset on this rank)",
                  true);
  }
  if (joined != std::string(kGenerationBytes, '\0') && joined != generation) {
    return refuse(c,
                  "this client joined generation " + auth::hex(joined) +
                      " of the rendezvous store, which has been replaced by generation " +
                      auth::hex(generation) +
                      " (rank 0 destroyed its process group and initialised a new one, or "
                      "another job took the port): call init_process_group again",
                  false);
  }
  c.client_nonce = std::move(nc);
  c.server_nonce = server_nonce();
  c.member = member;
  c.stage = kExpectAuth;
  std::string p;
  put_u8(p, token.empty() ? 0 : kFlagToken);
  p += c.server_nonce;
  p += generation;
  p += proof(token, kServerLabel, c.client_nonce, c.server_nonce, generation);
  reply(c, kOk, p);
  return true;
}

bool TcpStoreServer::Impl::handle_auth(Conn& c, Reader& r) {
  uint8_t verified = r.u8();
  if (verified != 1) {
    r.finish();
    return refuse(c,
                  "rendezvous token rejected: the client could not verify this store's proof "
                  "(its ACCEL_RENDEZVOUS_TOKEN differs from rank 0's)",
                  true);
  }
  std::string theirs = r.bytes(kProofBytes);
  r.finish();
  std::string want = proof(token, kClientLabel, c.client_nonce, c.server_nonce, generation);
  if (!auth::equal_ct(theirs.data(), want.data(), kProofBytes)) {
    return refuse(c,
                  "rendezvous token rejected: the client's ACCEL_RENDEZVOUS_TOKEN differs from "
                  "rank 0's",
                  true);
  }
  c.stage = kAuthenticated;
  c.authed = true;
  c.client_nonce.clear();
  c.server_nonce.clear();
  unauthed.erase(c.id);
  unauthed_open = int64_t(unauthed.size());
  member_joined(c);
  reply(c, kOk, job_secret);
  return true;
}

// GET / WAIT: reply now when the keys are there (or a watched rank left), else queue a waiter.
bool TcpStoreServer::Impl::handle_wait(Conn& c, Reader& r, uint8_t op) {
  uint64_t timeout_ms = r.integer<uint64_t>();
  std::vector<std::string> keys;
  if (op == kGet) {
    keys.push_back(r.str(kMaxStoreKeyBytes));
  } else {
    uint32_t nk = r.integer<uint32_t>();
    if (nk > kMaxKeysPerRequest) throw ParseError{"too many keys"};
    // Each key needs at least its 4-byte length: reject counts the body cannot hold
    // before reserving anything.
    if (size_t(nk) * 4 > r.remaining()) throw ParseError{"key count exceeds message"};
    keys.reserve(nk);
    for (uint32_t i = 0; i < nk; ++i) keys.push_back(r.str(kMaxStoreKeyBytes));
  }
  uint32_t nw = r.integer<uint32_t>();
  if (nw > kMaxKeysPerRequest || size_t(nw) * 4 > r.remaining())
    throw ParseError{"watched rank count exceeds message"};
  std::vector<int32_t> watch(nw);
  for (auto& w : watch) w = r.integer<int32_t>();
  r.finish();
  if (all_present(keys)) {
    std::string payload;
    if (op == kGet) put_str(payload, data.at(keys[0]));
    reply(c, kOk, payload);
    return true;
  }
  int32_t who = -1;
  if (std::string why = left_message(watch, &who); !why.empty()) {
    std::string payload;
    put_int<int32_t>(payload, who);
    put_str(payload, why);
    reply(c, kLeft, payload);
    return true;
  }
  // Clamp so the deadline arithmetic cannot overflow.
  timeout_ms = std::min<uint64_t>(timeout_ms, uint64_t(365) * 24 * 3600 * 1000);
  c.blocked = true;
  waiters.push_back(
      {c.id, op, std::move(keys), Clock::now() + Milliseconds(timeout_ms), std::move(watch)});
  return true;
}

bool TcpStoreServer::Impl::handle_add(Conn& c, Reader& r) {
  std::string key = r.str(kMaxStoreKeyBytes);
  int64_t delta = r.integer<int64_t>();
  r.finish();
  auto it = data.find(key);
  int64_t cur = 0;
  if (it != data.end() && !parse_i64(it->second, &cur)) {
    reply_error(c, "value of key '" + printable_key(key) + "' is not an integer");
    return true;
  }
  int64_t next = int64_t(uint64_t(cur) + uint64_t(delta));  // wraps, never UB
  std::string text = std::to_string(next);
  if (std::string why = check_room(key, text.size()); !why.empty()) {
    reply_error(c, why);
    return true;
  }
  bool created = it == data.end();
  put_value(key, std::move(text));
  std::string p;
  put_int<int64_t>(p, next);
  reply(c, kOk, p);
  if (created) on_key_created();
  return true;
}

bool TcpStoreServer::Impl::handle_compare_set(Conn& c, Reader& r) {
  std::string key = r.str(kMaxStoreKeyBytes);
  std::string expected = r.str(max_message);
  std::string desired = r.str(max_message);
  r.finish();
  auto it = data.find(key);
  bool swap = it == data.end() ? expected.empty() : it->second == expected;
  bool created = swap && it == data.end();
  if (swap) {
    if (std::string why = check_room(key, desired.size()); !why.empty()) {
      reply_error(c, why);
      return true;
    }
    put_value(key, std::move(desired));
  }
  auto now = data.find(key);
  std::string p;
  put_str(p, now == data.end() ? std::string() : now->second);
  reply(c, kOk, p);
  if (created) on_key_created();
  return true;
}

void TcpStoreServer::Impl::reply_flag(Conn& c, bool flag) {
  std::string p;
  put_u8(p, flag ? 1 : 0);
  reply(c, kOk, p);
}

bool TcpStoreServer::Impl::handle(Conn& c, const char* body, size_t n) {
  try {
    Reader r(body, n);
    uint8_t op = r.u8();
    if (c.authed && c.id == counted_conn) ++counted_frames;
    if (c.stage == kExpectHello) {
      if (op != kHello) throw ParseError{"the first message must be HELLO"};
      return handle_hello(c, r);
    }
    if (c.stage == kExpectAuth) {
      if (op != kAuth) throw ParseError{"the second message must be AUTH"};
      return handle_auth(c, r);
    }
    switch (op) {
      case kSet: {
        std::string key = r.str(kMaxStoreKeyBytes);
        std::string value = r.str(max_message);
        r.finish();
        if (std::string why = check_room(key, value.size()); !why.empty()) {
          reply_error(c, why);
          return true;
        }
        bool created = !data.count(key);
        put_value(key, std::move(value));
        reply(c, kOk, "");
        if (created) on_key_created();
        return true;
      }
      case kGet:
      case kWait: return handle_wait(c, r, op);
      case kAdd: return handle_add(c, r);
      case kCompareSet: return handle_compare_set(c, r);
      case kCheck: {
        uint32_t nk = r.integer<uint32_t>();
        if (nk > kMaxKeysPerRequest || size_t(nk) * 4 > r.remaining())
          throw ParseError{"key count exceeds message"};
        std::vector<std::string> keys;
        for (uint32_t i = 0; i < nk; ++i) keys.push_back(r.str(kMaxStoreKeyBytes));
        r.finish();
        reply_flag(c, all_present(keys));
        return true;
      }
      case kDelete: {
        std::string key = r.str(kMaxStoreKeyBytes);
        r.finish();
        reply_flag(c, erase_key(key));
        return true;
      }
      case kNumKeys: {
        r.finish();
        std::string p;
        put_int<int64_t>(p, int64_t(data.size()));
        reply(c, kOk, p);
        return true;
      }
      case kMembers: {
        r.finish();
        reply(c, kOk, members_reply());
        return true;
      }
      case kLeave: {
        std::string why = r.str(kMaxHelloBytes);
        r.finish();
        c.left = true;
        c.leave_reason = std::move(why);
        reply(c, kOk, "");
        return true;
      }
      default: throw ParseError{"unknown opcode " + std::to_string(op)};
    }
  } catch (const ParseError& e) {
    ++rejected;
    reply_error_and_close(c, "malformed request: " + e.what);
    return false;
  } catch (const std::bad_alloc&) {
    reply_error_and_close(c, "out of memory");
    return false;
  }
}

}  // namespace accel::dist
