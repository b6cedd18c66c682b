// Block-wise codebook quantization and SRAM-quantiles: the CPU twin
// (lowbit::kernels::quantize_blockwise, estimate_quantiles) against the exact reference
// (reference/blockwise.hpp), plus the codebooks' construction and validation, the NaN/Inf/zero/
// partial-block rules, nested absmax quantization and the measured rank error of the estimator.
//
// The bound of the nearest-entry search. The twin normalizes t = fl(x / a), one correctly
// rounded float32 division, and then decides exactly (pair sums held as TwoSum pairs), so
//
//   |t - x/a| <= u |x/a|  (u = 2^-24)  where |x/a| >= 2^-126,   |t - x/a| <= 2^-150 below,
//
// i.e. |t - y| <= e(y) = max(u |y|, 2^-150) with y = x/a exact. The twin's index may differ from
// the reference's index of y only when the band [y - e(y), y + e(y)] contains a midpoint
// (the reference gives its two ends different indices), and then it must be one of the indices
// reachable from the band (between the ends' indices). Given the float t itself, there is no
// rounding left: the twin must equal the reference's index of t exactly.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <lowbit/kernels/blockwise.hpp>
#include <lowbit/reference/blockwise.hpp>

#include "support.hpp"
// White box: the input loads of the kernels (cast_ops.hpp), for the GPU sort's skipped key bits.
#include "../../kernels/cast/cast_ops.hpp"
// White box: the CUDA kernels' bucket search, checked here on the CPU against the binary search.
#include "../../kernels/blockwise/blockwise_ops.hpp"
#include "../common/blockwise_inputs.hpp"

