// Fused attention on the CPU, forward and backward, one template on the weight function
// (attention.h's AttnWeight: Elastic, softmax1, symax, stablemax, sigmoid, Cog;
// docs/attention.md section 2, docs/native.md section 5). Flash-style: per (batch, head,
// query block) the forward visits the key blocks with the GEMMs of the BLAS torch links
// (s = scale q k^T, acc += p v) and per query a running sum of the weights (and, for the
// exp family, an online max) from the weight's row kernels (attention_rows.h, vectorized
// per instruction set); it keeps one score tile per thread and two statistics per query,
// never a length x length matrix. The backward recomputes p tile by tile from (m, den), in
// one of two schedules with the same arithmetic (backward_impl), so dq, dk, dv and the
// parameters' gradients are the same bits whatever the thread count. An optional (batch,
// length_k) key-padding mask hides keys inside the loop: key blocks it hides whole are
// skipped, the tile is cut after the last kept key, and hidden keys inside it get a score
// of weight 0 (hidden_score: -inf, symax 0; Cog tells a hidden key's -inf from a computed
// one by whether the tile holds hidden keys). NaN queries and those with an infinite weight
// are flagged by their statistics (m NaN, m = +inf) and the latter finished in Python
// (elasticbench/attention/special.py). An optional gate (batch, heads, length_q, value_dim)
// multiplies the output where the forward normalizes it, the ungated output written beside
// it when the backward will need it.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
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
  if (k == 0) {  // an empty product (head_dim 0): c = beta c
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == C(0) ? C(0) : beta * c[i * ldc + j];
    return;
  }
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

// A key-padding mask, (batch, length_k) bool (true: the key takes part), summarized per
// (batch, key block): how many of the block's columns reach its last kept key (0: none is
// kept, the block is skipped) and whether a key before that is hidden (the tile then gets
// -inf at the hidden columns). No length_q x length_k mask is ever built.
struct KeyMask {
  const bool* keep = nullptr;  // null: every key takes part
  std::vector<int64_t> cols;
  std::vector<char> partial;
  KeyMask() = default;
  KeyMask(const bool* k, int64_t batch, int64_t lk, int64_t bk) : keep(k) {
    const int64_t nkb = (lk + bk - 1) / bk;
    cols.assign(batch * nkb, 0);
    partial.assign(batch * nkb, 0);
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t kb = 0; kb < nkb; ++kb) {
        const bool* row = k + b * lk + kb * bk;
        const int64_t n = std::min(bk, lk - kb * bk);
        int64_t last = 0, kept = 0;
        for (int64_t j = 0; j < n; ++j)
          if (row[j]) last = j + 1, ++kept;
        cols[b * nkb + kb] = last;
        partial[b * nkb + kb] = kept != last;
      }
  }
};

// A (batch, head)'s weight parameters (p_score, p_den of elasticbench/attention/weights.py)
// as the loops use them: the denominator is l + sink exp(-m/t) for the exp family (Elastic:
// t = tau, sink = beta; softmax1: 1 and 1), l + sink for the others (symax: eta; stablemax:
// 0), 1 for sigmoid; `a` is the row kernels' parameter (attention.h).
template <typename C> struct WeightParams {
  double t, sink;
  C a;
};
// A (batch, heads) parameter where the caller laid it: (batch, head) strides, 0 where a
// scalar or a per-head tensor is broadcast (no copy per call: docs/attention.md section 7).
template <typename C> struct HeadParam {
  const C* p;
  int64_t sb, sh, heads;
  C operator[](int64_t bh) const { return p[(bh / heads) * sb + (bh % heads) * sh]; }
};
// A (batch, heads, length, dim) operand where the caller laid it: rows `ld` elements apart
// (the transposed view of a (batch, length, heads, dim) tensor has ld = heads x dim), the
// (batch, head) bases sb and sh apart, each row contiguous; read in place, no copy.
template <typename C> struct Rows {
  const C* p;
  int64_t sb, sh, ld, heads;
  const C* at(int64_t bh, int64_t row) const {
    return p + (bh / heads) * sb + (bh % heads) * sh + row * ld;
  }
};
// The gate where the caller laid it: (batch, head, row, column) strides, any of them 0.
template <typename C> struct Gate {
  const C* p = nullptr;  // null: no gate
  int64_t sb = 0, sh = 0, sl = 0, sd = 0, heads = 1;
  const C* row(int64_t bh, int64_t i) const {
    return p + (bh / heads) * sb + (bh % heads) * sh + i * sl;
  }
};
constexpr bool exponential(int w) { return w == kElastic || w == kSoftmax1 || w == kCog; }
template <int W, typename C>
WeightParams<C> weight_params(const HeadParam<C>& p_score, const HeadParam<C>& p_den,
                              int64_t bh) {
  if constexpr (W == kElastic) {
    const double t = double(p_score[bh]);
    return {t, double(p_den[bh]), C(1.0 / t)};
  } else if constexpr (W == kSoftmax1) {
    return {1.0, 1.0, C(1)};
  } else if constexpr (W == kSymax) {
    return {1.0, double(p_den[bh]), C(0)};
  } else if constexpr (W == kStablemax || W == kCog) {
    return {1.0, 0.0, C(0)};
  } else {
    return {1.0, 0.0, p_score[bh]};
  }
}
// The score a key hidden by the padding mask gets, so that its weight is 0: -inf, but 0 for
// symax (|-inf| is infinite).
template <int W, typename C> C hidden_score() {
  return W == kSymax ? C(0) : -std::numeric_limits<C>::infinity();
}

