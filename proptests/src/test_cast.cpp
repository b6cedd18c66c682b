// The CPU twin of the cast kernels (lowbit::kernels::cast / decode) against emu element by
// element: every input dtype, random shapes (empty, odd sizes), strided and transposed views,
// one thread against two, stochastic bits keyed by logical index, and the argument checks.
#include <climits>
#include <cstring>
#include <numeric>

#include <gtest/gtest.h>

#include <lowbit/emu/emu.hpp>
#include <lowbit/kernels/cast.hpp>
#include <lowbit/proptest/generators.hpp>

#include "support.hpp"

namespace {

namespace emu = lowbit::emu;
namespace kn = lowbit::kernels;
namespace pt = lowbit::proptest;
using kn::dtype;
using pt::test::check_property;
using pt::test::describe;
using pt::test::hex_code;

// The formats the twin specializes at compile time, and two it runs with run-time values.
std::vector<emu::format> cast_formats() {
  return {emu::e4m3fn,
          emu::e5m2,
          emu::e4m3fnuz,
          emu::e5m2fnuz,
          emu::e8m0fnu,
          emu::e3m2fn,
          emu::e2m3fn,
          emu::e2m1fn,
          emu::float16,
          emu::bfloat16,
          emu::tfloat32,
          emu::format{5, 3, 10, emu::specials::ieee},
          emu::format{4, 4, 7, emu::specials::fn, false}};
}

rc::Gen<emu::policy> any_policy() {
  return rc::gen::apply(
      [](int i, int k) {
        if (i == 48)
          return emu::stochastic(k, emu::overflow::nonsaturating);
        if (i == 49)
          return emu::stochastic(k, emu::overflow::saturate);
        return pt::test::deterministic_policies()[static_cast<std::size_t>(i)];
      },
      pt::uniform<int>(0, 49), pt::uniform<int>(1, 32));
}

kn::tensor_view view_of(void* data, dtype t, const std::vector<std::int64_t>& shape) {
  kn::tensor_view v;
  v.data = data;
  v.type = t;
  v.ndim = static_cast<int>(shape.size());
  std::int64_t stride = 1;
  for (int k = v.ndim - 1; k >= 0; --k) {
    v.shape[k] = shape[static_cast<std::size_t>(k)];
    v.strides[k] = stride;
    if (k > 0) // (the outermost extent multiplies no stride: 3 x 2^62 must not overflow here)
      stride *= v.shape[k];
  }
  return v;
}

// Codes of any width as uint32, from a code tensor stored in code_dtype(f).
struct code_buffer {
  dtype type;
  std::vector<std::uint8_t> bytes;
  code_buffer(const emu::format& f, std::size_t n)
      : type(kn::code_dtype(f)), bytes(n * kn::dtype_size(type) + 1) {}
  void* data() { return bytes.data(); }
  std::uint32_t at(std::size_t i) const {
    switch (type) {
    case dtype::uint8: return bytes[i];
    case dtype::uint16: {
      std::uint16_t v;
      std::memcpy(&v, bytes.data() + 2 * i, 2);
      return v;
    }
    default: {
      std::uint32_t v;
      std::memcpy(&v, bytes.data() + 4 * i, 4);
      return v;
    }
    }
  }
};

// Input values: a Gaussian or heavy-tailed tensor, with a fraction of edge values of f mixed in.
rc::Gen<pt::tensor> inputs(const emu::format& f) {
  return rc::gen::apply(
      [](pt::tensor t, std::vector<float> edges) {
        for (std::size_t i = 0; i < t.values.size() && !edges.empty(); i += 3)
          t.values[i] = edges[i % edges.size()];
        return t;
      },
      rc::gen::oneOf(pt::gaussian_tensors(pt::shapes(3, 3000), 4.0f),
                     pt::heavy_tailed_tensors(pt::shapes(3, 3000), 2, 10.0f),
                     pt::outlier_row_tensors(40, 101)),
      rc::gen::container<std::vector<float>>(64, pt::edge_values<float>(f)));
}

TEST(cast, float32_and_float64_inputs_match_encode) {
  for (const emu::format& f : cast_formats()) {
    const std::string name = emu::format_name(f);
    check_property(name + "/cast_contiguous", 40, [f, name] {
      const pt::tensor t = *inputs(f);
      const emu::policy p = *any_policy();
      const emu::random_stream rng{*pt::uniform<std::uint64_t>(0, 1000), 3};
      const std::size_t n = t.values.size();
      std::vector<double> wide(t.values.begin(), t.values.end());
      code_buffer out32(f, n), out64(f, n);
      kn::cast(view_of(const_cast<float*>(t.values.data()), dtype::float32, t.shape),
               view_of(out32.data(), out32.type, t.shape), f, p, rng);
      kn::cast(view_of(wide.data(), dtype::float64, t.shape),
               view_of(out64.data(), out64.type, t.shape), f, p, rng);
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint32_t r = rng.bits(i);
        const std::uint32_t want = emu::encode(f, t.values[i], p, r);
        if (out32.at(i) != want || out64.at(i) != emu::encode(f, wide[i], p, r))
          RC_FAIL(name + " " + describe(p) + " element " + std::to_string(i) + " " +
                  pt::test::describe_input(t.values[i]) + ": twin " + hex_code(out32.at(i)) +
                  " / " + hex_code(out64.at(i)) + ", emu " + hex_code(want));
      }
    });
  }
}

