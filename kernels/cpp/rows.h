// The row kernels of the native tier, written once on the vectors of simd.h and compiled
// once per instruction set (isa_*.cpp): this header gathers the three families (exp_rows.h,
// weight_rows.h, bwd_rows.h) into the instruction set's table (table.h), beside the
// roofline's exp probe. Each kernel works on one segment of one row: a whole row, or a
// piece of a long row split across threads (merge.h merges the pieces' reductions). The
// algorithms and pass structures are described in docs/native.md.
#pragma once
#include "exp_rows.h"
#include "weight_rows.h"
#include "bwd_rows.h"

namespace EB_NS {

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

// ---------------------------------------------------------------- the table

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