struct Shape {
  int64_t bh, lq, lk, d, dv;
  double scale;
  bool causal;
  int64_t bq, bk;
  int64_t heads = 1;
  KeyMask mask;
  // causal: query i sees key j iff j <= i + offset (0 top-left, lk - lq bottom-right)
  int64_t offset = 0;
  // Keys at or past key_end(q1) are hidden from every query before q1 (causal).
  int64_t key_end(int64_t q1) const {
    return causal ? std::clamp<int64_t>(q1 + offset, 0, lk) : lk;
  }
  // How many of the keys [k0, k0 + cols) query qi sees.
  int64_t visible(int64_t qi, int64_t k0, int64_t cols) const {
    return causal ? std::clamp<int64_t>(qi + offset - k0 + 1, 0, cols) : cols;
  }
  int64_t block(int64_t bh_, int64_t k0) const {
    return (bh_ / heads) * ((lk + bk - 1) / bk) + k0 / bk;
  }
  // The columns of key block k0 that head bh_ visits: nc (the causal limit) cut after the
  // block's last kept key; 0 when the mask hides the whole block.
  int64_t cols(int64_t bh_, int64_t k0, int64_t nc) const {
    return mask.keep ? std::min(nc, mask.cols[block(bh_, k0)]) : nc;
  }
  // Whether key block k0 of head bh_ holds keys the mask hides before its last kept one.
  bool partial(int64_t bh_, int64_t k0) const {
    return mask.keep && mask.partial[block(bh_, k0)];
  }
  // Hidden keys of a partially masked block: `fill` at their columns of the nr rows of s.
  // kept_neg_inf: what a kept key's -inf score becomes (Cog's forward: +inf, its |s| being
  // infinite all the same, so that -inf in the tile means a hidden key), else left as it is.
  template <typename C>
  void hide(int64_t bh_, int64_t k0, int64_t nr, int64_t nc, C* s, C fill,
            bool kept_neg_inf_to_inf = false) const {
    if (!partial(bh_, k0)) return;
    const bool* keep = mask.keep + (bh_ / heads) * lk + k0;
    const C inf = std::numeric_limits<C>::infinity();
    for (int64_t i = 0; i < nr; ++i)
      for (int64_t j = 0; j < nc; ++j) {
        C& x = s[i * bk + j];
        if (!keep[j]) x = fill;
        else if (kept_neg_inf_to_inf && x == -inf) x = inf;
      }
  }
};

