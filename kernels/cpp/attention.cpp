// Fused Elastic attention on the CPU, forward and backward (docs/attention.md section 2,
// docs/native.md section 5). Flash-style: per (batch, head, query block) the forward visits
// the key blocks with the GEMMs of the BLAS torch links (s = scale q k^T, acc += p v) and an
// online kept max and sum per query (attention_rows.h, vectorized per instruction set); it
// keeps one score tile per thread and two statistics per query, never a length x length
// matrix. The backward recomputes p tile by tile from (m, den); one thread owns a
// (batch, head) at a time, so dq, dk and dv are accumulated in a fixed order whatever the
// thread count. NaN and +inf queries are flagged by their statistics (m NaN, m = +inf) and
// finished in Python (elasticbench/attention/special.py).
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attention.h"

// The Fortran BLAS that torch links (MKL or OpenBLAS export these). Weak: where they are
// absent, the tiles go through at::addmm_out instead.
extern "C" {
void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*,
            const float*, const int*, const float*, const int*, const float*, float*,
            const int*) __attribute__((weak));
void dgemm_(const char*, const char*, const int*, const int*, const int*, const double*,
            const double*, const int*, const double*, const int*, const double*, double*,
            const int*) __attribute__((weak));
}

namespace eb {
namespace {

const char* (*current_isa)() = nullptr;
bool use_blas = true;  // attention_use_blas(False) forces the ATen path (tests)

const AttnTable* attn_table() {
  const std::string isa = current_isa ? current_isa() : "generic";
#if defined(__x86_64__) || defined(__i386__)
  if (isa == "avx512") return eb_attn_avx512::attn_table();
  if (isa == "avx2") return eb_attn_avx2::attn_table();
#endif
  return eb_attn_generic::attn_table();
}

template <typename C> const AttnRows<C>& rows_of(const AttnTable* t);
template <> const AttnRows<float>& rows_of<float>(const AttnTable* t) { return t->f32; }
template <> const AttnRows<double>& rows_of<double>(const AttnTable* t) { return t->f64; }

template <typename C>
void blas(const char* ta, const char* tb, const int* m, const int* n, const int* k, const C* alpha,
          const C* a, const int* lda, const C* b, const int* ldb, const C* beta, C* c, const int* ldc);
template <>
void blas<float>(const char* ta, const char* tb, const int* m, const int* n, const int* k,
                 const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                 const float* beta, float* c, const int* ldc) {
  sgemm_(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
template <>
void blas<double>(const char* ta, const char* tb, const int* m, const int* n, const int* k,
                  const double* alpha, const double* a, const int* lda, const double* b,
                  const int* ldb, const double* beta, double* c, const int* ldc) {
  dgemm_(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
template <typename C> bool have_blas() {
  return use_blas && (std::is_same<C, float>::value ? sgemm_ != nullptr : dgemm_ != nullptr);
}

// Row-major c (m x n, ldc) = alpha op(a) op(b) + beta c, op = transpose where ta / tb.
// beta = 0 ignores what c held (NaN included), as BLAS does.
template <typename C>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, C alpha, const C* a, int64_t lda,
          const C* b, int64_t ldb, C beta, C* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (have_blas<C>()) {
    // row-major c is column-major c^T = op(b)^T op(a)^T
    const int mi = int(n), ni = int(m), ki = int(k), la = int(lda), lb = int(ldb), lc = int(ldc);
    blas<C>(tb ? "T" : "N", ta ? "T" : "N", &mi, &ni, &ki, &alpha, b, &lb, a, &la, &beta, c, &lc);
    return;
  }
  const auto opts = at::TensorOptions().dtype(c10::CppTypeToScalarType<C>::value);
  auto view = [&](const C* p, int64_t rows, int64_t cols, int64_t ld, bool t) {
    at::Tensor x = at::from_blob(const_cast<C*>(p), {rows, cols}, {ld, 1}, opts);
    return t ? x.t() : x;
  };
  at::Tensor out = view(c, m, n, ldc, false);
  at::Tensor x = view(a, ta ? k : m, ta ? m : k, lda, ta), y = view(b, tb ? n : k, tb ? k : n, ldb, tb);
  if (beta == C(0)) out.zero_();
  at::Tensor r = at::addmm(out, x, y, beta == C(0) ? C(1) : beta, alpha);
  out.copy_(r);
}

struct Shape {
  int64_t bh, lq, lk, d, dv;
  double scale;
  bool causal;
  int64_t bq, bk;
  // Keys at or past key_end(q1) are hidden from every query before q1 (causal).
  int64_t key_end(int64_t q1) const { return causal ? std::min(lk, q1) : lk; }
  // How many of the keys [k0, k0 + cols) query qi sees.
  int64_t visible(int64_t qi, int64_t k0, int64_t cols) const {
    return causal ? std::clamp<int64_t>(qi - k0 + 1, 0, cols) : cols;
  }
};

template <typename C>
void forward_impl(const C* q, const C* k, const C* v, const C* tau, const C* beta, C* out,
                  C* m_out, C* den_out, const Shape& sh, const AttnRows<C>& rows) {
  const int64_t nqb = (sh.lq + sh.bq - 1) / sh.bq;
  const C nan = std::numeric_limits<C>::quiet_NaN(), inf = std::numeric_limits<C>::infinity();
  at::parallel_for(0, sh.bh * nqb, 1, [&](int64_t begin, int64_t end) {
    std::vector<C> s(sh.bq * sh.bk), acc(sh.bq * sh.dv), m(sh.bq);
    std::vector<double> l(sh.bq);
    std::vector<char> has_nan(sh.bq), has_inf(sh.bq);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t bh = item / nqb, q0 = (item % nqb) * sh.bq, nr = std::min(sh.bq, sh.lq - q0);
      const C* qb = q + (bh * sh.lq + q0) * sh.d;
      const C* kh = k + bh * sh.lk * sh.d;
      const C* vh = v + bh * sh.lk * sh.dv;
      const double t = double(tau[bh]);
      const C inv_tau = C(1.0 / t);
      std::fill(m.begin(), m.end(), C(0));
      std::fill(l.begin(), l.end(), 0.0);
      std::fill(acc.begin(), acc.end(), C(0));
      std::fill(has_nan.begin(), has_nan.end(), 0);
      std::fill(has_inf.begin(), has_inf.end(), 0);
      const int64_t kend = sh.key_end(q0 + nr);
      for (int64_t k0 = 0; k0 < kend; k0 += sh.bk) {
        const int64_t nc = std::min(sh.bk, kend - k0);
        gemm<C>(false, true, nr, nc, sh.d, C(sh.scale), qb, sh.d, kh + k0 * sh.d, sh.d, C(0),
                s.data(), sh.bk);
        for (int64_t i = 0; i < nr; ++i) {
          const C m_old = m[i];
          const AttnRowSum r = rows.fwd(s.data() + i * sh.bk, sh.visible(q0 + i, k0, nc), nc,
                                        &m[i], inv_tau);
          has_nan[i] |= r.nan;
          has_inf[i] |= r.inf;
          if (m[i] > m_old) {
            const double alpha = std::exp((double(m_old) - double(m[i])) / t);
            l[i] *= alpha;
            C* a = acc.data() + i * sh.dv;
            for (int64_t j = 0; j < sh.dv; ++j) a[j] *= C(alpha);
          }
          l[i] += r.sum;
        }
        gemm<C>(false, false, nr, sh.dv, nc, C(1), s.data(), sh.bk, vh + k0 * sh.dv, sh.dv, C(1),
                acc.data(), sh.dv);
      }
      for (int64_t i = 0; i < nr; ++i) {
        const int64_t row = bh * sh.lq + q0 + i;
        C* o = out + row * sh.dv;
        if (has_nan[i]) {
          std::fill(o, o + sh.dv, nan);
          m_out[row] = den_out[row] = nan;
          continue;
        }
        const double den = l[i] + double(beta[bh]) * std::exp(-double(m[i]) / t);
        const C dc = C(den);
        const C* a = acc.data() + i * sh.dv;
        for (int64_t j = 0; j < sh.dv; ++j) o[j] = l[i] > 0 ? a[j] / dc : C(0);
        m_out[row] = has_inf[i] ? inf : m[i];
        den_out[row] = dc;
      }
    }
  });
}

template <typename C>
void backward_impl(const C* q, const C* k, const C* v, const C* out, const C* dout, const C* m,
                   const C* den, const C* tau, const C* beta, C* dq, C* dk, C* dv, C* dtau,
                   C* dbeta, const Shape& sh, const AttnRows<C>& rows) {
  const C inf = std::numeric_limits<C>::infinity();
  at::parallel_for(0, sh.bh, 1, [&](int64_t begin, int64_t end) {
    std::vector<C> s(sh.bq * sh.bk), dp(sh.bq * sh.bk), r(sh.bq), m0(sh.bq), c(sh.bq);
    std::vector<char> cls(sh.bq);  // 0 finite, 1 NaN, 2 +inf
    for (int64_t bh = begin; bh < end; ++bh) {
      const C* kh = k + bh * sh.lk * sh.d;
      const C* vh = v + bh * sh.lk * sh.dv;
      C* dkh = dk + bh * sh.lk * sh.d;
      C* dvh = dv + bh * sh.lk * sh.dv;
      const double t = double(tau[bh]), b = double(beta[bh]);
      const C inv_tau = C(1.0 / t);
      double dtau_acc = 0, dbeta_acc = 0;
      for (int64_t q0 = 0; q0 < sh.lq; q0 += sh.bq) {
        const int64_t nr = std::min(sh.bq, sh.lq - q0), row0 = bh * sh.lq + q0;
        const C* qb = q + row0 * sh.d;
        const C* dob = dout + row0 * sh.dv;
        C* dqb = dq + row0 * sh.d;
        for (int64_t i = 0; i < nr; ++i) {
          const C mi = m[row0 + i], di = den[row0 + i];
          cls[i] = std::isnan(mi) ? 1 : (mi == inf ? 2 : 0);
          m0[i] = mi == inf ? C(0) : mi;
          r[i] = di == C(0) ? C(0) : C(1) / di;
          double ci = 0;
          for (int64_t j = 0; j < sh.dv; ++j)
            ci += double(dob[i * sh.dv + j]) * double(out[(row0 + i) * sh.dv + j]);
          c[i] = C(ci);
        }
        const int64_t kend = sh.key_end(q0 + nr);
        for (int64_t k0 = 0; k0 < kend; k0 += sh.bk) {
          const int64_t nc = std::min(sh.bk, kend - k0);
          gemm<C>(false, true, nr, nc, sh.d, C(sh.scale), qb, sh.d, kh + k0 * sh.d, sh.d, C(0),
                  s.data(), sh.bk);
          gemm<C>(false, true, nr, nc, sh.dv, C(1), dob, sh.dv, vh + k0 * sh.dv, sh.dv, C(0),
                  dp.data(), sh.bk);
          for (int64_t i = 0; i < nr; ++i) {
            C* si = s.data() + i * sh.bk;
            C* dpi = dp.data() + i * sh.bk;
            if (cls[i] == 2) {  // +inf queries: special.fix_backward
              std::fill(si, si + nc, C(0));
              std::fill(dpi, dpi + nc, C(0));
              continue;
            }
            dtau_acc -= rows.bwd(si, dpi, sh.visible(q0 + i, k0, nc), nc, m0[i], r[i], c[i],
                                 inv_tau, cls[i] == 1);
          }
          gemm<C>(true, false, nc, sh.dv, nr, C(1), s.data(), sh.bk, dob, sh.dv, C(1),
                  dvh + k0 * sh.dv, sh.dv);
          gemm<C>(true, false, nc, sh.d, nr, C(sh.scale), dp.data(), sh.bk, qb, sh.d, C(1),
                  dkh + k0 * sh.d, sh.d);
          gemm<C>(false, false, nr, sh.d, nc, C(sh.scale), dp.data(), sh.bk, kh + k0 * sh.d, sh.d,
                  C(1), dqb, sh.d);
        }
        for (int64_t i = 0; i < nr; ++i) {  // the sink's terms (docs/attention.md section 2)
          if (cls[i] == 2) continue;
          const double mt = double(m0[i]) / t, e = std::exp(-mt), w = b * e * double(r[i]);
          const double wm = w != 0 ? w * mt : 0.0;  // w underflows long before m/tau overflows
          dtau_acc -= double(c[i]) * wm / t;
          dbeta_acc -= double(c[i]) * e * double(r[i]);
        }
      }
      dtau[bh] = C(dtau_acc);
      dbeta[bh] = C(dbeta_acc);
    }
  });
}

struct Operands {
  at::ScalarType wd;
  Shape sh;
};

Operands check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
               const at::Tensor& tau, const at::Tensor& beta, double scale, bool causal,
               int64_t block_q, int64_t block_k) {
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(),
              "the native attention kernels take CPU tensors");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "q, k, v must be 4-d");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type(),
              "q, k, v must share a dtype");
  TORCH_CHECK(q.size(0) == k.size(0) && q.size(1) == k.size(1) && k.size(0) == v.size(0) &&
                  k.size(1) == v.size(1) && q.size(3) == k.size(3) && k.size(2) == v.size(2),
              "q, k, v shapes do not fit together");
  const int64_t bh = q.size(0) * q.size(1);
  TORCH_CHECK(tau.numel() == bh && beta.numel() == bh, "tau and beta must be (batch, heads)");
  TORCH_CHECK(block_q > 0 && block_k > 0, "block sizes must be positive");
  TORCH_CHECK(q.size(3) < (1 << 30) && v.size(3) < (1 << 30) && block_k < (1 << 30),
              "dimensions too large for the BLAS");
  const at::ScalarType wd = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  return {wd, {bh, q.size(2), k.size(2), q.size(3), v.size(3), scale, causal, block_q, block_k}};
}

