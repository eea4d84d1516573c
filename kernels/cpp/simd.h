// Portable SIMD through GCC/Clang vector extensions: the including file picks the width
// (EB_VEC_BYTES) and the instruction set (#pragma GCC target), and names its namespace
// (EB_NS), so one source compiles once per instruction set with no shared inline symbols.
// Only compiler builtins are used here: no standard-library function is instantiated in
// an instruction-set-specific translation unit.
#pragma once
#include <cstdint>
#if EB_VEC_BYTES > 16
#include <immintrin.h>  // intrinsics are always-inline: nothing shared is emitted
#endif

// The vector helpers are forced inline: left to its heuristics, GCC kept the exponential
// out of line (a call per vector through the PLT, its accumulators spilled around it),
// which cost the exp-bound kernels about half their speed.
#ifndef EB_INLINE
#define EB_INLINE inline __attribute__((always_inline))
#endif

namespace EB_NS {

template <typename C> struct V;
template <> struct V<float> {
  static constexpr int W = EB_VEC_BYTES / 4;
  typedef float type __attribute__((vector_size(EB_VEC_BYTES)));
  typedef int32_t itype __attribute__((vector_size(EB_VEC_BYTES)));
};
template <> struct V<double> {
  static constexpr int W = EB_VEC_BYTES / 8;
  typedef double type __attribute__((vector_size(EB_VEC_BYTES)));
  typedef int64_t itype __attribute__((vector_size(EB_VEC_BYTES)));
};

template <typename C> using vec = typename V<C>::type;
template <typename C> using ivec = typename V<C>::itype;
template <typename C> constexpr int width() { return V<C>::W; }

template <typename C> EB_INLINE vec<C> splat(C v) { return vec<C>{} + v; }
template <typename C> EB_INLINE ivec<C> bits(vec<C> v) { return (ivec<C>)v; }
template <typename C> EB_INLINE vec<C> from_bits(ivec<C> v) { return (vec<C>)v; }
template <typename C> EB_INLINE vec<C> select(ivec<C> m, vec<C> a, vec<C> b) { return m ? a : b; }
template <typename C> EB_INLINE vec<C> vmax(vec<C> a, vec<C> b) { return a > b ? a : b; }
template <typename C> EB_INLINE vec<C> vmin(vec<C> a, vec<C> b) { return a < b ? a : b; }
template <typename C> EB_INLINE vec<C> vabs(vec<C> a) { return a < 0 ? -a : a; }
template <typename C> EB_INLINE ivec<C> lanes_below(int64_t count) {  // lane i < count
  ivec<C> iota;
  for (int i = 0; i < width<C>(); ++i) iota[i] = i;
  using E = decltype(iota[0] + 0);
  E c = count < width<C>() ? E(count) : E(width<C>());
  return iota < c;
}
template <typename C> EB_INLINE C hmax(vec<C> v) {
  C r = v[0];
  for (int i = 1; i < width<C>(); ++i) r = v[i] > r ? v[i] : r;
  return r;
}
// hmax's lane for a vector that holds no NaN, in a tree of adjacent pairs (log2(width) steps
// instead of a chain of width - 1, a short row's fixed cost): each pair keeps its lower lane
// unless the higher is strictly greater, so the first lane of the largest value wins, as in
// hmax's scan, and a zero keeps the sign hmax gives it. (With a NaN the two differ: hmax
// skips one past lane 0.)
template <typename C> EB_INLINE C hmax_nonan(vec<C> v) {
  C a[width<C>()];
  for (int i = 0; i < width<C>(); ++i) a[i] = v[i];
  for (int w = width<C>() / 2; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) a[i] = a[2 * i + 1] > a[2 * i] ? a[2 * i + 1] : a[2 * i];
  return a[0];
}
template <typename C> EB_INLINE double hsum(vec<C> v) {  // the lanes' sum, in fp64
  double r = 0;
  for (int i = 0; i < width<C>(); ++i) r += double(v[i]);
  return r;
}
template <typename C> EB_INLINE bool any(ivec<C> m) {
  for (int i = 0; i < width<C>(); ++i)
    if (m[i]) return true;
  return false;
}
template <typename C> EB_INLINE int64_t count(ivec<C> m) {
  int64_t c = 0;
  for (int i = 0; i < width<C>(); ++i) c += m[i] != 0;
  return c;
}

// ---- storage formats: load W values of T as compute type C, store C back rounded once ----

struct f16 { uint16_t bits; };
struct bf16 { uint16_t bits; };

template <typename T, typename C> struct Io;

template <typename C> struct Io<C, C> {
  EB_INLINE static vec<C> load(const C* p) { vec<C> v; __builtin_memcpy(&v, p, sizeof v); return v; }
  EB_INLINE static void store(C* p, vec<C> v) { __builtin_memcpy(p, &v, sizeof v); }
};
// Widening and narrowing conversions: GCC lowers a widening __builtin_convertvector into
// 128-bit pieces, so the x86 builds name the full-width instructions.
#if EB_VEC_BYTES == 64
template <> struct Io<float, double> {
  EB_INLINE static vec<double> load(const float* p) { return (vec<double>)_mm512_cvtps_pd(_mm256_loadu_ps(p)); }
  EB_INLINE static void store(float* p, vec<double> v) { _mm256_storeu_ps(p, _mm512_cvtpd_ps((__m512d)v)); }
};
template <> struct Io<f16, float> {
  EB_INLINE static vec<float> load(const f16* p) {
    return (vec<float>)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
  }
  EB_INLINE static void store(f16* p, vec<float> v) {
    _mm256_storeu_si256((__m256i*)p, _mm512_cvtps_ph((__m512)v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
};
#elif EB_VEC_BYTES == 32
template <> struct Io<float, double> {
  EB_INLINE static vec<double> load(const float* p) { return (vec<double>)_mm256_cvtps_pd(_mm_loadu_ps(p)); }
  EB_INLINE static void store(float* p, vec<double> v) { _mm_storeu_ps(p, _mm256_cvtpd_ps((__m256d)v)); }
};
template <> struct Io<f16, float> {
  EB_INLINE static vec<float> load(const f16* p) { return (vec<float>)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
  EB_INLINE static void store(f16* p, vec<float> v) {
    _mm_storeu_si128((__m128i*)p, _mm256_cvtps_ph((__m256)v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
};
#else
template <> struct Io<float, double> {
  typedef float h __attribute__((vector_size(EB_VEC_BYTES / 2)));
  EB_INLINE static vec<double> load(const float* p) {
    h v; __builtin_memcpy(&v, p, sizeof v); return __builtin_convertvector(v, vec<double>);
  }
  EB_INLINE static void store(float* p, vec<double> v) {  // round to nearest even, once
    h r = __builtin_convertvector(v, h); __builtin_memcpy(p, &r, sizeof r);
  }
};
template <> struct Io<f16, float> {
  typedef _Float16 h __attribute__((vector_size(EB_VEC_BYTES / 2)));
  EB_INLINE static vec<float> load(const f16* p) {
    h v; __builtin_memcpy(&v, p, sizeof v); return __builtin_convertvector(v, vec<float>);
  }
  EB_INLINE static void store(f16* p, vec<float> v) {
    h r = __builtin_convertvector(v, h); __builtin_memcpy(p, &r, sizeof r);
  }
};
#endif
template <> struct Io<bf16, float> {
  typedef uint16_t h __attribute__((vector_size(EB_VEC_BYTES / 2)));
  typedef uint32_t u __attribute__((vector_size(EB_VEC_BYTES)));
  EB_INLINE static vec<float> load(const bf16* p) {
#if EB_VEC_BYTES == 64
    return (vec<float>)_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16);
#elif EB_VEC_BYTES == 32
    return (vec<float>)_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16);
#else
    h v; __builtin_memcpy(&v, p, sizeof v);
    return (vec<float>)(__builtin_convertvector(v, u) << 16);
#endif
  }
  EB_INLINE static void store(bf16* p, vec<float> v) {  // round to nearest even; NaN stays a quiet NaN
    u b = (u)v;
    u r = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
    r = (v != v) ? ((b >> 16) | 0x40u) : r;
#if EB_VEC_BYTES == 64
    _mm256_storeu_si256((__m256i*)p, _mm512_cvtepi32_epi16((__m512i)r));
#elif EB_VEC_BYTES == 32
    __m256i packed = _mm256_packus_epi32((__m256i)r, (__m256i)r);  // values < 2^16: exact
    _mm_storeu_si128((__m128i*)p, _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08)));
#else
    h o = __builtin_convertvector(r, h); __builtin_memcpy(p, &o, sizeof o);
#endif
  }
};
template <> struct Io<f16, double> {  // through fp32: exact, since fp16 -> fp32 is exact
  static vec<double> load(const f16* p);
};
template <> struct Io<bf16, double> {
  static vec<double> load(const bf16* p);
};

// A store that bypasses the cache (no read for ownership), to a vector-aligned address; a
// plain store where the instruction set has none. Follow a run of them with stream_fence().
EB_INLINE void stream_store(float* p, vec<float> v) {
#if EB_VEC_BYTES == 64
  _mm512_stream_ps(p, (__m512)v);
#elif EB_VEC_BYTES == 32
  _mm256_stream_ps(p, (__m256)v);
#else
  __builtin_memcpy(p, &v, sizeof v);
#endif
}
EB_INLINE void stream_store(double* p, vec<double> v) {
#if EB_VEC_BYTES == 64
  _mm512_stream_pd(p, (__m512d)v);
#elif EB_VEC_BYTES == 32
  _mm256_stream_pd(p, (__m256d)v);
#else
  __builtin_memcpy(p, &v, sizeof v);
#endif
}
EB_INLINE void stream_store(float* p, vec<double> v) {  // rounded once to fp32
#if EB_VEC_BYTES == 64
  _mm256_stream_ps(p, _mm512_cvtpd_ps((__m512d)v));
#elif EB_VEC_BYTES == 32
  _mm_stream_ps(p, _mm256_cvtpd_ps((__m256d)v));
#else
  Io<float, double>::store(p, v);
#endif
}
// Storage formats written around the cache (the 16-bit ones are not).
template <typename T> constexpr bool streamable = sizeof(T) >= 4;
EB_INLINE void stream_fence() {
#if EB_VEC_BYTES > 16
  _mm_sfence();
#endif
}

// A partial vector: the first `count` elements, the rest filled with `fill`.
template <typename T, typename C> EB_INLINE vec<C> load_tail(const T* p, int64_t count, T fill) {
  T buf[width<C>()];
  for (int i = 0; i < width<C>(); ++i) buf[i] = i < count ? p[i] : fill;
  return Io<T, C>::load(buf);
}
template <typename T, typename C> EB_INLINE void store_tail(T* p, int64_t count, vec<C> v) {
  T buf[width<C>()];
  Io<T, C>::store(buf, v);
  for (int i = 0; i < count; ++i) p[i] = buf[i];
}

// ---- exp(z) for z <= 0, by Cody-Waite reduction z = k ln2 + r and a Taylor polynomial ----
// ln2 is split so that k * LN2_HI is exact without an FMA. The result comes back scaled by
// 2^PRESCALE (ExpConst), so that every value the kernels need is a normal number: arguments
// are clamped at LOWEST, where exp(z) is below half the least subnormal of the output
// format, and the scale is undone by the final multiply, which rounds subnormal outputs once.
// DEGREE 6 (fp32, and an fp64 exponential that only feeds an fp32 output) is EXP_POLY6,
// 1 + r + r^2 q(r) with q interpolating (e^r - 1 - r)/r^2 at Chebyshev nodes: 2^-26.5
// relative on |r| <= ln2/2, as the Taylor polynomial of degree 7 it replaced, with one
// multiply-add fewer. fp64 results take the Taylor polynomial of degree 13.

// scripts/exp_polynomial.py prints these (monomial coefficients, constant term first).
constexpr double EXP_POLY6[7] = {0x1.0000000000000p+0, 0x1.0000000000000p+0, 0x1.0000000000000p-1,
                                 0x1.5554db204d49ep-3, 0x1.55551841640b3p-5, 0x1.120d57df45ccap-7,
                                 0x1.6d12f282a2eaap-10};

template <typename C> struct ExpConst;
template <> struct ExpConst<float> {
  static constexpr float LOG2E = 1.44269504088896341f, SHIFT = 12582912.0f;  // 1.5 * 2^23
  static constexpr float LN2_HI = 0.693145751953125f, LN2_LO = 1.42860676533018704e-06f;
  static constexpr float LOWEST = -104.0f;
  static constexpr int BIAS = 127, MANT = 23, DEGREE = 6, PRESCALE = 64;
};
template <> struct ExpConst<double> {
  static constexpr double LOG2E = 1.44269504088896338700, SHIFT = 6755399441055744.0;  // 1.5*2^52
  static constexpr double LN2_HI = 6.93147180369123816490e-01, LN2_LO = 1.90821492927058770002e-10;
  static constexpr double LOWEST = -746.0;
  static constexpr int BIAS = 1023, MANT = 52, DEGREE = 13, PRESCALE = 600;
};

#if EB_VEC_BYTES == 64
// AVX-512 rounds (vrndscale) and scales by 2^k (vscalef) in one instruction each, and the
// 2^PRESCALE is folded into the coefficients (a power of two: exact).
EB_INLINE vec<float> round_even(vec<float> t) {
  return (vec<float>)_mm512_roundscale_ps((__m512)t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
EB_INLINE vec<double> round_even(vec<double> t) {
  return (vec<double>)_mm512_roundscale_pd((__m512d)t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
EB_INLINE vec<float> scale2(vec<float> p, vec<float> k) {
  return (vec<float>)_mm512_scalef_ps((__m512)p, (__m512)k);
}
EB_INLINE vec<double> scale2(vec<double> p, vec<double> k) {
  return (vec<double>)_mm512_scalef_pd((__m512d)p, (__m512d)k);
}
#endif

// max(lo, z), a NaN z staying NaN: on x86 one instruction (max returns its second operand
// when either is NaN), where a compare and a select would be two.
EB_INLINE vec<float> at_least(float lo, vec<float> z) {
#if EB_VEC_BYTES == 64
  return (vec<float>)_mm512_max_ps(_mm512_set1_ps(lo), (__m512)z);
#elif EB_VEC_BYTES == 32
  return (vec<float>)_mm256_max_ps(_mm256_set1_ps(lo), (__m256)z);
#else
  return z < lo ? splat<float>(lo) : z;
#endif
}
EB_INLINE vec<double> at_least(double lo, vec<double> z) {
#if EB_VEC_BYTES == 64
  return (vec<double>)_mm512_max_pd(_mm512_set1_pd(lo), (__m512d)z);
#elif EB_VEC_BYTES == 32
  return (vec<double>)_mm256_max_pd(_mm256_set1_pd(lo), (__m256d)z);
#else
  return z < lo ? splat<double>(lo) : z;
#endif
}

template <typename C, int DEGREE = ExpConst<C>::DEGREE>
EB_INLINE vec<C> vexp_scaled(vec<C> z) {
  using K = ExpConst<C>;
  z = at_least(K::LOWEST, z);
  C coef[DEGREE + 1];  // folded at compile time
  coef[0] = 1;
  for (int i = 1; i <= DEGREE; ++i) coef[i] = DEGREE == 6 ? C(EXP_POLY6[i]) : coef[i - 1] / i;
#if EB_VEC_BYTES == 64
  vec<C> k = round_even(z * K::LOG2E);
  vec<C> r = z - k * K::LN2_HI;
  r = r - k * K::LN2_LO;
  const C pre = C(__builtin_ldexp(1.0, K::PRESCALE));
  vec<C> p = splat<C>(coef[DEGREE] * pre);
  for (int i = DEGREE - 1; i >= 0; --i) p = p * r + coef[i] * pre;
  return scale2(p, k);
#else
  vec<C> t = z * K::LOG2E + K::SHIFT;
  vec<C> k = t - K::SHIFT;
  vec<C> r = z - k * K::LN2_HI;
  r = r - k * K::LN2_LO;
  vec<C> p = splat<C>(coef[DEGREE]);
  for (int i = DEGREE - 1; i >= 0; --i) p = p * r + coef[i];
  ivec<C> ki = bits<C>(t) - bits<C>(splat<C>(K::SHIFT));
  return p * from_bits<C>((ki + (K::BIAS + K::PRESCALE)) << K::MANT);
#endif
}

// 2^-PRESCALE: multiply a sum of scaled exponentials by it to get the true sum.
template <typename C> EB_INLINE double exp_unscale() {
  return __builtin_ldexp(1.0, -ExpConst<C>::PRESCALE);
}

}  // namespace EB_NS
