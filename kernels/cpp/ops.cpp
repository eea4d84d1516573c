// torch binding of the native tier: tensors in, tensors out. Picks the row kernels of the
// widest instruction set this CPU has (or $ELASTICBENCH_CPP_ISA), spreads rows over torch's
// intra-op threads with at::parallel_for, splits rows too long for one core's L2 between the
// threads row by row, and few long rows in two phases (segment reductions, merged per row,
// then the segment writes). docs/native.md.
#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "table.h"

namespace {

using eb::Table;

bool cpu_has(const std::string& isa) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (isa == "avx512")
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  if (isa == "avx2")
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
#endif
  return isa == "generic";
}

const Table* table_of(const std::string& isa) {
#if defined(__x86_64__) || defined(__i386__)
  if (isa == "avx512") return eb_avx512::table();
  if (isa == "avx2") return eb_avx2::table();
#endif
  return eb_generic::table();
}

std::vector<std::string> isas() {
  std::vector<std::string> out;
  for (const char* isa : {"avx512", "avx2", "generic"})
    if (cpu_has(isa)) out.push_back(isa);
  return out;
}

const Table*& current() {
  static const Table* t = [] {
    const char* forced = std::getenv("ELASTICBENCH_CPP_ISA");
    if (forced && *forced) {
      TORCH_CHECK(cpu_has(forced), "ELASTICBENCH_CPP_ISA=", forced,
                  " is not available on this CPU (available: avx512, avx2, generic as supported)");
      return table_of(forced);
    }
    return table_of(isas().front());
  }();
  return t;
}

void set_isa(const std::string& isa) {
  TORCH_CHECK(isa == "avx512" || isa == "avx2" || isa == "generic", "unknown instruction set ", isa);
  TORCH_CHECK(cpu_has(isa), "this CPU cannot run the ", isa, " kernels");
  current() = table_of(isa);
}

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

const char* ptr(const at::Tensor& t, int64_t row, int64_t n, int64_t i0) {
  return static_cast<const char*>(t.data_ptr()) + (row * n + i0) * t.element_size();
}
char* mptr(at::Tensor& t, int64_t row, int64_t n, int64_t i0) {
  return static_cast<char*>(t.data_ptr()) + (row * n + i0) * t.element_size();
}

// One core's L2 in bytes (the OS's figure; 1 MiB where it gives none).
int64_t l2_bytes() {
  static const int64_t b = [] {
    long v = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return v > 0 ? int64_t(v) : int64_t(1) << 20;
  }();
  return b;
}

// How drive spreads rows over threads: s segments per row (1: whole rows, one thread each),
// and whether the threads take each row together (see drive). `bytes`: what one element
// costs the data a row's second sweep reads again (x and y, or y and g, ...).
struct Plan {
  int64_t s;
  bool together;
};

Plan plan(int64_t rows, int64_t n, int64_t bytes) {
  const int64_t threads = at::get_num_threads();
  constexpr int64_t MIN_SEGMENT = 1 << 15;
  if (threads <= 1) return {1, false};
#ifdef _OPENMP
  const int64_t room = l2_bytes() * 3 / 4;  // beside the output's lines and the stack
  if (n / threads >= MIN_SEGMENT && n * bytes > room && n * bytes / threads <= room)
    return {threads, true};
#endif
  if (rows % threads == 0 || rows >= 4 * threads || n < 2 * MIN_SEGMENT) return {1, false};
  int64_t s = (2 * threads + rows - 1) / rows;
  while (s > 1 && n / s < MIN_SEGMENT) --s;
  return {s, false};
}

// The kernels' scratch, left uninitialized: every kernel writes what it reads back (a
// zeroed vector cost a full write of a buffer up to twice the input's size per call).
struct Scratch : std::unique_ptr<double[]> {
  explicit Scratch(int64_t count) : std::unique_ptr<double[]>(count ? new double[count] : nullptr) {}
};

// Segment length for n split s ways (drive's), for sizing scratch.
int64_t segment_length(int64_t n, int64_t s) { return s == 1 ? n : ((n + s - 1) / s + 63) / 64 * 64; }

