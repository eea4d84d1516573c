// torch binding of the native tier: tensors in, tensors out. Each op takes the row kernels
// of the instruction set in use (cpu.h), runs them over the rows on the schedule of
// schedule.h and finishes each row by merge.h, then the module binds the ops (the fused
// attention kernel binds its own, attention.cpp). docs/native.md.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cpu.h"
#include "merge.h"
#include "schedule.h"
#include "table.h"

namespace {

using eb::Table;

eb::Dtype dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kDouble: return eb::F64;
    case at::kFloat: return eb::F32;
    case at::kHalf: return eb::F16;
    case at::kBFloat16: return eb::BF16;
    default: TORCH_CHECK(false, "the native kernels take fp64, fp32, fp16 or bf16, not ", t.scalar_type());
  }
}

struct Rows {
  at::Tensor x;  // contiguous, rows last
  int64_t rows, n;
  eb::Dtype dt;
};

Rows rows_of(const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu(), "the native kernels run on CPU tensors");
  TORCH_CHECK(x.dim() >= 1, "x needs at least one dimension");
  Rows r{x.contiguous(), 0, x.dim() ? x.size(-1) : 1, dtype_of(x)};
  r.rows = r.n ? x.numel() / r.n : 0;
  return r;
}

// A contiguous tensor's data and element size, read once per call rather than per row (a
// short row's kernels cost about as much as reading a tensor's data pointer twice).
struct RowBase {
  char* p;
  int64_t size;
  explicit RowBase(const at::Tensor& t)
      : p(static_cast<char*>(const_cast<void*>(t.data_ptr()))), size(t.element_size()) {}
};
const char* ptr(const RowBase& t, int64_t row, int64_t n, int64_t i0) {
  return t.p + (row * n + i0) * t.size;
}
char* mptr(const RowBase& t, int64_t row, int64_t n, int64_t i0) {
  return t.p + (row * n + i0) * t.size;
}

// Rows of x along its last dimension (without making x contiguous, as rows_of does).
int64_t row_count(const at::Tensor& x) {
  const int64_t n = x.dim() ? x.size(-1) : 1;
  return n ? x.numel() / n : 0;
}

// tau and offset of each row: one pair for every row, or per-row (rows,) fp64 tensors.
struct RowParams {
  double tau, offset;
  at::Tensor tau_rows, offset_rows;  // undefined: the scalars serve every row
  const double* t = nullptr;
  const double* o = nullptr;

  RowParams(double tau_, double offset_, const at::Tensor& tr, const at::Tensor& orows, int64_t rows)
      : tau(tau_), offset(offset_) {
    if (tr.defined()) {
      TORCH_CHECK(tr.scalar_type() == at::kDouble && tr.numel() == rows && tr.device().is_cpu(),
                  "per-row tau: a CPU float64 tensor of one value per row");
      tau_rows = tr.contiguous();
      t = tau_rows.data_ptr<double>();
      for (int64_t r = 0; r < rows; ++r)
        TORCH_CHECK(t[r] > 0 && std::isfinite(t[r]), "tau must be finite and > 0");
    } else {
      TORCH_CHECK(tau > 0 && std::isfinite(tau), "tau must be finite and > 0");
    }
    if (orows.defined()) {
      TORCH_CHECK(orows.scalar_type() == at::kDouble && orows.numel() == rows && orows.device().is_cpu(),
                  "per-row offset: a CPU float64 tensor of one value per row");
      offset_rows = orows.contiguous();
      o = offset_rows.data_ptr<double>();
    }
  }
  double tau_of(int64_t r) const { return t ? t[r] : tau; }
  double offset_of(int64_t r) const { return o ? o[r] : offset; }
  eb::ExpSpec spec(int mask_negative, double floor, int64_t r) const {
    return eb::ExpSpec{mask_negative, floor, tau_of(r), offset_of(r)};
  }
};

