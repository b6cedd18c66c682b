// The exact scaled matmul and the SwitchBack chain: every product and sum an exact rational,
// specials by the IEEE rules of extended arithmetic, one rounding at the end through round.hpp.
// Nothing here models how a kernel orders or rounds its sums: that is what the tests bound.
#include <lowbit/reference/gemm.hpp>

#include <cmath>
#include <string>

#include <lowbit/emu/error.hpp>
#include <lowbit/emu/integer.hpp>

namespace lowbit::reference {

namespace {

std::string fn_name(const char* fn) {
  return std::string("reference::") + fn + ": ";
}

int elem_bits(gemm_elem e) {
  switch (e) {
  case gemm_elem::int8:
  case gemm_elem::e4m3fn:
  case gemm_elem::e5m2: return 8;
  case gemm_elem::bfloat16:
  case gemm_elem::float16: return 16;
  }
  return 0;
}

bool negative_of(const extended& x) {
  return x.k == extended::kind::neg_inf || (x.is_finite() && x.value < 0);
}

void check_operand(const code_matrix& a, const char* fn, const char* arg) {
  const std::string p = fn_name(fn) + arg;
  require(a.rows >= 0 && a.cols >= 0, errc::invalid_argument, p + ": negative shape");
  require(static_cast<std::int64_t>(a.codes.size()) == a.rows * a.cols, errc::invalid_argument,
          p + ": " + std::to_string(a.codes.size()) + " codes for a " + std::to_string(a.rows) +
              " x " + std::to_string(a.cols) + " matrix");
  const auto ns = static_cast<std::int64_t>(a.scales.size());
  require(ns == 0 || ns == 1 || ns == a.rows, errc::invalid_argument,
          p + ": " + std::to_string(ns) + " scales; 0, 1 or " + std::to_string(a.rows) +
              " (one per row) expected");
}

std::vector<extended> scale_values(const code_matrix& a) {
  std::vector<extended> s;
  s.reserve(a.scales.size());
  for (const float v : a.scales)
    s.push_back(extended::of(static_cast<double>(v)));
  return s;
}

// Scale i of a vector of 0, 1 or `rows` scales.
const extended& scale_at(const std::vector<extended>& s, std::int64_t i) {
  static const extended one = extended::of(rational(1));
  if (s.empty())
    return one;
  return s.size() == 1 ? s[0] : s[static_cast<std::size_t>(i)];
}

} // namespace

const char* gemm_elem_name(gemm_elem e) {
  switch (e) {
  case gemm_elem::int8: return "int8";
  case gemm_elem::e4m3fn: return "e4m3fn";
  case gemm_elem::e5m2: return "e5m2";
  case gemm_elem::bfloat16: return "bfloat16";
  case gemm_elem::float16: return "float16";
  }
  return "?";
}

const char* gemm_out_name(gemm_out o) {
  switch (o) {
  case gemm_out::float32: return "float32";
  case gemm_out::bfloat16: return "bfloat16";
  case gemm_out::float16: return "float16";
  }
  return "?";
}

emu::format elem_format(gemm_elem e) {
  switch (e) {
  case gemm_elem::e4m3fn: return emu::e4m3fn;
  case gemm_elem::e5m2: return emu::e5m2;
  case gemm_elem::bfloat16: return emu::bfloat16;
  case gemm_elem::float16: return emu::float16;
  case gemm_elem::int8: break;
  }
  throw error(errc::invalid_argument, "reference::elem_format: int8 is not a floating format");
}

emu::format out_format(gemm_out o) {
  switch (o) {
  case gemm_out::float32: return emu::float32;
  case gemm_out::bfloat16: return emu::bfloat16;
  case gemm_out::float16: return emu::float16;
  }
  throw error(errc::invalid_argument, "reference::out_format: unknown output format");
}

extended extended::of(double x) {
  if (std::isnan(x))
    return nan();
  if (std::isinf(x))
    return inf(x < 0);
  return of(exact(x));
}

extended mul(const extended& x, const extended& y) {
  if (x.is_nan() || y.is_nan())
    return extended::nan();
  if (x.is_finite() && y.is_finite())
    return extended::of(x.value * y.value);
  // At least one infinity: times zero is undefined, otherwise the signs multiply.
  if ((x.is_finite() && x.value == 0) || (y.is_finite() && y.value == 0))
    return extended::nan();
  return extended::inf(negative_of(x) != negative_of(y));
}

extended add(const extended& x, const extended& y) {
  if (x.is_nan() || y.is_nan())
    return extended::nan();
  if (x.is_finite() && y.is_finite())
    return extended::of(x.value + y.value);
  if (x.is_inf() && y.is_inf() && x.k != y.k)
    return extended::nan();
  return x.is_inf() ? x : y;
}

extended element_value(gemm_elem e, std::uint32_t code) {
  require(code >> elem_bits(e) == 0, errc::invalid_argument,
          "reference::element_value: code " + std::to_string(code) + " has more than the " +
              std::to_string(elem_bits(e)) + " bits of " + gemm_elem_name(e));
  if (e == gemm_elem::int8) {
    // Two's complement by definition: the byte's value minus 256 when its top bit is set.
    const int v = static_cast<int>(code) - ((code & 0x80u) != 0 ? 256 : 0);
    return extended::of(rational(v));
  }
  const emu::format f = elem_format(e);
  if (is_nan(f, code))
    return extended::nan();
  if (is_inf(f, code))
    return extended::inf(sign_of(f, code));
  return extended::of(value_of(f, code));
}

std::uint32_t round_output(gemm_out o, const extended& y) {
  const emu::format f = out_format(o);
  switch (y.k) {
  case extended::kind::nan: {
    // The matmul's one NaN (kernels/gemm.hpp): positive, quiet, the top mantissa bit alone.
    const std::uint32_t exp_ones = (1u << f.exp_bits) - 1u;
    return (exp_ones << f.man_bits) | (1u << (f.man_bits - 1));
  }
  case extended::kind::pos_inf: return round(f, HUGE_VAL, emu::rne);
  case extended::kind::neg_inf: return round(f, -HUGE_VAL, emu::rne);
  case extended::kind::finite: break;
  }
  return round(f, y.value, /*negative=*/false, emu::rne);
}

extended output_value(gemm_out o, std::uint32_t code) {
  const emu::format f = out_format(o);
  if (is_nan(f, code))
    return extended::nan();
  if (is_inf(f, code))
    return extended::inf(sign_of(f, code));
  return extended::of(value_of(f, code));
}

gemm_result exact_matmul_of_values(std::int64_t m, std::int64_t n, std::int64_t k,
                                   const std::vector<extended>& a_values,
                                   const std::vector<extended>& b_values,
                                   const std::vector<extended>& sa, const std::vector<extended>& sb,
                                   const std::vector<extended>& bias, gemm_out out) {
  const std::string p = fn_name("exact_matmul_of_values");
  require(m >= 0 && n >= 0 && k >= 0, errc::invalid_argument, p + "negative shape");
  require(static_cast<std::int64_t>(a_values.size()) == m * k, errc::invalid_argument,
          p + "a_values: M*K elements expected");
  require(static_cast<std::int64_t>(b_values.size()) == n * k, errc::invalid_argument,
          p + "b_values: N*K elements expected");
  require(sa.empty() || sa.size() == 1 || static_cast<std::int64_t>(sa.size()) == m,
          errc::invalid_argument, p + "sa: 0, 1 or M elements expected");
  require(sb.empty() || sb.size() == 1 || static_cast<std::int64_t>(sb.size()) == n,
          errc::invalid_argument, p + "sb: 0, 1 or N elements expected");
  require(bias.empty() || static_cast<std::int64_t>(bias.size()) == n, errc::invalid_argument,
          p + "bias: 0 or N elements expected");
  gemm_result r;
  r.m = m;
  r.n = n;
  r.entries.resize(static_cast<std::size_t>(m * n));
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      gemm_entry& e = r.entries[static_cast<std::size_t>(i * n + j)];
      e.sum = extended::of(rational(0));
      e.abs_sum = 0;
      for (std::int64_t l = 0; l < k; ++l) {
        const extended prod = mul(a_values[static_cast<std::size_t>(i * k + l)],
                                  b_values[static_cast<std::size_t>(j * k + l)]);
        if (prod.is_finite())
          e.abs_sum += abs(prod.value);
        e.sum = add(e.sum, prod);
      }
      // The specification's order of operations: the same extended value whatever the order
      // when finite; the order decides which undefined form (Inf * 0, Inf - Inf) a special
      // value meets, and this is the epilogue's order.
      extended y = mul(mul(e.sum, scale_at(sa, i)), scale_at(sb, j));
      if (!bias.empty())
        y = add(y, bias[static_cast<std::size_t>(j)]);
      e.exact = y;
      e.rounded = round_output(out, y);
    }
  return r;
}

