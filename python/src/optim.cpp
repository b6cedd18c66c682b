// lowbit._core's fused optimizer steps: kernels/include/lowbit/kernels/optim.hpp over DLPack
// tensors and numpy arrays (the array intake of arrays.hpp), every tensor updated in place. The
// torch.optim layer (lowbit/optim/) allocates the states and calls optimizer_step once per param
// group with the group's tensors.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include <lowbit/emu/error.hpp>
#include <lowbit/kernels/optim.hpp>
#include <lowbit/kernels/residual.hpp>
#include <lowbit/kernels/tensor.hpp>

#include "arrays.hpp"
#include "bindings.hpp"

namespace lowbit::python {
namespace {

namespace k = kernels;

k::optimizer parse_optimizer(const std::string& s) {
  for (k::optimizer o : {k::optimizer::adam, k::optimizer::adamw, k::optimizer::stable_adamw,
                         k::optimizer::sgd, k::optimizer::lion, k::optimizer::rmsprop,
                         k::optimizer::adagrad, k::optimizer::lamb, k::optimizer::lars})
    if (s == k::optimizer_name(o))
      return o;
  fail(errc::invalid_argument, "optimizer '" + s +
                                   "': expected one of adam, adamw, stable_adamw, sgd, lion, "
                                   "rmsprop, adagrad, lamb, lars");
}

k::codebook_rounding parse_rounding(const std::string& s) {
  if (s == "nearest_toward_zero")
    return k::codebook_rounding::nearest;
  if (s == "stochastic")
    return k::codebook_rounding::stochastic;
  fail(errc::invalid_argument,
       "rounding '" + s + "': expected one of nearest_toward_zero, stochastic");
}

// One tensor's arguments, kept alive for the call.
struct taken {
  std::string names[8]; // the argument records point to them
  std::vector<array_arg> args;
  k::optim_tensor t;
};

const dtypes param_dtypes = {dtype::float32, dtype::bfloat16, dtype::float16};

// A tensor's tuple: (param, grad, state1, state2, absmax1, absmax2), or with the third state
// (amsgrad, RMSprop with momentum and centered) appended: (..., state3, absmax3).
void take_tensor(const py::handle& item, std::size_t j, std::uintptr_t stream, taken& out) {
  const py::tuple tup = py::reinterpret_borrow<py::tuple>(item);
  if (tup.size() != 6 && tup.size() != 8)
    fail(errc::invalid_argument, "tensors[" + std::to_string(j) +
                                     "]: expected (param, grad, state1, state2, absmax1, "
                                     "absmax2[, state3, absmax3]), None for the ones not kept");
  static const char* names[8] = {"param",   "grad",    "state1", "state2",
                                 "absmax1", "absmax2", "state3", "absmax3"};
  k::tensor_view* dst[8] = {&out.t.param,   &out.t.grad,    &out.t.state1, &out.t.state2,
                            &out.t.absmax1, &out.t.absmax2, &out.t.state3, &out.t.absmax3};
  out.args.reserve(tup.size());
  for (std::size_t q = 0; q < tup.size(); ++q) {
    if (tup[q].is_none())
      continue;
    out.names[q] = "tensors[" + std::to_string(j) + "]." + names[q];
    const bool is_state = q == 2 || q == 3 || q == 6;
    const dtype_rule rule{q < 2      ? param_dtypes
                          : is_state ? dtypes{dtype::float32, dtype::uint8}
                                     : dtypes{dtype::float32},
                          ""};
    out.args.push_back(take(tup[q], out.names[q].c_str(), stream, rule, q != 1));
    *dst[q] = view_of(out.args.back(), out.args.back().contiguous());
  }
}

// The keyword arguments of both entries below: LAMB's and LARS' trust-ratio settings,
// RMSprop's centered flag and Adam's amsgrad.
struct keyword_args {
  double max_trust_ratio, trust_coefficient;
  bool adapt, bias_correction, centered, amsgrad;
};

// The hyper-parameters and the configuration of one step, as both entries below take them.
k::optim_hparams hparams_of(double lr, double beta1, double beta2, double eps, double weight_decay,
                            double momentum, double dampening, bool nesterov, double lr_decay,
                            bool maximize, std::int64_t step, const keyword_args& kw) {
  k::optim_hparams h;
  h.lr = lr;
  h.beta1 = beta1;
  h.beta2 = beta2;
  h.eps = eps;
  h.weight_decay = weight_decay;
  h.momentum = momentum;
  h.dampening = dampening;
  h.nesterov = nesterov;
  h.lr_decay = lr_decay;
  h.maximize = maximize;
  h.step = step;
  h.max_trust_ratio = kw.max_trust_ratio;
  h.trust_coefficient = kw.trust_coefficient;
  h.adapt = kw.adapt;
  h.bias_correction = kw.bias_correction;
  h.centered = kw.centered;
  h.amsgrad = kw.amsgrad;
  return h;
}

k::optim_config config_of(std::int64_t block, const std::string& rounding, std::uint64_t seed,
                          std::uint64_t offset) {
  k::optim_config cfg;
  cfg.block = block;
  cfg.rounding = parse_rounding(rounding);
  cfg.seed = seed;
  cfg.offset = offset;
  return cfg;
}

py::object optimizer_step(const std::string& optimizer, const py::list& tensors, double lr,
                          double beta1, double beta2, double eps, double weight_decay,
                          double momentum, double dampening, bool nesterov, double lr_decay,
                          bool maximize, std::int64_t step, py::handle skipped, std::int64_t block,
                          const std::string& rounding, std::uint64_t seed, std::uint64_t offset,
                          std::int64_t threads, std::uintptr_t stream, double max_trust_ratio,
                          double trust_coefficient, bool adapt, bool bias_correction, bool centered,
                          bool amsgrad) {
  const k::optimizer o = parse_optimizer(optimizer);
  const k::optim_hparams h = hparams_of(
      lr, beta1, beta2, eps, weight_decay, momentum, dampening, nesterov, lr_decay, maximize, step,
      {max_trust_ratio, trust_coefficient, adapt, bias_correction, centered, amsgrad});
  k::optim_config cfg = config_of(block, rounding, seed, offset);
  const k::exec ex = exec_of(threads, stream);
  std::vector<taken> held(tensors.size());
  std::vector<k::optim_tensor> views;
  views.reserve(tensors.size());
  for (std::size_t j = 0; j < tensors.size(); ++j) {
    take_tensor(tensors[j], j, stream, held[j]);
    views.push_back(held[j].t);
  }
  array_arg sk;
  k::tensor_view sv;
  if (!skipped.is_none()) {
    sk = take(skipped, "skipped", stream, {{dtype::int64}, ""}, true);
    sv = view_of(sk, sk.contiguous());
  }
  {
    py::gil_scoped_release no_gil;
    k::optimizer_step(o, h, views.data(), static_cast<std::int64_t>(views.size()), sv, cfg, ex);
  }
  return py::none();
}

// The torch layer's entry: tensors as raw fields, read from torch tensors it owns (contiguous,
// on `device`, the current CUDA device for CUDA): per tensor (param, grad, state1, state2,
// state3, absmax1, absmax2, absmax3 data pointers, 0 for none; numel; dtype code 0 float32,
// 1 bfloat16, 2 float16; eight_bit; the residual master weight's data pointer, 0 for none, and
// its bits, 8 or 16). One DLPack exchange per tensor costs microseconds, which for the hundreds
// of tensors of a model would outweigh the step itself.
using raw_item = std::tuple<std::uintptr_t, std::uintptr_t, std::uintptr_t, std::uintptr_t,
                            std::uintptr_t, std::uintptr_t, std::uintptr_t, std::uintptr_t,
                            std::int64_t, int, bool, std::uintptr_t, int>;

py::object optimizer_step_raw(const std::string& optimizer, const std::vector<raw_item>& items,
                              int device_type, int device_index, double lr, double beta1,
                              double beta2, double eps, double weight_decay, double momentum,
                              double dampening, bool nesterov, double lr_decay, bool maximize,
                              std::int64_t step, std::uintptr_t skipped, std::int64_t block,
                              const std::string& rounding, std::uint64_t seed, std::uint64_t offset,
                              std::int64_t threads, std::uintptr_t stream, double max_trust_ratio,
                              double trust_coefficient, bool adapt, bool bias_correction,
                              bool centered, bool amsgrad) {
  const k::optimizer o = parse_optimizer(optimizer);
  const k::optim_hparams h = hparams_of(
      lr, beta1, beta2, eps, weight_decay, momentum, dampening, nesterov, lr_decay, maximize, step,
      {max_trust_ratio, trust_coefficient, adapt, bias_correction, centered, amsgrad});
  k::optim_config cfg = config_of(block, rounding, seed, offset);
  cfg.check_device_memory = false;
  const k::exec ex = exec_of(threads, stream);
  if (device_type != 0 && device_type != 1)
    fail(errc::invalid_argument, "device_type: expected 0 (cpu) or 1 (cuda)");
  const k::device dev{device_type == 1 ? k::device_type::cuda : k::device_type::cpu, device_index};
  const auto view = [&](std::uintptr_t ptr, dtype t, std::int64_t n) {
    if (ptr == 0)
      return k::tensor_view{};
    return k::tensor_view::contiguous(reinterpret_cast<void*>(ptr), t, {n}, dev);
  };
  std::vector<k::optim_tensor> views;
  views.reserve(items.size());
  for (const raw_item& it : items) {
    const auto [pp, gp, s1, s2, s3, a1, a2, a3, n, code, eight, rp, rbits] = it;
    if (code < 0 || code > 2 || n < 0)
      fail(errc::invalid_argument, "optimizer_step_raw: bad dtype code or element count");
    if (rp != 0 && rbits != 8 && rbits != 16)
      fail(errc::invalid_argument, "optimizer_step_raw: residual bits must be 8 or 16");
    const dtype pt = code == 0 ? dtype::float32 : (code == 1 ? dtype::bfloat16 : dtype::float16);
    const dtype st = eight ? dtype::uint8 : dtype::float32;
    const std::int64_t blocks = k::blockwise_blocks(n, block < 1 ? 1 : block);
    k::optim_tensor t;
    t.param = view(pp, pt, n);
    t.grad = view(gp, pt, n);
    t.state1 = view(s1, st, n);
    t.state2 = view(s2, st, n);
    t.absmax1 = view(a1, dtype::float32, blocks);
    t.absmax2 = view(a2, dtype::float32, blocks);
    t.state3 = view(s3, st, n);
    t.absmax3 = view(a3, dtype::float32, blocks);
    t.residual = view(rp, rbits == 8 ? dtype::int8 : dtype::int16, n);
    views.push_back(t);
  }
  const k::tensor_view sv = view(skipped, dtype::int64, static_cast<std::int64_t>(items.size()));
  {
    py::gil_scoped_release no_gil;
    k::optimizer_step(o, h, views.data(), static_cast<std::int64_t>(views.size()), sv, cfg, ex);
  }
  return py::none();
}

// Residual split/join over raw pointers of contiguous tensors the caller owns (the torch layer):
// weight code 1 bfloat16, 2 float16.
void residual_raw(bool split, std::uintptr_t x, std::uintptr_t w, std::uintptr_t r, std::int64_t n,
                  int weight_code, int bits, int device_type, int device_index,
                  std::uintptr_t stream) {
  if (weight_code != 1 && weight_code != 2)
    fail(errc::invalid_argument, "residual: weight dtype code must be 1 (bfloat16) or 2 (float16)");
  if (device_type != 0 && device_type != 1)
    fail(errc::invalid_argument, "device_type: expected 0 (cpu) or 1 (cuda)");
  if (n < 0)
    fail(errc::invalid_argument, "residual: element count must be >= 0");
  const k::device dev{device_type == 1 ? k::device_type::cuda : k::device_type::cpu, device_index};
  const dtype rt = k::residual_dtype(bits);
  const auto view = [&](std::uintptr_t ptr, dtype t) {
    return k::tensor_view::contiguous(reinterpret_cast<void*>(ptr), t, {n}, dev);
  };
  const k::tensor_view xv = view(x, dtype::float32),
                       wv = view(w, weight_code == 1 ? dtype::bfloat16 : dtype::float16),
                       rv = view(r, rt);
  const k::exec ex = exec_of(0, stream);
  py::gil_scoped_release no_gil;
  if (split)
    k::residual_split(xv, wv, rv, bits, ex);
  else
    k::residual_join(wv, rv, bits, xv, ex);
}

} // namespace

void bind_optim(py::module_& m) {
  m.def(
      "residual_split_raw",
      [](std::uintptr_t x, std::uintptr_t weight, std::uintptr_t residual, std::int64_t n,
         int weight_code, int bits, int device_type, int device_index, std::uintptr_t stream) {
        residual_raw(true, x, weight, residual, n, weight_code, bits, device_type, device_index,
                     stream);
      },
      py::arg("x"), py::arg("weight"), py::arg("residual"), py::arg("n"), py::arg("weight_code"),
      py::arg("bits"), py::arg("device_type"), py::arg("device_index"), py::arg("stream"),
      "Splits n float32 values at x into 16-bit weights and k-bit residuals "
      "(kernels/include/lowbit/kernels/residual.hpp), over raw data pointers.");
  m.def(
      "residual_join_raw",
      [](std::uintptr_t weight, std::uintptr_t residual, std::uintptr_t out, std::int64_t n,
         int weight_code, int bits, int device_type, int device_index, std::uintptr_t stream) {
        residual_raw(false, out, weight, residual, n, weight_code, bits, device_type, device_index,
                     stream);
      },
      py::arg("weight"), py::arg("residual"), py::arg("out"), py::arg("n"), py::arg("weight_code"),
      py::arg("bits"), py::arg("device_type"), py::arg("device_index"), py::arg("stream"),
      "The float32 values of n (weight, residual) pairs into out, over raw data pointers.");
  m.def("optimizer_step_raw", &optimizer_step_raw, py::arg("optimizer"), py::arg("items"),
        py::arg("device_type"), py::arg("device_index"), py::arg("lr"), py::arg("beta1"),
        py::arg("beta2"), py::arg("eps"), py::arg("weight_decay"), py::arg("momentum"),
        py::arg("dampening"), py::arg("nesterov"), py::arg("lr_decay"), py::arg("maximize"),
        py::arg("step"), py::arg("skipped"), py::arg("block"), py::arg("rounding"), py::arg("seed"),
        py::arg("offset"), py::arg("threads"), py::arg("stream"),
        py::arg("max_trust_ratio") = std::numeric_limits<double>::infinity(),
        py::arg("trust_coefficient") = 1e-3, py::arg("adapt") = true,
        py::arg("bias_correction") = true, py::arg("centered") = false, py::arg("amsgrad") = false,
        "optimizer_step over raw data pointers of contiguous tensors the caller owns (the torch "
        "layer's fast path; no DLPack exchange, no device-memory query).");
  m.def("optimizer_step", &optimizer_step, py::arg("optimizer"), py::arg("tensors"), py::arg("lr"),
        py::arg("beta1"), py::arg("beta2"), py::arg("eps"), py::arg("weight_decay"),
        py::arg("momentum"), py::arg("dampening"), py::arg("nesterov"), py::arg("lr_decay"),
        py::arg("maximize"), py::arg("step"), py::arg("skipped"), py::arg("block"),
        py::arg("rounding"), py::arg("seed"), py::arg("offset"), py::arg("threads"),
        py::arg("stream"), py::arg("max_trust_ratio") = std::numeric_limits<double>::infinity(),
        py::arg("trust_coefficient") = 1e-3, py::arg("adapt") = true,
        py::arg("bias_correction") = true, py::arg("centered") = false, py::arg("amsgrad") = false,
        "One fused optimizer step over tensors, a list of (param, grad, state1, state2, absmax1, "
        "absmax2), or (..., state3, absmax3) where the optimizer keeps three states, with None "
        "for the states not kept, updated in place (kernels/include/lowbit/kernels/optim.hpp).");
}

} // namespace lowbit::python