// A thread's scratch: 64-byte aligned, so the BLAS takes the same path in every thread.
template <typename C> struct Scratch {
  C* p;
  explicit Scratch(int64_t n) : p(static_cast<C*>(std::aligned_alloc(64, bytes(n)))) {
    TORCH_CHECK(p != nullptr, "out of memory for an attention tile");
  }
  ~Scratch() { std::free(p); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  static size_t bytes(int64_t n) { return (size_t(n) * sizeof(C) + 63) / 64 * 64; }
};

template <typename C, int W>
void forward_impl(const Rows<C>& q, const Rows<C>& k, const Rows<C>& v,
                  const HeadParam<C>& p_score, const HeadParam<C>& p_den, C* out,
                  C* m_out, C* den_out, const Shape& sh, const AttnRows<C>& rows,
                  const Gate<C>& gate, C* ungated) {
  const int64_t nqb = (sh.lq + sh.bq - 1) / sh.bq;
  const C nan = std::numeric_limits<C>::quiet_NaN(), inf = std::numeric_limits<C>::infinity();
  at::parallel_for(0, sh.bh * nqb, 1, [&](int64_t begin, int64_t end) {
    Scratch<C> tile(sh.bq * sh.bk), block(sh.bq * sh.dv);
    C* const s = tile.p;
    C* const acc = block.p;
    std::vector<C> m(sh.bq);
    std::vector<double> l(sh.bq);
    std::vector<char> has_nan(sh.bq), has_inf(sh.bq);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t bh = item / nqb, q0 = (item % nqb) * sh.bq, nr = std::min(sh.bq, sh.lq - q0);
      const C* qb = q.at(bh, q0);
      const WeightParams<C> wp = weight_params<W>(p_score, p_den, bh);
      const double t = wp.t;
      std::fill(m.begin(), m.end(), C(0));
      std::fill(l.begin(), l.end(), 0.0);
      std::fill(acc, acc + sh.bq * sh.dv, C(0));
      std::fill(has_nan.begin(), has_nan.end(), 0);
      std::fill(has_inf.begin(), has_inf.end(), 0);
      const int64_t kend = sh.key_end(q0 + nr);
      // Before the first key block a query block visits, l and acc are exact zeros, which
      // the rescale by alpha in [0, 1] leaves as they are: its exponential is skipped there
      // (a short row's one block). Not for a tau that is not finite and positive, whose
      // alpha may be NaN.
      bool first = std::isfinite(t) && t > 0;
      for (int64_t k0 = 0; k0 < kend; k0 += sh.bk) {
        const int64_t nc = sh.cols(bh, k0, std::min(sh.bk, kend - k0));
        if (nc == 0) continue;
        gemm<C>(false, true, nr, nc, sh.d, C(sh.scale), qb, q.ld, k.at(bh, k0), k.ld, C(0),
                s, sh.bk);
        sh.hide(bh, k0, nr, nc, s, hidden_score<W, C>(), W == kCog);
        // Cog: a -inf score left in a partially masked tile is a hidden key's (hide made a
        // kept one +inf); anywhere else it is a computed score of infinite |s|
        const bool neg_is_inf = W == kCog && !sh.partial(bh, k0);
        for (int64_t i = 0; i < nr; ++i) {
          const C m_old = m[i];
          const AttnRowSum r = rows.fwd[W](s + i * sh.bk, sh.visible(q0 + i, k0, nc), nc,
                                           &m[i], wp.a);
          has_nan[i] |= r.nan;
          has_inf[i] |= r.inf | (neg_is_inf & r.neg);
          if (exponential(W) && m[i] > m_old && !first) {
            const double alpha = std::exp((double(m_old) - double(m[i])) / t);
            l[i] *= alpha;
            C* a = acc + i * sh.dv;
            for (int64_t j = 0; j < sh.dv; ++j) a[j] *= C(alpha);
          }
          l[i] += r.sum;
        }
        gemm<C>(false, false, nr, sh.dv, nc, C(1), s, sh.bk, v.at(bh, k0), v.ld, C(1), acc,
                sh.dv);
        first = false;
      }
      for (int64_t i = 0; i < nr; ++i) {
        const int64_t row = bh * sh.lq + q0 + i;
        C* o = out + row * sh.dv;
        C* u = ungated ? ungated + row * sh.dv : nullptr;
        const C* g = gate.p ? gate.row(bh, q0 + i) : nullptr;
        // the epilogue: o = O g (O the ungated output, kept in u where asked), O = x[j] / d
        auto put = [&](auto value) {
          for (int64_t j = 0; j < sh.dv; ++j) {
            const C x = value(j);
            if (u) u[j] = x;
            o[j] = g ? x * g[j * gate.sd] : x;
          }
        };
        if (has_nan[i]) {
          put([&](int64_t) { return nan; });
          m_out[row] = den_out[row] = nan;
          continue;
        }
        const C* a = acc + i * sh.dv;
        if constexpr (W == kSigmoid) {  // no normalizer: the sum of y v itself, den = 1
          put([&](int64_t j) { return a[j]; });
          m_out[row] = C(0);
          den_out[row] = C(1);
          continue;
        }
        const double den = exponential(W) ? l[i] + wp.sink * std::exp(-double(m[i]) / t)
                                          : l[i] + wp.sink;
        const C dc = C(den);
        // 0 where nothing is kept (exp family) or the denominator is 0 (its weights are too)
        const bool zero = exponential(W) ? !(l[i] > 0) : dc == C(0);
        put([&](int64_t j) { return zero ? C(0) : a[j] / dc; });
        m_out[row] = has_inf[i] ? inf : m[i];
        den_out[row] = dc;
      }
    }
  });
}