at::Tensor work(const at::Tensor& t, at::ScalarType wd) { return t.to(wd).contiguous(); }

std::vector<at::Tensor> attention_forward(const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& v, const at::Tensor& tau,
                                          const at::Tensor& beta, double scale, bool causal,
                                          int64_t block_q, int64_t block_k) {
  const Operands o = check(q, k, v, tau, beta, scale, causal, block_q, block_k);
  const at::Tensor qc = work(q, o.wd), kc = work(k, o.wd), vc = work(v, o.wd);
  const at::Tensor tc = work(tau, o.wd), bc = work(beta, o.wd);
  const auto opts = q.options().dtype(o.wd);
  at::Tensor out = at::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, opts);
  at::Tensor m = at::empty({q.size(0), q.size(1), q.size(2)}, opts), den = at::empty_like(m);
  const AttnTable* table = attn_table();
  AT_DISPATCH_FLOATING_TYPES(o.wd, "attention_forward", [&] {
    forward_impl<scalar_t>(qc.data_ptr<scalar_t>(), kc.data_ptr<scalar_t>(),
                           vc.data_ptr<scalar_t>(), tc.data_ptr<scalar_t>(),
                           bc.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
                           m.data_ptr<scalar_t>(), den.data_ptr<scalar_t>(), o.sh,
                           rows_of<scalar_t>(table));
  });
  return {out, m, den};
}

