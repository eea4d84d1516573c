// The fast reference's gradient sweeps in native code: elasticbench/numerics/certified_grad.py
// evaluates dx, dtau and doffset of an exp-normalize member in double-double with an
// absolute error bound beside every quantity; this file runs the same two sweeps a row at a
// time (docs/numerics.md section 6.10). Every double-double operation is the one of
// numerics/dd.py in the same order, so hi and lo agree bit for bit with the NumPy code
// (tests/test_certified_native.py); the bounds are the same expressions, their sums over a
// row taken in another order, whose rounding the factor SLACK covers as it does there.
// Nothing here is vectorized by hand, and nothing may contract a*b+c into one fused
// multiply-add (which rounds once where the NumPy form rounds twice): GCC contracts by
// default in C++ wherever the target has FMA (aarch64 always), hence the pragmas.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <vector>

namespace eb {
namespace {

// numerics/dd.py and numerics/certified_grad.py (tests/test_certified_native.py compares)
constexpr double U2 = 0x1p-106;
constexpr double ADD_DD = 4.0, ADD_D = 3.0, MUL_DD = 8.0, MUL_D = 4.0, DIV_D = 4.0;
constexpr double SPLIT = 134217729.0;  // 2^27 + 1
constexpr double EXP_MIN = -760.0;
constexpr double TINY = 0x1p-960, CUT = 0x1p-1086;
constexpr double ABS_FLOOR = 0x1p-1071, SUBNORMAL = 0x1p-1070;
constexpr int64_t OFFSET = 0, TEMPERATURE = 1;  // parameter roles (numerics/native_sweeps.py)

struct DD {
  double h, l;
};

inline DD two_sum(double a, double b) {
  const double s = a + b, bb = s - a;
  return {s, (a - (s - bb)) + (b - bb)};
}
inline DD fast_two_sum(double a, double b) {
  const double s = a + b;
  return {s, b - (s - a)};
}
inline void split(double a, double& hi, double& lo) {
  const double c = SPLIT * a;
  hi = c - (c - a);
  lo = a - hi;
}
inline DD two_prod(double a, double b) {
  const double p = a * b;
  double ah, al, bh, bl;
  split(a, ah, al);
  split(b, bh, bl);
  return {p, ((ah * bh - p) + ah * bl + al * bh) + al * bl};
}
inline DD add(DD a, DD b) {
  DD s = two_sum(a.h, b.h);
  const DD t = two_sum(a.l, b.l);
  s = fast_two_sum(s.h, s.l + t.h);
  return fast_two_sum(s.h, s.l + t.l);
}
inline DD add_d(DD a, double b) {
  const DD s = two_sum(a.h, b);
  return fast_two_sum(s.h, s.l + a.l);
}
inline DD mul(DD a, DD b) {
  const DD p = two_prod(a.h, b.h);
  return fast_two_sum(p.h, p.l + (a.h * b.l + a.l * b.h));
}
inline DD mul_d(DD a, double b) {
  const DD p = two_prod(a.h, b);
  return fast_two_sum(p.h, p.l + a.l * b);
}
inline DD div_d(DD a, double b) {
  const double q = a.h / b;
  const DD p = two_prod(q, b);
  const double r = ((a.h - p.h) - p.l) + a.l;
  return fast_two_sum(q, r / b);
}
inline DD neg(DD a) { return {-a.h, -a.l}; }

// certified_grad.floor_of: slack where a value is in float64's subnormal tail or underflowed
inline double floor_of(double v, bool factors_live) {
  return ((v != 0 || factors_live) && std::fabs(v) < TINY) ? ABS_FLOOR : 0.0;
}
inline double floor_of(double v) { return (v != 0 && std::fabs(v) < TINY) ? ABS_FLOOR : 0.0; }

// bounds.scaled: z = d / tau as a dd where |z| <= 2^11, else d / tau rounded
inline DD scaled(DD d, double tau) {
  const double q = d.h / tau;
  return std::fabs(q) <= 2048.0 ? div_d(d, tau) : DD{q, 0.0};
}

int depth(int64_t n) {  // dd.depth: the levels of sum_rows's tree
  int levels = 0;
  while (n > 1 && (int64_t{1} << levels) < n) ++levels;
  return levels;
}

// A row quantity as a dd with its absolute error bound (certified_grad.RowSums).
struct Sum {
  DD v{0.0, 0.0};
  double bound = 0.0;
};

// Terms of one row sum: dd values summed by dd.sum_rows's tree (the same pairs), and the
// two sums its bound needs (certified_grad.tree_sum).
struct Terms {
  std::vector<double> h, l;
  double bounds = 0.0, abs_h = 0.0;