namespace {

using namespace lowbit;
using lowbit::proptest::test::check_property;
using lowbit::proptest::test::describe_input;
namespace ref = lowbit::reference;
using rational = ref::rational;
using integer = ref::integer;
using kernels::codebook;
using kernels::dtype;
using kernels::tensor_view;

rational exact_of(float x) {
  return ref::exact(static_cast<double>(x));
}

ref::codebook_values values_of(const codebook& cb) {
  ref::codebook_values v{};
  std::copy(cb.values().begin(), cb.values().end(), v.begin());
  return v;
}

std::uint32_t bits_of(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}

// ---- codebooks ---------------------------------------------------------------------------------

// The published construction (docs/techniques/blockwise.md) recomputed by the reference with
// exact rationals rounded to float32 at every step: the kernel's float arithmetic must give the
// same bits. The variant with linspace's product rounded separately (PyTorch's baseline CPU
// kernel) gives other bits, so this test tells the two apart.
TEST(blockwise_codebook, dynamic_tree_is_the_published_float32_construction) {
  for (bool s : {true, false}) {
    const auto want = ref::dynamic_tree_float32(s);
    const codebook cb = codebook::dynamic_tree(s);
    for (int i = 0; i < 256; ++i)
      EXPECT_EQ(bits_of(cb[i]), bits_of(want[static_cast<std::size_t>(i)]))
          << (s ? "signed" : "unsigned") << " entry " << i;
    const auto unfused = ref::dynamic_tree_float32(s, false);
    int differ = 0;
    for (int i = 0; i < 256; ++i)
      differ += bits_of(cb[i]) != bits_of(unfused[static_cast<std::size_t>(i)]);
    EXPECT_EQ(differ, s ? 42 : 31) << (s ? "signed" : "unsigned"); // measured by PyTorch as well
  }
}

// The relation to the exact map. With u = 2^-24 and B_k = 0.1 + 0.9 k/N the exact boundaries
// (N = F - 1 intervals), the float32 steps give (signs aside, the signed map's negatives being
// exact negations):
//   s = fl(0.1) = 0.1 + 0.025u;  fl(1 - s) = 0.9 - 0.4u;  step = fl((1 - s)/N), |step N - 0.9|
//   <= 0.4u + 0.9u = 1.3u;  point k < F/2: |s + step k - B_k| <= 0.025u + 1.3u k/N, and
//   k/N = (B_k - 0.1)/0.9, so with its rounding |b_k - B_k| <= 2.45u B_k; point k >= F/2
//   (B_k >= 0.55): |1 - step (N-k) - B_k| <= 1.3u (N-k)/N <= 1.19u B_k, plus rounding: 2.19u B_k;
//   midpoint: a sum of two such values, rounded once (3.45u), halved exactly;
//   scale fl(10^-d): u; product: u.
// In all |v - exact| <= 5.5u |exact| (to first order; the second-order terms are below 1e-6 u).
// Measured on the table: at most 2 float32 steps from the correctly rounded exact value.
TEST(blockwise_codebook, dynamic_tree_is_within_the_derived_bound_of_the_exact_map) {
  const rational bound = rational(55, 10) / (integer(1) << 24);
  for (bool s : {true, false}) {
    const auto exact = ref::dynamic_tree_exact(s);
    const auto once = ref::to_float32(exact);
    const codebook cb = codebook::dynamic_tree(s);
    int differ = 0;
    std::int64_t worst_steps = 0;
    double worst_rel = 0;
    for (std::size_t i = 0; i < 256; ++i) {
      const rational& e = exact[i];
      const rational err = abs(exact_of(cb[static_cast<int>(i)]) - e);
      EXPECT_LE(err, rational(bound * abs(e))) << (s ? "signed" : "unsigned") << " entry " << i;
      if (e != 0)
        worst_rel = std::max(worst_rel, static_cast<double>(rational(err / abs(e))) * 0x1p24);
      // Same sign on both sides, so the distance in float32 steps is the distance of the bits.
      const auto steps = std::abs(static_cast<std::int64_t>(bits_of(cb[static_cast<int>(i)])) -
                                  static_cast<std::int64_t>(bits_of(once[i])));
      worst_steps = std::max(worst_steps, steps);
      differ += steps != 0;
    }
    EXPECT_LE(worst_steps, 2);
    EXPECT_EQ(differ, s ? 72 : 100); // signed: 36 positive values and their negatives
    std::printf("dynamic tree (%s): %d entries differ from the exact values rounded once, by at "
                "most %lld float32 steps; largest relative error %.3g u (bound 5.5 u)\n",
                s ? "signed" : "unsigned", differ, static_cast<long long>(worst_steps), worst_rel);
  }
}

// proptests/data/dynamic_map_published.txt holds both maps as float32 bits; PyTorch reproduces it
// (scripts/device/dynamic_map_torch.py). LOWBIT_PROPTEST_DATA names another data folder;
// LOWBIT_WRITE_DYNAMIC_MAP=FILE writes the kernel's table in the file's line format (the file's
// '#' header is kept by hand).
std::filesystem::path data_file(const char* name) {
  if (const char* dir = std::getenv("LOWBIT_PROPTEST_DATA"))
    return std::filesystem::path(dir) / name;
  return std::filesystem::path(__FILE__).parent_path().parent_path() / "data" / name;
}

TEST(blockwise_codebook, dynamic_tree_matches_the_published_table) {
  std::string table;
  for (bool s : {true, false}) {
    const codebook cb = codebook::dynamic_tree(s);
    for (int i = 0; i < 256; ++i) {
      char line[40];
      std::snprintf(line, sizeof line, "%s %d %08x\n", s ? "signed" : "unsigned", i,
                    static_cast<unsigned>(bits_of(cb[i])));
      table += line;
    }
  }
  if (const char* out = std::getenv("LOWBIT_WRITE_DYNAMIC_MAP")) {
    std::ofstream(out) << table;
  }
  const auto path = data_file("dynamic_map_published.txt");
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot read " << path;
  std::string line, data;
  int lines = 0;
  while (std::getline(in, line))
    if (!line.empty() && line[0] != '#') {
      data += line + "\n";
      ++lines;
    }
  EXPECT_EQ(lines, 512) << path;
  // On a mismatch, name the first line that differs.
  std::istringstream got(table), want(data);
  std::string g, w;
  for (int n = 1; std::getline(want, w); ++n) {
    std::getline(got, g);
    ASSERT_EQ(g, w) << "data line " << n << " of " << path << " (kernel vs file)";
  }
}

TEST(blockwise_codebook, dynamic_tree_structure) {
  for (bool s : {true, false}) {
    const codebook cb = codebook::dynamic_tree(s);
    const auto& v = cb.values();
    EXPECT_TRUE(std::is_sorted(v.begin(), v.end()));
    EXPECT_EQ(std::count(v.begin(), v.end(), 0.0f), 1);
    EXPECT_EQ(std::count(v.begin(), v.end(), 1.0f), 1);
    EXPECT_EQ(v[255], 1.0f);
    // The published map has +1 but not -1: its negative half mirrors the 127 fraction values.
    EXPECT_EQ(std::count(v.begin(), v.end(), -1.0f), 0);
    const int positives =
        static_cast<int>(std::count_if(v.begin(), v.end(), [](float x) { return x > 0; }));
    EXPECT_EQ(positives, s ? 128 : 255);
    if (s) {
      for (int i = 0; i < 127; ++i)
        EXPECT_EQ(v[static_cast<std::size_t>(i)], -v[static_cast<std::size_t>(254 - i)]) << i;
      EXPECT_EQ(v[127], 0.0f);
    } else {
      EXPECT_EQ(v[0], 0.0f);
    }
    // Per decade 10^-d (d = 6..0): 2^(6-d) (signed) or 2^(7-d) (unsigned) positive values in
    // [0.1, 1) * 10^-d, evenly spaced: the midpoints of equal intervals of [0.1, 1].
    for (int d = 6; d >= 0; --d) {
      const double lo = 0.1 * std::pow(10.0, -d), hi = std::pow(10.0, -d);
      std::vector<double> in;
      for (float x : v)
        if (x > 0 && x < 1.0f && x >= lo * (1 - 1e-6) && x < hi)
          in.push_back(x);
      const std::size_t want = std::size_t{1} << (s ? 6 - d : 7 - d);
      ASSERT_EQ(in.size(), want) << "decade " << d;
      const double step = 0.9 * hi / static_cast<double>(want);
      for (std::size_t k = 0; k < in.size(); ++k)
        EXPECT_NEAR(in[k], lo + step * (static_cast<double>(k) + 0.5), 1e-7 * hi) << d << " " << k;
    }
  }
  // Printed for docs/techniques/blockwise.md.
  const codebook cb = codebook::dynamic_tree(true);
  std::printf(
      "dynamic tree (signed): [0]=%.9g [126]=%.9g [127]=%.9g [128]=%.9g [254]=%.9g [255]=%.9g\n",
      cb[0], cb[126], cb[127], cb[128], cb[254], cb[255]);
  const codebook cu = codebook::dynamic_tree(false);
  std::printf("dynamic tree (unsigned): [0]=%.9g [1]=%.9g [2]=%.9g [254]=%.9g [255]=%.9g\n", cu[0],
              cu[1], cu[2], cu[254], cu[255]);
}

TEST(blockwise_codebook, linear_equals_exact_construction_rounded_once) {
  for (bool s : {true, false}) {
    const auto want = ref::to_float32(ref::linear_exact(s));
    const codebook cb = codebook::linear(s);
    for (int i = 0; i < 256; ++i)
      EXPECT_EQ(bits_of(cb[i]), bits_of(want[static_cast<std::size_t>(i)])) << i;
  }
}

TEST(blockwise_codebook, from_format_takes_every_finite_value_once_and_pads_with_zeros) {
  struct c {
    emu::format f;
    int distinct; // distinct finite values (+-0 once)
    float max;
  };
  for (const auto& t : {c{emu::e4m3fn, 253, 448.0f}, c{emu::e5m2, 247, 57344.0f},
                        c{emu::e4m3fnuz, 255, 240.0f}, c{emu::e2m1fn, 15, 6.0f}}) {
    const codebook cb = codebook::from_format(t.f);
    const auto& v = cb.values();
    EXPECT_TRUE(std::is_sorted(v.begin(), v.end()));
    EXPECT_EQ(std::count(v.begin(), v.end(), 0.0f), 256 - t.distinct + 1) << emu::format_name(t.f);
    EXPECT_EQ(v[255], 1.0f);
    EXPECT_EQ(v[0], -1.0f);
    // Every finite code's value, divided by max in float32, is an entry.
    for (std::uint32_t code = 0; code < (1u << t.f.bits()); ++code) {
      const float x = emu::decode<float>(t.f, code);
      if (!std::isfinite(x))
        continue;
      EXPECT_TRUE(std::binary_search(v.begin(), v.end(), x / t.max)) << code;
    }
  }
  EXPECT_THROW(codebook::from_format(emu::float16), lowbit::error);
}

void expect_error_containing(const std::function<void()>& fn, const std::string& part) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning \"" << part << "\"";
  } catch (const lowbit::error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

// The GPU kernels find the nearest entry through a bucket table (blockwise_ops.hpp); the CPU
// twin by binary search. Both must give the same index for every |t| <= 1: checked at every
// bucket's two ends and their neighbours, at every midpoint's neighbours, and at random t, for
// the built-in codebooks and one whose entries crowd into single buckets.
TEST(blockwise_codebook, bucket_search_equals_binary_search) {
  namespace ops = lowbit::kernels::blockwise_ops;
  const std::vector<float> crowd = lowbit::proptest::test::crowded_codebook_values();
  const std::vector<codebook> cbs = {codebook::dynamic_tree(true),
                                     codebook::dynamic_tree(false),
                                     codebook::linear(true),
                                     codebook::linear(false),
                                     codebook::from_format(lowbit::emu::e4m3fn),
                                     codebook::from_format(lowbit::emu::e2m1fn),
                                     codebook::from_values(crowd.data(), 256)};
  std::mt19937_64 g(7);
  for (std::size_t c = 0; c < cbs.size(); ++c) {
    ops::tables tb;
    ops::prepare(cbs[c].values().data(), tb);
    std::vector<std::uint32_t> buckets(ops::bucket_count);
    for (std::uint32_t u = 0; u < ops::bucket_count; ++u)
      buckets[u] = ops::bucket_entry(tb.sum_hi, tb.sum_lo, u);
    int mismatches = 0;
    const auto check = [&](float t) {
      if (!(std::fabs(t) <= 1.0f))
        return;
      const std::uint32_t want = ops::nearest_index(tb.sum_hi, tb.sum_lo, t);
      const std::uint32_t got = ops::nearest_by_buckets(buckets.data(), tb.sum_hi, tb.sum_lo, t);
      if (got != want && ++mismatches <= 5)
        ADD_FAILURE() << "codebook " << c << ", t = " << describe_input(t) << ": buckets " << got
                      << ", binary search " << want;
      // The kernels' entry address for |t| <= 1.
      for (const std::uint32_t base : {0u, 0x1000u - ops::bucket_bias}) {
        const std::uint32_t at = ops::bucket_address(base, bits_of(t));
        if (at != base + 4 * ops::bucket_of(t) + ops::bucket_bias && ++mismatches <= 5)
          ADD_FAILURE() << "t = " << describe_input(t) << ": address " << at << " from base "
                        << base << ", bucket " << ops::bucket_of(t);
      }
    };
    for (std::uint32_t u = 0; u < ops::bucket_count; ++u) {
      const std::uint32_t sign = ops::bucket_sign(u), first = ops::bucket_first(u) | sign;
      const std::uint32_t last = ops::bucket_last(u) | sign;
      // The raw low bits where a one-step bucket's index changes, and their neighbours.
      const std::uint32_t e = buckets[u], h = (1u << 24) - (e & 0xFFFFFFu);
      const std::uint32_t step = (e & ops::bucket_step_flag) == 0 || h >= ops::bucket_never
                                     ? 0u
                                     : (sign != 0 ? ops::bucket_never - h : h);
      const std::uint32_t top = first & ~0x1FFFFu;
      for (std::uint32_t b : {first, first + 1u, last - 0x10000u, last - 1u, last,
                              top | (step - 1u), top | step, top | ((step + 1u) & 0x1FFFFu)}) {
        float t;
        std::memcpy(&t, &b, 4);
        check(t);
      }
    }
    // Below the buckets' floor (2^-32) every |t| shares bucket 0 of its sign: every binade there.
    for (std::uint32_t ex = 0; ex <= (ops::bucket_floor >> 23); ++ex)
      for (std::uint32_t sign : {0u, 0x80000000u})
        for (std::uint32_t m : {0u, 1u, 0x400000u, 0x7FFFFFu}) {
          const std::uint32_t b = sign | (ex << 23) | m;
          float t;
          std::memcpy(&t, &b, 4);
          check(t);
        }
    for (int j = 0; j < 255; ++j) {
      const float mid = (tb.value[j] + tb.value[j + 1]) / 2.0f;
      for (float t : {mid, std::nextafter(mid, -2.0f), std::nextafter(mid, 2.0f), tb.value[j]})
        check(t);
    }
    for (int i = 0; i < 1000000; ++i) {
      const std::uint32_t b = static_cast<std::uint32_t>(g()) & 0xBFFFFFFFu; // |t| < 2
      float t;
      std::memcpy(&t, &b, 4);
      check(t);
    }
    EXPECT_EQ(mismatches, 0) << "codebook " << c;
  }
}

// The optimizer step kernels find the unsigned states' entries through a pair table (two step
// words per bucket, blockwise_ops.hpp's bucket_pair) of the nonnegative buckets, reading t <= -0
// as +0. Where every bucket of a codebook has a pair and its negative buckets all hold the index
// of +0, the kernels' address and pair_index must give nearest_index for every |t| <= 1, checked
// at every bucket's ends, at both steps of each pair and their neighbours, at every midpoint's
// neighbours and at random t. The unsigned dynamic map must be such a codebook (the launcher
// refuses the kernels otherwise); the signed one and one crowding three midpoints into a bucket
// are not.
TEST(blockwise_codebook, pair_table_equals_binary_search) {
  namespace ops = lowbit::kernels::blockwise_ops;
  const std::vector<float> crowd = lowbit::proptest::test::crowded_codebook_values();
  const std::vector<codebook> cbs = {codebook::dynamic_tree(false), codebook::linear(false),
                                     codebook::dynamic_tree(true),
                                     codebook::from_values(crowd.data(), 256)};
  std::mt19937_64 g(11);
  const auto from_bits_of = [](std::uint32_t b) {
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  };
  for (std::size_t c = 0; c < cbs.size(); ++c) {
    ops::tables tb;
    ops::prepare(cbs[c].values().data(), tb);
    std::vector<std::uint32_t> pairs(ops::bucket_count); // bucket 2j's pair at 2j, 2j + 1
    const std::uint32_t zero = ops::nearest_index(tb.sum_hi, tb.sum_lo, 0.0f);
    bool usable = true;
    for (std::uint32_t u = 0; u < ops::bucket_count; ++u) {
      std::uint32_t e[2] = {0, 0};
      usable = usable && ops::bucket_pair(tb.sum_hi, tb.sum_lo, u, e);
      if (u % 2 == 0) {
        pairs[u] = e[0];
        pairs[u + 1] = e[1];
      } else {
        usable = usable && e[0] == ops::bucket_step_entry(zero, ops::bucket_never) &&
                 e[1] == ops::bucket_step_entry(0, ops::bucket_never);
      }
    }
    EXPECT_EQ(usable, c < 2) << "codebook " << c;
    if (!usable)
      continue;
    constexpr std::uint32_t at0 = 0x10000u; // the table's address in the kernels' shared memory
    int mismatches = 0;
    const auto check = [&](float t) {
      if (!(std::fabs(t) <= 1.0f))
        return;
      std::uint32_t bits = bits_of(t);
      bits = static_cast<std::int32_t>(bits) < 0 ? 0u : bits; // as the kernels read t
      const std::uint32_t at = ops::entry_address(at0 - ops::bucket_bias, bits);
      if (at != at0 + 8 * (ops::bucket_of(from_bits_of(bits)) / 2)) {
        if (++mismatches <= 5)
          ADD_FAILURE() << "t = " << describe_input(t) << ": pair address " << at;
        return;
      }
      const std::uint32_t j = (at - at0) / 4;
      const std::uint32_t got = ops::pair_index(pairs[j], pairs[j + 1], bits & 0x1FFFFu);
      const std::uint32_t want = ops::nearest_index(tb.sum_hi, tb.sum_lo, t);
      if (got != want && ++mismatches <= 5)
        ADD_FAILURE() << "codebook " << c << ", t = " << describe_input(t) << ": pair table " << got
                      << ", binary search " << want;
    };
    for (std::uint32_t u = 0; u < ops::bucket_count; ++u) {
      const std::uint32_t sign = ops::bucket_sign(u), first = ops::bucket_first(u);
      std::vector<std::uint32_t> lows = {0u, 1u, 0x10000u, 0x1FFFEu, 0x1FFFFu};
      for (int w = 0; w < 2; ++w) { // each step h of the bucket's pair and its neighbours
        const std::uint32_t h = (1u << 24) - (pairs[(u & ~1u) + w] & 0xFFFFFFu);
        if (h < ops::bucket_never)
          for (std::uint32_t d : {h - 1u, h, h + 1u})
            lows.push_back(d & 0x1FFFFu);
      }
      for (std::uint32_t low : lows)
        check(from_bits_of(sign | first | low));
    }
    for (std::uint32_t ex = 0; ex <= (ops::bucket_floor >> 23); ++ex) // below the floor
      for (std::uint32_t sign : {0u, 0x80000000u})
        for (std::uint32_t m : {0u, 1u, 0x400000u, 0x7FFFFFu})
          check(from_bits_of(sign | (ex << 23) | m));
    for (int j = 0; j < 255; ++j) {
      const float mid = (tb.value[j] + tb.value[j + 1]) / 2.0f;
      for (float t : {mid, std::nextafter(mid, -2.0f), std::nextafter(mid, 2.0f), tb.value[j]})
        check(t);
    }
    for (int i = 0; i < 1000000; ++i)
      check(from_bits_of(static_cast<std::uint32_t>(g()) & 0xBFFFFFFFu)); // |t| < 2
    EXPECT_EQ(mismatches, 0) << "codebook " << c;
  }
}

float from_bits(std::uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// The CUDA kernels divide by a block's absmax through one reciprocal per block
// (ops::block_divisor); the CPU twin divides. Both must give the same bits for every |x| <= a:
// checked for absmax values across the whole float range (subnormal, the ends of the fast
// range, powers of two and their neighbours, random) against x from every binade below a,
// each binade's ends, the fast path's lower limit and its neighbours, and signed zeros.
TEST(blockwise_codebook, block_divisor_equals_division) {
  namespace ops = lowbit::kernels::blockwise_ops;
  std::mt19937_64 g(11);
  std::vector<float> as;
  for (std::uint32_t e = 0; e < 255; ++e) // every binade: its power of two, its top, a random one
    for (std::uint32_t m : {0u, 1u, 0x7FFFFFu, static_cast<std::uint32_t>(g()) & 0x7FFFFFu})
      if ((e << 23 | m) != 0)
        as.push_back(from_bits(e << 23 | m));
  for (std::uint32_t edge : {27u << 23, 227u << 23, 148u << 23, 48u << 23})
    for (std::uint32_t d : {0u, 1u, 0xFFFFFFFFu})
      as.push_back(from_bits(edge + d));
  int mismatches = 0;
  std::int64_t checked = 0;
  for (const float a : as) {
    const ops::block_divisor div = ops::block_divisor::make(a);
    const std::uint32_t ab = bits_of(a);
    const auto check = [&](std::uint32_t xb) {
      if ((xb & 0x7FFFFFFFu) > ab)
        return;
      const float x = from_bits(xb);
      const float want = x / a, got = div(x);
      ++checked;
      if (bits_of(want) != bits_of(got) && ++mismatches <= 5)
        ADD_FAILURE() << "a = " << describe_input(a) << ", x = " << describe_input(x)
                      << ": divisor " << describe_input(got) << ", division "
                      << describe_input(want);
    };
    std::vector<std::uint32_t> xs = {0u,
                                     0x80000000u,
                                     ab,
                                     ab | 0x80000000u,
                                     ab - 1u,
                                     1u,
                                     div.small_bits - 1u,
                                     div.small_bits,
                                     div.small_bits + 1u};
    for (std::uint32_t e = 0; e <= (ab >> 23); ++e)
      for (std::uint32_t m : {0u, 0x7FFFFFu})
        xs.push_back(e << 23 | m);
    for (int i = 0; i < 4000; ++i) { // random x with exponents up to a's
      const std::uint32_t e = static_cast<std::uint32_t>(g() % ((ab >> 23) + 1));
      xs.push_back(e << 23 | (static_cast<std::uint32_t>(g()) & 0x7FFFFFu));
    }
    for (std::uint32_t xb : xs) {
      check(xb & 0x7FFFFFFFu);
      check(xb | 0x80000000u);
    }
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_GT(checked, 500000);
}

// The kernels of codebooks with simple bucket tables divide through ops::scaled_divisor: the
// division's bits wherever its result lies in a bucket above bucket 0, else a result in a bucket
// 0 too (either sign: both hold the index of zero there). Checked for absmax values in every
// binade (subnormal ones included) against x from every binade below a, random x, signed zeros.
TEST(blockwise_codebook, scaled_divisor_buckets_equal_division) {
  namespace ops = lowbit::kernels::blockwise_ops;
  const auto in_bucket0 = [](float t) { return ops::bucket_of(t) < 2; };
  std::mt19937_64 g(13);
  int mismatches = 0;
  std::int64_t exact = 0, tiny = 0;
  for (std::uint32_t e = 0; e < 255; ++e)
    for (std::uint32_t m :
         {0u, 1u, 0x400000u, 0x7FFFFFu, static_cast<std::uint32_t>(g()) & 0x7FFFFFu}) {
      const std::uint32_t ab = e << 23 | m;
      if (ab == 0)
        continue;
      const float a = from_bits(ab);
      const ops::scaled_divisor div = ops::scaled_divisor::make(a);
      std::vector<std::uint32_t> xs = {0u, ab, ab - 1u, 1u};
      for (std::uint32_t xe = 0; xe <= e; ++xe)
        for (std::uint32_t xm : {0u, 0x7FFFFFu, static_cast<std::uint32_t>(g()) & 0x7FFFFFu})
          xs.push_back(xe << 23 | xm);
      for (int i = 0; i < 600; ++i)
        xs.push_back(static_cast<std::uint32_t>(g() % (std::uint64_t{ab} + 1)));
      // x whose quotient lies next to a midpoint between two floats (where one correction is
      // not enough): x = a (q + ulp(q) / 2) rounded, for q over several binades.
      for (int i = 0; i < 300; ++i) {
        const float q = std::ldexp(1.0f + static_cast<float>(g() % (1u << 23)) * 0x1p-23f,
                                   -static_cast<int>(g() % 40) - 1);
        const double mid = static_cast<double>(q) + std::ldexp(1.0, std::ilogb(q) - 24);
        const float xf = static_cast<float>(static_cast<double>(a) * mid);
        if (std::isfinite(xf))
          xs.push_back(bits_of(xf));
      }
      for (std::uint32_t xb0 : xs)
        for (std::uint32_t sign : {0u, 0x80000000u}) {
          const std::uint32_t xb = (xb0 & 0x7FFFFFFFu) | sign;
          if ((xb & 0x7FFFFFFFu) > ab)
            continue;
          const float x = from_bits(xb);
          const float want = x / a, got = div(x);
          const bool ok = in_bucket0(want) ? in_bucket0(got) : bits_of(want) == bits_of(got);
          (in_bucket0(want) ? tiny : exact) += 1;
          if (!ok && ++mismatches <= 5)
            ADD_FAILURE() << "a = " << describe_input(a) << ", x = " << describe_input(x)
                          << ": scaled divisor " << describe_input(got) << ", division "
                          << describe_input(want);
        }
    }
  EXPECT_EQ(mismatches, 0);
  EXPECT_GT(exact, 500000);
  EXPECT_GT(tiny, 10000);
}

// simple_buckets picks the branch-free kernels: where it says yes, the table must hold no walk
// and both buckets 0 the index of zero. The signed dynamic map (the common case) must qualify
// (the unsigned one crowds: 8 of its buckets span two midpoints); codebooks whose entries crowd,
// or with an entry below 2^-32, must not.
TEST(blockwise_codebook, simple_buckets_is_conservative) {
  namespace ops = lowbit::kernels::blockwise_ops;
  const std::vector<float> crowd = lowbit::proptest::test::crowded_codebook_values();
  std::vector<float> tiny(256); // entries down to 2^-40 around zero: bucket 0 changes index
  for (int i = 0; i < 256; ++i)
    tiny[static_cast<std::size_t>(i)] = (i - 128) / 128.0f;
  tiny[129] = std::ldexp(1.0f, -40);
  const std::vector<codebook> cbs = {codebook::dynamic_tree(true),
                                     codebook::dynamic_tree(false),
                                     codebook::linear(true),
                                     codebook::linear(false),
                                     codebook::from_format(lowbit::emu::e4m3fn),
                                     codebook::from_format(lowbit::emu::e2m1fn),
                                     codebook::from_values(crowd.data(), 256),
                                     codebook::from_values(tiny.data(), 256)};
  for (std::size_t c = 0; c < cbs.size(); ++c) {
    ops::tables tb;
    ops::prepare(cbs[c].values().data(), tb);
    const bool simple = ops::simple_buckets(tb);
    bool really = true;
    const std::uint32_t zero = ops::nearest_index(tb.sum_hi, tb.sum_lo, 0.0f);
    for (std::uint32_t u = 0; u < ops::bucket_count; ++u) {
      const std::uint32_t e = ops::bucket_entry(tb.sum_hi, tb.sum_lo, u);
      if ((e & ops::bucket_step_flag) == 0)
        really = false;
      if (u < 2 && e != ops::bucket_step_entry(zero, ops::bucket_never))
        really = false;
    }
    EXPECT_TRUE(!simple || really) << "codebook " << c << ": simple_buckets says yes, wrongly";
    if (c == 0) {
      EXPECT_TRUE(simple) << "the signed dynamic map";
    }
    if (c >= 6) {
      EXPECT_FALSE(simple) << "codebook " << c;
    }
  }
}

// simple_buckets compares only consecutive midpoints of one sign; marking every bucket each
// widened midpoint may fall in gives the same answer. Checked on the built-in codebooks and on
// random ones: geometric magnitudes (one or both signs, with zero, jittered), some crowded
// enough to share buckets, some with entries near zero.
TEST(blockwise_codebook, simple_buckets_equals_marking_every_bucket) {
  namespace ops = lowbit::kernels::blockwise_ops;
  const auto marked_twice = [](const ops::tables& tb) { // the definition, bucket by bucket
    std::vector<unsigned char> marked(ops::bucket_count + 2, 0);
    for (int j = 0; j < 255; ++j) {
      const float m = tb.sum_hi[j] * 0.5f;
      const float lo = std::nextafter(std::nextafter(m, -2.0f), -2.0f);
      const float hi = std::nextafter(std::nextafter(m, 2.0f), 2.0f);
      if (!(lo > 0.0f) && !(hi < 0.0f))
        return true;
      const std::uint32_t b0 = ops::bucket_of(lo), b1 = ops::bucket_of(hi);
      for (std::uint32_t b = std::min(b0, b1); b <= std::max(b0, b1); b += 2) {
        if (b < 2 || marked[b])
          return true;
        marked[b] = 1;
      }
    }
    return false;
  };
  std::vector<std::vector<float>> books;
  for (const codebook& cb :
       {codebook::dynamic_tree(true), codebook::dynamic_tree(false), codebook::linear(true),
        codebook::linear(false), codebook::from_format(lowbit::emu::e4m3fn)})
    books.emplace_back(cb.values().begin(), cb.values().end());
  std::mt19937_64 g(17);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int i = 0; i < 400; ++i) {
    const bool both_signs = g() & 1;
    const int per_sign = both_signs ? 127 : 255;
    const double floor_exp = -2.0 - 40.0 * unit(g); // smallest magnitude 2^floor_exp
    std::vector<float> v = {0.0f};
    for (int k = 0; k < per_sign; ++k) {
      const double e = floor_exp * (1.0 - (k + 0.3 * unit(g)) / per_sign);
      const float mag = static_cast<float>(std::min(1.0, std::exp2(e)));
      v.push_back(mag);
      if (both_signs)
        v.push_back(-mag);
    }
    while (v.size() < 256)
      v.push_back(1.0f);
    std::sort(v.begin(), v.end());
    books.push_back(v);
  }
  int simple = 0, not_simple = 0;
  for (const std::vector<float>& v : books) {
    ops::tables tb;
    ops::prepare(v.data(), tb);
    const bool want = !marked_twice(tb);
    EXPECT_EQ(ops::simple_buckets(tb), want);
    (want ? simple : not_simple) += 1;
  }
  EXPECT_GT(simple, 20);
  EXPECT_GT(not_simple, 20);
}

TEST(blockwise_codebook, user_values_are_validated) {
  std::vector<float> v(256);
  for (int i = 0; i < 256; ++i)
    v[static_cast<std::size_t>(i)] = (i - 128) / 128.0f;
  EXPECT_NO_THROW(codebook::from_values(v.data(), 256));
  expect_error_containing([&] { codebook::from_values(v.data(), 255); }, "exactly 256");
  auto w = v;
  w[17] = std::numeric_limits<float>::quiet_NaN();
  expect_error_containing([&] { codebook::from_values(w.data(), 256); }, "entry 17 is not finite");
  w = v;
  w[255] = std::numeric_limits<float>::infinity();
  expect_error_containing([&] { codebook::from_values(w.data(), 256); }, "entry 255 is not finite");
  w = v;
  w[255] = 1.5f;
  expect_error_containing([&] { codebook::from_values(w.data(), 256); }, "outside [-1, 1]");
  w = v;
  std::swap(w[40], w[41]);
  expect_error_containing([&] { codebook::from_values(w.data(), 256); }, "ascending");
  const float zeros[3] = {0, 0, 0};
  expect_error_containing([&] { codebook::from_quantiles(zeros, 3); }, "every quantile is 0");
  expect_error_containing([&] { codebook::from_quantiles(zeros, 256); }, "1..255");
}

// ---- quantization: CPU twin vs reference --------------------------------------------------------

struct named_codebook {
  std::string name;
  codebook cb;
};

// A user codebook with duplicated entries (0 and others) and values very close together.
codebook odd_user_codebook() {
  std::vector<float> v;
  for (int i = 0; i < 100; ++i)
    v.push_back(-1.0f + i / 200.0f);
  for (int i = 0; i < 20; ++i)
    v.push_back(0.0f);
  for (int i = 0; i < 50; ++i)
    v.push_back(0.25f);
  for (int i = 0; i < 86; ++i)
    v.push_back(std::nextafter(0.5f, 0.0f) + i * 1e-7f);
  std::sort(v.begin(), v.end());
  return codebook::from_values(v.data(), 256);
}

const std::vector<named_codebook>& all_codebooks() {
  static const std::vector<named_codebook> all = {
      {"dynamic_signed", codebook::dynamic_tree(true)},
      {"dynamic_unsigned", codebook::dynamic_tree(false)},
      {"linear_signed", codebook::linear(true)},
      {"linear_unsigned", codebook::linear(false)},
      {"e4m3fn", codebook::from_format(emu::e4m3fn)},
      {"e2m1fn", codebook::from_format(emu::e2m1fn)},
      {"odd_user", odd_user_codebook()},
  };
  return all;
}

// float -> float16 / bfloat16 bits and back (the inputs of those dtypes are what they hold).
std::uint16_t to_half_bits(float x, bool bf16) {
  return static_cast<std::uint16_t>(
      emu::encode(bf16 ? emu::bfloat16 : emu::float16, x, emu::policy{}, 0));
}
float from_half_bits(std::uint16_t b, bool bf16) {
  return emu::decode<float>(bf16 ? emu::bfloat16 : emu::float16, b);
}

// Block values: a random scale, random magnitudes (some tiny relative to the block's largest,
// exercising subnormal quotients), zeros, exact codebook multiples (ties and exact hits), and
// rarely NaN/Inf.
std::vector<float> block_values(std::size_t n, bool specials, const codebook& cb) {
  std::vector<float> v(n);
  const int e0 = *rc::gen::inRange(-40, 40);
  const float a =
      std::ldexp(1.0f + static_cast<float>(*rc::gen::inRange(0, 1 << 10)) / 1024.0f, e0);
  for (auto& x : v) {
    const int k = *rc::gen::inRange(0, 100);
    if (specials && k < 2)
      x = std::numeric_limits<float>::quiet_NaN();
    else if (specials && k < 3)
      x = (k & 1) ? std::numeric_limits<float>::infinity()
                  : -std::numeric_limits<float>::infinity();
    else if (k < 10)
      x = (k & 1) ? -0.0f : 0.0f;
    else if (k < 30) { // a midpoint of two neighbours, times a (often exact: ties)
      const int j = *rc::gen::inRange(0, 255);
      x = (cb[j] * 0.5f + cb[j + 1] * 0.5f) * a;
    } else if (k < 40) {
      x = cb[*rc::gen::inRange(0, 256)] * a;
    } else
      x = std::ldexp(static_cast<float>(*rc::gen::inRange(-(1 << 24), 1 << 24)),
                     e0 - 24 + *rc::gen::inRange(-30, 1));
  }
  if (*rc::gen::inRange(0, 4) != 0 && n > 0)
    v[*rc::gen::inRange<std::size_t>(0, n)] = a; // |x| <= a
  return v;
}

const std::vector<std::int64_t> blocks = {64, 128, 256, 512, 1024, 2048, 4096};

// Runs the twin on x (as dtype `dt`); returns codes and absmax, and the float values it read.
struct run_result {
  std::vector<float> xf; // the values as float (what the twin loads)
  std::vector<std::uint8_t> codes;
  std::vector<float> absmax;
};

run_result run_twin(const std::vector<float>& x, dtype dt, const codebook& cb,
                    const kernels::blockwise_config& cfg) {
  const auto n = static_cast<std::int64_t>(x.size());
  run_result r;
  r.codes.assign(x.size(), 0xAB);
  r.absmax.assign(static_cast<std::size_t>(kernels::blockwise_blocks(n, cfg.block)), -7.0f);
  std::vector<std::uint16_t> h(x.size());
  const void* data = x.data();
  r.xf = x;
  if (dt != dtype::float32) {
    const bool bf = dt == dtype::bfloat16;
    for (std::size_t i = 0; i < x.size(); ++i) {
      h[i] = to_half_bits(x[i], bf);
      r.xf[i] = from_half_bits(h[i], bf);
    }
    data = h.data();
  }
  kernels::quantize_blockwise(tensor_view::contiguous(data, dt, {n}),
                              tensor_view::contiguous(r.codes.data(), dtype::uint8, {n}),
                              tensor_view::contiguous(r.absmax.data(), dtype::float32,
                                                      {static_cast<std::int64_t>(r.absmax.size())}),
                              cb, cfg);
  return r;
}

TEST(blockwise, twin_nearest_index_within_derived_bound_of_reference) {
  check_property("blockwise_twin_vs_reference", 60, [] {
    const auto& all = all_codebooks();
    const auto& nc = *rc::gen::elementOf(all);
    const ref::exact_codebook ecb(values_of(nc.cb));
    kernels::blockwise_config cfg;
    cfg.block = *rc::gen::elementOf(blocks);
    const dtype dt =
        *rc::gen::element(dtype::float32, dtype::float32, dtype::float16, dtype::bfloat16);
    // up to three blocks, the last usually partial; shorter for the long blocks
    const std::int64_t n =
        *rc::gen::inRange<std::int64_t>(1, std::min<std::int64_t>(3 * cfg.block, 700));
    const bool specials = *rc::gen::inRange(0, 4) == 0;
    std::vector<float> x;
    for (std::int64_t b = 0; b < kernels::blockwise_blocks(n, cfg.block); ++b) {
      const auto len = static_cast<std::size_t>(std::min(cfg.block, n - b * cfg.block));
      const auto part = block_values(len, specials, nc.cb);
      x.insert(x.end(), part.begin(), part.end());
    }
    const run_result r = run_twin(x, dt, nc.cb, cfg);
    const int zero_idx = ref::nearest_entry(ecb, rational(0));
    const rational u = rational(1, ref::integer(1) << 24);
    const rational tiny = rational(1, ref::integer(1) << 150);
    for (std::int64_t b = 0; b < static_cast<std::int64_t>(r.absmax.size()); ++b) {
      const std::int64_t i0 = b * cfg.block, i1 = std::min(n, i0 + cfg.block);
      bool poison = false;
      float amax = 0.0f;
      for (std::int64_t i = i0; i < i1; ++i) {
        const float v = r.xf[static_cast<std::size_t>(i)];
        if (!std::isfinite(v))
          poison = true;
        else
          amax = std::max(amax, std::fabs(v));
      }
      const float stored = r.absmax[static_cast<std::size_t>(b)];
      if (poison) {
        RC_ASSERT(std::isnan(stored));
        for (std::int64_t i = i0; i < i1; ++i)
          RC_ASSERT(r.codes[static_cast<std::size_t>(i)] == zero_idx);
        continue;
      }
      RC_ASSERT(bits_of(stored) == bits_of(amax));
      for (std::int64_t i = i0; i < i1; ++i) {
        const float xi = r.xf[static_cast<std::size_t>(i)];
        const int twin = r.codes[static_cast<std::size_t>(i)];
        if (amax == 0.0f) {
          RC_ASSERT(twin == zero_idx);
          continue;
        }
        // Exact given the float quotient.
        const float t = xi / amax;
        const int at_t = ref::nearest_entry(ecb, exact_of(t));
        if (twin != at_t)
          RC_FAIL(nc.name + ": element " + std::to_string(i) + " t " + describe_input(t) +
                  ": twin " + std::to_string(twin) + ", reference " + std::to_string(at_t));
        // Within the derived bound of the exact quotient.
        const rational y = exact_of(xi) / exact_of(amax);
        const int at_y = ref::nearest_entry(ecb, y);
        if (twin == at_y)
          continue;
        rational e = abs(y) * u;
        if (e < tiny)
          e = tiny;
        const int lo = ref::nearest_entry(ecb, y - e), hi = ref::nearest_entry(ecb, y + e);
        if (lo == hi || twin < std::min(lo, hi) || twin > std::max(lo, hi))
          RC_FAIL(nc.name + ": element " + std::to_string(i) + " x " + describe_input(xi) +
                  " absmax " + describe_input(amax) + ": twin " + std::to_string(twin) +
                  ", exact " + std::to_string(at_y) + ", band ends " + std::to_string(lo) + "/" +
                  std::to_string(hi));
      }
    }
  });
}

TEST(blockwise, twin_stochastic_picks_a_neighbour_of_the_reference_bracket) {
  check_property("blockwise_stochastic_bracket", 40, [] {
    const auto& all = all_codebooks();
    const auto& nc = *rc::gen::elementOf(all);
    const ref::exact_codebook ecb(values_of(nc.cb));
    kernels::blockwise_config cfg;
    cfg.block = *rc::gen::element<std::int64_t>(64, 256);
    cfg.rounding = kernels::codebook_rounding::stochastic;
    cfg.rng = {*rc::gen::arbitrary<std::uint64_t>(), *rc::gen::arbitrary<std::uint64_t>()};
    const std::int64_t n = *rc::gen::inRange<std::int64_t>(1, 400);
    std::vector<float> x;
    for (std::int64_t b = 0; b < kernels::blockwise_blocks(n, cfg.block); ++b) {
      const auto part = block_values(
          static_cast<std::size_t>(std::min(cfg.block, n - b * cfg.block)), false, nc.cb);
      x.insert(x.end(), part.begin(), part.end());
    }
    const run_result r = run_twin(x, dtype::float32, nc.cb, cfg);
    for (std::int64_t i = 0; i < n; ++i) {
      const float a = r.absmax[static_cast<std::size_t>(i / cfg.block)];
      const float t =
          a == 0.0f ? x[static_cast<std::size_t>(i)] : x[static_cast<std::size_t>(i)] / a;
      const auto br = ref::bracket_entries(ecb, exact_of(t));
      const int twin = r.codes[static_cast<std::size_t>(i)];
      const int want_lo = std::max(br.lo, 0), want_hi = std::min(br.hi, 255);
      const bool exact_hit = br.lo >= 0 && ecb.c[static_cast<std::size_t>(br.lo)] == exact_of(t);
      if (br.lo < 0 || br.hi > 255 || exact_hit)
        RC_ASSERT(twin == (br.lo < 0 ? 0 : br.lo)); // clamped, or on an entry: no randomness
      else
        RC_ASSERT(twin == want_lo || twin == want_hi);
    }
  });
}

TEST(blockwise, stochastic_rounding_is_unbiased) {
  // Between two neighbours lo < t < hi the expected dequantized value is t. 2^16 elements of one
  // value (absmax fixed by a leading 1.0): the mean must be within 5 standard errors of t.
  const codebook cb = codebook::dynamic_tree(true);
  for (float t : {0.3f, 0.01234f, -0.777f, 0.9951f}) {
    const std::int64_t n = 1 << 16;
    std::vector<float> x(static_cast<std::size_t>(n), t);
    for (std::int64_t b = 0; b < n; b += 64)
      x[static_cast<std::size_t>(b)] = 1.0f;
    kernels::blockwise_config cfg;
    cfg.block = 64;
    cfg.rounding = kernels::codebook_rounding::stochastic;
    cfg.rng = {1234, 5};
    const run_result r = run_twin(x, dtype::float32, cb, cfg);
    const auto j = static_cast<std::size_t>(
        std::upper_bound(cb.values().begin(), cb.values().end(), t) - cb.values().begin());
    const double lo = cb[static_cast<int>(j - 1)], hi = cb[static_cast<int>(j)];
    double sum = 0;
    std::int64_t cnt = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      if (i % 64 == 0)
        continue;
      const double v = cb[r.codes[static_cast<std::size_t>(i)]];
      ASSERT_TRUE(v == lo || v == hi) << v;
      sum += v;
      ++cnt;
    }
    const double mean = sum / static_cast<double>(cnt);
    const double p = (t - lo) / (hi - lo);
    const double se = (hi - lo) * std::sqrt(p * (1 - p) / static_cast<double>(cnt));
    EXPECT_NEAR(mean, t, 5 * se + 1e-12) << "t " << t;
  }
}

TEST(blockwise, dequantize_then_quantize_is_idempotent) {
  check_property("blockwise_idempotent", 60, [] {
    const auto& all = all_codebooks();
    const auto& nc = *rc::gen::elementOf(all);
    kernels::blockwise_config cfg;
    cfg.block = *rc::gen::elementOf(blocks);
    const std::int64_t n = *rc::gen::inRange<std::int64_t>(1, 600);
    std::vector<float> x;
    for (std::int64_t b = 0; b < kernels::blockwise_blocks(n, cfg.block); ++b) {
      const auto part = block_values(
          static_cast<std::size_t>(std::min(cfg.block, n - b * cfg.block)), false, nc.cb);
      x.insert(x.end(), part.begin(), part.end());
    }
    const run_result r1 = run_twin(x, dtype::float32, nc.cb, cfg);
    std::vector<float> y(x.size()), y2(x.size());
    const auto nb = static_cast<std::int64_t>(r1.absmax.size());
    kernels::dequantize_blockwise(tensor_view::contiguous(r1.codes.data(), dtype::uint8, {n}),
                                  tensor_view::contiguous(r1.absmax.data(), dtype::float32, {nb}),
                                  tensor_view::contiguous(y.data(), dtype::float32, {n}), nc.cb,
                                  cfg.block);
    const run_result r2 = run_twin(y, dtype::float32, nc.cb, cfg);
    kernels::dequantize_blockwise(tensor_view::contiguous(r2.codes.data(), dtype::uint8, {n}),
                                  tensor_view::contiguous(r2.absmax.data(), dtype::float32, {nb}),
                                  tensor_view::contiguous(y2.data(), dtype::float32, {n}), nc.cb,
                                  cfg.block);
    // Where the block's absmax survives the round trip (its largest element maps to an entry of
    // magnitude 1), the second round trip reproduces the first bit for bit.
    std::int64_t compared = 0;
    for (std::int64_t b = 0; b < nb; ++b) {
      if (bits_of(r1.absmax[static_cast<std::size_t>(b)]) !=
          bits_of(r2.absmax[static_cast<std::size_t>(b)]))
        continue;
      ++compared;
      for (std::int64_t i = b * cfg.block; i < std::min(n, (b + 1) * cfg.block); ++i)
        if (bits_of(y[static_cast<std::size_t>(i)]) != bits_of(y2[static_cast<std::size_t>(i)]) &&
            !(y[static_cast<std::size_t>(i)] == 0 && y2[static_cast<std::size_t>(i)] == 0))
          RC_FAIL(nc.name + ": element " + std::to_string(i) + " " +
                  describe_input(y[static_cast<std::size_t>(i)]) + " -> " +
                  describe_input(y2[static_cast<std::size_t>(i)]));
    }
    RC_CLASSIFY(compared > 0, "blocks compared");
  });
}

TEST(blockwise, zero_nan_inf_and_partial_blocks) {
  const codebook cb = codebook::dynamic_tree(true);
  const int zero_code = 127; // the signed dynamic map's 0
  ASSERT_EQ(cb[zero_code], 0.0f);
  const std::int64_t n = 64 * 3 + 8;
  std::vector<float> x(static_cast<std::size_t>(n), 0.0f);
  for (int i = 64; i < 128; ++i)
    x[static_cast<std::size_t>(i)] = 0.5f * static_cast<float>(i - 96);
  x[70] = std::numeric_limits<float>::quiet_NaN();
  for (int i = 128; i < 192; ++i)
    x[static_cast<std::size_t>(i)] = -0.25f;
  x[130] = std::numeric_limits<float>::infinity();
  for (int i = 192; i < n; ++i)
    x[static_cast<std::size_t>(i)] = static_cast<float>(i - 190); // 2..9
  kernels::blockwise_config cfg;
  cfg.block = 64;
  const run_result r = run_twin(x, dtype::float32, cb, cfg);
  ASSERT_EQ(r.absmax.size(), 4u);
  EXPECT_EQ(r.absmax[0], 0.0f);         // all zeros: absmax 0, codes of 0
  EXPECT_TRUE(std::isnan(r.absmax[1])); // NaN inside
  EXPECT_TRUE(std::isnan(r.absmax[2])); // Inf inside
  EXPECT_EQ(r.absmax[3], 9.0f);         // partial block: its own 8 elements
  for (int i = 0; i < 192; ++i)
    EXPECT_EQ(r.codes[static_cast<std::size_t>(i)], zero_code) << i;
  EXPECT_EQ(r.codes[199], 255); // 9 / 9 = 1
  std::vector<float> y(static_cast<std::size_t>(n));
  kernels::dequantize_blockwise(tensor_view::contiguous(r.codes.data(), dtype::uint8, {n}),
                                tensor_view::contiguous(r.absmax.data(), dtype::float32, {4}),
                                tensor_view::contiguous(y.data(), dtype::float32, {n}), cb, 64);
  for (int i = 0; i < 64; ++i)
    EXPECT_EQ(bits_of(y[static_cast<std::size_t>(i)]), 0u);
  for (int i = 64; i < 192; ++i)
    EXPECT_EQ(bits_of(y[static_cast<std::size_t>(i)]), 0x7FC00000u);
  EXPECT_EQ(y[199], 9.0f);
  // Empty input: nothing written, no blocks.
  std::vector<float> none;
  EXPECT_NO_THROW(
      kernels::quantize_blockwise(tensor_view::contiguous(none.data(), dtype::float32, {0}),
                                  tensor_view::contiguous(none.data(), dtype::uint8, {0}),
                                  tensor_view::contiguous(none.data(), dtype::float32, {0}), cb));
}

TEST(blockwise, argument_errors) {
  const codebook cb = codebook::linear(true);
  std::vector<float> x(100), a(2);
  std::vector<std::uint8_t> c(100);
  const auto xv = tensor_view::contiguous(x.data(), dtype::float32, {100});
  const auto cv = tensor_view::contiguous(c.data(), dtype::uint8, {100});
  kernels::blockwise_config cfg;
  cfg.block = 100;
  expect_error_containing(
      [&] {
        kernels::quantize_blockwise(xv, cv, tensor_view::contiguous(a.data(), dtype::float32, {1}),
                                    cb, cfg);
      },
      "block: must be one of 64");
  cfg.block = 64;
  expect_error_containing(
      [&] {
        kernels::quantize_blockwise(xv, cv, tensor_view::contiguous(a.data(), dtype::float32, {1}),
                                    cb, cfg);
      },
      "absmax: expected 2 elements");
  expect_error_containing(
      [&] {
        kernels::quantize_blockwise(xv, tensor_view::contiguous(c.data(), dtype::int8, {100}),
                                    tensor_view::contiguous(a.data(), dtype::float32, {2}), cb,
                                    cfg);
      },
      "codes: dtype int8");
  expect_error_containing(
      [&] {
        kernels::quantize_blockwise(xv, tensor_view::contiguous(c.data(), dtype::uint8, {99}),
                                    tensor_view::contiguous(a.data(), dtype::float32, {2}), cb,
                                    cfg);
      },
      "codes: expected 100 elements");
  tensor_view strided = xv;
  strided.shape[0] = 50;
  strided.strides[0] = 2;
  expect_error_containing(
      [&] {
        kernels::quantize_blockwise(strided, tensor_view::contiguous(c.data(), dtype::uint8, {50}),
                                    tensor_view::contiguous(a.data(), dtype::float32, {1}), cb,
                                    cfg);
      },
      "contiguous");
  std::vector<float> q(5000);
  expect_error_containing(
      [&] {
        kernels::estimate_quantiles(xv, tensor_view::contiguous(q.data(), dtype::float32, {5000}));
      },
      "1..4096");
  expect_error_containing(
      [&] {
        kernels::estimate_quantiles(tensor_view::contiguous(x.data(), dtype::float32, {0}),
                                    tensor_view::contiguous(q.data(), dtype::float32, {4}));
      },
      "empty");
}

TEST(blockwise, nested_absmax_is_blockwise_quantization_of_the_absmax) {
  const codebook cb = codebook::dynamic_tree(true);
  const kernels::nested_absmax proto; // default nested codebook: unsigned dynamic tree
  std::mt19937_64 gen(7);
  std::normal_distribution<float> nd;
  const std::int64_t block = 64, n = 64 * 600 + 5; // 601 blocks: 3 nested blocks, the last partial
  std::vector<float> x(static_cast<std::size_t>(n));
  for (auto& v : x)
    v = nd(gen) * 3.0f;
  for (int i = 0; i < 64; ++i)
    x[static_cast<std::size_t>(64 * 300 + i)] = 0.0f;        // a zero block
  x[64 * 450 + 3] = std::numeric_limits<float>::quiet_NaN(); // a poisoned one
  const std::int64_t nb = kernels::blockwise_blocks(n, block),
                     nb2 = kernels::blockwise_blocks(nb, 256);
  kernels::blockwise_config cfg;
  cfg.block = block;
  const run_result plain = run_twin(x, dtype::float32, cb, cfg);
  std::vector<std::uint8_t> codes(static_cast<std::size_t>(n)), c2(static_cast<std::size_t>(nb));
  std::vector<float> a2(static_cast<std::size_t>(nb2));
  kernels::nested_absmax nested{tensor_view::contiguous(c2.data(), dtype::uint8, {nb}),
                                tensor_view::contiguous(a2.data(), dtype::float32, {nb2}),
                                proto.cb};
  kernels::quantize_blockwise_nested(tensor_view::contiguous(x.data(), dtype::float32, {n}),
                                     tensor_view::contiguous(codes.data(), dtype::uint8, {n}),
                                     nested, cb, cfg);
  EXPECT_EQ(codes, plain.codes); // elements use the exact absmax
  kernels::blockwise_config cfg2;
  cfg2.block = 256;
  const run_result of_absmax = run_twin(plain.absmax, dtype::float32, proto.cb, cfg2);
  EXPECT_EQ(c2, of_absmax.codes);
  for (std::int64_t g = 0; g < nb2; ++g)
    EXPECT_EQ(bits_of(a2[static_cast<std::size_t>(g)]),
              bits_of(of_absmax.absmax[static_cast<std::size_t>(g)]));
  EXPECT_TRUE(std::isnan(a2[1])); // block 450 is in nested block 1: poisoned
  std::vector<float> y(static_cast<std::size_t>(n));
  kernels::dequantize_blockwise_nested(
      tensor_view::contiguous(codes.data(), dtype::uint8, {n}), nested,
      tensor_view::contiguous(y.data(), dtype::float32, {n}), cb, block);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t b = i / block;
    float a = proto.cb[c2[static_cast<std::size_t>(b)]] * a2[static_cast<std::size_t>(b / 256)];
    if (std::isnan(a))
      a = std::numeric_limits<float>::quiet_NaN();
    float want = cb[codes[static_cast<std::size_t>(i)]] * a;
    if (std::isnan(want))
      want = std::numeric_limits<float>::quiet_NaN();
    ASSERT_EQ(bits_of(y[static_cast<std::size_t>(i)]), bits_of(want)) << i;
  }
  // Relative error of the reconstructed absmax (finite nested blocks): a few percent at most with
  // the unsigned dynamic map.
  double worst = 0;
  for (std::int64_t b = 0; b < nb; ++b) {
    const float a = plain.absmax[static_cast<std::size_t>(b)];
    if (!(a > 0) || std::isnan(a2[static_cast<std::size_t>(b / 256)]))
      continue;
    const double r =
        proto.cb[c2[static_cast<std::size_t>(b)]] * a2[static_cast<std::size_t>(b / 256)];
    worst = std::max(worst, std::fabs(r - a) / a);
  }
  std::printf("nested absmax (unsigned dynamic map, Gaussian data): worst relative error %.4g\n",
              worst);
  EXPECT_LT(worst, 0.05);
}

