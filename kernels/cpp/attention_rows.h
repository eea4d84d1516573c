// The row kernels of fused Elastic attention (attention.h says what each computes), written
// once on the vectors of simd.h and compiled once per instruction set (attention_isa_*.cpp),
// as the row kernels of rows.h are. The exponential is simd.h's.
#pragma once
#include "attention.h"
#include "simd.h"

namespace EB_NS {

template <typename C> struct AttnRowKernels {
  static constexpr int W = width<C>();

  static vec<C> load(const C* p, int64_t i, int64_t n) {
    return n - i >= W ? Io<C, C>::load(p + i) : load_tail<C, C>(p + i, n - i, -__builtin_inf());
  }
  static void store(C* p, int64_t i, int64_t n, vec<C> v) {
    if (n - i >= W) Io<C, C>::store(p + i, v);
    else store_tail<C, C>(p + i, n - i, v);
  }
  // exp(z) for z <= 0 (simd.h's, unscaled: subnormal results are rounded once)
  static vec<C> ex(vec<C> z) { return vexp_scaled<C>(z) * C(exp_unscale<C>()); }
  static ivec<C> kept(vec<C> s) { return (s >= C(0)) & (s < C(__builtin_inf())); }
  static void zero(C* p, int64_t n0, int64_t n1) {
    for (int64_t i = n0; i < n1; ++i) p[i] = C(0);
  }

  static eb::AttnRowSum fwd(C* s, int64_t n, int64_t cols, C* m_io, C inv_tau) {
    vec<C> mx = splat<C>(C(0));
    ivec<C> nan{}, inf{};
    for (int64_t i = 0; i < n; i += W) {
      vec<C> v = load(s, i, n);
      ivec<C> k = kept(v);
      mx = vmax<C>(mx, select<C>(k, v, splat<C>(C(0))));
      nan |= v != v;
      inf |= v == C(__builtin_inf());
    }
    C m = hmax<C>(mx);
    m = m > *m_io ? m : *m_io;
    *m_io = m;
    vec<C> acc0{}, acc1{};
    int64_t i = 0;
    for (; i + 2 * W <= n; i += 2 * W) {  // two chains: the exp's latency, not its throughput
      vec<C> v0 = Io<C, C>::load(s + i), v1 = Io<C, C>::load(s + i + W);
      vec<C> e0 = select<C>(kept(v0), ex((v0 - m) * inv_tau), splat<C>(C(0)));
      vec<C> e1 = select<C>(kept(v1), ex((v1 - m) * inv_tau), splat<C>(C(0)));
      Io<C, C>::store(s + i, e0);
      Io<C, C>::store(s + i + W, e1);
      acc0 += e0;
      acc1 += e1;
    }
    for (; i < n; i += W) {
      vec<C> v = load(s, i, n);
      vec<C> e = select<C>(kept(v), ex((v - m) * inv_tau), splat<C>(C(0)));
      store(s, i, n, e);
      acc0 += e;
    }
    zero(s, n, cols);
    vec<C> t = acc0 + acc1;
    double sum = 0;
    for (int j = 0; j < W; ++j) sum += double(t[j]);
    return {sum, any<C>(nan) ? 1 : 0, any<C>(inf) ? 1 : 0};
  }

  static double bwd(C* s, C* dp, int64_t n, int64_t cols, C m, C r, C c, C inv_tau,
                    int nan_row) {
    if (nan_row) {
      for (int64_t i = 0; i < n; ++i) s[i] = dp[i] = C(__builtin_nan(""));
      zero(s, n, cols);
      zero(dp, n, cols);
      return __builtin_nan("");
    }
    vec<C> acc{};
    const vec<C> zero_v = splat<C>(C(0));
    for (int64_t i = 0; i < n; i += W) {
      vec<C> v = load(s, i, n);
      ivec<C> k = kept(v);
      vec<C> z = select<C>(k, (v - m) * inv_tau, zero_v);
      vec<C> p = select<C>(k, ex(z) * r, zero_v);
      // (dp - c)/tau before the product: a subnormal p (dp - c) is never scaled by 1/tau
      vec<C> ds = select<C>(k, p * ((load(dp, i, n) - c) * inv_tau), zero_v);
      store(s, i, n, p);
      store(dp, i, n, ds);
      acc += select<C>(k, ds * z, zero_v);
    }
    zero(s, n, cols);
    zero(dp, n, cols);
    double sum = 0;
    for (int j = 0; j < W; ++j) sum += double(acc[j]);
    return sum;
  }
};

inline const eb::AttnTable* make_attn_table(const char* isa) {
  static const eb::AttnTable t = {
      isa,
      {&AttnRowKernels<float>::fwd, &AttnRowKernels<float>::bwd},
      {&AttnRowKernels<double>::fwd, &AttnRowKernels<double>::bwd},
  };
  return &t;
}

}  // namespace EB_NS
