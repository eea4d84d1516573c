// The row kernels of the native tier, written once on the vectors of simd.h and compiled
// once per instruction set (isa_*.cpp). Each works on one segment of one row: a whole row,
// or a piece of a long row split across threads (ops.cpp merges the pieces' reductions).
// The algorithms and pass structures are described in docs/native.md.
#pragma once
#include "simd.h"
#include "table.h"

namespace EB_NS {

template <bool B> struct Flag { static constexpr bool value = B; };

template <typename T> inline T neg_inf();
template <> inline double neg_inf<double>() { return -__builtin_inf(); }
template <> inline float neg_inf<float>() { return -__builtin_inff(); }
template <> inline f16 neg_inf<f16>() { return f16{0xfc00}; }
template <> inline bf16 neg_inf<bf16>() { return bf16{0xff80}; }
template <typename T> inline T zero() { T z; __builtin_memset(&z, 0, sizeof z); return z; }

template <typename C> inline C lowest_finite();
template <> inline float lowest_finite<float>() { return -3.40282346638528859812e+38f; }
template <> inline double lowest_finite<double>() { return -1.79769313486231570815e+308; }

// Load W values at p[i..], the lanes past n filled with `fill`.
template <typename T, typename C> EB_INLINE vec<C> ld(const T* p, int64_t i, int64_t n, T fill) {
  return n - i >= width<C>() ? Io<T, C>::load(p + i) : load_tail<T, C>(p + i, n - i, fill);
}
template <typename T, typename C> EB_INLINE void st(T* p, int64_t i, int64_t n, vec<C> v) {
  if (n - i >= width<C>()) Io<T, C>::store(p + i, v);
  else store_tail<T, C>(p + i, n - i, v);
}

// A sum kept in fp64 lanes whatever the compute type (the denominator of a long row).
// fp64 block sums are added with their rounding errors kept (TwoSum per lane), so a row of
// many blocks carries about one rounding per block chain, not one per block (docs/native.md).
struct Wide {
  vec<double> a{}, b{}, err{};
  void add(vec<double> v) {
    vec<double> t = a + v, z = t - a;
    err += (a - (t - z)) + (v - z);
    a = t;
  }
  void add(vec<float> v) {
#if EB_VEC_BYTES == 64
    __m512 f = (__m512)v;  // GCC lowers a widening convertvector to 4-lane pieces: say it
    a += (vec<double>)_mm512_cvtps_pd(_mm512_castps512_ps256(f));
    b += (vec<double>)_mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1)));
#elif EB_VEC_BYTES == 32
    __m256 f = (__m256)v;
    a += (vec<double>)_mm256_cvtps_pd(_mm256_castps256_ps128(f));
    b += (vec<double>)_mm256_cvtps_pd(_mm256_extractf128_ps(f, 1));
#else
    a += __builtin_convertvector(__builtin_shufflevector(v, v, 0, 1), vec<double>);
    b += __builtin_convertvector(__builtin_shufflevector(v, v, 2, 3), vec<double>);
#endif
  }
  double total() const {
    vec<double> t = a + b;
    double s = 0, e = 0;
    for (int i = 0; i < width<double>(); ++i) s += t[i], e += err[i];
    return __builtin_isfinite(s) ? s + e : s;  // a non-finite sum leaves err NaN: keep s
  }
  void scale(double f) { a *= f; b *= f; err *= f; }
};

// A row (segment) this long leaves the cache before it is read again: its output is written
// around the cache (no read for ownership of its lines), where the format can be and the
// output is aligned for the store.
template <typename T, typename C> inline bool long_row(const T* out, int64_t n) {
  return streamable<T> && n * int64_t(sizeof(T)) >= eb::STREAM_BYTES &&
         reinterpret_cast<uintptr_t>(out) % (width<C>() * sizeof(T)) == 0;
}

template <typename C> EB_INLINE ivec<C> kept_mask(vec<C> x, int mask_negative) {
  return x >= (mask_negative ? C(0) : lowest_finite<C>());
}

