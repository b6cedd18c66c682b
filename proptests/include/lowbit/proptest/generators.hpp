// rapidcheck generators for property-testing code that handles low-precision formats: codes of a
// format, real inputs that sit where conversions go wrong (on the grid, on exact midpoints, one
// source ulp beside them, subnormals, the overflow threshold, specials, random bit patterns) and
// tensors with the value distributions of training workloads. lowbit's own property tests use
// them; link lowbit::proptest to test your own kernels the same way, e.g.
//
//   RC_GTEST_PROP(my_kernel, matches_emu, ()) {
//     const float x = *lowbit::proptest::edge_values<float>(lowbit::emu::e4m3fn);
//     RC_ASSERT(my_encode(x) == lowbit::emu::encode(lowbit::emu::e4m3fn, x, lowbit::emu::rne));
//   }
//
// Every generator draws uniformly whatever rapidcheck's size parameter (edge cases must not wait
// for large sizes), shrinks toward simple values where that means something, and needs only emu.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include <rapidcheck.h>

#include <lowbit/emu/convert.hpp>
#include <lowbit/emu/format.hpp>

namespace lowbit::proptest {

// ---- building blocks -----------------------------------------------------------------------

// Uniform over [lo, hi] (both included), independent of the size parameter; shrinks toward lo.
template <class T> rc::Gen<T> uniform(T lo, T hi) {
  static_assert(std::is_integral_v<T>);
  if (hi == std::numeric_limits<T>::max()) {
    // inRange excludes its upper end; draw raw bits where the range is the whole type.
    if (lo == std::numeric_limits<T>::min())
      return rc::gen::resize(rc::kNominalSize, rc::gen::arbitrary<T>());
    return rc::gen::map(uniform<T>(lo - 1, hi - 1), [](T v) { return static_cast<T>(v + 1); });
  }
  return rc::gen::resize(rc::kNominalSize, rc::gen::inRange<T>(lo, static_cast<T>(hi + 1)));
}

// A fair coin (true with probability 1/2).
inline rc::Gen<bool> coin() {
  return rc::gen::map(uniform<int>(0, 1), [](int v) { return v != 0; });
}

// A double in [0, 1) with 52 random fraction bits.
inline rc::Gen<double> unit_interval() {
  return rc::gen::map(uniform<std::uint64_t>(0, (std::uint64_t{1} << 52) - 1),
                      [](std::uint64_t m) { return std::ldexp(static_cast<double>(m), -52); });
}

namespace detail {

inline double with_sign(double v, bool negative) {
  return negative ? -v : v;
}

// max + ulp(max): the grid point above the largest finite value (docs/rounding.md).
inline double above_max(const emu::format& f) {
  return emu::max_value(f) + std::ldexp(1.0, f.emax() - f.man_bits);
}

// The next grid point above finite magnitude code c.
inline double next_up(const emu::format& f, std::uint32_t c) {
  return c < f.max_code() ? emu::decode<double>(f, c + 1) : above_max(f);
}

// v converted to T (rounded where T cannot hold it) and moved `steps` ulps of T.
template <class T> T nudge(double v, int steps) {
  T r = static_cast<T>(v);
  const T toward =
      steps < 0 ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::infinity();
  for (int i = 0; i < (steps < 0 ? -steps : steps); ++i)
    r = std::nextafter(r, toward);
  return r;
}

// Magnitude anchors: exact doubles at interesting places of format f (all nonnegative).
inline rc::Gen<double> grid_anchor(const emu::format& f) {
  return rc::gen::map(uniform<std::uint32_t>(0, f.max_code()),
                      [f](std::uint32_t c) { return emu::decode<double>(f, c); });
}
inline rc::Gen<double> midpoint_anchor(const emu::format& f) {
  // Midpoints of formats with at most 23 mantissa bits are exact doubles.
  return rc::gen::map(uniform<std::uint32_t>(0, f.max_code()), [f](std::uint32_t c) {
    return 0.5 * (emu::decode<double>(f, c) + next_up(f, c));
  });
}
inline rc::Gen<double> subnormal_anchor(const emu::format& f) {
  const double min_normal = emu::min_normal(f);
  const rc::Gen<double> inside =
      rc::gen::map(unit_interval(), [min_normal](double u) { return u * min_normal; });
  if (!f.has_subnormals())
    return inside;
  return rc::gen::oneOf(inside,
                        rc::gen::map(uniform<std::uint32_t>(1, f.man_mask()),
                                     [f](std::uint32_t m) { return emu::decode<double>(f, m); }));
}
inline rc::Gen<double> overflow_anchor(const emu::format& f) {
  const double max = emu::max_value(f), above = above_max(f);
  const double half_way = 0.5 * (max + above);
  return rc::gen::oneOf(
      rc::gen::element(max, half_way, above, 2.0 * above),
      rc::gen::map(unit_interval(), [max](double u) { return max * (1.0 + 2.0 * u); }),
      rc::gen::element(static_cast<double>(std::numeric_limits<float>::max()),
                       std::numeric_limits<double>::max()));
}
inline rc::Gen<double> far_below_anchor(const emu::format& f) {
  const double smallest = emu::min_positive(f);
  return rc::gen::oneOf(
      rc::gen::apply([smallest](int j, double u) { return std::ldexp(smallest * (1.0 + u), -j); },
                     uniform<int>(1, 80), unit_interval()),
      rc::gen::element(0.5 * smallest, 0.25 * smallest, std::numeric_limits<double>::denorm_min(),
                       static_cast<double>(std::numeric_limits<float>::denorm_min())));
}
inline rc::Gen<double> in_range_anchor(const emu::format& f) {
  // Log-uniform from just below the smallest subnormal to just above max.
  return rc::gen::apply([](int e, double u) { return std::ldexp(1.0 + u, e); },
                        uniform<int>(f.emin() - f.man_bits - 3, f.emax() + 2), unit_interval());
}

// An anchor from `gen`, given a random sign, converted to T and moved by `steps` ulps of T.
template <class T> rc::Gen<T> signed_nudged(rc::Gen<double> gen, rc::Gen<int> steps) {
  return rc::gen::apply(
      [](double v, int s, bool negative) { return nudge<T>(with_sign(v, negative), s); },
      std::move(gen), std::move(steps), coin());
}

inline rc::Gen<int> exact_steps() {
  return rc::gen::just(0);
}
inline rc::Gen<int> near_steps() {
  return rc::gen::element(-2, -1, 1, 2);
}

template <class T> using bits_of = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;

} // namespace detail

// ---- codes -----------------------------------------------------------------------------------

// Any code of f (all f.bits() bits uniform): finite values, zeros, NaNs and infinities alike.
inline rc::Gen<std::uint32_t> any_code(const emu::format& f) {
  return uniform<std::uint32_t>(0, static_cast<std::uint32_t>((std::uint64_t{1} << f.bits()) - 1));
}

// A code of a finite value of f, magnitude uniform over the finite codes, random sign where f is
// signed (fnuz's negative-zero code, its NaN, becomes +0).
inline rc::Gen<std::uint32_t> finite_code(const emu::format& f) {
  return rc::gen::apply(
      [f](std::uint32_t mag, bool negative) {
        if (mag == 0 && f.special == emu::specials::fnuz)
          return 0u;
        return mag | (negative ? f.sign_mask() : 0u);
      },
      uniform<std::uint32_t>(0, f.max_code()), coin());
}

// ---- real inputs for a format, as T = float or double ----------------------------------------

// Exactly on f's grid (a finite value of f), random sign.
template <class T> rc::Gen<T> grid_values(const emu::format& f) {
  return detail::signed_nudged<T>(detail::grid_anchor(f), detail::exact_steps());
}

// Exact midpoints between neighbouring grid points, including max + ulp(max)/2 (the overflow
// tie); as T, where T cannot hold the midpoint, the nearest T.
template <class T> rc::Gen<T> midpoints(const emu::format& f) {
  return detail::signed_nudged<T>(detail::midpoint_anchor(f), detail::exact_steps());
}

// One or two ulps of T beside grid points and beside midpoints: the inputs that catch a converter
// which rounds twice or misreads a sticky bit.
template <class T> rc::Gen<T> near_grid_and_midpoints(const emu::format& f) {
  return rc::gen::oneOf(detail::signed_nudged<T>(detail::grid_anchor(f), detail::near_steps()),
                        detail::signed_nudged<T>(detail::midpoint_anchor(f), detail::near_steps()));
}

// Below the smallest normal of f: its subnormal values (on the grid and beside) and random points.
template <class T> rc::Gen<T> subnormals(const emu::format& f) {
  return detail::signed_nudged<T>(detail::subnormal_anchor(f),
                                  rc::gen::weightedElement<int>({{3, 0}, {1, -1}, {1, 1}}));
}

// Around the overflow threshold: max, the tie max + ulp/2, max + ulp, one or two ulps of T beside
// each, values up to 3 max, and the largest float and double.
template <class T> rc::Gen<T> overflow_region(const emu::format& f) {
  return detail::signed_nudged<T>(
      detail::overflow_anchor(f),
      rc::gen::weightedElement<int>({{2, 0}, {1, -1}, {1, 1}, {1, -2}, {1, 2}}));
}

// Far below the smallest positive value of f (down to 2^-80 of it), half and a quarter of it, and
// the smallest subnormal double and float (which T = float flushes to 0 or keeps).
template <class T> rc::Gen<T> far_below(const emu::format& f) {
  return detail::signed_nudged<T>(detail::far_below_anchor(f),
                                  rc::gen::weightedElement<int>({{3, 0}, {1, -1}, {1, 1}}));
}

// Log-uniform over f's range (from below its smallest subnormal to above max), random mantissa.
template <class T> rc::Gen<T> in_range(const emu::format& f) {
  return detail::signed_nudged<T>(detail::in_range_anchor(f), detail::exact_steps());
}

// +0, -0, +-Inf, and NaNs of both signs with random payloads.
template <class T> rc::Gen<T> specials() {
  using U = detail::bits_of<T>;
  constexpr int man = std::numeric_limits<T>::digits - 1;
  constexpr U exp_mask = static_cast<U>(~U{0} >> 1) & ~((U{1} << man) - 1u);
  const rc::Gen<T> nans = rc::gen::apply(
      [](U payload, bool negative) {
        U bits = exp_mask | (payload == 0 ? U{1} : payload);
        if (negative)
          bits |= U{1} << (sizeof(U) * 8 - 1);
        return emu::detail::bit_cast<T>(bits);
      },
      uniform<U>(0, (U{1} << man) - 1u), coin());
  return rc::gen::oneOf(rc::gen::element(T(0), -T(0), std::numeric_limits<T>::infinity(),
                                         -std::numeric_limits<T>::infinity(),
                                         std::numeric_limits<T>::quiet_NaN(),
                                         -std::numeric_limits<T>::quiet_NaN()),
                        nans);
}

// Uniformly random bit patterns of T (every finite, subnormal, Inf and NaN encoding).
template <class T> rc::Gen<T> random_bits() {
  using U = detail::bits_of<T>;
  return rc::gen::map(uniform<U>(0, std::numeric_limits<U>::max()),
                      [](U b) { return emu::detail::bit_cast<T>(b); });
}

// The mixture of every generator above, weighted toward the places where rounding is decided:
// what a conversion property should be checked against.
template <class T> rc::Gen<T> edge_values(const emu::format& f) {
  return rc::gen::weightedOneOf<T>({
      {3, grid_values<T>(f)},
      {4, midpoints<T>(f)},
      {5, near_grid_and_midpoints<T>(f)},
      {2, subnormals<T>(f)},
      {2, overflow_region<T>(f)},
      {1, far_below<T>(f)},
      {2, in_range<T>(f)},
      {1, specials<T>()},
      {1, random_bits<T>()},
  });
}

// ---- tensors ---------------------------------------------------------------------------------

// A row-major float tensor: shape and values (values.size() == product of the shape).
struct tensor {
  std::vector<std::int64_t> shape;
  std::vector<float> values;
};

// Shapes of rank 0..max_rank whose extents are mostly small and odd-sized (1, 3, 17, ...) so
// that vector-width tails are hit, sometimes 0 (empty), never more than max_numel elements.
inline rc::Gen<std::vector<std::int64_t>> shapes(int max_rank = 3, std::int64_t max_numel = 4096) {
  const rc::Gen<std::int64_t> extent = rc::gen::weightedOneOf<std::int64_t>({
      {1, rc::gen::just<std::int64_t>(0)},
      {3, rc::gen::element<std::int64_t>(1, 2, 3, 4, 7, 8, 15, 16, 17, 31, 33, 64, 65)},
      {4, uniform<std::int64_t>(1, 300)},
  });
  return rc::gen::mapcat(uniform<int>(0, max_rank), [extent, max_numel](int rank) {
    return rc::gen::map(
        rc::gen::container<std::vector<std::int64_t>>(static_cast<std::size_t>(rank), extent),
        [max_numel](std::vector<std::int64_t> s) {
          // Halve the largest extent until the tensor fits.
          for (;;) {
            std::int64_t n = 1;
            for (auto e : s)
              n *= e;
            if (n <= max_numel)
              return s;
            auto it = s.begin();
            for (auto j = s.begin(); j != s.end(); ++j)
              if (*j > *it)
                it = j;
            *it = (*it + 1) / 2;
          }
        });
  });
}

namespace detail {

// A small deterministic generator (splitmix64) so a tensor is reproducible from its seed on any
// standard library (std::normal_distribution differs between them).
struct stream {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15u);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    return z ^ (z >> 31);
  }
  double uniform_open() { // (0, 1)
    return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53;
  }
  double gaussian() { // Box-Muller
    const double r = std::sqrt(-2.0 * std::log(uniform_open()));
    return r * std::cos(6.283185307179586 * uniform_open());
  }
  // Student's t with nu degrees of freedom (integer nu): heavy tails, finite moments below nu.
  double student_t(int nu) {
    double chi2 = 0;
    for (int i = 0; i < nu; ++i) {
      const double g = gaussian();
      chi2 += g * g;
    }
    return gaussian() / std::sqrt(chi2 / nu);
  }
};