// The backward's pieces (docs/attention.md section 2), shared by its two schedules.
template <typename C, int W> struct Backward {
  Rows<C> q, k, v, out, dout;  // where the caller laid them (dq, dk, dv are contiguous)
  const C *m, *den;
  HeadParam<C> p_score, p_den;
  C *dq, *dk, *dv;
  const Shape& sh;
  const AttnRows<C>& rows;

  // A query block's row data: class (0 finite, 1 NaN, 2 +inf), shift, 1/den, c = dO . out.
  struct Block {
    int64_t bh, q0, nr, row0;
    std::vector<char> cls;
    std::vector<C> m0, r, c;
    explicit Block(int64_t bq) : cls(bq), m0(bq), r(bq), c(bq) {}
  };
  void load(Block& b, int64_t bh, int64_t q0) const {
    const C inf = std::numeric_limits<C>::infinity();
    b.bh = bh, b.q0 = q0, b.nr = std::min(sh.bq, sh.lq - q0), b.row0 = bh * sh.lq + q0;
    for (int64_t i = 0; i < b.nr; ++i) {
      const C mi = m[b.row0 + i], di = den[b.row0 + i];
      b.cls[i] = std::isnan(mi) ? 1 : (mi == inf ? 2 : 0);
      b.m0[i] = mi == inf ? C(0) : mi;
      b.r[i] = di == C(0) ? C(0) : C(1) / di;
      double ci = 0;
      const C *di_row = dout.at(bh, q0 + i), *oi_row = out.at(bh, q0 + i);
      for (int64_t j = 0; j < sh.dv; ++j) ci += double(di_row[j]) * double(oi_row[j]);
      b.c[i] = C(ci);
    }
  }
  // p and ds of the tile (block b, keys [k0, k0 + nc)) into s and dp; returns sum ds z.
  double tile(const Block& b, int64_t k0, int64_t nc, C* s, C* dp) const {
    const int64_t nr = b.nr;
    const C a = weight_params<W>(p_score, p_den, b.bh).a;
    gemm<C>(false, true, nr, nc, sh.d, C(sh.scale), q.at(b.bh, b.q0), q.ld, k.at(b.bh, k0), k.ld,
            C(0), s, sh.bk);
    gemm<C>(false, true, nr, nc, sh.dv, C(1), dout.at(b.bh, b.q0), dout.ld, v.at(b.bh, k0), v.ld,
            C(0), dp, sh.bk);
    sh.hide(b.bh, k0, nr, nc, s, hidden_score<W, C>());
    double sum = 0;
    bool nan_rows = false;
    for (int64_t i = 0; i < nr; ++i) {
      C* si = s + i * sh.bk;
      C* dpi = dp + i * sh.bk;
      if (b.cls[i] == 2) {  // +inf queries: special.fix_backward
        std::fill(si, si + nc, C(0));
        std::fill(dpi, dpi + nc, C(0));
        continue;
      }
      nan_rows |= b.cls[i] == 1;
      sum += rows.bwd[W](si, dpi, sh.visible(b.q0 + i, k0, nc), nc, b.m0[i], b.r[i], b.c[i],
                         a, b.cls[i] == 1);
    }
    if (nan_rows) {  // a NaN query's p and ds are NaN at the keys it sees, 0 at hidden ones
      sh.hide(b.bh, k0, nr, nc, s, C(0));
      sh.hide(b.bh, k0, nr, nc, dp, C(0));
    }
    return sum;
  }
  void key_grads(const Block& b, int64_t k0, int64_t nc, const C* p, const C* ds) const {
    const int64_t off = b.bh * sh.lk;
    gemm<C>(true, false, nc, sh.dv, b.nr, C(1), p, sh.bk, dout.at(b.bh, b.q0), dout.ld, C(1),
            dv + (off + k0) * sh.dv, sh.dv);
    gemm<C>(true, false, nc, sh.d, b.nr, C(sh.scale), ds, sh.bk, q.at(b.bh, b.q0), q.ld, C(1),
            dk + (off + k0) * sh.d, sh.d);
  }
  void query_grads(const Block& b, int64_t k0, int64_t nc, const C* ds) const {
    gemm<C>(false, false, b.nr, sh.d, nc, C(sh.scale), ds, sh.bk,
            k.at(b.bh, k0), k.ld, C(1), dq + b.row0 * sh.d, sh.d);
  }
  // The block's share of dp_score and dp_den from the row kernels' tile sums (tile_sum) and
  // the per-query terms: Elastic's dtau (-sum ds z and the sink's) and dbeta; symax's
  // d eta = -sum delta/den; sigmoid's dbias = sum ds; 0 for the weights with no parameter.
  void params(const Block& b, double tile_sum, double* dp_score_part,
              double* dp_den_part) const {
    if constexpr (W != kElastic) {
      double d_score = 0, d_den = 0;
      if constexpr (W == kSigmoid) d_score = tile_sum;
      if constexpr (W == kSymax)
        for (int64_t i = 0; i < b.nr; ++i)
          if (b.cls[i] != 2) d_den -= double(b.c[i]) * double(b.r[i]);
      *dp_score_part = d_score;
      *dp_den_part = d_den;
      return;
    }
    const double t = double(p_score[b.bh]), bt = double(p_den[b.bh]);
    double dt = -tile_sum, db = 0;
    for (int64_t i = 0; i < b.nr; ++i) {
      if (b.cls[i] == 2) continue;
      const double mt = double(b.m0[i]) / t, e = std::exp(-mt), w = bt * e * double(b.r[i]);
      const double wm = w != 0 ? w * mt : 0.0;  // w underflows long before m/tau overflows
      dt -= double(b.c[i]) * wm / t;
      db -= double(b.c[i]) * e * double(b.r[i]);
    }
    *dp_score_part = dt;
    *dp_den_part = db;
  }
};

