// The exp family's forward row kernels (elastic, softmax, softmax1): the three-pass,
// online, fused and accurate pass structures of docs/native.md section 1, on one segment of
// one row (merge.h merges a split row's pieces).
#pragma once
#include "rows_common.h"

namespace EB_NS {

template <typename T, typename C> struct ExpRows {
  static constexpr int W = width<C>();
  static constexpr int64_t BLOCK = eb::FUSED_BLOCK;  // elements per online block

  // The census of a row that is not plainly finite (rare): max over kept values, NaN flag
  // and +inf count over x[i0, i1).
  static void census(const T* x, int64_t i0, int64_t i1, int mask_negative, C& m, int& nan,
                     int64_t& ninf) {
    vec<C> vm = splat<C>(-__builtin_inf());
    ivec<C> vnan{}, vinf{};
    for (int64_t i = i0; i < i1; i += W) {
      vec<C> v = ld<T, C>(x, i, i1, neg_inf<T>());
      vm = vmax<C>(vm, select<C>(kept_mask<C>(v, mask_negative), v, splat<C>(-__builtin_inf())));
      vnan |= v != v;
      vinf -= v == __builtin_inf();
    }
    C bm = hmax_nonan<C>(vm);
    m = bm > m ? bm : m;
    nan |= any<C>(vnan);
    for (int k = 0; k < W; ++k) ninf += vinf[k];
  }

  // Whether x[i0, i1) holds a NaN.
  static bool has_nan(const T* x, int64_t i0, int64_t i1) {
    ivec<C> vnan{};
    for (int64_t i = i0; i < i1; i += W) {
      vec<C> v = ld<T, C>(x, i, i1, neg_inf<T>());
      vnan |= v != v;
    }
    return any<C>(vnan);
  }

  // The largest kept value of x[i0, i1), merged into m. The sweep is a plain max (NaN
  // ignored): with masking, the kept max is the max when that is >= 0, else nothing is
  // kept. NaN is caught later, in the sum it turns to NaN (expv lets it through).
  static void kept_max(const T* x, int64_t i0, int64_t i1, int mask_negative, C& m) {
    vec<C> a = splat<C>(-__builtin_inf()), b = a;
    int64_t i = i0;
    for (; i + 2 * W <= i1; i += 2 * W) {
      a = vmax<C>(Io<T, C>::load(x + i), a);  // vmax(v, acc): a NaN v leaves acc
      b = vmax<C>(Io<T, C>::load(x + i + W), b);
    }
    for (; i < i1; i += W) a = vmax<C>(ld<T, C>(x, i, i1, neg_inf<T>()), a);
    C bm = hmax_nonan<C>(vmax<C>(a, b));
    if (mask_negative && bm < C(0)) bm = -__builtin_inf();
    m = bm > m ? bm : m;
  }

  // f(Flag<mask>, Flag<tau == 1>): the exp loops are instantiated per combination.
  template <class F> static void with_flags(int mask_negative, C inv_tau, F&& f) {
    if (mask_negative) {
      if (inv_tau == C(1)) f(Flag<true>{}, Flag<true>{});
      else f(Flag<true>{}, Flag<false>{});
    } else {
      if (inv_tau == C(1)) f(Flag<false>{}, Flag<true>{});
      else f(Flag<false>{}, Flag<false>{});
    }
  }

  // fp64 exponentials that only feed a 16- or 32-bit output need 2^-26.5 (0.1 fp32 ulp), not 2^-53
  static constexpr int DEGREE = sizeof(C) == 8 && sizeof(T) < 8 ? 6 : ExpConst<C>::DEGREE;

  // exp((x - m)/tau) * 2^PRESCALE, 0 on masked (negative) lanes; NaN stays NaN (simd.h).
  // Unmasked -inf lanes give exp(LOWEST), which every output rounds to 0.
  // UNIT: tau = 1 (softmax and softmax1 always), no multiply.
  template <bool MASK, bool UNIT> EB_INLINE static vec<C> expv(vec<C> v, C m, C inv_tau) {
    vec<C> e = vexp_scaled<C, DEGREE>(UNIT ? v - m : (v - m) * inv_tau);
    return MASK ? select<C>(v < C(0), splat<C>(0), e) : e;
  }

  // Ask for the lines PREFETCH bytes past x[i, i + K) (and past out[i, i + K), for writing):
  // while a block's exponentials are computed from L1, the next block's lines are on their
  // way, so the memory (or L3) stream overlaps the arithmetic instead of taking turns with
  // it; past a row's end they are the next row's (a prefetch never faults).
  static constexpr int64_t PREFETCH = 4096;
  template <int K> EB_INLINE static void prefetch_ahead(const T* x, const C* out) {
    const char* px = reinterpret_cast<const char*>(x) + PREFETCH;
    for (int b = 0; b < K * int(sizeof(T)); b += 64) __builtin_prefetch(px + b, 0, 3);
    if (!out) return;
    const char* po = reinterpret_cast<const char*>(out) + PREFETCH * int64_t(sizeof(C)) / int64_t(sizeof(T));
    for (int b = 0; b < K * int(sizeof(C)); b += 64) __builtin_prefetch(po + b, 1, 3);
  }

  // Sum of the exps of one block (at most BLOCK elements) into acc, four vectors at a time
  // added pairwise and then into acc, which keeps fp64 rounding errors and fp32 terms in
  // fp64: two roundings of the compute type per term, however long the row. A chain of
  // plain additions per lane would make each addition of an equal term (ties) round the
  // same way, an error growing with the chain's length. `out` stores the exps.
  template <bool MASK, bool UNIT>
  static void sum_block(const T* x, int64_t i0, int64_t i1, C m, C inv_tau, Wide& acc, C* out) {
    int64_t i = i0;
    for (; i + 4 * W <= i1; i += 4 * W) {
      prefetch_ahead<4 * W>(x + i, out ? out + i : nullptr);
      vec<C> e0 = expv<MASK, UNIT>(Io<T, C>::load(x + i), m, inv_tau);
      vec<C> e1 = expv<MASK, UNIT>(Io<T, C>::load(x + i + W), m, inv_tau);
      vec<C> e2 = expv<MASK, UNIT>(Io<T, C>::load(x + i + 2 * W), m, inv_tau);
      vec<C> e3 = expv<MASK, UNIT>(Io<T, C>::load(x + i + 3 * W), m, inv_tau);
      acc.add((e0 + e1) + (e2 + e3));
      if (out) {
        Io<C, C>::store(out + i, e0); Io<C, C>::store(out + i + W, e1);
        Io<C, C>::store(out + i + 2 * W, e2); Io<C, C>::store(out + i + 3 * W, e3);
      }
    }
    for (; i < i1; i += W) {
      vec<C> e = expv<MASK, UNIT>(ld<T, C>(x, i, i1, neg_inf<T>()), m, inv_tau);
      if (i1 - i < W) e = select<C>(lanes_below<C>(i1 - i), e, splat<C>(0));
      acc.add(e);
      if (out) st<C, C>(out, i, i1, e);
    }
  }

  static void sum_exp(const T* x, int64_t i0, int64_t i1, C m, C inv_tau, int mask_negative,
                      Wide& acc, C* out) {
    for (int64_t b0 = i0; b0 < i1; b0 += BLOCK) {
      int64_t b1 = b0 + BLOCK < i1 ? b0 + BLOCK : i1;
      with_flags(mask_negative, inv_tau, [&](auto mask, auto unit) {
        sum_block<decltype(mask)::value, decltype(unit)::value>(x, b0, b1, m, inv_tau, acc, out);
      });
    }
  }

  // The partial of a row whose max is not finite, or whose sum came out NaN: by census.
  static eb::ExpPartial by_census(const T* x, int64_t n, int mask_negative) {
    C m = -__builtin_inf();
    int nan = 0;
    int64_t ninf = 0;
    census(x, 0, n, mask_negative, m, nan, ninf);
    return {double(m), 0.0, ninf, nan};
  }

  // three-pass: a max sweep, then a sum sweep (the write sweep is `write`).
  static eb::ExpPartial three_pass(const void* xv, void*, int64_t n, const eb::ExpSpec& p,
                                   double*) {
    const T* x = static_cast<const T*>(xv);
    C m = -__builtin_inf();
    kept_max(x, 0, n, p.mask_negative, m);
    if (!(m > -__builtin_inf() && m < __builtin_inf())) return by_census(x, n, p.mask_negative);
    Wide acc;
    sum_exp(x, 0, n, m, C(1.0 / p.tau), p.mask_negative, acc, nullptr);
    double s = acc.total();
    if (s != s) return by_census(x, n, p.mask_negative);
    return {double(m), s * exp_unscale<C>(), 0, 0};
  }

  // online: one sweep in blocks of BLOCK elements (each read twice from L1: its max, then
  // its exps); the running sum is rescaled when the max grows. With `fused`, the exps are
  // stored and each block's shift is kept in scratch, so the write sweep only rescales
  // and computes no exponential. The exps go into y when y holds the compute type and the
  // segment is short, else into scratch after the shifts (eb::fused_scratch): a 16-bit y
  // would round them, and a long segment's y is then written once, streaming.
  static C* exps_buffer(void* y, double* scratch, int64_t n) {
    if (eb::exps_in_y(n, sizeof(T), sizeof(C))) return static_cast<C*>(y);
    return reinterpret_cast<C*>(scratch + eb::fused_blocks(n));
  }

  template <bool fused>
  static eb::ExpPartial online(const void* xv, void* yv, int64_t n, const eb::ExpSpec& p,
                               double* scratch) {
    const T* x = static_cast<const T*>(xv);
    C* buf = fused ? exps_buffer(yv, scratch, n) : nullptr;
    const C inv_tau = C(1.0 / p.tau);
    C m = -__builtin_inf();
    Wide acc;
    for (int64_t b0 = 0, blk = 0; b0 < n; b0 += BLOCK, ++blk) {
      int64_t b1 = b0 + BLOCK < n ? b0 + BLOCK : n;
      C old = m;
      if constexpr (sizeof(C) > sizeof(float) && sizeof(T) == sizeof(float)) {
        float mf = float(m);  // the max of fp32 values is one of them: take it in fp32 lanes
        ExpRows<T, float>::kept_max(x, b0, b1, p.mask_negative, mf);
        m = C(mf);
      } else {
        kept_max(x, b0, b1, p.mask_negative, m);
      }
      if (m == __builtin_inf()) return by_census(x, n, p.mask_negative);
      if (fused) scratch[blk] = double(m);
      if (m == -__builtin_inf()) {  // nothing kept yet: a NaN here is in no sum to show it
        if (has_nan(x, b0, b1)) return by_census(x, n, p.mask_negative);
        if (fused) for (int64_t i = b0; i < b1; ++i) buf[i] = C(0);
        continue;
      }
      if (m > old && old > -__builtin_inf()) acc.scale(__builtin_exp((double(old) - double(m)) / p.tau));
      sum_exp(x, b0, b1, m, inv_tau, p.mask_negative, acc, buf);
    }
    double s = acc.total();
    if (m == -__builtin_inf() || s != s) return by_census(x, n, p.mask_negative);
    return {double(m), s * exp_unscale<C>(), 0, 0};
  }

  // Fill y for a row of a special class; true when the row was one.
  static bool write_special(const T* x, T* y, int64_t n, const eb::ExpRow& r) {
    if (r.cls == eb::ROW_FINITE) return false;
    vec<C> fill = splat<C>(r.cls == eb::ROW_NAN ? C(__builtin_nan("")) : C(0));
    C share = C(1.0 / double(r.ninf));  // the +inf limit: the +inf positions share the row
    for (int64_t i = 0; i < n; i += W) {
      vec<C> out = fill;
      if (r.cls == eb::ROW_INF) {
        vec<C> v = ld<T, C>(x, i, n, neg_inf<T>());
        out = select<C>(v == __builtin_inf(), splat<C>(share), splat<C>(0));
      }
      st<T, C>(y, i, n, out);
    }
    return true;
  }

  // y = exp((x - m)/tau) / D on kept positions, 0 elsewhere.
  template <bool MASK, bool UNIT>
  static void write_exps(const T* x, T* y, int64_t n, C m, C inv_tau, C inv_den) {
    int64_t i = 0;
    if constexpr (streamable<T>) {
      if (long_row<T, C>(y, n)) {
        for (; i + W <= n; i += W)
          stream_store(y + i, expv<MASK, UNIT>(Io<T, C>::load(x + i), m, inv_tau) * inv_den);
        stream_fence();
      }
    }
    for (; i + 2 * W <= n; i += 2 * W) {
      vec<C> e0 = expv<MASK, UNIT>(Io<T, C>::load(x + i), m, inv_tau);
      vec<C> e1 = expv<MASK, UNIT>(Io<T, C>::load(x + i + W), m, inv_tau);
      Io<T, C>::store(y + i, e0 * inv_den);
      Io<T, C>::store(y + i + W, e1 * inv_den);
    }
    for (; i < n; i += W)
      st<T, C>(y, i, n, expv<MASK, UNIT>(ld<T, C>(x, i, n, neg_inf<T>()), m, inv_tau) * inv_den);
  }

  static void write(const void* xv, void* yv, int64_t n, const eb::ExpSpec& p, const eb::ExpRow& r,
                    const double*) {
    const T* x = static_cast<const T*>(xv);
    T* y = static_cast<T*>(yv);
    if (write_special(x, y, n, r)) return;
    const C m = C(r.m), inv_tau = C(1.0 / p.tau), inv_den = C(exp_unscale<C>() / r.den);
    with_flags(p.mask_negative, inv_tau, [&](auto mask, auto unit) {
      write_exps<decltype(mask)::value, decltype(unit)::value>(x, y, n, m, inv_tau, inv_den);
    });
  }

  // The fused kernel's write sweep: y (holding each block's scaled exps) times the block's
  // factor exp((m_block - m)/tau) / D, then the unscale (a power of two: exact, except that
  // it rounds subnormal outputs once).
  static void rescale(const void* xv, void* yv, int64_t n, const eb::ExpSpec& p,
                      const eb::ExpRow& r, const double* scratch) {
    const T* x = static_cast<const T*>(xv);
    T* y = static_cast<T*>(yv);
    if (write_special(x, y, n, r)) return;
    const C* buf = exps_buffer(yv, const_cast<double*>(scratch), n);
    // y's lines are in cache already where they hold the exps: overwritten in place there
    const bool stream = static_cast<const void*>(buf) != yv && long_row<T, C>(y, n);
    for (int64_t b0 = 0, blk = 0; b0 < n; b0 += BLOCK, ++blk) {
      int64_t b1 = b0 + BLOCK < n ? b0 + BLOCK : n;
      double mb = scratch[blk];
      // a block at the row's shift (a short row's one block): exp(0) is exactly 1
      C f = mb == -__builtin_inf() ? C(0)
            : mb == r.m           ? C(1.0 / r.den)
                                  : C(__builtin_exp((mb - r.m) / p.tau) / r.den);
      const C u = C(exp_unscale<C>());
      int64_t i = b0;
      if constexpr (streamable<T>) {
        if (stream)
          for (; i + W <= b1; i += W) stream_store(y + i, (Io<C, C>::load(buf + i) * f) * u);
      }
      for (; i + W <= b1; i += W) Io<T, C>::store(y + i, (Io<C, C>::load(buf + i) * f) * u);
      if (i < b1) st<T, C>(y, i, b1, (ld<C, C>(buf, i, b1, C(0)) * f) * u);
    }
    if (stream) stream_fence();
  }
};

}  // namespace EB_NS