// ---- SRAM-quantiles
// ------------------------------------------------------------------------------

std::vector<float> estimate(const std::vector<float>& x, int k) {
  std::vector<float> q(static_cast<std::size_t>(k));
  kernels::estimate_quantiles(
      tensor_view::contiguous(x.data(), dtype::float32, {static_cast<std::int64_t>(x.size())}),
      tensor_view::contiguous(q.data(), dtype::float32, {k}));
  return q;
}

TEST(sram_quantiles, one_chunk_gives_the_exact_quantiles) {
  check_property("sram_quantiles_one_chunk", 100, [] {
    const auto n = *rc::gen::inRange<std::size_t>(1, 4097);
    const int k = *rc::gen::element(1, 7, 255, 256, 1000);
    std::vector<float> x(n);
    for (auto& v : x)
      v = std::ldexp(static_cast<float>(*rc::gen::inRange(-1000, 1001)),
                     *rc::gen::inRange(-10, 10));
    const auto q = estimate(x, k);
    const auto want = ref::exact_quantiles(std::vector<double>(x.begin(), x.end()), k);
    for (int i = 0; i < k; ++i)
      RC_ASSERT(static_cast<double>(q[static_cast<std::size_t>(i)]) ==
                want[static_cast<std::size_t>(i)]);
  });
}