// Two schedules, the same arithmetic in the same order (so the same bits): with at least as
// many (batch, head) pairs as threads, a thread owns a head and walks its query blocks and,
// inside, its key blocks (five GEMMs a tile). With fewer, the key blocks are spread over the
// threads for dk and dv, then the query blocks for dq (seven GEMMs a tile, no thread idle).
// dp_score and dp_den are summed per query block, then over the blocks in order, either way.
template <typename C, int W>
void backward_impl(const Backward<C, W>& bw, C* dp_score, C* dp_den) {
  const Shape& sh = bw.sh;
  const int64_t nqb = (sh.lq + sh.bq - 1) / sh.bq, nkb = (sh.lk + sh.bk - 1) / sh.bk;
  std::vector<double> dp_score_part(sh.bh * nqb), dp_den_part(sh.bh * nqb);
  using Block = typename Backward<C, W>::Block;
  if (sh.bh >= at::get_num_threads()) {
    at::parallel_for(0, sh.bh, 1, [&](int64_t begin, int64_t end) {
      Scratch<C> s(sh.bq * sh.bk), dp(sh.bq * sh.bk);
      Block b(sh.bq);
      for (int64_t bh = begin; bh < end; ++bh) {
        for (int64_t qb = 0; qb < nqb; ++qb) {
          bw.load(b, bh, qb * sh.bq);
          const int64_t kend = sh.key_end(b.q0 + b.nr);
          double sum = 0;
          for (int64_t k0 = 0; k0 < kend; k0 += sh.bk) {
            const int64_t nc = sh.cols(bh, k0, std::min(sh.bk, kend - k0));
            if (nc == 0) continue;
            sum += bw.tile(b, k0, nc, s.p, dp.p);
            bw.key_grads(b, k0, nc, s.p, dp.p);
            bw.query_grads(b, k0, nc, dp.p);
          }
          bw.params(b, sum, &dp_score_part[bh * nqb + qb], &dp_den_part[bh * nqb + qb]);
        }
      }
    });
  } else {
    at::parallel_for(0, sh.bh * nkb, 1, [&](int64_t begin, int64_t end) {
      Scratch<C> s(sh.bq * sh.bk), dp(sh.bq * sh.bk);
      Block b(sh.bq);
      for (int64_t item = begin; item < end; ++item) {
        const int64_t bh = item / nkb, k0 = (item % nkb) * sh.bk;
        for (int64_t qb = 0; qb < nqb; ++qb) {
          const int64_t q0 = qb * sh.bq, kend = sh.key_end(std::min(sh.lq, q0 + sh.bq));
          if (k0 >= kend) continue;
          const int64_t nc = sh.cols(bh, k0, std::min(sh.bk, kend - k0));
          if (nc == 0) continue;
          bw.load(b, bh, q0);
          bw.tile(b, k0, nc, s.p, dp.p);
          bw.key_grads(b, k0, nc, s.p, dp.p);
        }
      }
    });
    at::parallel_for(0, sh.bh * nqb, 1, [&](int64_t begin, int64_t end) {
      Scratch<C> s(sh.bq * sh.bk), dp(sh.bq * sh.bk);
      Block b(sh.bq);
      for (int64_t item = begin; item < end; ++item) {
        bw.load(b, item / nqb, (item % nqb) * sh.bq);
        const int64_t kend = sh.key_end(b.q0 + b.nr);
        double sum = 0;
        for (int64_t k0 = 0; k0 < kend; k0 += sh.bk) {
          const int64_t nc = sh.cols(b.bh, k0, std::min(sh.bk, kend - k0));
          if (nc == 0) continue;
          sum += bw.tile(b, k0, nc, s.p, dp.p);
          bw.query_grads(b, k0, nc, dp.p);
        }
        bw.params(b, sum, &dp_score_part[item], &dp_den_part[item]);
      }
    });
  }
  for (int64_t bh = 0; bh < sh.bh; ++bh) {
    double d_score = 0, d_den = 0;
    for (int64_t qb = 0; qb < nqb; ++qb) {
      d_score += dp_score_part[bh * nqb + qb];
      d_den += dp_den_part[bh * nqb + qb];
    }
    dp_score[bh] = C(d_score);
    dp_den[bh] = C(d_den);
  }
}

struct Operands {
  at::ScalarType wd;
  Shape sh;
  at::Tensor keep;  // the key-padding mask sh.mask reads (undefined: none)
  at::Tensor p_score, p_den;  // the parameters in the work dtype, (batch, heads) in any strides
  template <typename C> HeadParam<C> param(const at::Tensor& p) const {
    return {p.data_ptr<C>(), p.stride(0), p.stride(1), sh.heads};
  }
};

using OptTensor = c10::optional<at::Tensor>;

Operands check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
               const at::Tensor& p_score, const at::Tensor& p_den, double scale, bool causal,
               int64_t block_q, int64_t block_k, const OptTensor& key_mask, int64_t offset) {
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(),
              "the native attention kernels take CPU tensors");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "q, k, v must be 4-d");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type(),
              "q, k, v must share a dtype");
  TORCH_CHECK(q.size(0) == k.size(0) && q.size(1) == k.size(1) && k.size(0) == v.size(0) &&
                  k.size(1) == v.size(1) && q.size(3) == k.size(3) && k.size(2) == v.size(2),
              "q, k, v shapes do not fit together");
  const int64_t bh = q.size(0) * q.size(1);
  TORCH_CHECK(p_score.numel() == bh && p_den.numel() == bh,
              "p_score and p_den must be (batch, heads)");
  TORCH_CHECK(std::abs(offset) < (int64_t(1) << 62), "causal offset out of range");
  TORCH_CHECK(block_q > 0 && block_k > 0, "block sizes must be positive");
  TORCH_CHECK(q.size(3) < (1 << 30) && v.size(3) < (1 << 30) && block_k < (1 << 30),
              "dimensions too large for the BLAS");
  const at::ScalarType wd = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  // Queries within one block are one block whatever its size: the tiles' rows shrink to
  // them, so a short call does not allocate (and page-fault in) a 256-row tile per thread.
  // The row stride (block_k) stays: the BLAS may take another path for another stride.
  const int64_t bq = std::min(block_q, std::max<int64_t>(q.size(2), 1)), bk = block_k;
  Operands o{wd, {bh, q.size(2), k.size(2), q.size(3), v.size(3), scale, causal, bq, bk},
             at::Tensor(), at::Tensor(), at::Tensor()};
  o.sh.heads = q.size(1);
  o.sh.offset = causal ? offset : 0;
  // read where they lie (a broadcast view has stride 0); converted only from another dtype
  auto as_bh = [&](const at::Tensor& p) {
    const at::Tensor x = p.dim() == 2 && p.size(0) == q.size(0) && p.size(1) == q.size(1)
                             ? p : p.reshape({q.size(0), q.size(1)});
    return x.scalar_type() == wd ? x : x.to(wd);
  };
  o.p_score = as_bh(p_score);
  o.p_den = as_bh(p_den);
  if (key_mask.has_value() && key_mask->defined()) {
    TORCH_CHECK(key_mask->dim() == 2 && key_mask->size(0) == q.size(0) &&
                    key_mask->size(1) == k.size(2),
                "key_mask must be (batch, length_k)");
    o.keep = key_mask->to(at::kCPU, at::kBool).contiguous();
    o.sh.mask = KeyMask(o.keep.data_ptr<bool>(), q.size(0), k.size(2), bk);
  }
  return o;
}