gemm_result exact_scaled_matmul(const code_matrix& a, const code_matrix& b,
                                const std::vector<float>& bias, gemm_out out) {
  check_operand(a, "exact_scaled_matmul", "a");
  check_operand(b, "exact_scaled_matmul", "b");
  require(a.cols == b.cols, errc::invalid_argument,
          fn_name("exact_scaled_matmul") + "a has K = " + std::to_string(a.cols) +
              " columns, b has " + std::to_string(b.cols));
  require(bias.empty() || static_cast<std::int64_t>(bias.size()) == b.rows, errc::invalid_argument,
          fn_name("exact_scaled_matmul") + "bias: " + std::to_string(bias.size()) +
              " elements; 0 or N = " + std::to_string(b.rows) + " expected");
  const auto values = [](const code_matrix& x) {
    std::vector<extended> v;
    v.reserve(x.codes.size());
    for (const std::uint32_t c : x.codes)
      v.push_back(element_value(x.elem, c));
    return v;
  };
  std::vector<extended> bv;
  bv.reserve(bias.size());
  for (const float x : bias)
    bv.push_back(extended::of(static_cast<double>(x)));
  return exact_matmul_of_values(a.rows, b.rows, a.cols, values(a), values(b), scale_values(a),
                                scale_values(b), bv, out);
}

