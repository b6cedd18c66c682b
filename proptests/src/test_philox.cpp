// Philox4x32-10 against the published Random123 known answers, and the layout of random_stream
// that docs/rounding.md specifies (element i uses word i % 4 of the block at counter i / 4).
#include <gtest/gtest.h>

#include <lowbit/emu/philox.hpp>
#include <lowbit/proptest/generators.hpp>

#include "support.hpp"

namespace {

namespace emu = lowbit::emu;
namespace pt = lowbit::proptest;

void expect_block(const emu::philox_block& got, std::uint32_t a, std::uint32_t b, std::uint32_t c,
                  std::uint32_t d) {
  EXPECT_EQ(got.v[0], a);
  EXPECT_EQ(got.v[1], b);
  EXPECT_EQ(got.v[2], c);
  EXPECT_EQ(got.v[3], d);
}

// Random123 kat_vectors, philox4x32 with 10 rounds.
TEST(philox, random123_known_answers) {
  expect_block(emu::philox4x32({{0, 0, 0, 0}}, 0, 0), 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu,
               0x9b00dbd8u);
  expect_block(emu::philox4x32({{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu,
                               0xffffffffu),
               0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu);
  expect_block(emu::philox4x32({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u,
                               0x299f31d0u),
               0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u);
}

TEST(philox, stream_layout) {
  pt::test::check_property("philox/stream_layout", 2000, [] {
    const emu::random_stream s{*pt::uniform<std::uint64_t>(0, ~std::uint64_t{0}),
                               *pt::uniform<std::uint64_t>(0, ~std::uint64_t{0})};
    const std::uint64_t i = *rc::gen::oneOf(pt::uniform<std::uint64_t>(0, 64),
                                            pt::uniform<std::uint64_t>(0, ~std::uint64_t{0}));
    const emu::philox_block b = s.block(i / 4);
    RC_ASSERT(s.bits(i) == b.v[i % 4]);
    // The counter is (lo(i/4), hi(i/4), lo(offset), hi(offset)), the key (lo(seed), hi(seed)).
    const std::uint64_t g = i / 4;
    const emu::philox_block direct = emu::philox4x32(
        {{static_cast<std::uint32_t>(g), static_cast<std::uint32_t>(g >> 32),
          static_cast<std::uint32_t>(s.offset), static_cast<std::uint32_t>(s.offset >> 32)}},
        static_cast<std::uint32_t>(s.seed), static_cast<std::uint32_t>(s.seed >> 32));
    for (int w = 0; w < 4; ++w)
      RC_ASSERT(direct.v[w] == b.v[w]);
  });
}

// Different offsets and seeds give different streams (a layout that ignored either would not).
TEST(philox, seed_and_offset_select_streams) {
  const emu::random_stream a{1, 0}, b{1, 1}, c{2, 0}, d{std::uint64_t{1} << 32 | 1, 0};
  int same_ab = 0, same_ac = 0, same_ad = 0;
  for (std::uint64_t i = 0; i < 256; ++i) {
    same_ab += a.bits(i) == b.bits(i);
    same_ac += a.bits(i) == c.bits(i);
    same_ad += a.bits(i) == d.bits(i);
  }
  // Independent 32-bit words agree with probability 2^-32: more than 2 of 256 would be a defect.
  EXPECT_LE(same_ab, 2);
  EXPECT_LE(same_ac, 2);
  EXPECT_LE(same_ad, 2);
}

} // namespace