at::Tensor work(const at::Tensor& t, at::ScalarType wd) { return t.to(wd).contiguous(); }

// A 4-d operand in the work dtype as the kernels read it (Rows): in place where its rows are
// contiguous and their stride is one the BLAS takes (at least the row's width, an int),
// else a contiguous copy; converted only from another dtype.
at::Tensor rows_operand(const at::Tensor& t, at::ScalarType wd) {
  at::Tensor x = t.scalar_type() == wd ? t : t.to(wd);
  const bool unit = x.size(3) <= 1 || x.stride(3) == 1;
  const bool ld_ok = x.size(2) <= 1 || (x.stride(2) >= std::max<int64_t>(1, x.size(3)) &&
                                        x.stride(2) < (int64_t(1) << 31));
  return unit && ld_ok ? x : x.contiguous();
}
template <typename C> Rows<C> operand_rows(const at::Tensor& x) {
  // a length-1 (or empty) operand's row stride is never stepped: the row's width then
  const int64_t ld = x.size(2) <= 1 ? std::max<int64_t>(1, x.size(3)) : x.stride(2);
  return {x.data_ptr<C>(), x.stride(0), x.stride(1), ld, x.size(1)};
}

// f(std::integral_constant<int, W>) for the weight w: the one switch outside every loop.
template <typename F> void with_weight(int64_t w, F&& f) {
  switch (w) {
    case kElastic: return f(std::integral_constant<int, kElastic>{});
    case kSoftmax1: return f(std::integral_constant<int, kSoftmax1>{});
    case kSymax: return f(std::integral_constant<int, kSymax>{});
    case kStablemax: return f(std::integral_constant<int, kStablemax>{});
    case kSigmoid: return f(std::integral_constant<int, kSigmoid>{});
    case kCog: return f(std::integral_constant<int, kCog>{});
    default: TORCH_CHECK(false, "unknown attention weight ", w, " (0 to ", kNumWeights - 1, ")");
  }
}

std::vector<at::Tensor> attention_forward(const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& v, const at::Tensor& p_score,
                                          const at::Tensor& p_den, double scale, bool causal,
                                          int64_t block_q, int64_t block_k,
                                          const OptTensor& key_mask, int64_t weight,
                                          int64_t offset, const OptTensor& gate,
                                          bool keep_ungated) {
  const Operands o = check(q, k, v, p_score, p_den, scale, causal, block_q, block_k, key_mask,
                           offset);
  const at::Tensor qc = rows_operand(q, o.wd), kc = rows_operand(k, o.wd);
  const at::Tensor vc = rows_operand(v, o.wd);
  const auto opts = q.options().dtype(o.wd);
  const std::vector<int64_t> out_shape{q.size(0), q.size(1), q.size(2), v.size(3)};
  at::Tensor out = at::empty(out_shape, opts);
  at::Tensor m = at::empty({q.size(0), q.size(1), q.size(2)}, opts), den = at::empty_like(m);
  at::Tensor g, ungated;  // the gate in the work dtype, read in its strides
  const bool gated = gate.has_value() && gate->defined();
  if (gated) {
    TORCH_CHECK(gate->device().is_cpu() && gate->dim() == 4 &&
                    gate->sizes() == at::IntArrayRef(out_shape),
                "gate must be a CPU tensor of the output's shape (batch, heads, length_q, "
                "value_dim)");
    g = gate->scalar_type() == o.wd ? *gate : gate->to(o.wd);
    if (keep_ungated) ungated = at::empty(out_shape, opts);
  }
  const AttnTable* table = attn_table();
  AT_DISPATCH_FLOATING_TYPES(o.wd, "attention_forward", [&] {
    Gate<scalar_t> gv;
    if (gated)
      gv = {g.data_ptr<scalar_t>(), g.stride(0), g.stride(1), g.stride(2), g.stride(3),
            q.size(1)};
    with_weight(weight, [&](auto w) {
      forward_impl<scalar_t, decltype(w)::value>(
          operand_rows<scalar_t>(qc), operand_rows<scalar_t>(kc), operand_rows<scalar_t>(vc),
          o.param<scalar_t>(o.p_score), o.param<scalar_t>(o.p_den), out.data_ptr<scalar_t>(),
          m.data_ptr<scalar_t>(), den.data_ptr<scalar_t>(), o.sh, rows_of<scalar_t>(table),
          gv, ungated.defined() ? ungated.data_ptr<scalar_t>() : nullptr);
    });
  });
  if (keep_ungated) return {out, m, den, ungated.defined() ? ungated : out};
  return {out, m, den};
}