// Run partial(row, i0, i1, item, scratch) over every segment of plan p, finish(row, first, count) per
// row (serially: a few flops a row), then write(row, i0, i1, item, scratch) over every
// segment (item = row * segments + segment). Each segment gets `per` doubles of scratch
// that its write sees again. Three schedules:
// - whole rows, one thread each, a row finished while it is still in its core's cache;
// - rows too long for one core's L2 but not for all the cores' together: the threads take
//   the rows one after another, each row split between them and the threads meeting between
//   its sweeps, so that the second sweep reads the row from L2 instead of memory;
// - a few long rows (fewer than the threads): all segments' partials, then all writes.
template <class Partial, class PartialF, class FinishF, class WriteF>
void drive(int64_t rows, int64_t n, const Plan& p, int64_t per, PartialF partial,
           FinishF finish, WriteF write) {
  const int64_t s = p.s;
  if (s == 1) {
    const int64_t grain = std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(n, 1));
    at::parallel_for(0, rows, grain, [&](int64_t b, int64_t e) {
      Scratch scratch(per);  // one row's worth, reused along the chunk
      for (int64_t r = b; r < e; ++r) {
        Partial q = partial(r, 0, n, r, scratch.get());
        finish(r, &q, 1);
        write(r, 0, n, r, scratch.get());
      }
    });
    return;
  }
  const int64_t seg = segment_length(n, s);
  auto bounds = [&](int64_t item, int64_t& i0, int64_t& i1) {
    i0 = std::min(n, (item % s) * seg);
    i1 = std::min(n, i0 + seg);
  };
#ifdef _OPENMP
  if (p.together) {
    std::vector<Partial> parts(s);
    Scratch scratch(per * s);
#pragma omp parallel num_threads(int(s))
    {
      // a smaller team than asked (a nested call) takes several segments a thread
      const int64_t t = omp_get_thread_num(), team = omp_get_num_threads();
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t k = t; k < s; k += team) {
          int64_t i0, i1;
          bounds(k, i0, i1);
          parts[k] = partial(r, i0, i1, r * s + k, scratch.get() + k * per);
        }
#pragma omp barrier
        if (t == 0) finish(r, parts.data(), s);
#pragma omp barrier
        for (int64_t k = t; k < s; k += team) {
          int64_t i0, i1;
          bounds(k, i0, i1);
          write(r, i0, i1, r * s + k, scratch.get() + k * per);
        }
      }
    }
    return;
  }
#endif
  std::vector<Partial> parts(rows * s);
  Scratch scratch(per * rows * s);
  at::parallel_for(0, rows * s, 1, [&](int64_t b, int64_t e) {
    for (int64_t it = b; it < e; ++it) {
      int64_t i0, i1;
      bounds(it, i0, i1);
      parts[it] = partial(it / s, i0, i1, it, scratch.get() + it * per);
    }
  });
  for (int64_t r = 0; r < rows; ++r) finish(r, &parts[r * s], s);
  at::parallel_for(0, rows * s, 1, [&](int64_t b, int64_t e) {
    for (int64_t it = b; it < e; ++it) {
      int64_t i0, i1;
      bounds(it, i0, i1);
      write(it / s, i0, i1, it, scratch.get() + it * per);
    }
  });
}

// Merge segment reductions into the row's class, shift and denominator.
eb::ExpRow finish_exp(const eb::ExpPartial* p, int64_t count, const eb::ExpSpec& spec) {
  const double inf = std::numeric_limits<double>::infinity();
  eb::ExpRow r{eb::ROW_FINITE, -inf, 0.0, 0};
  int nan = 0;
  for (int64_t i = 0; i < count; ++i) {
    nan |= p[i].nan;
    r.ninf += p[i].ninf;
    r.m = std::max(r.m, p[i].m);
  }
  if (nan) { r.cls = eb::ROW_NAN; return r; }
  if (r.m == inf) { r.cls = eb::ROW_INF; return r; }
  const double shift = std::max(r.m, spec.floor);
  if (shift == -inf) { r.cls = eb::ROW_EMPTY; return r; }
  double s = 0;
  for (int64_t i = 0; i < count; ++i)
    if (p[i].m > -inf && p[i].s != 0) s += p[i].s * std::exp((p[i].m - shift) / spec.tau);
  r.m = shift;
  r.den = s + (spec.offset != 0 ? spec.offset * std::exp(-shift / spec.tau) : 0.0);
  if (!(r.den > 0)) r.cls = eb::ROW_EMPTY;
  return r;
}