// The definition's order, recomputed independently from per-chunk quantiles cq[c][i]: the exact
// products m_c * cq[c][i] summed in double in chunk order within groups of quantile_group chunks,
// the group sums added in group order, divided by n.
std::vector<float> two_level_mean(const std::vector<std::vector<double>>& cq,
                                  const std::vector<double>& m, double n) {
  const std::size_t k = cq[0].size(), g = static_cast<std::size_t>(kernels::quantile_group);
  std::vector<float> est(k);
  for (std::size_t i = 0; i < k; ++i) {
    double total = 0.0;
    for (std::size_t c0 = 0; c0 < cq.size(); c0 += g) {
      double group = 0.0;
      for (std::size_t c = c0; c < std::min(cq.size(), c0 + g); ++c)
        group += m[c] * cq[c][i];
      total += group;
    }
    est[i] = static_cast<float>(total / n);
  }
  return est;
}

// The same products summed in plain chunk order (the order before the groups), to show that an
// input tells the two orders apart.
std::vector<float> chunk_order_mean(const std::vector<std::vector<double>>& cq,
                                    const std::vector<double>& m, double n) {
  std::vector<float> est(cq[0].size());
  for (std::size_t i = 0; i < est.size(); ++i) {
    double total = 0.0;
    for (std::size_t c = 0; c < cq.size(); ++c)
      total += m[c] * cq[c][i];
    est[i] = static_cast<float>(total / n);
  }
  return est;
}