gemm_result exact_block_scaled_matmul(const code_matrix& a, std::int64_t a_block_rows,
                                      const code_matrix& b, std::int64_t b_block_rows,
                                      std::int64_t kblock, const std::vector<float>& bias,
                                      gemm_out out) {
  const std::string p = fn_name("exact_block_scaled_matmul");
  require(kblock >= 1, errc::invalid_argument, p + "kblock: at least 1");
  require(a.cols == b.cols, errc::invalid_argument, p + "a and b: K differs");
  require(bias.empty() || static_cast<std::int64_t>(bias.size()) == b.rows, errc::invalid_argument,
          p + "bias: 0 or N elements expected");
  const std::int64_t k = a.cols, nb = (k + kblock - 1) / kblock;
  const auto check = [&](const code_matrix& x, std::int64_t br, const char* arg) {
    require(x.rows >= 0 && x.cols >= 0 &&
                static_cast<std::int64_t>(x.codes.size()) == x.rows * x.cols,
            errc::invalid_argument, p + arg + ": codes do not match the shape");
    require(br >= 0, errc::invalid_argument, p + arg + ": negative block_rows");
    const auto ns = static_cast<std::int64_t>(x.scales.size());
    if (br == 0)
      require(ns == 0 || ns == 1 || ns == x.rows, errc::invalid_argument,
              p + arg + ": 0, 1 or rows scales expected");
    else
      require(ns == ((x.rows + br - 1) / br) * nb, errc::invalid_argument,
              p + arg + ": ceil(rows / block_rows) x ceil(K / kblock) scales expected");
  };
  check(a, a_block_rows, "a");
  check(b, b_block_rows, "b");
  const std::vector<extended> sa = scale_values(a), sb = scale_values(b);
  const auto scale = [&](const std::vector<extended>& s, std::int64_t br, std::int64_t row,
                         std::int64_t j) -> const extended& {
    if (br == 0)
      return scale_at(s, row);
    return s[static_cast<std::size_t>((row / br) * nb + j)];
  };
  gemm_result r;
  r.m = a.rows;
  r.n = b.rows;
  r.entries.resize(static_cast<std::size_t>(r.m * r.n));
  for (std::int64_t i = 0; i < r.m; ++i)
    for (std::int64_t j = 0; j < r.n; ++j) {
      gemm_entry& e = r.entries[static_cast<std::size_t>(i * r.n + j)];
      e.sum = extended::of(rational(0));
      e.abs_sum = 0;
      extended y = extended::of(rational(0));
      for (std::int64_t blk = 0; blk < nb; ++blk) {
        extended s = extended::of(rational(0));
        rational abs_s = 0;
        for (std::int64_t l = blk * kblock; l < k && l < (blk + 1) * kblock; ++l) {
          const extended prod =
              mul(element_value(a.elem, a.codes[static_cast<std::size_t>(i * k + l)]),
                  element_value(b.elem, b.codes[static_cast<std::size_t>(j * k + l)]));
          if (prod.is_finite())
            abs_s += abs(prod.value);
          s = add(s, prod);
        }
        e.sum = add(e.sum, s);
        const extended& x = scale(sa, a_block_rows, i, blk);
        const extended& z = scale(sb, b_block_rows, j, blk);
        y = add(y, mul(mul(s, x), z));
        if (x.is_finite() && z.is_finite())
          e.abs_sum += abs_s * abs(x.value) * abs(z.value);
      }
      if (!bias.empty())
        y = add(y, extended::of(static_cast<double>(bias[static_cast<std::size_t>(j)])));
      e.exact = y;
      e.rounded = round_output(out, y);
    }
  return r;
}

