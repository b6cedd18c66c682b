#include <lowbit/reference/blockwise.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>

#include <lowbit/emu/error.hpp>
#include <lowbit/emu/format.hpp>

namespace lowbit::reference {

std::vector<rational> dynamic_tree_exact(bool is_signed) {
  std::vector<rational> v;
  for (int d = 6; d >= 0; --d) {
    integer scale = 1;
    for (int j = 0; j < d; ++j)
      scale *= 10;
    const int f1 = 1 << (is_signed ? 6 - d : 7 - d); // F - 1 boundary intervals
    // Boundaries b_k = 1/10 + (9/10) k / (F - 1); their midpoints, times 10^-d.
    for (int k = 0; k < f1; ++k) {
      const rational b0 = rational(1, 10) + rational(9, 10) * rational(k, f1);
      const rational b1 = rational(1, 10) + rational(9, 10) * rational(k + 1, f1);
      const rational m = (b0 + b1) / 2 / rational(scale);
      v.push_back(m);
      if (is_signed)
        v.push_back(-m);
    }
  }
  v.push_back(0);
  v.push_back(1);
  require(v.size() == 256, errc::invalid_argument, "dynamic_tree_exact: not 256 values");
  std::sort(v.begin(), v.end());
  return v;
}

namespace {

// x rounded to the nearest float32 (ties to even), as an exact rational.
rational to_f32(const rational& x) {
  return value_of(emu::float32, round(emu::float32, x, false, emu::policy{}));
}

} // namespace

codebook_values dynamic_tree_float32(bool is_signed, bool fused_linspace) {
  const double scales[7] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0}; // 10^-d as doubles
  const rational start = to_f32(exact(0.1)), end = 1;
  std::vector<rational> v;
  for (int i = 0; i < 7; ++i) {
    const int n = (1 << (is_signed ? i : i + 1)) + 1; // linspace points
    const rational step = to_f32((end - start) / (n - 1));
    std::vector<rational> b;
    for (int k = 0; k < n; ++k) {
      const bool from_start = k < n / 2;
      const rational along = step * (from_start ? k : n - 1 - k);
      const rational term = fused_linspace ? along : to_f32(along);
      b.push_back(to_f32(from_start ? rational(start + term) : rational(end - term)));
    }
    const rational scale = to_f32(exact(scales[i]));
    for (int k = 0; k + 1 < n; ++k) {
      const rational mid = to_f32(b[k] + b[k + 1]) / 2;
      v.push_back(to_f32(scale * mid));
      if (is_signed)
        v.push_back(to_f32(-scale * mid));
    }
  }
  v.push_back(0);
  v.push_back(1);
  require(v.size() == 256, errc::invalid_argument, "dynamic_tree_float32: not 256 values");
  std::sort(v.begin(), v.end());
  return to_float32(v);
}

std::vector<rational> linear_exact(bool is_signed) {
  std::vector<rational> v;
  for (int k = 0; k < 256; ++k)
    v.push_back(is_signed ? rational(2 * k - 255, 255) : rational(k, 255));
  return v;
}

codebook_values to_float32(const std::vector<rational>& v) {
  require(v.size() == 256, errc::invalid_argument, "to_float32: expected 256 values");
  codebook_values out{};
  for (std::size_t i = 0; i < 256; ++i) {
    const std::uint32_t bits = round(emu::float32, v[i], false, emu::policy{});
    float f;
    static_assert(sizeof f == sizeof bits);
    std::memcpy(&f, &bits, sizeof f);
    out[i] = f;
  }
  return out;
}

exact_codebook::exact_codebook(const codebook_values& cb) {
  for (float v : cb) {
    require(std::isfinite(v), errc::invalid_argument, "exact_codebook: non-finite entry");
    c.push_back(exact(static_cast<double>(v)));
  }
}

int nearest_entry(const exact_codebook& cb, const rational& y) {
  const std::size_t n = cb.c.size();
  std::vector<rational> dist(n);
  for (std::size_t j = 0; j < n; ++j)
    dist[j] = abs(y - cb.c[j]);
  const rational best = *std::min_element(dist.begin(), dist.end());
  // The nearest values: y - best and/or y + best. Prefer the smaller magnitude, then +c over -c.
  bool found = false;
  rational chosen;
  for (std::size_t j = 0; j < n; ++j) {
    if (dist[j] != best)
      continue;
    const rational& c = cb.c[j];
    if (!found || abs(c) < abs(chosen) || (abs(c) == abs(chosen) && c > chosen))
      chosen = c;
    found = true;
  }
  // Among equal entries the run is entered from y's side: lowest index when y is below the
  // value, highest when above; y on the value: lowest for a positive value, highest otherwise.
  const bool lowest = y < chosen || (y == chosen && chosen > 0);
  int idx = -1;
  for (std::size_t j = 0; j < n; ++j) {
    if (cb.c[j] != chosen)
      continue;
    if (lowest)
      return static_cast<int>(j);
    idx = static_cast<int>(j);
  }
  return idx;
}

entry_bracket bracket_entries(const exact_codebook& cb, const rational& y) {
  int lo = -1;
  for (std::size_t j = 0; j < cb.c.size(); ++j)
    if (cb.c[j] <= y)
      lo = static_cast<int>(j);
  return {lo, lo + 1};
}

std::vector<double> exact_quantiles(std::vector<double> x, int k) {
  require(!x.empty(), errc::invalid_argument, "exact_quantiles: empty input");
  require(k >= 1, errc::invalid_argument, "exact_quantiles: k must be >= 1");
  for (double v : x)
    require(std::isfinite(v), errc::invalid_argument, "exact_quantiles: non-finite input");
  std::sort(x.begin(), x.end());
  const auto n = static_cast<std::int64_t>(x.size());
  std::vector<double> q(static_cast<std::size_t>(k));
  for (int i = 0; i < k; ++i)
    q[static_cast<std::size_t>(i)] =
        x[static_cast<std::size_t>((std::int64_t{2} * i + 1) * n / (std::int64_t{2} * k))];
  return q;
}

} // namespace lowbit::reference
