// Low-precision training recipes as a small value type: for each of a linear layer's three
// matmuls (forward Y = X W^T, input gradient dX = G W, weight gradient dW = G^T X), whether it is
// quantized, each operand's format, scale granularity and scaling (current or delayed), the amax
// history of delayed scaling, and the accumulation model of the matmuls. It mirrors
// python/lowbit/nn/recipe.py's LinearRecipe (the layer that runs it is lowbit.nn's); the named
// fp8 recipes and their meaning are in docs/techniques/fp8-training.md ("Recipes").
//
// Granularities are named on the matmul's operand (K its contraction axis: in for the forward,
// out for the input gradient, tokens for the weight gradient): tensor, rows (one scale per row of
// the K-major operand), blocks (1 x block along K), tiles (block x block), mx (OCP MX blocks of
// `block` along K, E8M0 scales). block_shape() gives the gemm_operand's block_rows / block_k.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <lowbit/emu/accumulate.hpp>
#include <lowbit/emu/error.hpp>
#include <lowbit/emu/target.hpp>
#include <lowbit/kernels/quantize.hpp>

namespace lowbit::kernels {

enum class scale_granularity : std::uint8_t { tensor, rows, blocks, tiles, mx };
enum class scaling_mode : std::uint8_t { current, delayed };

struct operand_recipe {
  target fmt = emu::target(emu::e4m3fn);
  scale_granularity granularity = scale_granularity::tensor;
  std::int64_t block = 0; // blocks / tiles / mx: the block length (0: 128, or 32 for mx)
  scaling_mode scaling = scaling_mode::current;

