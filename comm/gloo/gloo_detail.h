// What comm/gloo/process_group_gloo.cc and comm/gloo/process_group_gloo_ops.cc share: the tags
// of accel's own slots, tensor checks, Gloo buffer helpers. Internal to comm/gloo/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "comm/process_group.h"
#include "core/error.h"
#include "core/tensor.h"

namespace accel::dist::gloo_detail {

// Our own slots, far from Gloo's collective prefixes (0x01..0x08 in the top byte).
constexpr uint64_t kSlotReduceScatter = uint64_t(0xA1) << 56;
constexpr uint64_t kSlotP2PHeader = uint64_t(0xA2) << 56;
constexpr uint64_t kSlotP2PData = uint64_t(0xA3) << 56;
constexpr uint64_t kSlotP2PAck = uint64_t(0xA4) << 56;
constexpr uint32_t kP2PMagic = 0x50325041;  // "AP2P"

inline uint64_t p2p_slot(uint64_t prefix, int tag) {
  return prefix | (uint64_t(uint32_t(tag)) << 8);
}

inline void check_cpu_contiguous(const char* op, const Tensor& t, const char* what) {
  ACCEL_CHECK(t.defined(), ValueError, op, what, " is an undefined tensor");
  ACCEL_CHECK(t.device().is_cpu(), DeviceError, op, "the gloo backend needs CPU tensors, ", what,
              " is on ", t.device());
  ACCEL_CHECK(t.is_contiguous(), ValueError, op, what, " must be contiguous, got shape ",
              t.shape_str(), " with non-contiguous strides");
}

// Creates unbound buffers typed by element size (Gloo only uses the size): the output or, with
// kInput, the input of `o`.
template <bool kInput, typename Opts>
void set_buffer_bytes(Opts& o, void* p, size_t elems, size_t esize) {
  auto set = [&](auto* typed) {
    if constexpr (kInput) {
      o.setInput(typed, elems);
    } else {
      o.setOutput(typed, elems);
    }
  };
  switch (esize) {
    case 1: set(static_cast<uint8_t*>(p)); break;
    case 2: set(static_cast<uint16_t*>(p)); break;
    case 4: set(static_cast<uint32_t*>(p)); break;
    case 8: set(static_cast<uint64_t*>(p)); break;
    default: ACCEL_INTERNAL_ASSERT(false);
  }
}
template <typename Opts>
void set_output_bytes(Opts& o, void* p, size_t elems, size_t esize) {
  set_buffer_bytes<false>(o, p, elems, esize);
}
template <typename Opts>
void set_input_bytes(Opts& o, void* p, size_t elems, size_t esize) {
  set_buffer_bytes<true>(o, p, elems, esize);
}

// A Small message whose size disagrees with its (equal) fingerprint: a corrupt peer.
inline void check_message(const std::string& m, size_t bytes, int rank) {
  if (m.size() != bytes)
    throw PeerError("rank " + std::to_string(rank) + " sent " + std::to_string(m.size()) +
                    " bytes of data for a collective of " + std::to_string(bytes));
}

}  // namespace accel::dist::gloo_detail