// 16-bit float inputs: all bit patterns appear (NaN payloads, subnormals, Inf).
TEST(cast, float16_and_bfloat16_inputs_match_encode) {
  for (const emu::format& f : cast_formats()) {
    const std::string name = emu::format_name(f);
    for (const auto& [type, src] :
         {std::pair{dtype::float16, emu::float16}, std::pair{dtype::bfloat16, emu::bfloat16}}) {
      check_property(name + "/cast_" + kn::dtype_name(type), 20, [f, name, type = type, src = src] {
        const auto shape = *pt::shapes(2, 5000);
        const std::size_t n = static_cast<std::size_t>(
            std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>()));
        // No shrinking: a failure names its element; shrinking thousands of codes takes long.
        const auto raw = *rc::gen::noShrink(rc::gen::container<std::vector<std::uint16_t>>(
            n, pt::uniform<std::uint16_t>(0, 0xFFFF)));
        const emu::policy p = *any_policy();
        const emu::random_stream rng{11, *pt::uniform<std::uint64_t>(0, 5)};
        code_buffer out(f, n);
        kn::cast(view_of(const_cast<std::uint16_t*>(raw.data()), type, shape),
                 view_of(out.data(), out.type, shape), f, p, rng);
        for (std::size_t i = 0; i < n; ++i) {
          // The exact value of the 16-bit input, through double: an independent path from the
          // twin's float loader.
          const double x = emu::decode<double>(src, raw[i]);
          const std::uint32_t want = emu::encode(f, x, p, rng.bits(i));
          if (out.at(i) != want)
            RC_FAIL(name + " " + describe(p) + " " + kn::dtype_name(type) + " input " +
                    hex_code(raw[i]) + ": twin " + hex_code(out.at(i)) + ", emu " + hex_code(want));
        }
      });
    }
  }
}

// Strided views: every other element of a buffer, and a transposed 2-D view, into strided and
// contiguous outputs. Stochastic bits follow the logical index, so the strided view and its
// contiguous copy give identical codes.
TEST(cast, strided_views_match_their_contiguous_copy) {
  check_property("cast/strided", 150, [] {
    const emu::format f = *rc::gen::elementOf(cast_formats());
    // Half of the cases stochastic: the logical-index keying is what the strided walk can break.
    const emu::policy p =
        *rc::gen::oneOf(any_policy(), rc::gen::map(pt::uniform<int>(1, 32), [](int k) {
                          return emu::stochastic(k, emu::overflow::nonsaturating);
                        }));
    const emu::random_stream rng{*pt::uniform<std::uint64_t>(0, 99), 1};
    const std::int64_t rows = *pt::uniform<std::int64_t>(0, 37);
    const std::int64_t cols = *pt::uniform<std::int64_t>(1, 41);
    const pt::tensor src =
        *pt::gaussian_tensors(rc::gen::just(std::vector<std::int64_t>{cols, rows}), 3.0f);
    // Logical (rows x cols) tensor = transpose of the row-major (cols x rows) buffer.
    std::vector<float> logical(static_cast<std::size_t>(rows * cols));
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c)
        logical[static_cast<std::size_t>(r * cols + c)] =
            src.values[static_cast<std::size_t>(c * rows + r)];
    const std::size_t n = logical.size();

    code_buffer want(f, n);
    kn::cast(view_of(logical.data(), dtype::float32, {rows, cols}),
             view_of(want.data(), want.type, {rows, cols}), f, p, rng);

    // Transposed input view, contiguous output.
    kn::tensor_view tin =
        view_of(const_cast<float*>(src.values.data()), dtype::float32, {rows, cols});
    tin.strides[0] = 1;
    tin.strides[1] = rows;
    code_buffer got_t(f, n);
    kn::cast(tin, view_of(got_t.data(), got_t.type, {rows, cols}), f, p, rng);

    // Every other element of a buffer twice as long, into every other slot of the output.
    std::vector<float> spread(2 * n + 1, 1e30f);
    for (std::size_t i = 0; i < n; ++i)
      spread[2 * i] = logical[i];
    kn::tensor_view sin = view_of(spread.data(), dtype::float32, {static_cast<std::int64_t>(n)});
    sin.strides[0] = 2;
    code_buffer got_s(f, 2 * n + 1);
    kn::tensor_view sout = view_of(got_s.data(), got_s.type, {static_cast<std::int64_t>(n)});
    sout.strides[0] = 2;
    kn::cast(sin, sout, f, p, rng);

    for (std::size_t i = 0; i < n; ++i) {
      RC_ASSERT(want.at(i) == emu::encode(f, logical[i], p, rng.bits(i)));
      RC_ASSERT(got_t.at(i) == want.at(i));
      RC_ASSERT(got_s.at(2 * i) == want.at(i));
    }
    // The skipped output slots are untouched.
    for (std::size_t i = 0; i < n; ++i)
      RC_ASSERT(got_s.at(2 * i + 1) == 0u);
  });
}