// Chunk quantiles by the reference's exact sort, and chunk lengths.
void chunk_quantiles(const std::vector<float>& x, int k, std::vector<std::vector<double>>& cq,
                     std::vector<double>& m) {
  const auto chunk = static_cast<std::size_t>(kernels::quantile_chunk);
  for (std::size_t c0 = 0; c0 < x.size(); c0 += chunk) {
    const std::size_t c1 = std::min(x.size(), c0 + chunk);
    cq.push_back(
        ref::exact_quantiles(std::vector<double>(x.begin() + static_cast<std::ptrdiff_t>(c0),
                                                 x.begin() + static_cast<std::ptrdiff_t>(c1)),
                             k));
    m.push_back(static_cast<double>(c1 - c0));
  }
}

TEST(sram_quantiles, estimate_is_the_weighted_mean_of_chunk_quantiles) {
  // An independent recomputation from the definition, over more than two groups of chunks and a
  // short last chunk.
  std::mt19937_64 gen(11);
  std::normal_distribution<double> nd;
  std::vector<float> x(static_cast<std::size_t>(
      (2 * kernels::quantile_group + 37) * kernels::quantile_chunk + 1000));
  for (auto& v : x)
    v = static_cast<float>(nd(gen));
  const int k = 256;
  const auto q = estimate(x, k);
  std::vector<std::vector<double>> cq;
  std::vector<double> m;
  chunk_quantiles(x, k, cq, m);
  EXPECT_EQ(q, two_level_mean(cq, m, static_cast<double>(x.size())));
  // Deterministic across thread counts.
  std::vector<float> q1(static_cast<std::size_t>(k));
  kernels::estimate_quantiles(
      tensor_view::contiguous(x.data(), dtype::float32, {static_cast<std::int64_t>(x.size())}),
      tensor_view::contiguous(q1.data(), dtype::float32, {k}), kernels::exec{1, nullptr});
  EXPECT_EQ(q, q1);
}

