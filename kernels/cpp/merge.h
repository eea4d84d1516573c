// Finishing a row: the reductions of its segments (one, or one per thread where a long row
// was split, docs/native.md section 2) merged into the row's verdict, which its writes
// read. Plain C++ on table.h's structures, no torch header.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "table.h"

namespace eb {

// exp family, forward: the row's class, shift m and denominator D.
inline ExpRow finish_exp(const ExpPartial* p, int64_t count, const ExpSpec& spec) {
  const double inf = std::numeric_limits<double>::infinity();
  ExpRow r{ROW_FINITE, -inf, 0.0, 0};
  int nan = 0;
  for (int64_t i = 0; i < count; ++i) {
    nan |= p[i].nan;
    r.ninf += p[i].ninf;
    r.m = std::max(r.m, p[i].m);
  }
  if (nan) { r.cls = ROW_NAN; return r; }
  if (r.m == inf) { r.cls = ROW_INF; return r; }
  const double shift = std::max(r.m, spec.floor);
  if (shift == -inf) { r.cls = ROW_EMPTY; return r; }
  double s = 0;
  // a segment at the row's shift (a whole row's one segment) needs no exponential: exp(0)
  // is exactly 1 (tau is finite and > 0, checked by the caller)
  for (int64_t i = 0; i < count; ++i)
    if (p[i].m > -inf && p[i].s != 0)
      s += p[i].m == shift ? p[i].s : p[i].s * std::exp((p[i].m - shift) / spec.tau);
  r.m = shift;
  r.den = s + (spec.offset != 0 ? spec.offset * std::exp(-shift / spec.tau) : 0.0);
  if (!(r.den > 0)) r.cls = ROW_EMPTY;
  return r;
}

// weight family: the row's class, largest weight and denominator (sum w + c) / max(top, 1).
struct WeightRow {
  int cls;
  double top, den;
  int64_t ninf;
};

inline WeightRow finish_weight(const WeightPartial* p, int64_t count, double constant) {
  WeightRow v{ROW_FINITE, 0.0, 0.0, 0};
  int nan = 0;
  for (int64_t i = 0; i < count; ++i) {
    nan |= p[i].nan;
    v.ninf += p[i].ninf;
    v.top = std::max(v.top, p[i].top);
  }
  if (nan) v.cls = ROW_NAN;
  else if (v.ninf) v.cls = ROW_INF;
  else {
    const double scale = v.top > 1 ? v.top : 1;
    for (int64_t i = 0; i < count; ++i) v.den += p[i].s * ((p[i].top > 1 ? p[i].top : 1) / scale);
    v.den += constant / scale;
  }
  return v;
}

// exp family, backward: the segments' kept max, c = sum g y, max y, NaN flag and smallest
// nonzero y, merged (the dtau sums are merged by finish_bwd, against the row's max).
inline BwdPartial merge_bwd(const BwdPartial* p, int64_t count) {
  BwdPartial r{-std::numeric_limits<double>::infinity(), 0.0, 0.0, 0, 0};
  for (int64_t i = 0; i < count; ++i) {
    r.nan |= p[i].nan;
    r.m = std::max(r.m, p[i].m);
    r.c += p[i].c;
    r.ymax = std::max(r.ymax, p[i].ymax);
    r.ymin = std::min(r.ymin, p[i].ymin);
  }
  return r;
}

// Whether a row reduced from y and g alone needs x for its class: c is NaN, or its nonzero
// outputs are all equal (a +inf row's are all 1/k; a one-hot or tied finite row's may be).
inline bool needs_census(const BwdPartial& r) {
  return r.c != r.c || (r.ymax > 0 && !(r.ymin < r.ymax));
}

// The backward's verdict: class, m, c, max y and (with sums) yz = sum y z', gyz = sum g y z',
// z' = (x - m)/tau over kept positions.
struct BwdRow {
  int cls;
  double m, c, ymax, yz, gyz;
};

inline BwdRow finish_bwd(const BwdPartial& row, const BwdPartial* p, int64_t count, bool sums,
                         double tau) {
  const double inf = std::numeric_limits<double>::infinity();
  BwdRow v{ROW_FINITE, row.m, row.c, row.ymax, 0.0, 0.0};
  if (row.nan) v.cls = ROW_NAN;
  else if (v.m == inf) v.cls = ROW_INF;
  else if (sums && v.m > -inf) {
    for (int64_t i = 0; i < count; ++i) {  // each segment's sums, shifted to the row's m
      if (!(p[i].m > -inf)) continue;      // nothing kept there: its sums are 0
      v.yz += p[i].yd - (v.m - p[i].m) * p[i].ysum;
      v.gyz += p[i].gyd - (v.m - p[i].m) * p[i].c;
    }
    v.yz /= tau, v.gyz /= tau;
  }
  return v;
}

// A finished row's dtau and doffset (docs/gradients.md section 2; NaN for a NaN row, left
// at 0 for a +inf or empty one). 1/D' is the row's largest output.
inline void param_grads(const BwdRow& v, double tau, double offset, double& dtau, double& doff) {
  if (v.cls == ROW_NAN) { dtau = doff = std::nan(""); return; }
  if (v.cls != ROW_FINITE) return;
  const double m0 = std::isfinite(v.m) ? v.m : 0.0, mt = m0 / tau;
  const double q = std::exp(-mt) * v.ymax;  // exp(-m/tau)/D': 1/D' is the largest output
  const double w = offset * q;
  const double wmt = w != 0 ? w * mt : 0.0;
  dtau = (v.c * (v.yz - wmt) - v.gyz) / tau;
  doff = -v.c * q;
}

}  // namespace eb