std::vector<at::Tensor> attention_backward(const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, const at::Tensor& out,
                                           const at::Tensor& dout, const at::Tensor& m,
                                           const at::Tensor& den, const at::Tensor& p_score,
                                           const at::Tensor& p_den, double scale, bool causal,
                                           int64_t block_q, int64_t block_k,
                                           const OptTensor& key_mask, int64_t weight,
                                           int64_t offset) {
  const Operands o = check(q, k, v, p_score, p_den, scale, causal, block_q, block_k, key_mask,
                           offset);
  TORCH_CHECK(out.sizes() == dout.sizes() && out.size(2) == q.size(2) && out.size(3) == v.size(3),
              "out and dout must be (batch, heads, length_q, value_dim)");
  TORCH_CHECK(m.numel() == o.sh.bh * o.sh.lq && den.numel() == m.numel(),
              "m and den must be (batch, heads, length_q)");
  const at::Tensor qc = rows_operand(q, o.wd), kc = rows_operand(k, o.wd);
  const at::Tensor vc = rows_operand(v, o.wd), oc = rows_operand(out, o.wd);
  const at::Tensor dc = rows_operand(dout, o.wd), mc = work(m, o.wd);
  const at::Tensor nc = work(den, o.wd);
  const auto opts = q.options().dtype(o.wd);
  at::Tensor dq = at::zeros(q.sizes(), opts), dk = at::zeros(k.sizes(), opts);
  at::Tensor dv = at::zeros(v.sizes(), opts);
  at::Tensor dp_score = at::empty({q.size(0), q.size(1)}, opts);
  at::Tensor dp_den = at::empty_like(dp_score);
  const AttnTable* table = attn_table();
  AT_DISPATCH_FLOATING_TYPES(o.wd, "attention_backward", [&] {
    with_weight(weight, [&](auto w) {
      const Backward<scalar_t, decltype(w)::value> bw{
          operand_rows<scalar_t>(qc), operand_rows<scalar_t>(kc), operand_rows<scalar_t>(vc),
          operand_rows<scalar_t>(oc), operand_rows<scalar_t>(dc), mc.data_ptr<scalar_t>(),
          nc.data_ptr<scalar_t>(), o.param<scalar_t>(o.p_score), o.param<scalar_t>(o.p_den),
          dq.data_ptr<scalar_t>(), dk.data_ptr<scalar_t>(), dv.data_ptr<scalar_t>(),
          o.sh, rows_of<scalar_t>(table)};
      backward_impl(bw, dp_score.data_ptr<scalar_t>(), dp_den.data_ptr<scalar_t>());
    });
  });
  return {dq, dk, dv, dp_score, dp_den};
}

// ---------------------------------------------------------------------------------------
// The eager CPU call as one C++ autograd node (elasticbench/attention/autograd.py's
// attention_op, no gate): the kernels above, forward and backward, without a Python
// autograd function's forward, context and backward on every call. What stays in Python is
// set once (set_attention_hooks): special.py's finish of queries marked m = +inf (rare: looked
// for here, called only where one is), and the backward where autograd builds the
// gradient's graph (create_graph). Inputs, outputs and gradients are those of the Python
// path, bit for bit: the same kernels on the same tensors, the same conversions.

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// (fix_forward, fix_backward, differentiable_backward), set once from Python, never freed.
pybind11::tuple* attention_hooks = nullptr;
pybind11::object hook(size_t i) { return (*attention_hooks)[i].cast<pybind11::object>(); }

// Whether a query is marked m = +inf (special.py's test: its search runs only then).
bool any_marked(const at::Tensor& m) {
  bool found = false;
  AT_DISPATCH_FLOATING_TYPES(m.scalar_type(), "any_marked", [&] {
    const at::Tensor c = m.contiguous();
    const scalar_t* p = c.data_ptr<scalar_t>();
    const scalar_t inf = std::numeric_limits<scalar_t>::infinity();
    for (int64_t i = 0, n = c.numel(); i < n && !found; ++i) found = p[i] == inf;
  });
  return found;
}

pybind11::object mask_or_none(const at::Tensor& key_mask) {
  return key_mask.defined() ? pybind11::cast(key_mask) : pybind11::none();
}

at::Tensor as_dtype(const at::Tensor& t, at::ScalarType dtype) {
  return t.scalar_type() == dtype ? t : t.to(dtype);
}