  std::int64_t block_length() const {
    if (block > 0)
      return block;
    return granularity == scale_granularity::mx ? 32 : 128;
  }
  // (block_rows, block_k) of gemm_operand for the block granularities, (0, 0) otherwise.
  std::pair<std::int64_t, std::int64_t> block_shape() const {
    switch (granularity) {
    case scale_granularity::blocks:
    case scale_granularity::mx: return {1, block_length()};
    case scale_granularity::tiles: return {block_length(), block_length()};
    default: return {0, 0};
    }
  }
};

struct matmul_recipe {
  bool quantized = false; // false: the matmul runs in the input's own dtype
  operand_recipe a, b;
};

struct linear_recipe {
  std::string name;
  matmul_recipe forward, grad_input, grad_weight;
  std::int64_t amax_history = 16; // delayed scaling's history length
  history_reduce amax_reduce = history_reduce::max;
  std::optional<emu::accumulation> accumulation; // unset: each backend's own sum
};

// Throws lowbit::error (errc::invalid_argument, naming the matmul and operand) unless: delayed
// scaling is tensor-wise and fp8, mx blocks are fp8, a matmul's two K block lengths agree, the
// history is at least 1 long and the accumulation model is valid and not `exact`.
inline void check(const linear_recipe& r) {
  const auto fp8 = [](const target& t) {
    return !t.is_int && (t.fmt == emu::e4m3fn || t.fmt == emu::e5m2);
  };
  const std::pair<const char*, const matmul_recipe*> mms[] = {
      {"forward", &r.forward}, {"grad_input", &r.grad_input}, {"grad_weight", &r.grad_weight}};
  for (const auto& [slot, mm] : mms) {
    if (!mm->quantized)
      continue;
    for (const auto& [which, op] : {std::pair{"a", &mm->a}, std::pair{"b", &mm->b}}) {
      const std::string at = r.name + ": " + slot + "." + which;
      require(op->scaling == scaling_mode::current ||
                  (op->granularity == scale_granularity::tensor && fp8(op->fmt)),
              errc::invalid_argument,
              [&] { return at + ": delayed scaling is for tensor-wise fp8 operands"; });
      require(op->granularity != scale_granularity::mx || fp8(op->fmt), errc::invalid_argument,
              [&] { return at + ": MX blocks are for fp8 operands"; });
      require(op->block >= 0, errc::invalid_argument,
              [&] { return at + ": negative block length"; });
    }
    const auto ka = mm->a.block_shape().second, kb = mm->b.block_shape().second;
    require(ka == 0 || kb == 0 || ka == kb, errc::invalid_argument,
            [&] { return r.name + ": " + slot + ": the operands' K blocks differ"; });
  }
  require(r.amax_history >= 1, errc::invalid_argument,
          [&] { return r.name + ": amax_history below 1"; });
  if (r.accumulation)
    require(emu::is_valid(*r.accumulation) && r.accumulation->kind != emu::accumulation_kind::exact,
            errc::invalid_argument,
            [&] { return r.name + ": the accumulation model is invalid or exact"; });
}

// Hopper's fp8 accumulation as the H200 probes pinned it (fp8-training.md, "Hopper's
// parameters"), slow accumulation: what cuBLASLt's fp8 GEMMs (fast accumulation off) and the
// CUTLASS kernels (promotion every 4 MMAs) sum. Fitted on e4m3 x e4m3; applied to every pair.
inline constexpr emu::accumulation hopper_accumulation = emu::hopper_fp8_accumulation(false);

enum class fp8_granularity : std::uint8_t { tensorwise, rowwise, blockwise, mx };

// All three matmuls in fp8, E4M3 for X and W, E5M2 for G (python's lowbit.nn.fp8_recipe).
inline linear_recipe fp8_recipe(fp8_granularity g, scaling_mode s = scaling_mode::current,
                                std::optional<emu::accumulation> accumulation = std::nullopt,
                                std::string name = {}) {
  using sg = scale_granularity;
  const target e4 = emu::target(emu::e4m3fn), e5 = emu::target(emu::e5m2);
  const auto op = [s](target t, sg gr) {
    return operand_recipe{t, gr, 0, gr == sg::tensor ? s : scaling_mode::current};
  };
  linear_recipe r;
  static const char* const names[] = {"fp8_tensorwise", "fp8_rowwise", "fp8_blockwise_1x128",
                                      "mxfp8"};
  r.name = name.empty() ? std::string(names[static_cast<int>(g)]) +
                              (s == scaling_mode::delayed ? "_delayed" : "")
                        : name;
  // The row-wise recipe's per-row scales of the K-major operands: X and G per token, W per out
  // feature (forward) or per in feature (input gradient), G and X per feature (weight gradient).
  const sg xg = g == fp8_granularity::tensorwise  ? sg::tensor
                : g == fp8_granularity::rowwise   ? sg::rows
                : g == fp8_granularity::blockwise ? sg::blocks
                                                  : sg::mx;
  const sg w = g == fp8_granularity::blockwise ? sg::tiles : xg;
  r.forward = {true, op(e4, xg), op(e4, w)};
  r.grad_input = {true, op(e5, xg), op(e4, w)};
  r.grad_weight = {true, op(e5, xg), op(e4, xg)};
  r.accumulation = accumulation;
  check(r);
  return r;
}

// The named recipes of python/lowbit/nn/recipe.py's named_recipes() that are fp8 training
// recipes: fp8_tensorwise, fp8_tensorwise_delayed, fp8_rowwise, fp8_blockwise_1x128, mxfp8 and
// hopper_emulated (tensor-wise delayed under hopper_accumulation).
inline std::vector<linear_recipe> named_fp8_recipes() {
  using g = fp8_granularity;
  return {fp8_recipe(g::tensorwise),
          fp8_recipe(g::tensorwise, scaling_mode::delayed),
          fp8_recipe(g::rowwise),
          fp8_recipe(g::blockwise),
          fp8_recipe(g::mx),
          fp8_recipe(g::tensorwise, scaling_mode::delayed, hopper_accumulation, "hopper_emulated")};
}

// The named recipe, or errc::invalid_argument naming the known ones.
inline linear_recipe named_fp8_recipe(std::string_view name) {
  std::string known;
  for (linear_recipe& r : named_fp8_recipes()) {
    if (r.name == name)
      return r;
    known += (known.empty() ? "" : ", ") + r.name;
  }
  throw error(errc::invalid_argument,
              "recipe '" + std::string(name) + "': expected one of " + known);
}

} // namespace lowbit::kernels
