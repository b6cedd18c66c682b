// Host API of the activation quantization: argument checks with precise messages, then the CPU
// twin or the CUDA kernels.
#include <lowbit/kernels/actquant.hpp>

#include <cmath>
#include <string>

#include "../common/device_check.hpp"
#include "actquant_internal.hpp"

namespace lowbit::kernels {

namespace {

struct layout {
  std::int64_t run = 1, groups = 1;
};

layout layout_of(const tensor_view& x, const actquant_groups& g) {
  require_valid(x, "x");
  require(x.ndim >= 1, errc::invalid_argument, "x: a grouped dimension needs at least 1-d x");
  require(g.dim >= -x.ndim && g.dim < x.ndim, errc::invalid_argument, [&] {
    return "groups.dim = " + std::to_string(g.dim) + " is outside x's " + std::to_string(x.ndim) +
           " dimensions";
  });
  const int d = g.dim < 0 ? g.dim + x.ndim : g.dim;
  const std::int64_t c = x.shape[d];
  require(g.group_size >= 1, errc::invalid_argument,
          [&] { return "groups.group_size = " + std::to_string(g.group_size) + " must be >= 1"; });
  require(c % g.group_size == 0, errc::invalid_argument, [&] {
    return "groups.group_size = " + std::to_string(g.group_size) + " does not divide x.shape[" +
           std::to_string(d) + "] = " + std::to_string(c);
  });
  std::int64_t inner = 1;
  for (int k = d + 1; k < x.ndim; ++k)
    inner *= x.shape[k];
  layout l;
  l.groups = c / g.group_size;
  l.run = inner * g.group_size;
  if (l.run < 1)
    l.run = 1; // empty x
  // One group: every element in the same run (a power of two, so that any vector width divides
  // it), which spares the drivers a division per run.
  if (l.groups == 1)
    l.run = std::int64_t{1} << 62;
  return l;
}

void check_estimates(const tensor_view& alpha, const tensor_view& beta, const tensor_view& x,
                     std::int64_t groups) {
  require_valid(alpha, "alpha");
  require_valid(beta, "beta");
  require_dtype(alpha, "alpha", {dtype::float32});
  require_dtype(beta, "beta", {dtype::float32});
  require_contiguous(alpha, "alpha");
  require_contiguous(beta, "beta");
  require(alpha.numel() == groups && beta.numel() == groups, errc::invalid_argument, [&] {
    return "alpha and beta must have one element per group (" + std::to_string(groups) + "), got " +
           std::to_string(alpha.numel()) + " and " + std::to_string(beta.numel());
  });
  require_same_device(alpha, "alpha", x, "x");
  require_same_device(beta, "beta", x, "x");
}

void check_momentum(float m) {
  require(m >= 0.0f && m <= 1.0f, errc::invalid_argument,
          [&] { return "momentum = " + std::to_string(m) + " must be in [0, 1]"; });
}

actquant_problem problem_of(const tensor_view& x, const tensor_view& alpha, const tensor_view& beta,
                            const actquant_groups& g) {
  const layout l = layout_of(x, g);
  check_estimates(alpha, beta, x, l.groups);
  require_dtype(x, "x", {dtype::float32, dtype::bfloat16, dtype::float16});
  require_contiguous(x, "x");
  actquant_problem p;
  p.x = x;
  p.alpha = alpha.ptr<float>();
  p.beta = beta.ptr<float>();
  p.n = x.numel();
  p.group = actquant_ops::group_of{l.run, l.groups};
  return p;
}

void run_quantize(const actquant_problem& p, const exec& ex) {
  if (p.n == 0)
    return;
  if (p.x.dev.type == device_type::cuda)
    cuda::actquant_quantize(p, ex);
  else
    cpu::actquant_quantize(p, ex);
}

} // namespace

std::int64_t actquant_group_count(const tensor_view& x, const actquant_groups& g) {
  return layout_of(x, g).groups;
}

namespace {

// The checked problem of a quantize call (both modes): x, codes, the estimates and the policy.
actquant_problem quantize_problem(const tensor_view& x, const tensor_view& codes,
                                  const tensor_view& alpha, const tensor_view& beta,
                                  const actquant_groups& g, const emu::policy& pol,
                                  const emu::random_stream& rng, bool update, float momentum) {
  actquant_problem p = problem_of(x, alpha, beta, g);
  require_valid(codes, "codes");
  require_dtype(codes, "codes", {dtype::uint8});
  require_same_shape(x, "x", codes, "codes");
  require_contiguous(codes, "codes");
  require_same_device(codes, "codes", x, "x");
  if (const char* why = emu::check_policy(pol))
    throw error(errc::invalid_argument, std::string("policy: ") + why);
  if (update)
    check_momentum(momentum);
  if (x.dev.type == device_type::cuda && p.n > 0)
    require_device_memory({&x, &codes, &alpha, &beta}, {"x", "codes", "alpha", "beta"});
  p.codes = codes;
  p.pol = pol;
  p.rng = rng;
  p.quantize = true;
  p.momentum = momentum;
  return p;
}

} // namespace

void actquant_quantize(const tensor_view& x, const tensor_view& codes, const tensor_view& alpha,
                       const tensor_view& beta, const actquant_groups& g, const emu::policy& pol,
                       const emu::random_stream& rng, bool update, float momentum, const exec& ex) {
  actquant_problem p = quantize_problem(x, codes, alpha, beta, g, pol, rng, update, momentum);
  p.update = update;
  run_quantize(p, ex);
}

void actquant_quantize_lagged(const tensor_view& x, const tensor_view& codes,
                              const tensor_view& alpha, const tensor_view& beta,
                              const actquant_groups& g, const emu::policy& pol,
                              const emu::random_stream& rng, float momentum, const exec& ex) {
  actquant_problem p = quantize_problem(x, codes, alpha, beta, g, pol, rng, true, momentum);
  p.lagged = true;
  run_quantize(p, ex);
}

void actquant_update(const tensor_view& x, const tensor_view& alpha, const tensor_view& beta,
                     const actquant_groups& g, float momentum, const exec& ex) {
  actquant_problem p = problem_of(x, alpha, beta, g);
  check_momentum(momentum);
  if (x.dev.type == device_type::cuda && p.n > 0)
    require_device_memory({&x, &alpha, &beta}, {"x", "alpha", "beta"});
  p.update = true;
  p.momentum = momentum;
  run_quantize(p, ex);
}

void actquant_dequantize(const tensor_view& codes, const tensor_view& alpha,
                         const tensor_view& beta, const tensor_view& out, const actquant_groups& g,
                         const exec& ex) {
  const layout l = layout_of(codes, g);
  check_estimates(alpha, beta, codes, l.groups);
  require_dtype(codes, "codes", {dtype::uint8});
  require_contiguous(codes, "codes");
  require_valid(out, "out");
  require_dtype(out, "out", {dtype::float32, dtype::bfloat16, dtype::float16});
  require_same_shape(codes, "codes", out, "out");
  require_contiguous(out, "out");
  require_same_device(out, "out", codes, "codes");
  actquant_problem p;
  p.codes = codes;
  p.out = out;
  p.alpha = alpha.ptr<float>();
  p.beta = beta.ptr<float>();
  p.n = codes.numel();
  p.group = actquant_ops::group_of{l.run, l.groups};
  if (p.n == 0)
    return;
  if (codes.dev.type == device_type::cuda) {
    require_device_memory({&codes, &alpha, &beta, &out}, {"codes", "alpha", "beta", "out"});
    cuda::actquant_dequantize(p, ex);
  } else {
    cpu::actquant_dequantize(p, ex);
  }
}

void actquant_activation_backward(const tensor_view& codes, const tensor_view& alpha,
                                  const tensor_view& beta, const actquant_groups& g,
                                  actquant_activation f, const tensor_view& dy,
                                  const tensor_view& gx, const tensor_view& value, const exec& ex) {
  const layout l = layout_of(codes, g);
  check_estimates(alpha, beta, codes, l.groups);
  require_dtype(codes, "codes", {dtype::uint8});
  require_contiguous(codes, "codes");
  require(static_cast<unsigned>(f) <= static_cast<unsigned>(actquant_activation::relu),
          errc::invalid_argument, "f: not an actquant_activation");
  require_valid(dy, "dy");
  require_dtype(dy, "dy", {dtype::float32, dtype::bfloat16, dtype::float16});
  require_same_shape(codes, "codes", dy, "dy");
  require_contiguous(dy, "dy");
  require_same_device(dy, "dy", codes, "codes");
  const auto output = [&](const tensor_view& v, const char* name) {
    require_valid(v, name);
    require(v.type == dy.type, errc::invalid_argument, [&] {
      return std::string(name) + ": dtype " + dtype_name(v.type) + ", expected dy's (" +
             dtype_name(dy.type) + ")";
    });
    require_same_shape(codes, "codes", v, name);
    require_contiguous(v, name);
    require_same_device(v, name, codes, "codes");
  };
  output(gx, "gx");
  if (value.data != nullptr)
    output(value, "value");
  act_backward_problem p;
  p.codes = codes.ptr<std::uint8_t>();
  p.alpha = alpha.ptr<float>();
  p.beta = beta.ptr<float>();
  p.n = codes.numel();
  p.group = actquant_ops::group_of{l.run, l.groups};
  p.f = f;
  p.type = dy.type;
  p.dy = dy.data;
  p.gx = gx.data;
  p.value = value.data;
  if (p.n == 0)
    return;
  if (codes.dev.type == device_type::cuda) {
    require_device_memory({&codes, &alpha, &beta, &dy, &gx},
                          {"codes", "alpha", "beta", "dy", "gx"});
    if (value.data != nullptr)
      require_device_memory({&value}, {"value"});
    cuda::actquant_activation_backward(p, ex);
  } else {
    cpu::actquant_activation_backward(p, ex);
  }
}

void actquant_layer_norm_backward(const tensor_view& codes, const tensor_view& alpha,
                                  const tensor_view& beta, std::int64_t group_size,
                                  const tensor_view& gy, const tensor_view& weight, float eps,
                                  const tensor_view& gx, const tensor_view& gw,
                                  const tensor_view& gb, const exec& ex) {
  const actquant_groups g{-1, group_size};
  const layout l = layout_of(codes, g);
  check_estimates(alpha, beta, codes, l.groups);
  require_dtype(codes, "codes", {dtype::uint8});
  require_contiguous(codes, "codes");
  const std::int64_t cols = codes.shape[codes.ndim - 1];
  require(cols >= 1 && cols <= (std::int64_t{1} << 24), errc::invalid_argument, [&] {
    return "codes: the normalized (last) dimension has " + std::to_string(cols) +
           " elements; expected 1 to 2^24";
  });
  require(std::isfinite(eps) && eps >= 0.0f, errc::invalid_argument,
          [&] { return "eps = " + std::to_string(eps) + " must be finite and >= 0"; });
  require_valid(gy, "gy");
  require_dtype(gy, "gy", {dtype::float32, dtype::bfloat16, dtype::float16});
  require_same_shape(codes, "codes", gy, "gy");
  require_contiguous(gy, "gy");
  require_same_device(gy, "gy", codes, "codes");
  const bool on_device = codes.dev.type == device_type::cuda;
  if (on_device && codes.numel() > 0)
    require_device_memory({&codes, &alpha, &beta, &gy}, {"codes", "alpha", "beta", "gy"});
  const auto optional_vector = [&](const tensor_view& v, const char* name) {
    if (v.data == nullptr)
      return;
    require_valid(v, name);
    require_dtype(v, name, {dtype::float32});
    require_contiguous(v, name);
    require(v.numel() == cols, errc::invalid_argument, [&] {
      return std::string(name) + ": expected " + std::to_string(cols) + " elements, got " +
             std::to_string(v.numel());
    });
    require_same_device(v, name, codes, "codes");
    if (on_device)
      require_device_memory({&v}, {name});
  };
  optional_vector(weight, "weight");
  optional_vector(gw, "gw");
  optional_vector(gb, "gb");
  if (gx.data != nullptr) {
    require_valid(gx, "gx");
    require(gx.type == gy.type, errc::invalid_argument, [&] {
      return std::string("gx: dtype ") + dtype_name(gx.type) + ", expected gy's (" +
             dtype_name(gy.type) + ")";
    });
    require_same_shape(codes, "codes", gx, "gx");
    require_contiguous(gx, "gx");
    require_same_device(gx, "gx", codes, "codes");
    if (on_device && gx.numel() > 0)
      require_device_memory({&gx}, {"gx"});
  }
  ln_backward_problem p;
  p.codes = codes.ptr<std::uint8_t>();
  p.alpha = alpha.ptr<float>();
  p.beta = beta.ptr<float>();
  p.cols = cols;
  p.rows = codes.numel() / cols;
  p.group_size = group_size;
  p.type = gy.type;
  p.gy = gy.data;
  p.weight = weight.ptr<float>();
  p.eps = eps;
  p.gx = gx.data;
  p.gw = gw.ptr<float>();
  p.gb = gb.ptr<float>();
  if (p.gx == nullptr && p.gw == nullptr && p.gb == nullptr)
    return;
  if (codes.dev.type == device_type::cuda) {
    cuda::actquant_layer_norm_backward(p, ex);
  } else {
    cpu::actquant_layer_norm_backward(p, ex);
  }
}

} // namespace lowbit::kernels