at::Tensor exp_forward_impl(const at::Tensor& x_in, eb::Structure structure, bool mask_negative,
                            double floor, const RowParams& rp) {
  Rows in = rows_of(x_in);
  const Table* t = eb::current_table();
  auto partial_fn = t->exp_partial[structure][in.dt];
  auto write_fn = t->exp_write[structure][in.dt];
  TORCH_CHECK(partial_fn && write_fn, "this pass structure does not take ", x_in.scalar_type());
  at::Tensor y = at::empty_like(in.x);
  if (in.x.numel() == 0) return y;
  const int mneg = mask_negative ? 1 : 0;
  const int64_t n = in.n;
  const eb::Plan how = eb::plan(in.rows, n, 2 * in.x.element_size());  // x, and y (the fused exps)
  const int64_t per = eb::fused_scratch(eb::segment_length(n, how.s), in.dt, structure);
  std::vector<eb::ExpRow> verdict(in.rows);
  const RowBase xb(in.x), yb(y);
  eb::drive<eb::ExpPartial>(
      in.rows, n, how, per,
      [&](int64_t r, int64_t i0, int64_t i1, int64_t, double* scratch) {
        return partial_fn(ptr(xb, r, n, i0), mptr(yb, r, n, i0), i1 - i0, rp.spec(mneg, floor, r),
                          scratch);
      },
      [&](int64_t r, const eb::ExpPartial* p, int64_t count) {
        verdict[r] = eb::finish_exp(p, count, rp.spec(mneg, floor, r));
      },
      [&](int64_t r, int64_t i0, int64_t i1, int64_t, double* scratch) {
        write_fn(ptr(xb, r, n, i0), mptr(yb, r, n, i0), i1 - i0, rp.spec(mneg, floor, r), verdict[r],
                 scratch);
      });
  return y;
}

at::Tensor exp_forward(const at::Tensor& x_in, eb::Structure structure, bool mask_negative,
                       double floor, double tau, double offset) {
  TORCH_CHECK(structure >= 0 && structure < eb::NUM_STRUCTURES, "unknown pass structure");
  return exp_forward_impl(x_in, structure, mask_negative, floor,
                          RowParams(tau, offset, at::Tensor(), at::Tensor(), 0));
}

// The fused forward with a tau and an offset per row (fp64 tensors of one value per row).
at::Tensor exp_forward_rows(const at::Tensor& x_in, bool mask_negative, double floor,
                            const at::Tensor& tau_rows, const at::Tensor& offset_rows) {
  return exp_forward_impl(x_in, eb::FUSED, mask_negative, floor,
                          RowParams(1.0, 0.0, tau_rows, offset_rows, row_count(x_in)));
}

at::Tensor weight_forward(const at::Tensor& x_in, bool symax, double constant) {
  Rows in = rows_of(x_in);
  const Table* t = eb::current_table();
  auto partial_fn = t->weight_partial[in.dt];
  auto write_fn = t->weight_write[in.dt];
  at::Tensor y = at::empty_like(in.x);
  if (in.x.numel() == 0) return y;
  std::vector<eb::WeightRow> verdict(in.rows);
  const int64_t n = in.n;
  const RowBase xb(in.x), yb(y);
  eb::drive<eb::WeightPartial>(
      in.rows, n, eb::plan(in.rows, n, in.x.element_size()), 0,
      [&](int64_t r, int64_t i0, int64_t i1, int64_t, double*) {
        return partial_fn(ptr(xb, r, n, i0), i1 - i0, symax ? 1 : 0);
      },
      [&](int64_t r, const eb::WeightPartial* p, int64_t count) {
        verdict[r] = eb::finish_weight(p, count, constant);
      },
      [&](int64_t r, int64_t i0, int64_t i1, int64_t, double*) {
        const eb::WeightRow& v = verdict[r];
        write_fn(ptr(xb, r, n, i0), mptr(yb, r, n, i0), i1 - i0, symax ? 1 : 0, v.top, v.den, v.cls,
                 v.ninf);
      });
  return y;
}