// ---------------------------------------------------------------- exp family, forward

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
    C bm = hmax<C>(vm);
    m = bm > m ? bm : m;
    nan |= any<C>(vnan);
    for (int k = 0; k < W; ++k) ninf += vinf[k];
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
    C bm = hmax<C>(vmax<C>(a, b));
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

  // Sum of the exps of one block (at most BLOCK elements) into acc, in four chains of the
  // compute type (16 terms per fp32 lane: a few ulps at most); `out` stores the exps.
  template <bool MASK, bool UNIT>
  static void sum_block(const T* x, int64_t i0, int64_t i1, C m, C inv_tau, Wide& acc, C* out) {
    vec<C> s0{}, s1{}, s2{}, s3{};
    int64_t i = i0;
    for (; i + 4 * W <= i1; i += 4 * W) {
      prefetch_ahead<4 * W>(x + i, out ? out + i : nullptr);
      vec<C> e0 = expv<MASK, UNIT>(Io<T, C>::load(x + i), m, inv_tau);
      vec<C> e1 = expv<MASK, UNIT>(Io<T, C>::load(x + i + W), m, inv_tau);
      vec<C> e2 = expv<MASK, UNIT>(Io<T, C>::load(x + i + 2 * W), m, inv_tau);
      vec<C> e3 = expv<MASK, UNIT>(Io<T, C>::load(x + i + 3 * W), m, inv_tau);
      s0 += e0; s1 += e1; s2 += e2; s3 += e3;
      if (out) {
        Io<C, C>::store(out + i, e0); Io<C, C>::store(out + i + W, e1);
        Io<C, C>::store(out + i + 2 * W, e2); Io<C, C>::store(out + i + 3 * W, e3);
      }
    }
    for (; i < i1; i += W) {
      vec<C> e = expv<MASK, UNIT>(ld<T, C>(x, i, i1, neg_inf<T>()), m, inv_tau);
      if (i1 - i < W) e = select<C>(lanes_below<C>(i1 - i), e, splat<C>(0));
      s0 += e;
      if (out) st<C, C>(out, i, i1, e);
    }
    acc.add((s0 + s1) + (s2 + s3));
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
      if (m == -__builtin_inf()) {  // nothing kept yet
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
      C f = mb == -__builtin_inf() ? C(0) : C(__builtin_exp((mb - r.m) / p.tau) / r.den);
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

// ---------------------------------------------------------------- weight family, forward

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
    // fp64: two chains per block of FUSED_BLOCK, the blocks added compensated (Wide)
    const C inv = C(1 / scale);
    for (int64_t b0 = 0; b0 < n; b0 += eb::FUSED_BLOCK) {
      const int64_t b1 = b0 + eb::FUSED_BLOCK < n ? b0 + eb::FUSED_BLOCK : n;
      vec<C> s0{}, s1{};
      int64_t i = b0;
      for (; i + 2 * W <= b1; i += 2 * W) {
        s0 += weight(Io<T, C>::load(x + i), symax) * inv;
        s1 += weight(Io<T, C>::load(x + i + W), symax) * inv;
      }
      for (; i < b1; i += W)
        s0 += select<C>(lanes_below<C>(b1 - i), weight(ld<T, C>(x, i, b1, zero<T>()), symax),
                        splat<C>(0)) * inv;
      acc.add(s0 + s1);
    }
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

// ---------------------------------------------------------------- exp family, backward

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
    eb::BwdPartial out{inf ? __builtin_inf() : double(r), c.total(), double(hmax<C>(vy)), 0, 0};
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
    eb::BwdPartial r{__builtin_nan(""), c.total(), double(hmax<C>(vy)), 0, 0};
    r.ymin = -double(hmax<C>(-vlo));
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

// ---------------------------------------------------------------- the table

// ---------------------------------------------------------------- the roofline's probe

// The sum of exp(x) over x[0, n), every x <= 0: the row kernels' exponential with nothing
// stored, for the exp ceiling of docs/benchmarking.md (the native tier's exp+sum probe).
template <typename T, typename C> double exp_sum(const void* xv, int64_t n) {
  const T* x = static_cast<const T*>(xv);
  constexpr int W = width<C>();
  vec<C> a{}, b{};
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    a += vexp_scaled<C>(Io<T, C>::load(x + i));
    b += vexp_scaled<C>(Io<T, C>::load(x + i + W));
  }
  for (; i < n; i += W) a += vexp_scaled<C>(ld<T, C>(x, i, n, neg_inf<T>()));
  return hsum<C>(a + b) * exp_unscale<C>();
}

inline const eb::Table* make_table(const char* isa) {
  static eb::Table t = [isa] {
    eb::Table t{};
    t.isa = isa;
    t.vector_bytes = EB_VEC_BYTES;
    using namespace eb;
    t.exp_partial[THREE_PASS][F64] = ExpRows<double, double>::three_pass;
    t.exp_partial[THREE_PASS][F32] = ExpRows<float, float>::three_pass;
    t.exp_partial[THREE_PASS][F16] = ExpRows<f16, float>::three_pass;
    t.exp_partial[THREE_PASS][BF16] = ExpRows<bf16, float>::three_pass;
    t.exp_partial[ONLINE][F64] = ExpRows<double, double>::online<false>;
    t.exp_partial[ONLINE][F32] = ExpRows<float, float>::online<false>;
    t.exp_partial[ONLINE][F16] = ExpRows<f16, float>::online<false>;
    t.exp_partial[ONLINE][BF16] = ExpRows<bf16, float>::online<false>;
    t.exp_partial[FUSED][F64] = ExpRows<double, double>::online<true>;
    t.exp_partial[FUSED][F32] = ExpRows<float, float>::online<true>;
    t.exp_partial[FUSED][F16] = ExpRows<f16, float>::online<true>;
    t.exp_partial[FUSED][BF16] = ExpRows<bf16, float>::online<true>;
    // accurate: the fused structure in fp64 (its exps kept in fp64 scratch for an fp32 y)
    t.exp_partial[ACCURATE][F64] = ExpRows<double, double>::online<true>;
    t.exp_partial[ACCURATE][F32] = ExpRows<float, double>::online<true>;
    for (int d = 0; d < NUM_DTYPES; ++d) {
      t.exp_write[THREE_PASS][d] = t.exp_write[ONLINE][d] = nullptr;
    }
    t.exp_write[THREE_PASS][F64] = t.exp_write[ONLINE][F64] = ExpRows<double, double>::write;
    t.exp_write[THREE_PASS][F32] = t.exp_write[ONLINE][F32] = ExpRows<float, float>::write;
    t.exp_write[THREE_PASS][F16] = t.exp_write[ONLINE][F16] = ExpRows<f16, float>::write;
    t.exp_write[THREE_PASS][BF16] = t.exp_write[ONLINE][BF16] = ExpRows<bf16, float>::write;
    t.exp_write[FUSED][F64] = ExpRows<double, double>::rescale;
    t.exp_write[FUSED][F32] = ExpRows<float, float>::rescale;
    t.exp_write[FUSED][F16] = ExpRows<f16, float>::rescale;
    t.exp_write[FUSED][BF16] = ExpRows<bf16, float>::rescale;
    t.exp_write[ACCURATE][F64] = ExpRows<double, double>::rescale;
    t.exp_write[ACCURATE][F32] = ExpRows<float, double>::rescale;
    t.weight_partial[F64] = WeightRows<double, double>::partial;
    t.weight_partial[F32] = WeightRows<float, float>::partial;
    t.weight_partial[F16] = WeightRows<f16, float>::partial;
    t.weight_partial[BF16] = WeightRows<bf16, float>::partial;
    t.weight_write[F64] = WeightRows<double, double>::write;
    t.weight_write[F32] = WeightRows<float, float>::write;
    t.weight_write[F16] = WeightRows<f16, float>::write;
    t.weight_write[BF16] = WeightRows<bf16, float>::write;
    t.bwd_partial[F64] = BwdRows<double, double>::partial;
    t.bwd_partial[F32] = BwdRows<float, float>::partial;
    t.bwd_partial[F16] = BwdRows<f16, float>::partial;
    t.bwd_partial[BF16] = BwdRows<bf16, float>::partial;
    t.bwd_write[F64] = BwdRows<double, double>::write;
    t.bwd_write[F32] = BwdRows<float, float>::write;
    t.bwd_write[F16] = BwdRows<f16, float>::write;
    t.bwd_write[BF16] = BwdRows<bf16, float>::write;
    t.exp_sum[F64] = exp_sum<double, double>;
    t.exp_sum[F32] = exp_sum<float, float>;
    t.exp_sum[F16] = exp_sum<f16, float>;
    t.exp_sum[BF16] = exp_sum<bf16, float>;
    return t;
  }();
  return &t;
}

}  // namespace EB_NS