// Large enough that two threads really split the work (the twin's grain is 2^16 elements).
TEST(cast, one_thread_and_two_threads_agree) {
  constexpr std::int64_t n = 3 * 65536 + 17;
  std::vector<float> x(n);
  std::uint64_t s = 12345;
  for (auto& v : x) {
    s = s * 6364136223846793005u + 1442695040888963407u;
    std::uint32_t b = static_cast<std::uint32_t>(s >> 32);
    std::memcpy(&v, &b, sizeof v); // every bit pattern, NaN and Inf included
  }
  for (const emu::format& f : {emu::e4m3fn, emu::e5m2, emu::float16}) {
    for (const emu::policy& p :
         {emu::rne, emu::rne_sat, emu::stochastic(13, emu::overflow::saturate)}) {
      const emu::random_stream rng{77, 5};
      code_buffer one(f, n), two(f, n);
      kn::cast(view_of(x.data(), dtype::float32, {n}), view_of(one.data(), one.type, {n}), f, p,
               rng, kn::exec{1});
      kn::cast(view_of(x.data(), dtype::float32, {n}), view_of(two.data(), two.type, {n}), f, p,
               rng, kn::exec{2});
      ASSERT_EQ(one.bytes, two.bytes) << emu::format_name(f) << " " << describe(p);
      for (std::int64_t i = 0; i < n; ++i)
        ASSERT_EQ(one.at(static_cast<std::size_t>(i)),
                  emu::encode(f, x[static_cast<std::size_t>(i)], p,
                              rng.bits(static_cast<std::uint64_t>(i))))
            << emu::format_name(f) << " " << describe(p) << " element " << i;
    }
  }
}

TEST(cast, decode_matches_emu) {
  for (const emu::format& f : cast_formats()) {
    const std::string name = emu::format_name(f);
    check_property(name + "/decode", 30, [f, name] {
      const auto shape = *pt::shapes(2, 3000);
      const std::size_t n = static_cast<std::size_t>(
          std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>()));
      code_buffer codes(f, n);
      const auto raw =
          *rc::gen::noShrink(rc::gen::container<std::vector<std::uint32_t>>(n, pt::any_code(f)));
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint32_t c = raw[i];
        std::memcpy(codes.bytes.data() + i * kn::dtype_size(codes.type), &c,
                    kn::dtype_size(codes.type)); // little-endian: the low bytes
      }
      std::vector<double> d(n);
      kn::decode(view_of(codes.data(), codes.type, shape), view_of(d.data(), dtype::float64, shape),
                 f);
      std::vector<float> s(n);
      if (f.fits_float())
        kn::decode(view_of(codes.data(), codes.type, shape),
                   view_of(s.data(), dtype::float32, shape), f);
      for (std::size_t i = 0; i < n; ++i) {
        const double e = emu::decode<double>(f, raw[i]);
        RC_ASSERT(std::memcmp(&d[i], &e, sizeof e) == 0);
        if (f.fits_float()) {
          const float ef = emu::decode<float>(f, raw[i]);
          RC_ASSERT(std::memcmp(&s[i], &ef, sizeof ef) == 0);
        }
      }
    });
  }
}

TEST(cast, empty_tensors_are_a_no_op) {
  std::uint8_t out = 0xAB;
  float in = 1.0f;
  kn::cast(view_of(&in, dtype::float32, {0, 5}), view_of(&out, dtype::uint8, {0, 5}), emu::e4m3fn,
           emu::rne);
  kn::cast(view_of(nullptr, dtype::float32, {3, 0}), view_of(nullptr, dtype::uint8, {3, 0}),
           emu::e4m3fn, emu::rne);
  EXPECT_EQ(out, 0xAB);
}

