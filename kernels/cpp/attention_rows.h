// The row kernels of fused attention, a forward and a backward per weight (attention.h says
// what each computes), written once on the vectors of simd.h and compiled once per
// instruction set (attention_isa_*.cpp), as the row kernels of rows.h are. The exponential
// is simd.h's.
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
    C m = hmax_nonan<C>(mx);
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

// The other weights' row kernels (attention.h), on the helpers of Elastic's above.
template <typename C> struct FamilyRowKernels {
  using K = AttnRowKernels<C>;
  static constexpr int W = K::W;
  static vec<C> load0(const C* p, int64_t i, int64_t n) {  // the tail filled with 0
    return n - i >= W ? Io<C, C>::load(p + i) : load_tail<C, C>(p + i, n - i, C(0));
  }
  static double total(vec<C> acc) { return hsum<C>(acc); }
  static eb::AttnRowSum nan_inf_sum(vec<C> acc, ivec<C> nan, ivec<C> inf) {
    return {total(acc), any<C>(nan) ? 1 : 0, any<C>(inf) ? 1 : 0};
  }
  static double nan_row(C* s, C* dp, int64_t n, int64_t cols) {
    for (int64_t i = 0; i < n; ++i) s[i] = dp[i] = C(__builtin_nan(""));
    K::zero(s, n, cols);
    K::zero(dp, n, cols);
    return __builtin_nan("");
  }
  static ivec<C> finite_or_neg_inf(vec<C> v) { return v < C(__builtin_inf()); }  // not NaN

  // softmax1: exp(s - m) over the scores below +inf (-inf gives 0), m >= 0 for the 1.
  static eb::AttnRowSum softmax1_fwd(C* s, int64_t n, int64_t cols, C* m_io, C) {
    vec<C> mx = splat<C>(C(0));
    ivec<C> nan{}, inf{};
    for (int64_t i = 0; i < n; i += W) {
      vec<C> v = K::load(s, i, n);
      mx = vmax<C>(mx, select<C>(finite_or_neg_inf(v), v, splat<C>(C(0))));
      nan |= v != v;
      inf |= v == C(__builtin_inf());
    }
    C m = hmax_nonan<C>(mx);
    m = m > *m_io ? m : *m_io;
    *m_io = m;
    vec<C> acc0{}, acc1{};
    int64_t i = 0;
    for (; i + 2 * W <= n; i += 2 * W) {
      vec<C> v0 = Io<C, C>::load(s + i), v1 = Io<C, C>::load(s + i + W);
      vec<C> e0 = select<C>(finite_or_neg_inf(v0), K::ex(v0 - m), splat<C>(C(0)));
      vec<C> e1 = select<C>(finite_or_neg_inf(v1), K::ex(v1 - m), splat<C>(C(0)));
      Io<C, C>::store(s + i, e0);
      Io<C, C>::store(s + i + W, e1);
      acc0 += e0;
      acc1 += e1;
    }
    for (; i < n; i += W) {
      vec<C> v = K::load(s, i, n);
      vec<C> e = select<C>(finite_or_neg_inf(v), K::ex(v - m), splat<C>(C(0)));
      K::store(s, i, n, e);
      acc0 += e;
    }
    K::zero(s, n, cols);
    return nan_inf_sum(acc0 + acc1, nan, inf);
  }
  static double softmax1_bwd(C* s, C* dp, int64_t n, int64_t cols, C m, C r, C c, C,
                             int nan) {
    if (nan) return nan_row(s, dp, n, cols);
    const vec<C> zero_v = splat<C>(C(0));
    for (int64_t i = 0; i < n; i += W) {
      vec<C> v = K::load(s, i, n);
      ivec<C> k = finite_or_neg_inf(v);
      vec<C> p = select<C>(k, K::ex(select<C>(k, v - m, zero_v)) * r, zero_v);
      K::store(s, i, n, p);
      K::store(dp, i, n, p * (K::load(dp, i, n) - c));
    }
    K::zero(s, n, cols);
    K::zero(dp, n, cols);
    return 0;
  }

  // symax: |s| (|-inf| is infinite: reported), hidden keys come as 0.
  static eb::AttnRowSum symax_fwd(C* s, int64_t n, int64_t cols, C*, C) {
    vec<C> acc{};
    ivec<C> nan{}, inf{};
    for (int64_t i = 0; i < n; i += W) {
      vec<C> v = load0(s, i, n), a = vabs<C>(v);
      nan |= v != v;
      inf |= a == C(__builtin_inf());
      K::store(s, i, n, a);
      acc += a;
    }
    K::zero(s, n, cols);
    return nan_inf_sum(acc, nan, inf);
  }
  static double symax_bwd(C* s, C* dp, int64_t n, int64_t cols, C, C r, C c, C, int nan) {
    if (nan) return nan_row(s, dp, n, cols);
    const vec<C> one = splat<C>(C(1)), zero_v = splat<C>(C(0));
    for (int64_t i = 0; i < n; i += W) {
      vec<C> v = load0(s, i, n);
      vec<C> sign = select<C>(v > C(0), one, select<C>(v < C(0), -one, zero_v));
      K::store(s, i, n, vabs<C>(v) * r);
      K::store(dp, i, n, sign * ((load0(dp, i, n) - c) * r));
    }
    K::zero(s, n, cols);
    K::zero(dp, n, cols);
    return 0;
  }

  // stablemax: s + 1 at s >= 0, 1/(1 - s) below (0 at -inf); its derivative 1, 1/(1 - s)^2.
  static eb::AttnRowSum stablemax_fwd(C* s, int64_t n, int64_t cols, C*, C) {
    vec<C> acc{};
    ivec<C> nan{}, inf{};
    const vec<C> one = splat<C>(C(1));
    for (int64_t i = 0; i < n; i += W) {
      vec<C> v = K::load(s, i, n);
      vec<C> st = select<C>(v >= C(0), v + one, one / (one - v));
      nan |= v != v;
      inf |= v == C(__builtin_inf());
      K::store(s, i, n, st);
      acc += st;
    }
    K::zero(s, n, cols);
    return nan_inf_sum(acc, nan, inf);
  }
  static double stablemax_bwd(C* s, C* dp, int64_t n, int64_t cols, C, C r, C c, C,
                              int nan) {
    if (nan) return nan_row(s, dp, n, cols);
    const vec<C> one = splat<C>(C(1));
    for (int64_t i = 0; i < n; i += W) {
      vec<C> v = K::load(s, i, n);
      ivec<C> pos = v >= C(0);
      vec<C> u = one / (one - v);
      K::store(s, i, n, select<C>(pos, v + one, u) * r);
      K::store(dp, i, n, select<C>(pos, one, u * u) * ((K::load(dp, i, n) - c) * r));
    }
    K::zero(s, n, cols);
    K::zero(dp, n, cols);
    return 0;
  }

  // sigmoid(x), x = s + bias, from e = exp(-|x|) <= 1 (no overflow): 1/(1 + e) at x >= 0,
  // e/(1 + e) below; y (1 - y) = e/(1 + e)^2 either way. +inf gives 1, -inf 0, NaN NaN.
  // Each weight stands alone: a NaN score is not reported, it reaches the output (and, in
  // the backward, its key's and query's gradients) through its own products.
  static eb::AttnRowSum sigmoid_fwd(C* s, int64_t n, int64_t cols, C*, C bias) {
    const vec<C> one = splat<C>(C(1));
    for (int64_t i = 0; i < n; i += W) {
      vec<C> x = K::load(s, i, n) + bias;
      vec<C> e = K::ex(-vabs<C>(x));
      K::store(s, i, n, select<C>(x >= C(0), one, e) / (one + e));
    }
    K::zero(s, n, cols);
    return {0.0, 0, 0};
  }
  static double sigmoid_bwd(C* s, C* dp, int64_t n, int64_t cols, C, C, C, C bias, int nan) {
    if (nan) return nan_row(s, dp, n, cols);
    vec<C> acc{};
    const vec<C> one = splat<C>(C(1));
    for (int64_t i = 0; i < n; i += W) {
      vec<C> x = K::load(s, i, n) + bias;
      vec<C> e = K::ex(-vabs<C>(x));
      vec<C> d = one + e;
      K::store(s, i, n, select<C>(x >= C(0), one, e) / d);
      vec<C> ds = K::load(dp, i, n) * (e / (d * d));
      K::store(dp, i, n, ds);
      acc += select<C>(lanes_below<C>(n - i), ds, splat<C>(C(0)));
    }
    K::zero(s, n, cols);
    K::zero(dp, n, cols);
    return total(acc);
  }
};