// ---- the SwitchBack chain ----------------------------------------------------------------------

namespace {

gemm_elem elem_of_target(const quant_target& t) {
  if (t.is_int)
    return gemm_elem::int8;
  if (t.fmt == emu::e4m3fn)
    return gemm_elem::e4m3fn;
  if (t.fmt == emu::e5m2)
    return gemm_elem::e5m2;
  throw error(errc::invalid_argument,
              "reference::quantize_exact: target: only int8, e4m3fn and e5m2 feed the matmul");
}

float_matrix transposed(const float_matrix& x) {
  float_matrix t{x.cols, x.rows, std::vector<float>(x.values.size())};
  for (std::int64_t i = 0; i < x.rows; ++i)
    for (std::int64_t j = 0; j < x.cols; ++j)
      t.values[static_cast<std::size_t>(j * x.rows + i)] =
          x.values[static_cast<std::size_t>(i * x.cols + j)];
  return t;
}

std::vector<extended> as_extended(const std::vector<rational>& v) {
  std::vector<extended> r;
  r.reserve(v.size());
  for (const rational& x : v)
    r.push_back(extended::of(x));
  return r;
}

std::vector<extended> code_values(const code_matrix& x) {
  std::vector<extended> v;
  v.reserve(x.codes.size());
  for (const std::uint32_t c : x.codes)
    v.push_back(element_value(x.elem, c));
  return v;
}

chain_result chain(const float_matrix& x, const quant_target& tx, bool x_rows,
                   const float_matrix& w, const quant_target& tw, bool w_rows,
                   const std::vector<float>& bias, gemm_out out) {
  require(x.cols == w.cols, errc::invalid_argument,
          "reference::switchback: the operands' inner dimensions differ");
  chain_result r;
  r.a = quantize_exact(x, tx, x_rows);
  r.b = quantize_exact(w, tw, w_rows);
  std::vector<extended> bv;
  for (const float v : bias)
    bv.push_back(extended::of(static_cast<double>(v)));
  r.y =
      exact_matmul_of_values(x.rows, w.rows, x.cols, code_values(r.a.codes), code_values(r.b.codes),
                             as_extended(r.a.dequant), as_extended(r.b.dequant), bv, out);
  return r;
}

} // namespace

