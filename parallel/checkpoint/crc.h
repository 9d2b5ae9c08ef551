// Checksums of the format-2 checkpoint (Note [format-2 checksums]): zlib's CRC-32 per block of a
// piece's bytes, seeded with the piece's identity, and over the index text. Internal to
// parallel/checkpoint/ (the writer computes them, the index parser and the reader check them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"
#include "parallel/placement.h"

namespace accel::dist::ckpt {

// Note [format-2 checksums]
// Every piece's bytes are cut into blocks of the index's crc_block_bytes (1 MiB by default; the
// last block may be shorter) and each block gets zlib's crc32 continued from the CRC of the
// piece's identity `name|dtype|global shape|region json`, so the check fails when
//   * a byte of the block changed (a flipped bit, a truncated or swapped file): that block fails;
//   * the index says another name, dtype or region for the piece than the one it was written
//     with (a shape-preserving lie: the q and k rows of a qkv piece swapped, two ranks' regions
//     exchanged): every block of the piece fails, although each region alone is valid.
// A reader checks only the blocks it reads: a block is always read whole. index_crc32 is the CRC
// of the index's compact text without that field (truncation, a hand-edited scalar). This is
// integrity, not authentication: whoever recomputes the CRCs can still lie.
uint32_t piece_seed(const std::string& name, DType dtype, const Region& region);
// crc32 of `n` bytes continued from `seed`.
uint32_t block_crc(uint32_t seed, const void* data, size_t n);
// The block CRCs of `n` bytes, blocks of `block_bytes`.
std::vector<uint32_t> block_crcs(uint32_t seed, const void* data, uint64_t n, uint64_t block_bytes);
// ceil(bytes / block_bytes).
inline uint64_t block_count(uint64_t bytes, uint64_t block_bytes) {
  return bytes / block_bytes + (bytes % block_bytes != 0);
}
// crc32 of a text (the index).
uint32_t text_crc(std::string_view text);

}  // namespace accel::dist::ckpt