// dx, and per-row (rows,) fp64 contributions to dtau and doffset when params.
std::vector<at::Tensor> exp_backward_impl(const at::Tensor& x_in, const at::Tensor& y_in,
                                          const at::Tensor& g_in, bool mask_negative,
                                          const RowParams& rp, bool params) {
  TORCH_CHECK(x_in.sizes() == y_in.sizes() && x_in.sizes() == g_in.sizes(),
              "x, y and g must have one shape");
  TORCH_CHECK(x_in.scalar_type() == y_in.scalar_type() && x_in.scalar_type() == g_in.scalar_type(),
              "x, y and g must have one dtype");
  Rows in = rows_of(x_in);
  at::Tensor y = y_in.contiguous(), g = g_in.contiguous();
  const Table* t = eb::current_table();
  auto partial_fn = t->bwd_partial[in.dt];
  auto write_fn = t->bwd_write[in.dt];
  at::Tensor dx = at::empty_like(in.x);
  auto opts = at::TensorOptions().dtype(at::kDouble);
  at::Tensor dtau = at::zeros({in.rows}, opts), doff = at::zeros({in.rows}, opts);
  if (in.x.numel() == 0) return {dx, dtau, doff};
  // Without parameter gradients, pass 1 reads y and g alone (x is a third of its traffic).
  // y then settles the class of a row whose sum c is a number and whose nonzero outputs are
  // not all equal: a +inf row's nonzero outputs are all 1/k, a NaN row's are NaN. Any other
  // row (one-hot, ties, NaN) is read again with x for the census. With them, pass 1 reads x
  // once and forms the sums dtau needs too; pass 2 reads y and g alone either way.
  const bool y_only = !params;
  const int64_t n = in.n;
  const eb::Plan how = eb::plan(in.rows, n, 2 * in.x.element_size());  // pass 2 rereads y and g
  std::vector<eb::BwdRow> verdict(in.rows);
  const int mneg = mask_negative ? 1 : 0;
  const RowBase xb(in.x), yb(y), gb(g), dxb(dx);
  eb::drive<eb::BwdPartial>(
      in.rows, n, how, 0,
      [&](int64_t r, int64_t i0, int64_t i1, int64_t, double*) {
        return partial_fn(y_only ? nullptr : ptr(xb, r, n, i0), ptr(yb, r, n, i0),
                          ptr(gb, r, n, i0), i1 - i0, mneg);
      },
      [&](int64_t r, const eb::BwdPartial* p, int64_t count) {
        eb::BwdPartial row = eb::merge_bwd(p, count);
        if (y_only && eb::needs_census(row))
          row = partial_fn(ptr(xb, r, n, 0), ptr(yb, r, n, 0), ptr(gb, r, n, 0), n, mneg);
        verdict[r] = eb::finish_bwd(row, p, count, !y_only, rp.tau_of(r));
      },
      [&](int64_t r, int64_t i0, int64_t i1, int64_t, double*) {
        write_fn(ptr(yb, r, n, i0), ptr(gb, r, n, i0), mptr(dxb, r, n, i0), i1 - i0, verdict[r].cls,
                 verdict[r].c, rp.tau_of(r));
      });
  if (params) {
    double* dt = dtau.data_ptr<double>();
    double* db = doff.data_ptr<double>();
    for (int64_t r = 0; r < in.rows; ++r)
      eb::param_grads(verdict[r], rp.tau_of(r), rp.offset_of(r), dt[r], db[r]);
  }
  return {dx, dtau, doff};
}

std::vector<at::Tensor> exp_backward(const at::Tensor& x_in, const at::Tensor& y_in,
                                     const at::Tensor& g_in, bool mask_negative, double tau,
                                     double offset, bool params) {
  return exp_backward_impl(x_in, y_in, g_in, mask_negative,
                           RowParams(tau, offset, at::Tensor(), at::Tensor(), 0), params);
}

// The backward with a tau and an offset per row (fp64 tensors of one value per row).
std::vector<at::Tensor> exp_backward_rows(const at::Tensor& x_in, const at::Tensor& y_in,
                                          const at::Tensor& g_in, bool mask_negative,
                                          const at::Tensor& tau_rows, const at::Tensor& offset_rows,
                                          bool params) {
  return exp_backward_impl(x_in, y_in, g_in, mask_negative,
                           RowParams(1.0, 0.0, tau_rows, offset_rows, row_count(x_in)), params);
}

