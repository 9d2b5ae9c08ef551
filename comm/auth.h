// Cryptographic helpers for the rendezvous (Note [store authentication] in comm/store_protocol.h)
// and the heartbeat datagrams (Note [heartbeat authentication] in heartbeat.cc), over OpenSSL's
// libcrypto (Debian libssl-dev): HMAC-SHA256, constant-time comparison, and random bytes from the
// system's generator. Nothing here is home-made cryptography; these are thin, checked wrappers.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace accel::dist::auth {

constexpr size_t kDigestBytes = 32;  // HMAC-SHA256
using Digest = std::array<uint8_t, kDigestBytes>;

// HMAC-SHA256 of `message` under `key` (any length, empty included).
Digest hmac_sha256(std::string_view key, std::string_view message);
// The same as a 32-byte string (for keys derived from keys).
std::string hmac_sha256_str(std::string_view key, std::string_view message);

// Constant-time comparison of n bytes (CRYPTO_memcmp): the time does not depend on where the
// first difference is, so a peer cannot find a valid proof byte by byte.
bool equal_ct(const void* a, const void* b, size_t n);

// n bytes from the system's cryptographic generator (RAND_bytes). Throws DistError when the
// generator fails (an unseeded system): a predictable nonce or key would be worse than none.
std::string random_bytes(size_t n);

// Lower-case hex of bytes, for messages and logs (generation ids; never keys).
std::string hex(std::string_view bytes);

}  // namespace accel::dist::auth