at::Tensor exp_forward(const at::Tensor& x_in, int64_t structure, bool mask_negative, double floor,
                       double tau, double offset) {
  TORCH_CHECK(structure >= 0 && structure < eb::NUM_STRUCTURES, "unknown pass structure");
  TORCH_CHECK(tau > 0 && std::isfinite(tau), "tau must be finite and > 0");
  Rows in = rows_of(x_in);
  const Table* t = current();
  auto partial_fn = t->exp_partial[structure][in.dt];
  auto write_fn = t->exp_write[structure][in.dt];
  TORCH_CHECK(partial_fn && write_fn, "this pass structure does not take ", x_in.scalar_type());
  at::Tensor y = at::empty_like(in.x);
  if (in.x.numel() == 0) return y;
  const eb::ExpSpec spec{mask_negative ? 1 : 0, floor, tau, offset};
  const int64_t n = in.n;
  const Plan how = plan(in.rows, n, 2 * in.x.element_size());  // x, and y (the fused exps)
  const int64_t per = eb::fused_scratch(segment_length(n, how.s), in.dt, structure);
  std::vector<eb::ExpRow> verdict(in.rows);
  drive<eb::ExpPartial>(
      in.rows, n, how, per,
      [&](int64_t r, int64_t i0, int64_t i1, int64_t, double* scratch) {
        return partial_fn(ptr(in.x, r, n, i0), mptr(y, r, n, i0), i1 - i0, spec, scratch);
      },
      [&](int64_t r, const eb::ExpPartial* p, int64_t count) { verdict[r] = finish_exp(p, count, spec); },
      [&](int64_t r, int64_t i0, int64_t i1, int64_t, double* scratch) {
        write_fn(ptr(in.x, r, n, i0), mptr(y, r, n, i0), i1 - i0, spec, verdict[r], scratch);
      });
  return y;
}

at::Tensor weight_forward(const at::Tensor& x_in, bool symax, double constant) {
  Rows in = rows_of(x_in);
  const Table* t = current();
  auto partial_fn = t->weight_partial[in.dt];
  auto write_fn = t->weight_write[in.dt];
  at::Tensor y = at::empty_like(in.x);
  if (in.x.numel() == 0) return y;
  struct Verdict { int cls; double top, den; int64_t ninf; };
  std::vector<Verdict> verdict(in.rows);
  const int64_t n = in.n;
  drive<eb::WeightPartial>(
      in.rows, n, plan(in.rows, n, in.x.element_size()), 0,
      [&](int64_t r, int64_t i0, int64_t i1, int64_t, double*) {
        return partial_fn(ptr(in.x, r, n, i0), i1 - i0, symax ? 1 : 0);
      },
      [&](int64_t r, const eb::WeightPartial* p, int64_t count) {
        Verdict v{eb::ROW_FINITE, 0.0, 0.0, 0};
        int nan = 0;
        for (int64_t i = 0; i < count; ++i) {
          nan |= p[i].nan;
          v.ninf += p[i].ninf;
          v.top = std::max(v.top, p[i].top);
        }
        if (nan) v.cls = eb::ROW_NAN;
        else if (v.ninf) v.cls = eb::ROW_INF;
        else {
          const double scale = v.top > 1 ? v.top : 1;
          for (int64_t i = 0; i < count; ++i) v.den += p[i].s * ((p[i].top > 1 ? p[i].top : 1) / scale);
          v.den += constant / scale;
        }
        verdict[r] = v;
      },
      [&](int64_t r, int64_t i0, int64_t i1, int64_t, double*) {
        const Verdict& v = verdict[r];
        write_fn(ptr(in.x, r, n, i0), mptr(y, r, n, i0), i1 - i0, symax ? 1 : 0, v.top, v.den, v.cls,
                 v.ninf);
      });
  return y;
}