// sum(exp(x)) over a contiguous x <= 0, in chunks over the threads: the exp ceiling's probe.
double exp_sum(const at::Tensor& x_in) {
  TORCH_CHECK(x_in.device().is_cpu(), "exp_sum: a CPU tensor");
  const at::Tensor x = x_in.contiguous();
  const auto fn = eb::current_table()->exp_sum[dtype_of(x)];
  const char* base = static_cast<const char*>(x.data_ptr());
  const int64_t n = x.numel(), size = x.element_size(), grain = 1 << 14;
  std::vector<double> parts((n + grain - 1) / grain, 0.0);
  at::parallel_for(0, (int64_t)parts.size(), 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      parts[c] = fn(base + c * grain * size, std::min(grain, n - c * grain));
  });
  double total = 0;
  for (double p : parts) total += p;
  return total;
}

std::string isa() { return eb::current_table()->isa; }

// ---------------------------------------------------------------------------------------
// Autograd for the library's eager calls on CPU tensors (elasticbench.rows.ops,
// elasticbench.nn; docs/dispatch.md section 5): the same kernels as the ops above, as C++
// autograd functions, so that a small call does not pay a Python autograd function's
// forward and, above all, its backward through the engine.

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Called (with the GIL) where autograd builds the gradient's own graph (create_graph): the
// differentiable torch code of elasticbench.rows.ops. Set once from Python, never freed.
pybind11::object* differentiable_rows_backward = nullptr;

bool per_row(const at::Tensor& t) { return t.defined() && t.dim() > 0; }

// A parameter as one fp64 value per row of x (given, (..., 1) broadcasting against x, or the
// float `value` where t is undefined).
at::Tensor param_rows(const at::Tensor& t, double value, const at::Tensor& x) {
  if (!t.defined()) return at::full({row_count(x)}, value, at::TensorOptions().dtype(at::kDouble));
  std::vector<int64_t> lead = x.sizes().vec();
  lead.back() = 1;
  return t.detach().expand(lead).reshape({-1}).to(at::kDouble).contiguous();
}

double param_value(const at::Tensor& t, double value) { return t.defined() ? t.item<double>() : value; }

// Per-row (rows,) fp64 gradients summed to the parameter's shape, in its dtype.
at::Tensor fit(const at::Tensor& rows, const at::Tensor& like, const at::Tensor& x) {
  std::vector<int64_t> lead = x.sizes().vec();
  lead.back() = 1;
  return at::sum_to(rows.reshape(lead), like.sizes()).to(like.scalar_type());
}