// Each bad argument throws lowbit::error whose message names the argument at fault.
TEST(cast, bad_arguments_are_refused_by_name) {
  std::vector<float> in(6, 1.0f);
  std::vector<std::uint8_t> out(6);
  const auto expect_error = [](auto&& fn, lowbit::errc code, std::vector<std::string> words) {
    try {
      fn();
      ADD_FAILURE() << "no error thrown; expected one naming " << words.front();
    } catch (const lowbit::error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      for (const auto& w : words)
        EXPECT_NE(std::string(e.what()).find(w), std::string::npos)
            << "message '" << e.what() << "' does not name '" << w << "'";
    }
  };
  const auto fin = view_of(in.data(), dtype::float32, {2, 3});
  const auto fout = view_of(out.data(), dtype::uint8, {2, 3});
  expect_error(
      [&] {
        kn::cast(view_of(in.data(), dtype::int32, {2, 3}), fout, emu::e4m3fn, emu::rne);
      },
      lowbit::errc::invalid_type, {"x", "int32"});
  expect_error(
      [&] {
        kn::cast(fin, view_of(out.data(), dtype::uint16, {2, 3}), emu::e4m3fn, emu::rne);
      },
      lowbit::errc::invalid_type, {"out", "uint8"});
  expect_error(
      [&] {
        kn::cast(fin, view_of(out.data(), dtype::uint8, {3, 2}), emu::e4m3fn, emu::rne);
      },
      lowbit::errc::invalid_argument, {"x", "out", "(2, 3)", "(3, 2)"});
  expect_error(
      [&] {
        kn::cast(view_of(nullptr, dtype::float32, {2, 3}), fout, emu::e4m3fn, emu::rne);
      },
      lowbit::errc::invalid_argument, {"x", "null"});
  expect_error(
      [&] {
        kn::cast(fin, view_of(nullptr, dtype::uint8, {2, 3}), emu::e4m3fn, emu::rne);
      },
      lowbit::errc::invalid_argument, {"out", "null"});
  expect_error([&] { kn::cast(fin, fout, emu::e4m3fn, emu::policy{emu::rounding::stochastic}); },
               lowbit::errc::invalid_argument, {"random bits"});
  expect_error(
      [&] {
        kn::cast(fin, fout, emu::format{0, 3, 7}, emu::rne);
      },
      lowbit::errc::invalid_argument, {"exponent bits"});
  expect_error(
      [&] {
        kn::decode(view_of(out.data(), dtype::uint16, {2, 3}),
                   view_of(in.data(), dtype::float32, {2, 3}), emu::e4m3fn);
      },
      lowbit::errc::invalid_type, {"codes", "uint16"});
  expect_error(
      [&] {
        std::vector<std::uint16_t> c(6);
        kn::decode(view_of(c.data(), dtype::uint16, {2, 3}),
                   view_of(in.data(), dtype::float32, {2, 3}),
                   emu::format{8, 6, -700, emu::specials::ieee}); // does not fit float
      },
      lowbit::errc::invalid_type, {"out", "float64"});
  kn::tensor_view on_gpu = fout;
  on_gpu.dev = kn::device{kn::device_type::cuda, 0};
  expect_error([&] { kn::cast(fin, on_gpu, emu::e4m3fn, emu::rne); },
               lowbit::errc::invalid_argument, {"x", "out", "cuda:0"});
  // Shapes whose element count or byte span does not fit 64 bits (3 x 2^62 elements wrapped
  // to a negative count, and a cast of it returned as a no-op).
  expect_error(
      [&] {
        kn::cast(view_of(in.data(), dtype::float32, {3, std::int64_t{1} << 62}),
                 view_of(out.data(), dtype::uint8, {3, std::int64_t{1} << 62}), emu::e4m3fn,
                 emu::rne);
      },
      lowbit::errc::invalid_argument, {"x", "64 bits"});
  kn::tensor_view far = fin;
  far.strides[0] = (std::int64_t{1} << 62) + 1; // row 1 lies beyond 64 bits of bytes
  expect_error([&] { kn::cast(far, fout, emu::e4m3fn, emu::rne); }, lowbit::errc::invalid_argument,
               {"x", "64 bits"});
  // Enumerators and biases from integers that no enumerator or format has: refused before
  // any arithmetic on them (emin() of bias INT_MIN overflowed int).
  emu::policy odd_policy = emu::rne;
  odd_policy.round = static_cast<emu::rounding>(42);
  expect_error([&] { kn::cast(fin, fout, emu::e4m3fn, odd_policy); },
               lowbit::errc::invalid_argument, {"rounding"});
  expect_error(
      [&] {
        kn::cast(fin, fout, emu::format{4, 3, INT_MIN, emu::specials::fn}, emu::rne);
      },
      lowbit::errc::invalid_argument, {"bias"});
  expect_error([&] { (void)emu::parse_format("e4m3b--5"); }, lowbit::errc::invalid_argument,
               {"e4m3b--5"});
  EXPECT_EQ(emu::parse_format("e4m3b-5").bias, -5);
}

} // namespace