// dx, and per-row (rows,) fp64 contributions to dtau and doffset when params.
std::vector<at::Tensor> exp_backward(const at::Tensor& x_in, const at::Tensor& y_in,
                                     const at::Tensor& g_in, bool mask_negative, double tau,
                                     double offset, bool params) {
  TORCH_CHECK(tau > 0 && std::isfinite(tau), "tau must be finite and > 0");
  TORCH_CHECK(x_in.sizes() == y_in.sizes() && x_in.sizes() == g_in.sizes(),
              "x, y and g must have one shape");
  TORCH_CHECK(x_in.scalar_type() == y_in.scalar_type() && x_in.scalar_type() == g_in.scalar_type(),
              "x, y and g must have one dtype");
  Rows in = rows_of(x_in);
  at::Tensor y = y_in.contiguous(), g = g_in.contiguous();
  const Table* t = current();
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
  const Plan how = plan(in.rows, n, 2 * in.x.element_size());  // pass 2 rereads y and g
  // yz, gyz: sum y z' and sum g y z', z' = (x - m)/tau, over the row's kept positions
  struct Verdict { int cls; double m, c, ymax, yz, gyz; };
  std::vector<Verdict> verdict(in.rows);
  const int mneg = mask_negative ? 1 : 0;
  const double inf = std::numeric_limits<double>::infinity();
  drive<eb::BwdPartial>(
      in.rows, n, how, 0,
      [&](int64_t r, int64_t i0, int64_t i1, int64_t, double*) {
        return partial_fn(y_only ? nullptr : ptr(in.x, r, n, i0), ptr(y, r, n, i0),
                          ptr(g, r, n, i0), i1 - i0, mneg);
      },
      [&](int64_t r, const eb::BwdPartial* p, int64_t count) {
        Verdict v{eb::ROW_FINITE, -inf, 0.0, 0.0, 0.0, 0.0};
        int nan = 0;
        double ymin = inf;
        for (int64_t i = 0; i < count; ++i) {
          nan |= p[i].nan;
          v.m = std::max(v.m, p[i].m);
          v.c += p[i].c;
          v.ymax = std::max(v.ymax, p[i].ymax);
          ymin = std::min(ymin, p[i].ymin);
        }
        if (y_only && (v.c != v.c || (v.ymax > 0 && !(ymin < v.ymax)))) {
          eb::BwdPartial w = partial_fn(ptr(in.x, r, n, 0), ptr(y, r, n, 0), ptr(g, r, n, 0), n, mneg);
          v.m = w.m, v.c = w.c, v.ymax = w.ymax;
          nan = w.nan;
        }
        if (nan) v.cls = eb::ROW_NAN;
        else if (v.m == inf) v.cls = eb::ROW_INF;
        else if (!y_only && v.m > -inf) {
          for (int64_t i = 0; i < count; ++i) {  // each segment's sums, shifted to the row's m
            if (!(p[i].m > -inf)) continue;      // nothing kept there: its sums are 0
            v.yz += p[i].yd - (v.m - p[i].m) * p[i].ysum;
            v.gyz += p[i].gyd - (v.m - p[i].m) * p[i].c;
          }
          v.yz /= tau, v.gyz /= tau;
        }
        verdict[r] = v;
      },
      [&](int64_t r, int64_t i0, int64_t i1, int64_t, double*) {
        write_fn(ptr(y, r, n, i0), ptr(g, r, n, i0), mptr(dx, r, n, i0), i1 - i0, verdict[r].cls,
                 verdict[r].c, tau);
      });
  if (params) {
    double* dt = dtau.data_ptr<double>();
    double* db = doff.data_ptr<double>();
    for (int64_t r = 0; r < in.rows; ++r) {
      const Verdict& v = verdict[r];
      if (v.cls == eb::ROW_NAN) { dt[r] = db[r] = std::nan(""); continue; }
      if (v.cls != eb::ROW_FINITE) continue;
      const double m0 = std::isfinite(v.m) ? v.m : 0.0, mt = m0 / tau;
      const double q = std::exp(-mt) * v.ymax;  // exp(-m/tau)/D': 1/D' is the largest output
      const double w = offset * q;
      const double wmt = w != 0 ? w * mt : 0.0;
      dt[r] = (v.c * (v.yz - wmt) - v.gyz) / tau;
      db[r] = -v.c * q;
    }
  }
  return {dx, dtau, doff};
}

// sum(exp(x)) over a contiguous x <= 0, in chunks over the threads: the exp ceiling's probe.
double exp_sum(const at::Tensor& x_in) {
  TORCH_CHECK(x_in.device().is_cpu(), "exp_sum: a CPU tensor");
  const at::Tensor x = x_in.contiguous();
  const auto fn = current()->exp_sum[dtype_of(x)];
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

std::string isa() { return current()->isa; }

}  // namespace

namespace eb { void bind_attention(pybind11::module_& m, const char* (*isa)()); }  // attention.cpp

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "elasticbench native CPU kernels (docs/native.md)";
  m.def("exp_forward", &exp_forward, "exp-family forward (elastic, softmax, softmax1)");
  m.def("weight_forward", &weight_forward, "weight-family forward (stablemax, symax)");
  m.def("exp_backward", &exp_backward, "exp-family backward: dx and per-row dtau, doffset");
  m.def("exp_sum", &exp_sum, "sum of exp(x) over x <= 0: the roofline's exp probe");
  m.def("isa", &isa, "the instruction set in use");
  m.def("isas", &isas, "instruction sets this CPU can run, widest first");
  m.def("set_isa", &set_isa, "use the kernels of this instruction set");
  eb::bind_attention(m, [] { return current()->isa; });  // follows set_isa
}