TEST(sram_quantiles, sums_in_groups_of_chunks_then_groups) {
  // Chunks of constant values, so every chunk quantile is the chunk's value; products m_c Q(c):
  // 2^53 (chunk 0), 1 (chunk 1), 1 (first chunk of group 1), -2^53 (next chunk), 0 elsewhere.
  // In chunk order 2^53 + 1 rounds to 2^53 (tie to even) twice and the total is 0; in groups,
  // group 0 gives 2^53, group 1 gives 1 - 2^53 (exact), and the total is 1.
  const std::vector<float> x = lowbit::proptest::test::cancelling_chunks_input();
  const int k = 7;
  const auto q = estimate(x, k);
  std::vector<std::vector<double>> cq;
  std::vector<double> m;
  chunk_quantiles(x, k, cq, m);
  const double n = static_cast<double>(x.size());
  const auto want = two_level_mean(cq, m, n);
  const auto plain = chunk_order_mean(cq, m, n);
  for (int i = 0; i < k; ++i) {
    ASSERT_EQ(want[static_cast<std::size_t>(i)], static_cast<float>(1.0 / n)) << i;
    ASSERT_EQ(plain[static_cast<std::size_t>(i)], 0.0f) << i; // the input tells the orders apart
  }
  EXPECT_EQ(q, want);
}

