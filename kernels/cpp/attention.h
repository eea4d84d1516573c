// The interface between the instruction-set builds of the attention row kernels
// (attention_isa_*.cpp on attention_rows.h, plain C++ on raw pointers) and the torch side
// of the fused attention kernel (attention.cpp). No torch header is included here.
// The algorithm is docs/attention.md section 2; the kernel is docs/native.md section 5.
#pragma once
#include <cstdint>

namespace eb {

// The weight function (elasticbench/attention/weights.py's Weight, the same numbers): which
// row function turns a query's scores into its weights. The kernel is one template on it.
enum AttnWeight : int {
  kElastic = 0, kSoftmax1, kSymax, kStablemax, kSigmoid, kCog, kNumWeights
};

// What a forward row update found in one tile row: the sum of its weights (for the exp
// family after the shift to the new running max) and whether a visible score was NaN or
// gave an infinite weight (+inf; for symax +-inf). Never for sigmoid, whose weights are
// each their own: at most 1, and a NaN one reaches the output through its own product.
// Cog reports a -inf score apart (neg): -inf is also the score of a key the padding mask
// hides, so the caller, which knows whether the tile holds such keys, decides.
struct AttnRowSum {
  double sum;
  int nan, inf;
  int neg = 0;
};

// Row kernels on one row of a score tile of `cols` entries of which the first `n` are
// visible (causal mask); entries [n, cols) are written 0. `a` is the weight's row
// parameter: 1/tau for Elastic, the bias for sigmoid, unused otherwise.
//   fwd: the unnormalized weights written over s and summed. Elastic: *m = max(*m, kept
//        scores); s <- kept ? exp((s - *m) a) : 0, kept: 0 <= s < +inf. softmax1: *m =
//        max(*m, finite scores) (*m starts at 0, the 1's exponent); s <- exp(s - *m).
//        symax: |s|. stablemax: s + 1 (s >= 0), 1/(1 - s) (s < 0). sigmoid: sigmoid(s + a).
//        Cog: *m = max(*m, finite |s|) (*m starts at 0); s <- sign(s) exp(|s| - *m), the
//        sum of exp(|s| - *m) returned (a -inf score is a hidden key: weight 0, not summed).
//        NaN and infinite scores are reported, never summed as numbers.
//   bwd: s <- p = the normalized weight (times r = 1/den), dp <- ds = w'(s) r (dp - c) for
//        the normalized ones (Elastic's carries its 1/tau), dp y (1 - y) for sigmoid;
//        Cog: s <- sign(s) p, dp <- p (dp - sign(s) c), p = exp(|s| - m) r (-inf: 0);
//        returns Elastic's dtau tile term sum ds (s - m)/tau, sigmoid's sum ds (dbias),
//        0 for the others. nan_row: p and ds NaN on the visible entries, NaN returned.
template <typename C> struct AttnRows {
  AttnRowSum (*fwd[kNumWeights])(C* s, int64_t n, int64_t cols, C* m, C a);
  double (*bwd[kNumWeights])(C* s, C* dp, int64_t n, int64_t cols, C m, C r, C c, C a,
                             int nan_row);
};

struct AttnTable {
  const char* isa;
  AttnRows<float> f32;
  AttnRows<double> f64;
};

}  // namespace eb

namespace eb_attn_generic { const eb::AttnTable* attn_table(); }
namespace eb_attn_avx2 { const eb::AttnTable* attn_table(); }
namespace eb_attn_avx512 { const eb::AttnTable* attn_table(); }