// Cog: sign(s) exp(|s| - m) with m the running max of the finite |s| (docs/attention.md
// section 9). An infinite |s| (+inf reported as inf, -inf as neg) and NaN get weight 0 here
// and are reported; the caller finishes or marks their query. The row's sum is of the
// unsigned exps, the stored weights signed (sign(0) = 0: a zero score weighs nothing).
template <typename C> struct CogRowKernels {
  using K = AttnRowKernels<C>;
  static constexpr int W = K::W;
  static vec<C> with_sign(vec<C> v, vec<C> e) {  // sign(v) e, 0 where v is 0 (or NaN)
    return select<C>(v > C(0), e, select<C>(v < C(0), -e, splat<C>(C(0))));
  }
  static eb::AttnRowSum fwd(C* s, int64_t n, int64_t cols, C* m_io, C) {
    vec<C> mx = splat<C>(C(0));
    ivec<C> nan{}, inf{}, neg{};
    for (int64_t i = 0; i < n; i += W) {
      vec<C> v = K::load(s, i, n), a = vabs<C>(v);  // the tail: -inf, masked out of neg
      mx = vmax<C>(mx, select<C>(a < C(__builtin_inf()), a, splat<C>(C(0))));
      nan |= v != v;
      inf |= v == C(__builtin_inf());
      neg |= (v == -C(__builtin_inf())) & lanes_below<C>(n - i);
    }
    C m = hmax_nonan<C>(mx);
    m = m > *m_io ? m : *m_io;
    *m_io = m;
    vec<C> acc0{}, acc1{};
    int64_t i = 0;
    for (; i + 2 * W <= n; i += 2 * W) {  // two chains, as Elastic's
      vec<C> v0 = Io<C, C>::load(s + i), v1 = Io<C, C>::load(s + i + W);
      vec<C> a0 = vabs<C>(v0), a1 = vabs<C>(v1);
      vec<C> e0 = select<C>(a0 < C(__builtin_inf()), K::ex(a0 - m), splat<C>(C(0)));
      vec<C> e1 = select<C>(a1 < C(__builtin_inf()), K::ex(a1 - m), splat<C>(C(0)));
      Io<C, C>::store(s + i, with_sign(v0, e0));
      Io<C, C>::store(s + i + W, with_sign(v1, e1));
      acc0 += e0;
      acc1 += e1;
    }
    for (; i < n; i += W) {
      vec<C> v = K::load(s, i, n), a = vabs<C>(v);
      vec<C> e = select<C>(a < C(__builtin_inf()), K::ex(a - m), splat<C>(C(0)));
      K::store(s, i, n, with_sign(v, e));
      acc0 += e;
    }
    K::zero(s, n, cols);
    eb::AttnRowSum r = FamilyRowKernels<C>::nan_inf_sum(acc0 + acc1, nan, inf);
    r.neg = any<C>(neg) ? 1 : 0;
    return r;
  }
  // ds = p (g - sign(s) c): at s = 0 the mean of the one-sided derivatives, p g.
  static double bwd(C* s, C* dp, int64_t n, int64_t cols, C m, C r, C c, C, int nan) {
    if (nan) return FamilyRowKernels<C>::nan_row(s, dp, n, cols);
    const vec<C> one = splat<C>(C(1)), zero_v = splat<C>(C(0));
    for (int64_t i = 0; i < n; i += W) {
      vec<C> v = K::load(s, i, n), a = vabs<C>(v);
      vec<C> p = select<C>(a < C(__builtin_inf()), K::ex(a - m) * r, zero_v);
      vec<C> sign = with_sign(v, one);
      K::store(s, i, n, sign * p);
      K::store(dp, i, n, p * (K::load(dp, i, n) - sign * c));
    }
    K::zero(s, n, cols);
    K::zero(dp, n, cols);
    return 0;
  }
};

inline const eb::AttnTable* make_attn_table(const char* isa) {
  using F = FamilyRowKernels<float>;
  using D = FamilyRowKernels<double>;
  using CF = CogRowKernels<float>;
  using CD = CogRowKernels<double>;
  static const eb::AttnTable t = {
      isa,
      {{&AttnRowKernels<float>::fwd, &F::softmax1_fwd, &F::symax_fwd, &F::stablemax_fwd,
        &F::sigmoid_fwd, &CF::fwd},
       {&AttnRowKernels<float>::bwd, &F::softmax1_bwd, &F::symax_bwd, &F::stablemax_bwd,
        &F::sigmoid_bwd, &CF::bwd}},
      {{&AttnRowKernels<double>::fwd, &D::softmax1_fwd, &D::symax_fwd, &D::stablemax_fwd,
        &D::sigmoid_fwd, &CD::fwd},
       {&AttnRowKernels<double>::bwd, &D::softmax1_bwd, &D::symax_bwd, &D::stablemax_bwd,
        &D::sigmoid_bwd, &CD::bwd}},
  };
  return &t;
}

}  // namespace EB_NS