TEST(sram_quantiles, half_inputs_leave_the_low_key_bits_zero) {
  // The GPU sort skips the low 13 (float16) and 16 (bfloat16) bits of the keys (blockwise.cu,
  // key_skip_bits): every code of those types must load as a float32 with those bits 0.
  namespace cast_ops = lowbit::kernels::cast_ops;
  int bad16 = 0, bad_bf16 = 0;
  for (std::uint32_t c = 0; c < 65536; ++c) {
    const auto h = static_cast<std::uint16_t>(c);
    bad16 += (bits_of(cast_ops::load(cast_ops::f16_bits{h})) & 0x1FFFu) != 0;
    bad_bf16 += (bits_of(cast_ops::load(cast_ops::bf16_bits{h})) & 0xFFFFu) != 0;
  }
  EXPECT_EQ(bad16, 0);
  EXPECT_EQ(bad_bf16, 0);
}

// Rank error of an estimate v of quantile p: |F(v) - p| with the mid-rank empirical CDF
// F(v) = (#{x < v} + #{x <= v}) / 2n of the sorted data s.
double rank_error(const std::vector<float>& s, float v, double p) {
  const auto lt = std::lower_bound(s.begin(), s.end(), v) - s.begin();
  const auto le = std::upper_bound(s.begin(), s.end(), v) - s.begin();
  const double f =
      (static_cast<double>(lt) + static_cast<double>(le)) / (2.0 * static_cast<double>(s.size()));
  return std::fabs(f - p);
}