  void reset() {
    h.clear();
    l.clear();
    bounds = abs_h = 0.0;
  }
  void push(DD t, double bound) {
    h.push_back(t.h);
    l.push_back(t.l);
    bounds += bound;
    abs_h += std::fabs(t.h);
  }
  Sum total() {
    const int64_t n0 = static_cast<int64_t>(h.size());
    int64_t n = n0;
    while (n > 1) {  // the first half plus the second, an odd last term carried along
      const int64_t half = n / 2;
      for (int64_t i = 0; i < half; ++i) {
        const DD s = add({h[i], l[i]}, {h[half + i], l[half + i]});
        h[i] = s.h;
        l[i] = s.l;
      }
      if (n % 2) {
        h[half] = h[n - 1];
        l[half] = l[n - 1];
      }
      n = half + n % 2;
    }
    Sum s;
    if (n0) s.v = {h[0], l[0]};
    s.bound = bounds + depth(n0) * ADD_DD * U2 * abs_h;
    return s;
  }
};

// The block sums of a row, combined as certified_grad.combine does.
Sum combine(const std::vector<Sum>& parts, Terms& scratch) {
  if (parts.size() == 1) return parts[0];
  scratch.reset();
  for (const Sum& p : parts) scratch.push(p.v, p.bound);
  return scratch.total();
}

struct Row {
  const double *x, *g, *yh, *yl, *yb;
  const bool* kept;
  double m, tau, offset;
  DD q;  // exp(-m/tau) / S
  double bq;
};

// One position's view as the sweeps read it (certified_grad.Cols).
struct Col {
  bool kept;
  DD y;
  double by, g, gk;
  DD t;  // g y
  double bt;
};

inline Col col_of(const Row& r, int64_t k) {
  Col c;
  c.kept = r.kept[k];
  c.y = c.kept ? DD{r.yh[k], r.yl[k]} : DD{0.0, 0.0};
  c.by = c.kept ? r.yb[k] : 0.0;
  c.g = r.g[k];
  c.gk = c.kept ? c.g : 0.0;
  c.t = mul_d(c.y, c.gk);
  c.bt = std::fabs(c.gk) * c.by + std::fabs(c.t.h) * MUL_D * U2 +
         floor_of(c.t.h, c.y.h != 0 && c.gk != 0);
  return c;
}

// z = (x - m)/tau where kept and its exp is not cut (certified_grad.Z)
struct Zk {
  DD z;
  double bound, cut;
  bool live;
};

inline Zk z_of(const Row& r, int64_t k, bool kept) {
  const DD d = two_sum(kept ? r.x[k] : r.m, -r.m);
  DD z = scaled(d, r.tau);
  Zk out;
  out.live = kept && z.h >= EXP_MIN;
  if (!out.live) z = {0.0, 0.0};
  out.z = z;
  const double sub = (d.h != 0 && std::fabs(d.h) < TINY) ? SUBNORMAL : 0.0;
  out.bound = std::fabs(z.h) * DIV_D * U2 + sub / r.tau;
  out.cut = (kept && !out.live) ? CUT : 0.0;
  return out;
}

struct Top {  // the row's single largest kept logit, if there is one (certified_grad.Top)
  int64_t k = -1;
  double g = 0.0;
  Sum f;  // g_k - c in its cancellation-free form
};

Top single_top(const Row& r, int64_t n) {
  Top top;
  int64_t count = 0;
  for (int64_t k = 0; k < n; ++k) {
    if (r.kept[k] && r.x[k] == r.m && count++ == 0) top.k = k;
  }
  if (count != 1) top.k = -1;
  else top.g = r.g[top.k];
  return top;
}

// certified_grad._mean: sum y z - w m/tau, w = offset q
Sum mean_of(const Sum& a, const Row& r) {
  const DD mt = scaled({r.m, 0.0}, r.tau);
  const bool near = std::fabs(mt.h) <= 2048.0;
  const DD w = mul_d(r.q, r.offset);
  const double bw = r.offset * r.bq + std::fabs(w.h) * MUL_D * U2;
  const DD b = mul(w, near ? mt : DD{0.0, 0.0});
  const double bb = near ? std::fabs(w.h) * std::fabs(mt.h) * DIV_D * U2 + std::fabs(mt.h) * bw +
                               std::fabs(b.h) * MUL_DD * U2
                         : CUT * std::max(r.offset, 1.0);
  Sum mean;
  mean.v = add(a.v, neg(b));
  mean.bound = a.bound + bb + std::fabs(mean.v.h) * ADD_DD * U2;
  return mean;
}

// certified_grad._dominant_difference: sum_{i != k} (g_k - g_i) y_i + g_k w
void dominant_difference(Top& top, const Sum& s, const Row& r) {
  const DD w = mul_d(r.q, r.offset);
  const DD v = mul_d(w, top.g);
  const double bv = std::fabs(top.g) * (r.offset * r.bq + std::fabs(w.h) * MUL_D * U2) +
                    std::fabs(v.h) * MUL_D * U2 + floor_of(v.h);
  top.f.v = add(s.v, v);
  top.f.bound = s.bound + bv + std::fabs(top.f.v.h) * ADD_DD * U2;
}

struct Scratch {
  Terms c, a, s, v, parts;
  std::vector<Sum> cs, as, ss, vs;
};

// One finite row: dx (hi, lo, bound) written, the parameter gradients (hi, lo, bound) of
// each role returned through dp.
void grad_row(const Row& r, int64_t n, int64_t block, bool temperature, double slack,
              double* dxh, double* dxl, double* dxb, const std::vector<int64_t>& roles,
              double* dph, double* dpl, double* dpb, Scratch& w) {
  Top top = single_top(r, n);
  const int64_t nb = n ? (n + block - 1) / block : 1;
  w.cs.assign(nb, Sum());
  w.as.assign(nb, Sum());
  w.ss.assign(nb, Sum());
  w.vs.assign(nb, Sum());
  // first sweep: c = sum g y, sum y z (for dtau's mean), sum_{i != k} (g_k - g_i) y_i
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t j0 = b * block, j1 = std::min(n, j0 + block);
    w.c.reset();
    w.a.reset();
    w.s.reset();
    for (int64_t k = j0; k < j1; ++k) {
      const Col c = col_of(r, k);
      w.c.push(c.t, c.bt);
      if (temperature) {
        const Zk z = z_of(r, k, c.kept);
        const DD u = mul(c.y, z.z);
        w.a.push(u, std::fabs(z.z.h) * c.by + std::fabs(c.y.h) * z.bound +
                        std::fabs(u.h) * MUL_DD * U2 + floor_of(u.h, c.y.h != 0 && z.z.h != 0) +
                        z.cut);
      }
      if (top.k >= 0) {
        const DD a = two_sum(top.g, -c.gk);
        const DD u = mul(a, c.y);
        w.s.push(u, std::fabs(a.h) * c.by + std::fabs(u.h) * MUL_DD * U2 +
                        floor_of(u.h, a.h != 0 && c.y.h != 0));
      }
    }
    w.cs[b] = w.c.total();
    if (temperature) w.as[b] = w.a.total();
    if (top.k >= 0) w.ss[b] = w.s.total();
  }
  const Sum csum = combine(w.cs, w.parts);
  if (top.k >= 0) dominant_difference(top, combine(w.ss, w.parts), r);
  Sum mean;
  if (temperature) mean = mean_of(combine(w.as, w.parts), r);
  // second sweep: dx = y (g - c)/tau, and the terms of tau dtau = sum g y (mean - z)
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t j0 = b * block, j1 = std::min(n, j0 + block);
    w.v.reset();
    for (int64_t k = j0; k < j1; ++k) {
      const Col c = col_of(r, k);
      DD d = add_d(neg(csum.v), c.g);
      double bd = csum.bound + std::fabs(d.h) * ADD_D * U2;
      if (k == top.k && top.f.bound < bd) {
        d = top.f.v;
        bd = top.f.bound;
      }
      const DD p = mul(c.y, d);
      const DD xv = div_d(p, r.tau);
      const double bx = (std::fabs(c.y.h) * bd + std::fabs(d.h) * c.by) / r.tau +
                        std::fabs(xv.h) * (MUL_DD + DIV_D) * U2 +
                        floor_of(xv.h, c.y.h != 0 && d.h != 0);
      dxh[k] = c.kept ? xv.h : 0.0;
      dxl[k] = c.kept ? xv.l : 0.0;
      dxb[k] = (c.kept ? bx : 0.0) * slack;
      if (temperature) {
        const Zk z = z_of(r, k, c.kept);
        const DD f = add(mean.v, neg(z.z));
        const double bf = mean.bound + z.bound + std::fabs(f.h) * ADD_DD * U2;
        DD v = mul(c.t, f);
        double bv = std::fabs(c.t.h) * bf + std::fabs(f.h) * c.bt + std::fabs(v.h) * MUL_DD * U2 +
                    floor_of(v.h, c.t.h != 0 && f.h != 0);
        if (!z.live) {
          v = {0.0, 0.0};
          bv = 0.0;
        }
        w.v.push(v, bv + z.cut * std::fabs(c.gk) * (1 + std::fabs(mean.v.h)));
      }
    }
    if (temperature) w.vs[b] = w.v.total();
  }
  for (size_t j = 0; j < roles.size(); ++j) {
    if (roles[j] == OFFSET) {
      const DD bh = mul(csum.v, r.q);
      dph[j] = -bh.h;
      dpl[j] = -bh.l;
      dpb[j] = (std::fabs(r.q.h) * csum.bound + std::fabs(csum.v.h) * r.bq +
                std::fabs(bh.h) * MUL_DD * U2 + floor_of(bh.h, csum.v.h != 0 && r.q.h != 0)) *
               slack;
    } else {
      const Sum s = combine(w.vs, w.parts);
      const DD o = div_d(s.v, r.tau);
      dph[j] = o.h;
      dpl[j] = o.l;
      dpb[j] = (s.bound / r.tau + std::fabs(o.h) * DIV_D * U2 + floor_of(o.h)) * slack;
    }
  }
}