inline std::int64_t numel(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (auto e : shape)
    n *= e;
  return n;
}

template <class Fill>
rc::Gen<tensor> tensors_from(rc::Gen<std::vector<std::int64_t>> shape_gen, Fill fill) {
  // Values come from a seed rather than element by element: fast for large tensors, and a
  // counterexample shrinks in its shape and seed.
  return rc::gen::apply(
      [fill](std::vector<std::int64_t> shape, std::uint64_t seed) {
        tensor t;
        t.shape = std::move(shape);
        t.values.resize(static_cast<std::size_t>(numel(t.shape)));
        stream s{seed};
        fill(t, s);
        return t;
      },
      std::move(shape_gen), uniform<std::uint64_t>(0, std::numeric_limits<std::uint64_t>::max()));
}

} // namespace detail

// Gaussian values, mean 0, standard deviation sigma (weights and activations at initialization).
inline rc::Gen<tensor> gaussian_tensors(rc::Gen<std::vector<std::int64_t>> shape_gen = shapes(),
                                        float sigma = 1.0f) {
  return detail::tensors_from(std::move(shape_gen), [sigma](tensor& t, detail::stream& s) {
    for (float& v : t.values)
      v = static_cast<float>(sigma * s.gaussian());
  });
}

// Student-t values with nu degrees of freedom (nu = 2: infinite variance), scaled by `scale`:
// gradients and optimizer states, whose rare huge entries set absmax scales.
inline rc::Gen<tensor> heavy_tailed_tensors(rc::Gen<std::vector<std::int64_t>> shape_gen = shapes(),
                                            int nu = 2, float scale = 1.0f) {
  return detail::tensors_from(std::move(shape_gen), [nu, scale](tensor& t, detail::stream& s) {
    for (float& v : t.values)
      v = static_cast<float>(scale * s.student_t(nu));
  });
}

