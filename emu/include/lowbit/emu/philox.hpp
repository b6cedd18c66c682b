// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011), the
// counter-based generator behind stochastic rounding. A counter-based generator gives every
// element its random bits from its index alone, so the CPU twin and any GPU launch shape agree.
#pragma once

#include <cstdint>

#include <lowbit/emu/config.hpp>

namespace lowbit::emu {

struct philox_block {
  std::uint32_t v[4];
};

// One Philox4x32 evaluation with `rounds` rounds (10 is the published, crush-resistant choice).
LOWBIT_HD constexpr philox_block philox4x32(philox_block ctr, std::uint32_t key0,
                                            std::uint32_t key1, int rounds = 10) {
  constexpr std::uint32_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;
  constexpr std::uint32_t w0 = 0x9E3779B9u, w1 = 0xBB67AE85u;
  for (int r = 0; r < rounds; ++r) {
    if (r != 0) {
      key0 += w0;
      key1 += w1;
    }
    const std::uint64_t p0 = std::uint64_t{m0} * ctr.v[0];
    const std::uint64_t p1 = std::uint64_t{m1} * ctr.v[2];
    const auto hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    const auto hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    ctr = philox_block{{hi1 ^ ctr.v[1] ^ key0, lo1, hi0 ^ ctr.v[3] ^ key1, lo0}};
  }
  return ctr;
}

// The random stream of one stochastic-rounding call: the key is the seed, the offset selects a
// fresh stream for the same seed (one per training step, say). Element i draws word i % 4 of the
// block at counter (i / 4, offset): four elements share one evaluation, and the bits depend on
// (seed, offset, i) alone, whatever the thread or launch shape.
struct random_stream {
  std::uint64_t seed = 0;
  std::uint64_t offset = 0;

  LOWBIT_HD constexpr philox_block block(std::uint64_t group) const {
    return philox4x32(
        philox_block{{static_cast<std::uint32_t>(group), static_cast<std::uint32_t>(group >> 32),
                      static_cast<std::uint32_t>(offset),
                      static_cast<std::uint32_t>(offset >> 32)}},
        static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
  }
  // Random bits of element i.
  LOWBIT_HD constexpr std::uint32_t bits(std::uint64_t i) const { return block(i >> 2).v[i & 3]; }
};

// Published known answers (Random123 kat_vectors).
static_assert(philox4x32({{0, 0, 0, 0}}, 0, 0).v[0] == 0x6627e8d5u);
static_assert(philox4x32({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u,
                         0x299f31d0u)
                  .v[3] == 0x24126ea1u);

} // namespace lowbit::emu
