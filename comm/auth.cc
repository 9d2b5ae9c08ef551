#include "comm/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <climits>

#include "core/error.h"

namespace accel::dist::auth {

namespace {
// libcrypto frees its global state in an atexit handler, which runs before the destructors of
// statics that were constructed earlier (a default process group left alive at exit, whose
// heartbeat then signs its goodbye): HMAC after that crashes. Without that handler the state
// simply lives until the process ends. Has no effect when something else in the process
// initialised libcrypto first; the heartbeat therefore also signs its last datagrams ahead of
// time (Heartbeat::fail, Heartbeat::learn) instead of in its destructor.
void init_crypto() {
  static const bool done = OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, nullptr) == 1;
  (void)done;
}
}  // namespace

Digest hmac_sha256(std::string_view key, std::string_view message) {
  init_crypto();
  // A non-null pointer even for an empty key or message: HMAC() reads a null key as "no key".
  static const unsigned char kEmpty[1] = {0};
  const auto* k = key.empty() ? kEmpty : reinterpret_cast<const unsigned char*>(key.data());
  const auto* m = message.empty() ? kEmpty : reinterpret_cast<const unsigned char*>(message.data());
  ACCEL_CHECK(key.size() <= size_t(INT_MAX), DistError, "auth", "key of ", key.size(),
              " bytes is too long");
  Digest out{};
  unsigned int len = 0;
  unsigned char* r = HMAC(EVP_sha256(), k, int(key.size()), m, message.size(), out.data(), &len);
  ACCEL_CHECK(r != nullptr && len == kDigestBytes, DistError, "auth",
              "HMAC-SHA256 failed in libcrypto");
  return out;
}

std::string hmac_sha256_str(std::string_view key, std::string_view message) {
  Digest d = hmac_sha256(key, message);
  return std::string(reinterpret_cast<const char*>(d.data()), d.size());
}

bool equal_ct(const void* a, const void* b, size_t n) { return CRYPTO_memcmp(a, b, n) == 0; }

std::string random_bytes(size_t n) {
  init_crypto();
  std::string s(n, '\0');
  if (n == 0) return s;
  ACCEL_CHECK(
      n <= size_t(INT_MAX) && RAND_bytes(reinterpret_cast<unsigned char*>(s.data()), int(n)) == 1,
      DistError, "auth", "the system's random generator (RAND_bytes) failed");
  return s;
}

std::string hex(std::string_view bytes) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  s.reserve(bytes.size() * 2);
  for (char c : bytes) {
    auto u = static_cast<unsigned char>(c);
    s.push_back(digits[u >> 4]);
    s.push_back(digits[u & 15]);
  }
  return s;
}

}  // namespace accel::dist::auth