// 2-D (rows x cols) Gaussian values where a few rows (about 1 in 16, at least one when rows > 0)
// are multiplied by a factor in [20, 1000): the outlier features of large transformers that break
// tensor-wise scaling and motivate row-wise scaling.
inline rc::Gen<tensor> outlier_row_tensors(std::int64_t max_rows = 64,
                                           std::int64_t max_cols = 257) {
  const rc::Gen<std::vector<std::int64_t>> shape_gen = rc::gen::apply(
      [](std::int64_t r, std::int64_t c) {
        return std::vector<std::int64_t>{r, c};
      },
      uniform<std::int64_t>(0, max_rows), uniform<std::int64_t>(1, max_cols));
  return detail::tensors_from(shape_gen, [](tensor& t, detail::stream& s) {
    const std::int64_t rows = t.shape[0], cols = t.shape[1];
    const std::int64_t forced = rows > 0 ? static_cast<std::int64_t>(s.next() % rows) : -1;
    for (std::int64_t r = 0; r < rows; ++r) {
      const bool outlier = r == forced || s.next() % 16 == 0;
      const double factor = outlier ? 20.0 * std::pow(50.0, s.uniform_open()) : 1.0;
      for (std::int64_t c = 0; c < cols; ++c)
        t.values[static_cast<std::size_t>(r * cols + c)] =
            static_cast<float>(factor * s.gaussian());
    }
  });
}

} // namespace lowbit::proptest
