// What every row kernel family shares (exp_rows.h, weight_rows.h, bwd_rows.h): tail-safe
// loads and stores, the fp64 sum of block sums (Wide), the streaming threshold and the kept
// mask. Compiled once per instruction set with them (isa_*.cpp through rows.h).
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
  // The lanes added with their rounding errors kept too: a lane sum of plain additions
  // would put width - 1 roundings on the path of every term.
  double total() const {
    vec<double> t = a + b;  // b is nonzero only for fp32 terms, two dozen bits below an ulp
    double s = 0, e = 0;
    for (int i = 0; i < width<double>(); ++i) {
      double v = t[i], u = s + v, z = u - s;
      e += ((s - (u - z)) + (v - z)) + err[i];
      s = u;
    }
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

}  // namespace EB_NS