struct ExpRows : public torch::autograd::Function<ExpRows> {
  // tau and offset: tensors (0-d, or (..., 1) broadcasting against x) where has_tau and
  // has_offset say so, else stand-ins (autograd takes no undefined input) for the floats
  // beside them; offset 0 means none.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& tau_in,
                            const at::Tensor& offset_in, bool has_tau, bool has_offset,
                            double tau_value, double offset_value, bool mask_negative,
                            double floor) {
    const at::Tensor tau = has_tau ? tau_in : at::Tensor();
    const at::Tensor offset = has_offset ? offset_in : at::Tensor();
    at::Tensor y;
    if (per_row(tau) || per_row(offset)) {
      y = exp_forward_rows(x, mask_negative, floor, param_rows(tau, tau_value, x),
                           param_rows(offset, offset_value, x));
    } else {
      y = exp_forward(x, eb::FUSED, mask_negative, floor, param_value(tau, tau_value),
                      param_value(offset, offset_value));
    }
    ctx->save_for_backward({x, y, tau_in, offset_in});
    ctx->saved_data["has_tau"] = has_tau;
    ctx->saved_data["has_offset"] = has_offset;
    ctx->saved_data["tau_value"] = tau_value;
    ctx->saved_data["offset_value"] = offset_value;
    ctx->saved_data["mask_negative"] = mask_negative;
    ctx->saved_data["floor"] = floor;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &y = saved[1];
    const at::Tensor tau = ctx->saved_data["has_tau"].toBool() ? saved[2] : at::Tensor();
    const at::Tensor offset = ctx->saved_data["has_offset"].toBool() ? saved[3] : at::Tensor();
    const double tau_value = ctx->saved_data["tau_value"].toDouble();
    const double offset_value = ctx->saved_data["offset_value"].toDouble();
    const bool mask_negative = ctx->saved_data["mask_negative"].toBool();
    const double floor = ctx->saved_data["floor"].toDouble();
    const bool need_tau = tau.defined() && ctx->needs_input_grad(1);
    const bool need_offset = offset.defined() && ctx->needs_input_grad(2);
    const at::Tensor g = grads[0].contiguous();
    at::Tensor dtau, doffset;
    if (at::GradMode::is_enabled()) {
      pybind11::gil_scoped_acquire gil;
      auto none_or = [](const at::Tensor& t) {
        return t.defined() ? pybind11::cast(t) : pybind11::none();
      };
      pybind11::tuple r = (*differentiable_rows_backward)(
          x, y, g, none_or(tau), none_or(offset), tau_value, offset_value, mask_negative, floor,
          need_tau, need_offset);
      auto tensor_or = [](pybind11::handle h) {
        return h.is_none() ? at::Tensor() : h.cast<at::Tensor>();
      };
      return {tensor_or(r[0]), tensor_or(r[1]), tensor_or(r[2]), at::Tensor(), at::Tensor(),
              at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    }
    const bool params = need_tau || need_offset;
    std::vector<at::Tensor> out;
    if (per_row(tau) || per_row(offset)) {
      out = exp_backward_rows(x, y, g, mask_negative, param_rows(tau, tau_value, x),
                              param_rows(offset, offset_value, x), params);
    } else {
      out = exp_backward(x, y, g, mask_negative, param_value(tau, tau_value),
                         param_value(offset, offset_value), params);
    }
    if (need_tau) dtau = fit(out[1], tau, x);
    if (need_offset) doffset = fit(out[2], offset, x);
    return {out[0], dtau, doffset, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

at::Tensor exp_rows(const at::Tensor& x, const c10::optional<at::Tensor>& tau,
                    const c10::optional<at::Tensor>& offset, double tau_value,
                    double offset_value, bool mask_negative, double floor) {
  return ExpRows::apply(x, tau.value_or(x), offset.value_or(x), tau.has_value(),
                        offset.has_value(), tau_value, offset_value, mask_negative, floor);
}

// where(-limit <= s <= limit, a b [c], 0) as the torch ops give it (exact products in their
// order, then the clamp's mask: NaN s gives 0), in one loop where every operand is a CPU
// float or double tensor of s's shape and dtype; through those ops otherwise. Five or six
// small ops a parameter in each backward are a visible share of a small model's step.
at::Tensor masked_product(const at::Tensor& s, double limit, const at::Tensor& a,
                          const at::Tensor& b, const at::Tensor& c = at::Tensor()) {
  const auto fits = [&](const at::Tensor& t) {
    return !t.defined() || (t.device().is_cpu() && t.scalar_type() == s.scalar_type() &&
                            t.sizes() == s.sizes());
  };
  const bool fast = s.device().is_cpu() && (s.scalar_type() == at::kFloat ||
                                            s.scalar_type() == at::kDouble) &&
                    fits(a) && fits(b) && fits(c);
  if (!fast) {
    const at::Tensor g = c.defined() ? (a * b) * c : a * b;
    return at::where((s >= -limit).logical_and_(s <= limit), g, at::zeros({}, g.options()));
  }
  at::Tensor out = at::empty(s.sizes(), a.options());
  AT_DISPATCH_FLOATING_TYPES(s.scalar_type(), "masked_product", [&] {
    const at::Tensor sc = s.contiguous(), ac = a.contiguous(), bc = b.contiguous();
    const at::Tensor cc = c.defined() ? c.contiguous() : at::Tensor();
    const scalar_t *sp = sc.data_ptr<scalar_t>(), *ap = ac.data_ptr<scalar_t>(),
                   *bp = bc.data_ptr<scalar_t>();
    const scalar_t* cp = cc.defined() ? cc.data_ptr<scalar_t>() : nullptr;
    scalar_t* op = out.data_ptr<scalar_t>();
    const scalar_t lo = scalar_t(-limit), hi = scalar_t(limit);
    for (int64_t i = 0, n = out.numel(); i < n; ++i) {
      scalar_t g = ap[i] * bp[i];
      if (cp) g = g * cp[i];
      op[i] = sp[i] >= lo && sp[i] <= hi ? g : scalar_t(0);
    }
  });
  return out;
}

at::Tensor log_scaled(const at::Tensor& base, const at::Tensor& log_scale, double limit) {
  at::Tensor scale = log_scale.clamp(-limit, limit).exp();
  return (log_scale.scalar_type() == at::kDouble ? base : base.to(log_scale.scalar_type())) * scale;
}

// (tau0 exp(s_tau), beta0 exp(s_beta)), the log-scales clamped to [-limit, limit], in the
// log-scales' dtypes (elasticbench.nn's parametrization) as one autograd node.
struct ScaledParams : public torch::autograd::Function<ScaledParams> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& tau0,
                               const at::Tensor& log_tau, const at::Tensor& beta0,
                               const at::Tensor& log_beta, double limit) {
    at::Tensor tau = log_scaled(tau0, log_tau, limit), beta = log_scaled(beta0, log_beta, limit);
    ctx->save_for_backward({tau, log_tau, beta, log_beta});
    ctx->saved_data["limit"] = limit;
    return {tau, beta};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const double limit = ctx->saved_data["limit"].toDouble();
    auto grad = [&](const at::Tensor& g, const at::Tensor& value, const at::Tensor& s) {
      if (!g.defined()) return at::zeros_like(s);
      return masked_product(s, limit, g, value);
    };
    at::Tensor d_tau = ctx->needs_input_grad(1) ? grad(grads[0], saved[0], saved[1]) : at::Tensor();
    at::Tensor d_beta = ctx->needs_input_grad(3) ? grad(grads[1], saved[2], saved[3]) : at::Tensor();
    return {at::Tensor(), d_tau, at::Tensor(), d_beta, at::Tensor()};
  }
};

std::vector<at::Tensor> scaled_params(const at::Tensor& tau0, const at::Tensor& log_tau,
                                      const at::Tensor& beta0, const at::Tensor& log_beta,
                                      double limit) {
  return ScaledParams::apply(tau0, log_tau, beta0, log_beta, limit);
}

// base exp(clamp(s)) as elasticbench.nn's torch code forms one parameter (symax's eta), as
// one autograd node: the same ops forward, and backward the chain autograd would run through
// them, in its order ((g base) exp(s), then the clamp's mask), so the same bits.
struct ScaledParam : public torch::autograd::Function<ScaledParam> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& base, const at::Tensor& s,
                            double limit) {
    const at::Tensor e = s.clamp(-limit, limit).exp();
    const at::Tensor b = s.scalar_type() == at::kDouble ? base : base.to(s.scalar_type());
    ctx->save_for_backward({b, e, s});
    ctx->saved_data["limit"] = limit;
    return b * e;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const double limit = ctx->saved_data["limit"].toDouble();
    const at::Tensor &b = saved[0], &e = saved[1], &s = saved[2];
    at::Tensor d;
    if (ctx->needs_input_grad(1)) d = masked_product(s, limit, grads[0], b, e);
    return {at::Tensor(), d, at::Tensor()};
  }
};

