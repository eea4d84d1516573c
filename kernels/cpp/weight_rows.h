// The weight family's forward row kernels (stablemax, symax): largest weight and scaled
// sum in one sweep, then the write (docs/native.md section 1).
#pragma once
#include "rows_common.h"

namespace EB_NS {

template <typename T, typename C> struct WeightRows {
  static constexpr int W = width<C>();

  static vec<C> weight(vec<C> v, int symax) {
    if (symax) return vabs<C>(v);
    return select<C>(v >= C(0), v + C(1), C(1) / (C(1) - v));
  }

  // Largest weight, NaN, +inf count; then the sum of w / max(top, 1) (a second sweep only
  // in fp64, where the plain sum could overflow; fp32 weights are summed in fp64 directly).
  static eb::WeightPartial partial(const void* xv, int64_t n, int symax) {
    const T* x = static_cast<const T*>(xv);
    vec<C> vtop = splat<C>(0);
    ivec<C> vnan{}, vinf{};
    Wide acc;
    for (int64_t i = 0; i < n; i += W) {
      ivec<C> valid = lanes_below<C>(n - i);
      vec<C> w = select<C>(valid, weight(ld<T, C>(x, i, n, zero<T>()), symax), splat<C>(0));
      vnan |= w != w;
      vinf -= w == __builtin_inf();
      vtop = vmax<C>(vtop, w);
      if (sizeof(C) == 4) acc.add(select<C>(w != w, splat<C>(0), w));
    }
    eb::WeightPartial r{double(hmax<C>(vtop)), 0.0, 0, any<C>(vnan)};
    for (int k = 0; k < W; ++k) r.ninf += vinf[k];
    if (r.nan || r.ninf) return r;
    double scale = r.top > 1 ? r.top : 1;
    if (sizeof(C) == 4) {
      r.s = acc.total() / scale;
      return r;
    }
    // fp64: two vectors added, then into acc with the rounding errors kept (Wide): no
    // chain of plain additions, whose error grows with its length on equal terms
    const C inv = C(1 / scale);
    int64_t i = 0;
    for (; i + 2 * W <= n; i += 2 * W)
      acc.add(weight(Io<T, C>::load(x + i), symax) * inv +
              weight(Io<T, C>::load(x + i + W), symax) * inv);
    for (; i < n; i += W)
      acc.add(select<C>(lanes_below<C>(n - i), weight(ld<T, C>(x, i, n, zero<T>()), symax),
                        splat<C>(0)) * inv);
    r.s = acc.total();
    return r;
  }

  static void write(const void* xv, void* yv, int64_t n, int symax, double top, double den,
                    int cls, int64_t ninf) {
    const T* x = static_cast<const T*>(xv);
    T* y = static_cast<T*>(yv);
    const double scale = top > 1 ? top : 1;
    // divide by D (not times 1/D): D may be subnormal, and 1/D would overflow
    const C inv_scale = C(1 / scale), d = C(den);
    const C share = ninf ? C(1.0 / double(ninf)) : C(0);
    for (int64_t i = 0; i < n; i += W) {
      vec<C> w = weight(ld<T, C>(x, i, n, zero<T>()), symax), out;
      if (cls == eb::ROW_NAN) out = splat<C>(__builtin_nan(""));
      else if (cls == eb::ROW_INF) out = select<C>(w == __builtin_inf(), splat<C>(share), splat<C>(0));
      else out = d > C(0) ? (w * inv_scale) / d : splat<C>(0);
      st<T, C>(y, i, n, out);
    }
  }
};

}  // namespace EB_NS
