// Host API of the fused optimizer steps: argument checks with precise messages, the step's
// coefficients (in double, each rounded once to float32), the tensor table, then the CPU twin or
// the CUDA kernel.
#include <lowbit/kernels/optim.hpp>

#include <cmath>
#include <cstdio>
#include <string>

#include "../common/device_check.hpp"
#include "optim_internal.hpp"

namespace lowbit::kernels {

const char* optimizer_name(optimizer o) {
  switch (o) {
  case optimizer::adam: return "adam";
  case optimizer::adamw: return "adamw";
  case optimizer::stable_adamw: return "stable_adamw";
  case optimizer::sgd: return "sgd";
  case optimizer::lion: return "lion";
  case optimizer::rmsprop: return "rmsprop";
  case optimizer::adagrad: return "adagrad";
  case optimizer::lamb: return "lamb";
  case optimizer::lars: return "lars";
  }
  return "unknown";
}

int optimizer_states(optimizer o, const optim_hparams& h) {
  switch (o) {
  case optimizer::adam:
  case optimizer::adamw: return h.amsgrad ? 3 : 2;
  case optimizer::stable_adamw:
  case optimizer::lamb: return 2;
  case optimizer::sgd:
  case optimizer::lars: return h.momentum != 0.0 ? 1 : 0;
  case optimizer::rmsprop: return 1 + (h.momentum != 0.0 ? 1 : 0) + (h.centered ? 1 : 0);
  default: return 1;
  }
}

bool optimizer_state_signed(optimizer o, int k) {
  return optim_detail::state_signed(o, k);
}

namespace {

// A hyper-parameter as a message shows it: the shortest of %.9g's digits, so that -1e-08 does
// not read as -0.000000 (std::to_string's fixed six decimals).
std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string at(std::int64_t j, const char* what) {
  return "tensors[" + std::to_string(j) + "]." + what;
}

void check_hparams(optimizer o, const optim_hparams& h) {
  const std::string name = std::string("optimizer_step(") + optimizer_name(o) + "): ";
  const auto in = [&](double v, double lo, double hi, bool hi_open, const char* what) {
    require(std::isfinite(v) && v >= lo && (hi_open ? v < hi : v <= hi), errc::invalid_argument,
            [&] {
              return name + what + " = " + num(v) + " is outside [" + num(lo) + ", " + num(hi) +
                     (hi_open ? ")" : "]");
            });
  };
  require(std::isfinite(h.lr) && h.lr >= 0.0, errc::invalid_argument,
          [&] { return name + "lr = " + num(h.lr) + " must be finite and >= 0"; });
  require(std::isfinite(h.weight_decay) && h.weight_decay >= 0.0, errc::invalid_argument, [&] {
    return name + "weight_decay = " + num(h.weight_decay) + " must be finite and >= 0";
  });
  require(h.step >= 1, errc::invalid_argument, [&] {
    return name + "step = " + std::to_string(h.step) + " must be >= 1 (the step being taken)";
  });
  require(std::isfinite(h.eps) && h.eps >= 0.0, errc::invalid_argument,
          [&] { return name + "eps = " + num(h.eps) + " must be finite and >= 0"; });
  switch (o) {
  case optimizer::adam:
  case optimizer::adamw:
  case optimizer::stable_adamw:
  case optimizer::lion:
  case optimizer::lamb:
    in(h.beta1, 0.0, 1.0, true, "beta1");
    in(h.beta2, 0.0, 1.0, true, "beta2");
    break;
  case optimizer::rmsprop:
    in(h.beta2, 0.0, 1.0, true, "beta2 (alpha)");
    in(h.momentum, 0.0, 1.0, true, "momentum");
    break;
  case optimizer::sgd:
  case optimizer::lars:
    in(h.momentum, 0.0, 1.0, true, "momentum");
    in(h.dampening, 0.0, 1.0, false, "dampening");
    require(!h.nesterov || (h.momentum > 0.0 && h.dampening == 0.0), errc::invalid_argument,
            [&] { return name + "nesterov needs momentum > 0 and dampening = 0"; });
    break;
  case optimizer::adagrad:
    require(std::isfinite(h.lr_decay) && h.lr_decay >= 0.0, errc::invalid_argument,
            [&] { return name + "lr_decay must be finite and >= 0"; });
    break;
  }
  require(!h.amsgrad || o == optimizer::adam || o == optimizer::adamw, errc::invalid_argument,
          [&] { return name + "amsgrad applies to adam and adamw only"; });
  if (o == optimizer::stable_adamw)
    require(h.eps > 0.0, errc::invalid_argument, [&] {
      return name + "eps must be > 0 (eps^2 floors the second moment in the RMS term)";
    });
  if (o == optimizer::lamb || o == optimizer::lars)
    require(!std::isnan(h.max_trust_ratio) && h.max_trust_ratio > 0.0, errc::invalid_argument, [&] {
      return name + "max_trust_ratio = " + num(h.max_trust_ratio) +
             " must be > 0 (infinity: no clamp)";
    });
  if (o == optimizer::lars)
    require(std::isfinite(h.trust_coefficient) && h.trust_coefficient > 0.0, errc::invalid_argument,
            [&] {
              return name + "trust_coefficient = " + num(h.trust_coefficient) +
                     " must be finite and > 0";
            });
}

optim_ops::coeffs coeffs_of(optimizer o, const optim_hparams& h) {
  optim_ops::coeffs c;
  const auto f = [](double x) { return static_cast<float>(x); };
  const double t = static_cast<double>(h.step);
  c.maximize = h.maximize;
  c.eps = f(h.eps);
  switch (o) {
  case optimizer::adam:
  case optimizer::adamw:
    c.lr = f(h.lr * std::sqrt(1.0 - std::pow(h.beta2, t)) / (1.0 - std::pow(h.beta1, t)));
    c.eps = f(h.eps * std::sqrt(1.0 - std::pow(h.beta2, t)));
    c.one_m_b1 = f(1.0 - h.beta1);
    c.beta2 = f(h.beta2);
    c.one_m_b2 = f(1.0 - h.beta2);
    c.decay = f(1.0 - h.lr * h.weight_decay);
    c.wd = f(h.weight_decay);
    break;
  case optimizer::stable_adamw: {
    const auto hat = [&](double b) {
      return b * (1.0 - std::pow(b, t - 1.0)) / (1.0 - std::pow(b, t));
    };
    const double b1 = hat(h.beta1), b2 = hat(h.beta2);
    c.lr = f(h.lr);
    c.beta1 = f(b1);
    c.one_m_b1 = f(1.0 - b1);
    c.beta2 = f(b2);
    c.one_m_b2 = f(1.0 - b2);
    c.eps2 = f(h.eps * h.eps);
    break;
  }
  case optimizer::sgd:
    c.lr = f(h.lr);
    c.wd = f(h.weight_decay);
    c.beta1 = f(h.momentum);
    c.one_m_b1 = f(1.0 - h.dampening);
    c.first = h.step == 1;
    c.nesterov = h.nesterov;
    break;
  case optimizer::lion:
    c.lr = f(h.lr);
    c.decay = f(1.0 - h.lr * h.weight_decay);
    c.beta1 = f(h.beta1);
    c.one_m_b1 = f(1.0 - h.beta1);
    c.beta2 = f(h.beta2);
    c.one_m_b2 = f(1.0 - h.beta2);
    break;
  case optimizer::rmsprop:
    c.lr = f(h.lr);
    c.wd = f(h.weight_decay);
    c.beta1 = f(h.momentum);
    c.centered = h.centered;
    c.beta2 = f(h.beta2);
    c.one_m_b2 = f(1.0 - h.beta2);
    break;
  case optimizer::adagrad:
    c.lr = f(h.lr / (1.0 + (t - 1.0) * h.lr_decay));
    c.wd = f(h.weight_decay);
    break;
  case optimizer::lamb:
    c.lr = f(h.lr);
    c.wd = f(h.weight_decay);
    c.beta1 = f(h.beta1);
    c.one_m_b1 = f(1.0 - h.beta1);
    c.beta2 = f(h.beta2);
    c.one_m_b2 = f(1.0 - h.beta2);
    if (h.bias_correction) {
      c.bc = f(std::sqrt(1.0 - std::pow(h.beta2, t)) / (1.0 - std::pow(h.beta1, t)));
      c.eps = f(h.eps * std::sqrt(1.0 - std::pow(h.beta2, t)));
    }
    break;
  case optimizer::lars:
    c.lr = f(h.lr);
    c.wd = f(h.weight_decay);
    c.beta1 = f(h.momentum);
    c.one_m_b1 = f(1.0 - h.dampening);
    c.first = h.step == 1;
    c.nesterov = h.nesterov;
    break;
  }
  return c;
}

param_kind kind_of(dtype t) {
  switch (t) {
  case dtype::bfloat16: return param_kind::bf16;
  case dtype::float16: return param_kind::f16;
  default: return param_kind::f32;
  }
}

// The checks of one tensor with their messages (called only when plainly_valid says no, so a
// call over hundreds of valid tensors builds no message); throws lowbit::error.
void check_tensor(optimizer o, int ns, std::int64_t block, std::int64_t j, const optim_tensor& t,
                  const device& dev) {
  const char* sname[3] = {"state1", "state2", "state3"};
  const char* aname[3] = {"absmax1", "absmax2", "absmax3"};
  require_valid(t.param, at(j, "param").c_str());
  require_valid(t.grad, at(j, "grad").c_str());
  require_dtype(t.param, at(j, "param").c_str(), {dtype::float32, dtype::bfloat16, dtype::float16});
  require(t.grad.type == t.param.type, errc::invalid_type, [&] {
    return at(j, "grad") + ": dtype " + dtype_name(t.grad.type) + " differs from the parameter's " +
           dtype_name(t.param.type);
  });
  require_same_shape(t.param, at(j, "param").c_str(), t.grad, at(j, "grad").c_str());
  require_contiguous(t.param, at(j, "param").c_str());
  require_contiguous(t.grad, at(j, "grad").c_str());
  require(t.param.dev == dev, errc::invalid_argument, [&] {
    return at(j, "param") + ": on " + device_name(t.param.dev) + ", tensors[0] on " +
           device_name(dev) + "; every tensor of a step on one device";
  });
  require_same_device(t.param, at(j, "param").c_str(), t.grad, at(j, "grad").c_str());
  const std::int64_t n = t.param.numel();
  const std::int64_t blocks = blockwise_blocks(n, block);
  if (t.residual.data != nullptr) {
    const tensor_view& r = t.residual;
    require(t.param.type != dtype::float32, errc::invalid_argument, [&] {
      return at(j, "residual") + ": a float32 parameter is its own master; a residual needs a "
                                 "bfloat16 or float16 parameter";
    });
    require_valid(r, at(j, "residual").c_str());
    require_dtype(r, at(j, "residual").c_str(), {dtype::int16, dtype::int8});
    require(r.numel() == n, errc::invalid_argument, [&] {
      return at(j, "residual") + ": " + std::to_string(r.numel()) + " elements, the parameter " +
             std::to_string(n);
    });
    require_contiguous(r, at(j, "residual").c_str());
    require_same_device(t.param, at(j, "param").c_str(), r, at(j, "residual").c_str());
  }
  bool eight_bit = false;
  const tensor_view* st[3] = {&t.state1, &t.state2, &t.state3};
  const tensor_view* am[3] = {&t.absmax1, &t.absmax2, &t.absmax3};
  for (int k = 0; k < 3; ++k) {
    const tensor_view& s = *st[k];
    if (k >= ns) {
      require(s.data == nullptr && am[k]->data == nullptr, errc::invalid_argument, [&] {
        return at(j, sname[k]) + ": " + optimizer_name(o) + " keeps " + std::to_string(ns) +
               " state(s) here; leave " + sname[k] + " and " + aname[k] + " empty";
      });
      continue;
    }
    require_valid(s, at(j, sname[k]).c_str());
    require(s.numel() == n, errc::invalid_argument, [&] {
      return at(j, sname[k]) + ": " + std::to_string(s.numel()) + " elements, the parameter " +
             std::to_string(n);
    });
    require(n == 0 || s.data != nullptr, errc::invalid_argument, [&] {
      return at(j, sname[k]) + ": missing (" + optimizer_name(o) + " keeps " + std::to_string(ns) +
             " state(s))";
    });
    require_dtype(s, at(j, sname[k]).c_str(), {dtype::float32, dtype::uint8});
    require_contiguous(s, at(j, sname[k]).c_str());
    require_same_device(t.param, at(j, "param").c_str(), s, at(j, sname[k]).c_str());
    const bool eight = s.type == dtype::uint8;
    if (k == 0)
      eight_bit = eight;
    require(eight == eight_bit, errc::invalid_argument, [&] {
      return at(j, sname[k]) + ": dtype " + dtype_name(s.type) + " but state1 is " +
             (eight_bit ? "uint8" : "float32") + "; a tensor's states are of one kind";
    });
    if (eight) {
      const tensor_view& a = *am[k];
      require_valid(a, at(j, aname[k]).c_str());
      require_dtype(a, at(j, aname[k]).c_str(), {dtype::float32});
      require(a.numel() == blocks, errc::invalid_argument, [&] {
        return at(j, aname[k]) + ": " + std::to_string(a.numel()) + " elements; expected " +
               std::to_string(blocks) + " (one per block of " + std::to_string(block) + ")";
      });
      require_contiguous(a, at(j, aname[k]).c_str());
      require_same_device(t.param, at(j, "param").c_str(), a, at(j, aname[k]).c_str());
    } else {
      require(am[k]->data == nullptr, errc::invalid_argument,
              [&] { return at(j, aname[k]) + ": 32-bit states have no absmax; leave it empty"; });
    }
  }
}

// The dynamic tree maps' search tables, built once per process.
const blockwise_ops::tables& dynamic_tables(bool is_signed) {
  const auto make = [](bool sg) {
    blockwise_ops::tables t;
    const codebook cb = codebook::dynamic_tree(sg);
    blockwise_ops::prepare(cb.values().data(), t);
    return t;
  };
  static const blockwise_ops::tables signed_tables = make(true), unsigned_tables = make(false);
  return is_signed ? signed_tables : unsigned_tables;
}

bool plainly_flat(const tensor_view& v) {
  if (v.ndim < 0 || v.ndim > max_dims)
    return false;
  for (int k = 0; k < v.ndim; ++k)
    if (v.shape[static_cast<std::size_t>(k)] < 0)
      return false;
  return (v.numel() == 0 || v.data != nullptr) && v.is_contiguous();
}

// Whether check_tensor would pass, without building a message.
bool plainly_valid(const optim_tensor& t, int ns, std::int64_t block, const device& dev) {
  const tensor_view& pv = t.param;
  if (!plainly_flat(pv) || !plainly_flat(t.grad) || t.grad.type != pv.type ||
      !pv.same_shape(t.grad) || pv.dev != dev || t.grad.dev != dev)
    return false;
  if (pv.type != dtype::float32 && pv.type != dtype::bfloat16 && pv.type != dtype::float16)
    return false;
  const std::int64_t n = pv.numel(), blocks = blockwise_blocks(n, block);
  const tensor_view& r = t.residual;
  if (r.data != nullptr && (pv.type == dtype::float32 || !plainly_flat(r) || r.numel() != n ||
                            r.dev != dev || (r.type != dtype::int16 && r.type != dtype::int8)))
    return false;
  const bool eight = ns > 0 && t.state1.type == dtype::uint8;
  const tensor_view* st[3] = {&t.state1, &t.state2, &t.state3};
  const tensor_view* am[3] = {&t.absmax1, &t.absmax2, &t.absmax3};
  for (int k = 0; k < 3; ++k) {
    const tensor_view &s = *st[k], &a = *am[k];
    if (k >= ns) {
      if (s.data != nullptr || a.data != nullptr)
        return false;
      continue;
    }
    if (!plainly_flat(s) || s.numel() != n || (n > 0 && s.data == nullptr) || s.dev != dev ||
        s.type != (eight ? dtype::uint8 : dtype::float32))
      return false;
    if (eight
            ? (!plainly_flat(a) || a.type != dtype::float32 || a.numel() != blocks || a.dev != dev)
            : a.data != nullptr)
      return false;
  }
  return true;
}

} // namespace

void optimizer_step(optimizer o, const optim_hparams& h, const optim_tensor* tensors,
                    std::int64_t count, const tensor_view& skipped, const optim_config& cfg,
                    const exec& ex) {
  check_hparams(o, h);
  require(count >= 0, errc::invalid_argument, "optimizer_step: count must be >= 0");
  require(count == 0 || tensors != nullptr, errc::invalid_argument,
          "optimizer_step: tensors is null");
  require(cfg.block == 256 || cfg.block == 2048, errc::invalid_argument, [&] {
    return "optimizer_step: block = " + std::to_string(cfg.block) +
           " is not supported; expected 256 or 2048";
  });
  require(cfg.rounding == codebook_rounding::nearest ||
              cfg.rounding == codebook_rounding::stochastic,
          errc::invalid_argument, "optimizer_step: unknown rounding");
  optim_problem p;
  p.sh.kind = o;
  p.sh.states = optimizer_states(o, h);
  p.sh.c = coeffs_of(o, h);
  p.sh.lr = h.lr;
  p.sh.wd = h.weight_decay;
  p.sh.eps = h.eps;
  p.sh.max_trust_ratio = h.max_trust_ratio;
  p.sh.trust_coefficient = h.trust_coefficient;
  p.sh.prepass =
      o == optimizer::stable_adamw || ((o == optimizer::lamb || o == optimizer::lars) && h.adapt);
  p.sh.eta0 = o == optimizer::lars ? 1.0f : p.sh.c.lr; // LARS: the ratio 1; others: lr
  p.sh.decay0 = 1.0f;
  p.sh.block = cfg.block;
  p.sh.stochastic = cfg.rounding == codebook_rounding::stochastic;
  p.sh.seed = cfg.seed;
  p.sh.offset = cfg.offset;
  const int ns = p.sh.states;

  bool any = false;
  const char* sname[3] = {"state1", "state2", "state3"};
  const char* aname[3] = {"absmax1", "absmax2", "absmax3"};
  for (std::int64_t j = 0; j < count; ++j) {
    const optim_tensor& t = tensors[j];
    if (!any) {
      p.dev = t.param.dev;
      any = true;
    }
    if (!plainly_valid(t, ns, cfg.block, p.dev))
      check_tensor(o, ns, cfg.block, j, t, p.dev); // throws, naming what is wrong
    const std::int64_t n = t.param.numel();
    const std::int64_t blocks = blockwise_blocks(n, cfg.block);
    optim_item it;
    it.param = t.param.data;
    it.grad = t.grad.data;
    it.n = n;
    it.block0 = p.total_blocks;
    it.ptype = kind_of(t.param.type);
    it.eight_bit = ns > 0 && t.state1.type == dtype::uint8;
    const tensor_view* st[3] = {&t.state1, &t.state2, &t.state3};
    const tensor_view* am[3] = {&t.absmax1, &t.absmax2, &t.absmax3};
    if (cfg.check_device_memory && p.dev.type == device_type::cuda && n > 0) {
      const std::string pn = at(j, "param"), gn = at(j, "grad");
      require_device_memory({&t.param, &t.grad}, {pn.c_str(), gn.c_str()});
      if (t.residual.data != nullptr) {
        const std::string rn = at(j, "residual");
        require_device_memory({&t.residual}, {rn.c_str()});
      }
      for (int k = 0; k < ns; ++k) {
        const std::string sn = at(j, sname[k]);
        require_device_memory({st[k]}, {sn.c_str()});
        if (it.eight_bit) {
          const std::string an = at(j, aname[k]);
          require_device_memory({am[k]}, {an.c_str()});
        }
      }
    }
    it.s1 = t.state1.data;
    it.s2 = t.state2.data;
    it.a1 = static_cast<float*>(t.absmax1.data);
    it.a2 = static_cast<float*>(t.absmax2.data);
    it.s3 = t.state3.data;
    it.a3 = static_cast<float*>(t.absmax3.data);
    if (t.residual.data != nullptr) {
      it.resid = t.residual.data;
      it.rbits = t.residual.type == dtype::int16 ? 16 : 8;
    }
    p.total_blocks += blocks;
    p.items.push_back(it);
  }
  if (skipped.data != nullptr) {
    require_valid(skipped, "skipped");
    require_dtype(skipped, "skipped", {dtype::int64});
    require(skipped.numel() == count, errc::invalid_argument, [&] {
      return "skipped: " + std::to_string(skipped.numel()) +
             " elements; expected one per tensor (" + std::to_string(count) + ")";
    });
    require_contiguous(skipped, "skipped");
    if (any)
      require(skipped.dev == p.dev, errc::invalid_argument, [&] {
        return "skipped: on " + device_name(skipped.dev) + ", the tensors on " + device_name(p.dev);
      });
    if (cfg.check_device_memory && skipped.dev.type == device_type::cuda && count > 0)
      require_device_memory({&skipped}, {"skipped"});
    p.skipped = skipped.ptr<std::int64_t>();
  }
  if (p.total_blocks == 0)
    return;
  p.tb_signed = dynamic_tables(true);
  p.tb_unsigned = dynamic_tables(false);
  if (p.dev.type == device_type::cuda) {
    cuda::optimizer_step(p, ex);
    return;
  }
  cpu::optimizer_step(p, ex);
}

} // namespace lowbit::kernels