at::Tensor scaled_param(const at::Tensor& base, const at::Tensor& s, double limit) {
  return ScaledParam::apply(base, s, limit);
}

// Called (with the GIL) for ElasticScaled's backward where autograd builds the gradient's
// graph: elasticbench.nn's torch code. Set once from Python, never freed.
pybind11::object* differentiable_scaled_backward = nullptr;

// A parameter of elasticbench.nn's shape laid out against x (leading dims of 1 added, the
// rows' dimension last), in x's working precision (fp64 for fp64 x, else fp32).
at::Tensor against(const at::Tensor& p, const at::Tensor& x) {
  const auto work = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor t = p.to(work);
  if (t.dim() == 0) return t;
  std::vector<int64_t> shape(x.dim() - t.dim(), 1);
  for (int64_t s : t.sizes()) shape.push_back(s);
  return t.reshape(shape);
}

// The gradient of s for v = base exp(clamp(s)): grad * v inside the clamp, else 0, in s's
// dtype and shape (grad: v's gradient laid out against x, summed back to s's shape).
at::Tensor through_scale(const at::Tensor& grad, const at::Tensor& v, const at::Tensor& s,
                         double limit) {
  at::Tensor g = grad.reshape(s.sizes()).to(s.scalar_type()) * v;
  return at::where((s >= -limit) & (s <= limit), g, at::zeros({}, g.options()));
}

