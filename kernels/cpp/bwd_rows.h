// The exp family's backward row kernels: pass 1 (c, max y, the kept max and dtau's sums),
// pass 2 (dx from y and g), docs/native.md section 1. Pass 1 takes the forward's kept max
// and census (exp_rows.h).
#pragma once
#include "exp_rows.h"

namespace EB_NS {

template <typename T, typename C> struct BwdRows {
  static constexpr int W = width<C>();
  static constexpr int64_t BLOCK = eb::FUSED_BLOCK;

  // Kept positions, with NaN counted as kept so that a NaN x reaches the sum c (through
  // its y, NaN in a NaN row) and sends the row to the census.
  static ivec<C> kept_or_nan(vec<C> x, int mask_negative) {
    return !(x < (mask_negative ? C(0) : lowest_finite<C>()));
  }

  // Kept max m, c = sum of g y over kept positions, largest kept y, and the sums of y,
  // y (x - m) and g y (x - m) for dtau, in one read of x, y and g; NaN and +inf by census
  // only where the plain sweep saw a +inf max or a NaN c. Each block is read twice from L1:
  // its max, then its sums shifted by the running max r, which are carried in fp64 to the
  // new r whenever it grows (an exact shift of sums whose terms lie within the output's
  // range of the max: y is 0 further down). docs/native.md.
  static eb::BwdPartial partial(const void* xv, const void* yv, const void* gv, int64_t n,
                                int mask_negative) {
    if (!xv) return partial_y(yv, gv, n);
    const T *x = static_cast<const T*>(xv), *y = static_cast<const T*>(yv),
            *g = static_cast<const T*>(gv);
    vec<C> vy = splat<C>(0);
    Wide c;
    C r = -__builtin_inf();  // running finite kept max: the shift of the sums below
    bool inf = false;        // a +inf x: the row goes to the census
    double ysum = 0, yd = 0, gyd = 0;
    for (int64_t b0 = 0; b0 < n; b0 += BLOCK) {
      const int64_t b1 = b0 + BLOCK < n ? b0 + BLOCK : n;
      C old = r;
      ExpRows<T, C>::kept_max(x, b0, b1, mask_negative, r);
      if (r == __builtin_inf()) inf = true, r = old;
      if (r > old && old > -__builtin_inf()) {
        yd -= (double(r) - double(old)) * ysum;
        gyd -= (double(r) - double(old)) * c.total();
      }
      const C ref = r > -__builtin_inf() ? r : C(0);
      vec<C> s{}, ys{}, a{}, q{};
      for (int64_t i = b0; i < b1; i += W) {
        vec<C> xs = ld<T, C>(x, i, b1, neg_inf<T>());
        vec<C> yk = select<C>(kept_or_nan(xs, mask_negative), ld<T, C>(y, i, b1, zero<T>()), splat<C>(0));
        vec<C> gy = ld<T, C>(g, i, b1, zero<T>()) * yk;
        vy = vmax<C>(yk, vy);
        s += gy;
        ys += yk;
        // y = 0 where x = -inf or masked: keep 0 * inf out of the shifted sums
        vec<C> d = select<C>(yk != C(0), xs - ref, splat<C>(0));
        a += yk * d;
        q += gy * d;
      }
      c.add(s);
      ysum += hsum<C>(ys);
      yd += hsum<C>(a);
      gyd += hsum<C>(q);
    }
    eb::BwdPartial out{inf ? __builtin_inf() : double(r), c.total(), double(hmax_nonan<C>(vy)),
                       0, 0};
    out.ysum = ysum, out.yd = yd, out.gyd = gyd;
    if (inf || out.c != out.c) {
      C cm = -__builtin_inf();
      ExpRows<T, C>::census(x, 0, n, mask_negative, cm, out.nan, out.ninf);
    }
    return out;
  }

  // c = sum g y, max y and the smallest nonzero y, from y and g alone (y is exactly 0
  // where x was masked, so no x is needed to keep those positions out of c).
  static eb::BwdPartial partial_y(const void* yv, const void* gv, int64_t n) {
    const T *y = static_cast<const T*>(yv), *g = static_cast<const T*>(gv);
    const vec<C> inf = splat<C>(__builtin_inf());
    vec<C> vy = splat<C>(0), vlo = inf;
    Wide c;
    for (int64_t b0 = 0; b0 < n; b0 += BLOCK) {
      const int64_t b1 = b0 + BLOCK < n ? b0 + BLOCK : n;
      vec<C> s0{}, s1{};
      int64_t i = b0;
      for (; i + 2 * W <= b1; i += 2 * W) {
        vec<C> y0 = Io<T, C>::load(y + i), y1 = Io<T, C>::load(y + i + W);
        vy = vmax<C>(vmax<C>(y0, y1), vy);
        vlo = vmin<C>(vmin<C>(select<C>(y0 != C(0), y0, inf), select<C>(y1 != C(0), y1, inf)), vlo);
        s0 += Io<T, C>::load(g + i) * y0;
        s1 += Io<T, C>::load(g + i + W) * y1;
      }
      for (; i < b1; i += W) {
        vec<C> ys = ld<T, C>(y, i, b1, zero<T>());
        vy = vmax<C>(ys, vy);
        vlo = vmin<C>(select<C>(ys != C(0), ys, inf), vlo);
        s0 += ld<T, C>(g, i, b1, zero<T>()) * ys;
      }
      c.add(s0 + s1);
    }
    eb::BwdPartial r{__builtin_nan(""), c.total(), double(hmax_nonan<C>(vy)), 0, 0};
    r.ymin = -double(hmax_nonan<C>(-vlo));
    return r;
  }

  // dx = y (g - c)/tau, from y and g alone: y is exactly 0 at masked positions, and the
  // row's class is already known. (g - c)/tau before the product: a subnormal y (g - c) is
  // never scaled up by 1/tau.
  static void write(const void* yv, const void* gv, void* dxv, int64_t n, int cls, double c,
                    double tau) {
    const T *y = static_cast<const T*>(yv), *g = static_cast<const T*>(gv);
    T* dx = static_cast<T*>(dxv);
    if (cls != eb::ROW_FINITE) {
      vec<C> fill = splat<C>(cls == eb::ROW_NAN ? C(__builtin_nan("")) : C(0));
      for (int64_t i = 0; i < n; i += W) st<T, C>(dx, i, n, fill);
      return;
    }
    const C cc = C(c), inv_tau = C(1.0 / tau);
    auto dx_of = [&](vec<C> ys, vec<C> gs) {
      return select<C>(ys != C(0), ys * ((gs - cc) * inv_tau), splat<C>(0));
    };
    int64_t i0 = 0;
    if constexpr (streamable<T>) {  // dx of a long row, as ExpRows::write_exps writes y
      if (long_row<T, C>(dx, n)) {
        for (; i0 + W <= n; i0 += W)
          stream_store(dx + i0, dx_of(Io<T, C>::load(y + i0), Io<T, C>::load(g + i0)));
        stream_fence();
      }
    }
    for (int64_t i = i0; i < n; i += W)
      st<T, C>(dx, i, n, dx_of(ld<T, C>(y, i, n, zero<T>()), ld<T, C>(g, i, n, zero<T>())));
  }
};

}  // namespace EB_NS