void check(const at::Tensor& t, at::ScalarType type, int64_t rows, int64_t n, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == type && t.is_contiguous(), name,
              ": a contiguous CPU tensor of the right dtype");
  TORCH_CHECK(t.dim() == (n < 0 ? 1 : 2) && t.size(0) == rows && (n < 0 || t.size(1) == n), name,
              ": wrong shape");
}

// The gradient sweeps over the rows of x (rows, n): dx written into dx_h/dx_l/dx_b, the
// parameter gradients into dp_h/dp_l/dp_b (rows, len(roles)); rows not `finite` untouched.
void certified_grad_rows(const at::Tensor& x, const at::Tensor& g, const at::Tensor& yh,
                         const at::Tensor& yl, const at::Tensor& yb, const at::Tensor& kept,
                         const at::Tensor& finite, const at::Tensor& m, const at::Tensor& qh,
                         const at::Tensor& ql, const at::Tensor& bq, double tau, double offset,
                         std::vector<int64_t> roles, int64_t block, double slack,
                         at::Tensor dx_h, at::Tensor dx_l, at::Tensor dx_b, at::Tensor dp_h,
                         at::Tensor dp_l, at::Tensor dp_b) {
  const int64_t rows = x.size(0), n = x.dim() == 2 ? x.size(1) : 0;
  const int64_t p = static_cast<int64_t>(roles.size());
  using List = std::initializer_list<const at::Tensor*>;
  for (const at::Tensor* t : List{&x, &g, &yh, &yl, &yb, &dx_h, &dx_l, &dx_b})
    check(*t, at::kDouble, rows, n, "certified_grad_rows (rows, n)");
  check(kept, at::kBool, rows, n, "certified_grad_rows kept");
  check(finite, at::kBool, rows, -1, "certified_grad_rows finite");
  for (const at::Tensor* t : List{&m, &qh, &ql, &bq})
    check(*t, at::kDouble, rows, -1, "certified_grad_rows (rows,)");
  for (const at::Tensor* t : List{&dp_h, &dp_l, &dp_b})
    check(*t, at::kDouble, rows, p, "certified_grad_rows dp");
  TORCH_CHECK(block > 0, "certified_grad_rows: block must be positive");
  bool temperature = false;
  for (int64_t role : roles) {
    TORCH_CHECK(role == OFFSET || role == TEMPERATURE, "certified_grad_rows: unknown role ", role);
    temperature |= role == TEMPERATURE;
  }
  const bool* fin = finite.data_ptr<bool>();
  Scratch w;
  for (int64_t i = 0; i < rows; ++i) {
    if (!fin[i]) continue;
    const int64_t o = i * n;
    const Row r{x.data_ptr<double>() + o, g.data_ptr<double>() + o, yh.data_ptr<double>() + o,
                yl.data_ptr<double>() + o, yb.data_ptr<double>() + o, kept.data_ptr<bool>() + o,
                m.data_ptr<double>()[i], tau, offset,
                DD{qh.data_ptr<double>()[i], ql.data_ptr<double>()[i]}, bq.data_ptr<double>()[i]};
    grad_row(r, n, block, temperature, slack, dx_h.data_ptr<double>() + o,
             dx_l.data_ptr<double>() + o, dx_b.data_ptr<double>() + o, roles,
             dp_h.data_ptr<double>() + i * p, dp_l.data_ptr<double>() + i * p,
             dp_b.data_ptr<double>() + i * p, w);
  }
}

}  // namespace

void bind_reference(pybind11::module_& m) {
  m.def("certified_grad_rows", &certified_grad_rows,
        "the fast reference's gradient sweeps (numerics/certified_grad.py), in place");
  m.def("reference_constants", [] {
    return std::vector<double>{U2, ADD_DD, ADD_D, MUL_DD, MUL_D, DIV_D, EXP_MIN, TINY, CUT,
                               ABS_FLOOR, SUBNORMAL};
  }, "the constants this file shares with numerics/dd.py and certified_grad.py");
}

}  // namespace eb

// The harness's own extension, apart from the library's kernels (elasticbench/native.py
// builds both; docs/native.md section 4): the library never loads this code.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "elasticbench's reference sweeps, the harness's native code (docs/native.md)";
  eb::bind_reference(m);
}