// through_scale for a 0-d fp32 or fp64 log-scale, from the per-row fp64 gradients, as host
// arithmetic with the same roundings (the total summed by at::sum, rounded to the working
// dtype, then to s's, times v in s's dtype), in three small ops instead of ten.
at::Tensor through_scalar_scale(const at::Tensor& rows, at::ScalarType work, const at::Tensor& v,
                                const at::Tensor& s, double limit) {
  double g = rows.sum().item<double>();
  if (work == at::kFloat) g = static_cast<float>(g);
  const double sv = s.item<double>();
  double out = 0.0;
  if (sv >= -limit && sv <= limit) {
    out = s.scalar_type() == at::kFloat
              ? static_cast<double>(static_cast<float>(g) * v.item<float>())
              : g * v.item<double>();
  }
  return at::scalar_tensor(out, s.options());
}

// log_scaled, for a 0-d fp32 or fp64 log-scale as host arithmetic with the same roundings
// (the clamp exact, std::exp of the dtype, which is what torch's CPU exp runs on one
// element, the base rounded to the dtype, one product): one small op instead of four.
at::Tensor scaled_value(const at::Tensor& base, const at::Tensor& s, double limit) {
  if (s.dim() != 0 || base.dim() != 0 || !s.device().is_cpu()) return log_scaled(base, s, limit);
  const double sv = std::min(std::max(s.item<double>(), -limit), limit);
  if (s.scalar_type() == at::kFloat) {
    const float e = std::exp(static_cast<float>(sv));
    return at::scalar_tensor(static_cast<float>(base.item<double>()) * e, s.options());
  }
  if (s.scalar_type() == at::kDouble)
    return at::scalar_tensor(base.item<double>() * std::exp(sv), s.options());
  return log_scaled(base, s, limit);
}

// ElasticSoftmax's forward along x's last dimension with tau = tau0 exp(s_tau) and beta =
// beta0 exp(s_beta) formed inside, as one autograd node whose gradients go to x and the two
// log-scales (elasticbench.nn; docs/dispatch.md section 5).
struct ElasticScaled : public torch::autograd::Function<ElasticScaled> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& tau0,
                            const at::Tensor& log_tau, const at::Tensor& beta0,
                            const at::Tensor& log_beta, double limit) {
    const at::Tensor tau_v = scaled_value(tau0, log_tau, limit);
    const at::Tensor beta_v = scaled_value(beta0, log_beta, limit);
    const at::Tensor tau = against(tau_v, x), beta = against(beta_v, x);
    const double ninf = -std::numeric_limits<double>::infinity();
    at::Tensor y;
    if (per_row(tau) || per_row(beta)) {
      y = exp_forward_rows(x, true, ninf, param_rows(tau, 0.0, x), param_rows(beta, 0.0, x));
    } else {
      y = exp_forward(x, eb::FUSED, true, ninf, tau.item<double>(), beta.item<double>());
    }
    ctx->save_for_backward({x, y, tau0, log_tau, beta0, log_beta, tau_v, beta_v});
    ctx->saved_data["limit"] = limit;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &y = saved[1], &log_tau = saved[3], &log_beta = saved[5];
    const double limit = ctx->saved_data["limit"].toDouble();
    const bool need_tau = ctx->needs_input_grad(2), need_beta = ctx->needs_input_grad(4);
    const at::Tensor g = grads[0].contiguous();
    if (at::GradMode::is_enabled()) {
      pybind11::gil_scoped_acquire gil;
      pybind11::tuple r = (*differentiable_scaled_backward)(
          x, y, g, saved[2], log_tau, saved[4], log_beta, limit, need_tau, need_beta);
      auto tensor_or = [](pybind11::handle h) {
        return h.is_none() ? at::Tensor() : h.cast<at::Tensor>();
      };
      return {tensor_or(r[0]), at::Tensor(), tensor_or(r[1]), at::Tensor(), tensor_or(r[2]),
              at::Tensor()};
    }
    const at::Tensor tau = against(saved[6], x), beta = against(saved[7], x);
    const bool params = need_tau || need_beta;
    std::vector<at::Tensor> out;
    if (per_row(tau) || per_row(beta)) {
      out = exp_backward_rows(x, y, g, true, param_rows(tau, 0.0, x), param_rows(beta, 0.0, x),
                              params);
    } else {
      out = exp_backward(x, y, g, true, tau.item<double>(), beta.item<double>(), params);
    }
    auto grad_of = [&](const at::Tensor& rows, const at::Tensor& laid, const at::Tensor& v,
                       const at::Tensor& s) {
      if (s.dim() == 0 && (s.scalar_type() == at::kFloat || s.scalar_type() == at::kDouble))
        return through_scalar_scale(rows, laid.scalar_type(), v, s, limit);
      return through_scale(fit(rows, laid, x), v, s, limit);
    };
    at::Tensor d_tau, d_beta;
    if (need_tau) d_tau = grad_of(out[1], tau, saved[6], log_tau);
    if (need_beta) d_beta = grad_of(out[2], beta, saved[7], log_beta);
    return {out[0], at::Tensor(), d_tau, at::Tensor(), d_beta, at::Tensor()};
  }
};