TEST(sram_quantiles, measured_rank_error) {
  const std::int64_t n = 1 << 20;
  const int k = 256;
  struct dist {
    const char* name;
    std::function<float(std::mt19937_64&)> draw;
    double bound_max; // asserted: measured values with a margin (docs/techniques/sram-quantiles.md)
  };
  const std::vector<dist> dists = {
      {"gaussian",
       [](std::mt19937_64& g) { return static_cast<float>(std::normal_distribution<double>()(g)); },
       0.001},
      {"uniform",
       [](std::mt19937_64& g) {
         return static_cast<float>(std::uniform_real_distribution<double>(-1, 1)(g));
       },
       0.001},
      {"student_t3",
       [](std::mt19937_64& g) {
         return static_cast<float>(std::student_t_distribution<double>(3)(g));
       },
       0.001},
      {"gaussian_outliers",
       [](std::mt19937_64& g) {
         const double v = std::normal_distribution<double>()(g);
         return static_cast<float>(std::uniform_real_distribution<double>()(g) < 0.001 ? v * 1000
                                                                                       : v);
       },
       0.0025},
  };
  std::printf(
      "| data (n = 2^20, k = 256) | max rank error | mean rank error | max in ranks | at p |\n");
  std::printf("|---|---|---|---|---|\n");
  for (const auto& d : dists) {
    std::mt19937_64 gen(2024);
    std::vector<float> x(static_cast<std::size_t>(n));
    for (auto& v : x)
      v = d.draw(gen);
    const auto q = estimate(x, k);
    std::vector<float> s = x;
    std::sort(s.begin(), s.end());
    // The reference's exact quantiles have rank error <= (1 + ties)/(2n): a sanity check.
    const auto exact = ref::exact_quantiles(std::vector<double>(x.begin(), x.end()), k);
    double worst = 0, mean = 0, worst_exact = 0, worst_p = 0;
    for (int i = 0; i < k; ++i) {
      const double p = (2.0 * i + 1) / (2.0 * k);
      const double e = rank_error(s, q[static_cast<std::size_t>(i)], p);
      if (e > worst)
        worst_p = p;
      worst = std::max(worst, e);
      mean += e / k;
      worst_exact = std::max(
          worst_exact, rank_error(s, static_cast<float>(exact[static_cast<std::size_t>(i)]), p));
    }
    std::printf("| %s | %.3g | %.3g | %.0f | %.4f |\n", d.name, worst, mean,
                worst * static_cast<double>(n), worst_p);
    EXPECT_LE(worst_exact, 8.0 / static_cast<double>(n)) << d.name;
    EXPECT_LE(worst, d.bound_max) << d.name;
    // A quantile codebook from the estimate is a valid codebook.
    std::vector<float> q255 = estimate(x, 255);
    const codebook cb = codebook::from_quantiles(q255.data(), 255);
    EXPECT_TRUE(std::is_sorted(cb.values().begin(), cb.values().end()));
  }
}

} // namespace
