// libFuzzer target for the rendezvous store server: the bytes are one connection's stream into
// the server's real frame decoder and request handler (comm/store.cc), without sockets.
// Built by tests/fuzz/run.sh (libFuzzer) and as fuzz_store_replay (gcc); by hand:
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -I. tests/fuzz/fuzz_store.cc
//   comm/store.cc comm/auth.cc -lcrypto
// Byte 0 picks the token, whether the connection starts authenticated, and how the rest is split
// into reads; see store_fuzz_one. The server's nonce is fixed there, so the seeds written by
// tests/fuzz/make_corpus.py carry complete handshakes (their proofs are HMACs over it).
#include <cstddef>
#include <cstdint>

#include "comm/store.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  accel::dist::detail::store_fuzz_one(data, size);
  return 0;
}