struct FusedAttention : public torch::autograd::Function<FusedAttention> {
  // mask_in is the key-padding mask where has_mask, else a stand-in (autograd takes no
  // undefined input); offset as cpp.forward takes it (0 unless causal).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& p_score,
                            const at::Tensor& p_den, double scale, bool causal,
                            const at::Tensor& mask_in, bool has_mask, int64_t weight,
                            int64_t offset, int64_t block_q, int64_t block_k) {
    const at::Tensor key_mask = has_mask ? mask_in : at::Tensor();
    offset = causal ? offset : 0;
    const std::vector<at::Tensor> r =
        attention_forward(q, k, v, p_score, p_den, scale, causal, block_q, block_k,
                          has_mask ? OptTensor(key_mask) : OptTensor(), weight, offset,
                          OptTensor(), false);
    const at::Tensor &m = r[1], &den = r[2];
    if (any_marked(m)) {
      pybind11::gil_scoped_acquire gil;
      hook(0)(q, k, v, r[0], m, den, scale, causal, mask_or_none(key_mask), weight, offset);
    }
    const at::Tensor out = as_dtype(r[0], q.scalar_type());
    ctx->save_for_backward({q, k, v, out, m, den, p_score, p_den});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["weight"] = weight;
    ctx->saved_data["offset"] = offset;
    ctx->saved_data["block_q"] = block_q;
    ctx->saved_data["block_k"] = block_k;
    if (has_mask) ctx->saved_data["key_mask"] = key_mask;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3];
    const at::Tensor &m = saved[4], &den = saved[5], &p_score = saved[6], &p_den = saved[7];
    const double scale = ctx->saved_data["scale"].toDouble();
    const bool causal = ctx->saved_data["causal"].toBool();
    const int64_t weight = ctx->saved_data["weight"].toInt();
    const int64_t offset = ctx->saved_data["offset"].toInt();
    const auto kept = ctx->saved_data.find("key_mask");
    const at::Tensor key_mask =
        kept == ctx->saved_data.end() ? at::Tensor() : kept->second.toTensor();
    const at::Tensor& grad = grads[0];
    bool need[5];
    for (int i = 0; i < 5; ++i) need[i] = ctx->needs_input_grad(i);
    variable_list result(14);
    if (at::GradMode::is_enabled()) {  // create_graph: autograd through the composite
      pybind11::gil_scoped_acquire gil;
      pybind11::tuple r = hook(2)(
          q, k, v, p_score, p_den, scale, causal, mask_or_none(key_mask), weight, offset, grad,
          pybind11::make_tuple(need[0], need[1], need[2], need[3], need[4]));
      for (int i = 0; i < 5; ++i)
        if (!r[i].is_none()) result[i] = r[i].cast<at::Tensor>();
      return result;
    }
    if (!(need[0] || need[1] || need[2] || need[3] || need[4])) return result;
    std::vector<at::Tensor> d = attention_backward(
        q, k, v, out, grad, m, den, p_score, p_den, scale, causal,
        ctx->saved_data["block_q"].toInt(), ctx->saved_data["block_k"].toInt(),
        key_mask.defined() ? OptTensor(key_mask) : OptTensor(), weight, offset);
    if (any_marked(m)) {
      pybind11::gil_scoped_acquire gil;
      hook(1)(q, k, grad, d[2], m, scale, causal, mask_or_none(key_mask), weight, offset);
    }
    for (int i = 0; i < 3; ++i) result[i] = as_dtype(d[i], q.scalar_type());
    if (need[3]) result[3] = d[3];
    if (need[4]) result[4] = d[4];
    return result;
  }
};

at::Tensor attention_node(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& p_score, const at::Tensor& p_den, double scale,
                          bool causal, const OptTensor& key_mask, int64_t weight,
                          int64_t offset, int64_t block_q, int64_t block_k) {
  TORCH_CHECK(attention_hooks != nullptr, "set_attention_hooks first");
  const bool has_mask = key_mask.has_value() && key_mask->defined();
  return FusedAttention::apply(q, k, v, p_score, p_den, scale, causal, has_mask ? *key_mask : q,
                               has_mask, weight, offset, block_q, block_k);
}

}  // namespace

void bind_attention(pybind11::module_& m, const char* (*isa)()) {
  using namespace pybind11::literals;
  current_isa = isa;
  // p_score and p_den are weights.py's two parameter slots (Elastic's tau and beta), (batch,
  // heads) in any strides; weight is weights.py's Weight as an int; offset the causal
  // diagonal (query i sees key j <= i + offset)
  // gate: None or (batch, heads, length_q, value_dim) in any strides; keep_ungated adds the
  // ungated output (the output itself without a gate) as a fourth tensor
  m.def("attention_forward", &attention_forward,
        "fused attention forward for `weight`: (out, m, den[, ungated]) in the working dtype",
        "q"_a, "k"_a, "v"_a, "p_score"_a, "p_den"_a, "scale"_a, "causal"_a, "block_q"_a = 256,
        "block_k"_a = 512, "key_mask"_a = pybind11::none(), "weight"_a = int64_t(kElastic),
        "offset"_a = int64_t(0), "gate"_a = pybind11::none(), "keep_ungated"_a = false);
  m.def("attention_backward", &attention_backward,
        "fused attention backward for `weight`: (dq, dk, dv, dp_score, dp_den) in the "
        "working dtype",
        "q"_a, "k"_a, "v"_a, "out"_a, "dout"_a, "m"_a, "den"_a, "p_score"_a, "p_den"_a,
        "scale"_a, "causal"_a, "block_q"_a = 256, "block_k"_a = 512,
        "key_mask"_a = pybind11::none(), "weight"_a = int64_t(kElastic), "offset"_a = int64_t(0));
  m.def("attention_node", &attention_node,
        "the eager fused attention as one autograd node (no gate): its output, differentiable "
        "in q, k, v, p_score and p_den",
        "q"_a, "k"_a, "v"_a, "p_score"_a, "p_den"_a, "scale"_a, "causal"_a, "key_mask"_a,
        "weight"_a, "offset"_a, "block_q"_a, "block_k"_a);
  m.def("set_attention_hooks", [](pybind11::object fix_forward, pybind11::object fix_backward,
                                  pybind11::object differentiable) {
    if (attention_hooks == nullptr) attention_hooks = new pybind11::tuple();
    *attention_hooks = pybind11::make_tuple(fix_forward, fix_backward, differentiable);
  }, "the Python attention_node calls: special's fix_forward and fix_backward where a query "
     "is marked m = +inf, and the backward where autograd builds the gradient's graph");
  m.def("attention_use_blas", [](bool on) {
    const bool was = use_blas;
    use_blas = on;
    return was && (sgemm_ != nullptr);
  }, "tiles through the Fortran BLAS (True, where exported) or at::addmm; returns the old state");
}

}  // namespace eb