exact_quantized quantize_exact(const float_matrix& x, const quant_target& t, bool per_row,
                               const emu::policy& pol) {
  const std::string p = fn_name("quantize_exact");
  require(x.rows >= 0 && x.cols >= 0 &&
              static_cast<std::int64_t>(x.values.size()) == x.rows * x.cols,
          errc::invalid_argument, p + "x: values do not match its shape");
  exact_quantized r;
  r.codes.elem = elem_of_target(t);
  r.codes.rows = x.rows;
  r.codes.cols = x.cols;
  r.codes.codes.resize(x.values.size());
  r.x_times_q.resize(x.values.size());
  const std::int64_t groups = per_row ? x.rows : 1;
  const std::int64_t per_group = per_row ? x.cols : x.rows * x.cols;
  for (std::int64_t g = 0; g < groups; ++g) {
    rational amax = 0;
    for (std::int64_t i = g * per_group; i < (g + 1) * per_group; ++i) {
      const float v = x.values[static_cast<std::size_t>(i)];
      require(std::isfinite(v), errc::invalid_argument,
              p + "x: element " + std::to_string(i) + " is not finite");
      const rational a = abs(exact(static_cast<double>(v)));
      if (a > amax)
        amax = a;
    }
    const rational q = amax == 0 ? rational(1) : exact_scale(t, amax, 0, false);
    r.scale.push_back(q);
    r.dequant.push_back(1 / q);
    for (std::int64_t i = g * per_group; i < (g + 1) * per_group; ++i) {
      const float v = x.values[static_cast<std::size_t>(i)];
      const rational y = exact(static_cast<double>(v)) * q;
      r.x_times_q[static_cast<std::size_t>(i)] = y;
      r.codes.codes[static_cast<std::size_t>(i)] = quantize_value(t, y, std::signbit(v), pol);
    }
  }
  return r;
}

const char* switchback_variant_name(switchback_variant v) {
  switch (v) {
  case switchback_variant::int8: return "switchback_int8";
  case switchback_variant::int8_q: return "switchbackq_int8";
  case switchback_variant::fp8: return "switchback_fp8";
  case switchback_variant::fp8_q: return "switchbackq_fp8";
  }
  return "?";
}

quant_target switchback_input_target(switchback_variant v) {
  if (v == switchback_variant::int8 || v == switchback_variant::int8_q)
    return {true, {}, emu::int8_sym};
  return {false, emu::e4m3fn, {}};
}

quant_target switchback_grad_target(switchback_variant v) {
  if (v == switchback_variant::int8 || v == switchback_variant::int8_q)
    return {true, {}, emu::int8_sym};
  return {false, emu::e5m2, {}};
}

bool switchback_weight_per_row(switchback_variant v) {
  return v == switchback_variant::int8_q || v == switchback_variant::fp8_q;
}

chain_result switchback_forward(const float_matrix& x, const float_matrix& w,
                                const std::vector<float>& bias, switchback_variant v,
                                gemm_out out) {
  const quant_target t = switchback_input_target(v);
  return chain(x, t, true, w, t, switchback_weight_per_row(v), bias, out);
}

chain_result switchback_input_grad(const float_matrix& g, const float_matrix& w,
                                   switchback_variant v, gemm_out out) {
  require(g.cols == w.rows, errc::invalid_argument,
          "reference::switchback_input_grad: G has " + std::to_string(g.cols) + " columns, W has " +
              std::to_string(w.rows) + " rows");
  return chain(g, switchback_grad_target(v), true, transposed(w), switchback_input_target(v),
               switchback_weight_per_row(v), {}, out);
}

} // namespace lowbit::reference