at::Tensor elastic_scaled(const at::Tensor& x, const at::Tensor& tau0, const at::Tensor& log_tau,
                          const at::Tensor& beta0, const at::Tensor& log_beta, double limit) {
  return ElasticScaled::apply(x, tau0, log_tau, beta0, log_beta, limit);
}

}  // namespace

namespace eb { void bind_attention(pybind11::module_& m, const char* (*isa)()); }  // attention.cpp

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "elasticbench native CPU kernels (docs/native.md)";
  pybind11::enum_<eb::Structure>(m, "Structure", "pass structures of exp_forward (docs/native.md)")
      .value("THREE_PASS", eb::THREE_PASS)
      .value("ONLINE", eb::ONLINE)
      .value("FUSED", eb::FUSED)
      .value("ACCURATE", eb::ACCURATE);
  m.def("exp_forward", &exp_forward, "exp-family forward (elastic, softmax, softmax1)");
  m.def("weight_forward", &weight_forward, "weight-family forward (stablemax, symax)");
  m.def("exp_backward", &exp_backward, "exp-family backward: dx and per-row dtau, doffset");
  m.def("exp_forward_rows", &exp_forward_rows, "fused exp-family forward, tau and offset per row");
  m.def("exp_backward_rows", &exp_backward_rows, "exp-family backward, tau and offset per row");
  m.def("exp_sum", &exp_sum, "sum of exp(x) over x <= 0: the roofline's exp probe");
  m.def("isa", &isa, "the instruction set in use");
  m.def("isas", &eb::isas, "instruction sets this CPU can run, widest first");
  m.def("set_isa", &eb::set_isa, "use the kernels of this instruction set");
  m.def("exp_rows", &exp_rows, "exp-family rows with their gradients (a C++ autograd function)",
        pybind11::arg("x"), pybind11::arg("tau"), pybind11::arg("offset"),
        pybind11::arg("tau_value"), pybind11::arg("offset_value"), pybind11::arg("mask_negative"),
        pybind11::arg("floor"));
  m.def("set_differentiable_rows_backward", [](pybind11::object fn) {
    if (differentiable_rows_backward == nullptr) differentiable_rows_backward = new pybind11::object();
    *differentiable_rows_backward = std::move(fn);
  }, "the torch code exp_rows's backward runs where autograd builds the gradient's graph");
  m.def("scaled_params", &scaled_params, "elasticbench.nn's (tau, beta) as one autograd node");
  m.def("scaled_param", &scaled_param,
        "base exp(clamp(s, -limit, limit)) (symax's eta) as one autograd node");
  m.def("elastic_scaled", &elastic_scaled,
        "ElasticSoftmax along the last dimension, tau and beta formed from their log-scales "
        "inside one autograd node");
  m.def("set_differentiable_scaled_backward", [](pybind11::object fn) {
    if (differentiable_scaled_backward == nullptr)
      differentiable_scaled_backward = new pybind11::object();
    *differentiable_scaled_backward = std::move(fn);
  }, "the torch code elastic_scaled's backward runs where autograd builds the gradient's graph");
  eb::bind_attention(m, [] { return eb::current_table()->isa; });  // follows set_isa
}