std::vector<at::Tensor> attention_backward(const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, const at::Tensor& out,
                                           const at::Tensor& dout, const at::Tensor& m,
                                           const at::Tensor& den, const at::Tensor& tau,
                                           const at::Tensor& beta, double scale, bool causal,
                                           int64_t block_q, int64_t block_k) {
  const Operands o = check(q, k, v, tau, beta, scale, causal, block_q, block_k);
  TORCH_CHECK(out.sizes() == dout.sizes() && out.size(2) == q.size(2) && out.size(3) == v.size(3),
              "out and dout must be (batch, heads, length_q, value_dim)");
  TORCH_CHECK(m.numel() == o.sh.bh * o.sh.lq && den.numel() == m.numel(),
              "m and den must be (batch, heads, length_q)");
  const at::Tensor qc = work(q, o.wd), kc = work(k, o.wd), vc = work(v, o.wd);
  const at::Tensor oc = work(out, o.wd), dc = work(dout, o.wd), mc = work(m, o.wd);
  const at::Tensor nc = work(den, o.wd), tc = work(tau, o.wd), bc = work(beta, o.wd);
  const auto opts = q.options().dtype(o.wd);
  at::Tensor dq = at::zeros(q.sizes(), opts), dk = at::zeros(k.sizes(), opts);
  at::Tensor dv = at::zeros(v.sizes(), opts);
  at::Tensor dtau = at::empty({q.size(0), q.size(1)}, opts), dbeta = at::empty_like(dtau);
  const AttnTable* table = attn_table();
  AT_DISPATCH_FLOATING_TYPES(o.wd, "attention_backward", [&] {
    backward_impl<scalar_t>(qc.data_ptr<scalar_t>(), kc.data_ptr<scalar_t>(),
                            vc.data_ptr<scalar_t>(), oc.data_ptr<scalar_t>(),
                            dc.data_ptr<scalar_t>(), mc.data_ptr<scalar_t>(),
                            nc.data_ptr<scalar_t>(), tc.data_ptr<scalar_t>(),
                            bc.data_ptr<scalar_t>(), dq.data_ptr<scalar_t>(),
                            dk.data_ptr<scalar_t>(), dv.data_ptr<scalar_t>(),
                            dtau.data_ptr<scalar_t>(), dbeta.data_ptr<scalar_t>(), o.sh,
                            rows_of<scalar_t>(table));
  });
  return {dq, dk, dv, dtau, dbeta};
}

}  // namespace

void bind_attention(pybind11::module_& m, const char* (*isa)()) {
  using namespace pybind11::literals;
  current_isa = isa;
  m.def("attention_forward", &attention_forward,
        "fused Elastic attention forward: (out, m, den) in the working dtype",
        "q"_a, "k"_a, "v"_a, "tau"_a, "beta"_a, "scale"_a, "causal"_a, "block_q"_a = 256,
        "block_k"_a = 512);
  m.def("attention_backward", &attention_backward,
        "fused Elastic attention backward: (dq, dk, dv, dtau, dbeta) in the working dtype",
        "q"_a, "k"_a, "v"_a, "out"_a, "dout"_a, "m"_a, "den"_a, "tau"_a, "beta"_a, "scale"_a,
        "causal"_a, "block_q"_a = 256, "block_k"_a = 512);
  m.def("attention_use_blas", [](bool on) {
    const bool was = use_blas;
    use_blas = on;
    return was && (sgemm_ != nullptr);
  }, "tiles through the Fortran BLAS (True, where exported) or at::addmm; returns the old state");
}

}  // namespace eb
