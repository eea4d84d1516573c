// The interface between the instruction-set builds of the attention row kernels
// (attention_isa_*.cpp on attention_rows.h, plain C++ on raw pointers) and the torch side
// of the fused Elastic-attention kernel (attention.cpp). No torch header is included here.
// The algorithm is docs/attention.md section 2; the kernel is docs/native.md section 5.
#pragma once
#include <cstdint>

namespace eb {

// What a forward row update found in one tile row: the sum of its exponentials (after the
// shift to the new running max) and whether a visible score was NaN or +inf.
struct AttnRowSum {
  double sum;
  int nan, inf;
};

// Row kernels on one row of a score tile of `cols` entries of which the first `n` are
// visible (causal mask); entries [n, cols) are written 0.
//   fwd: *m = max(*m, kept scores); s <- kept ? exp((s - *m) * inv_tau) : 0.
//        Kept: 0 <= s < +inf. NaN and +inf are reported, never kept.
//   bwd: s <- p = kept ? exp((s - m) * inv_tau) * r : 0; dp <- ds = p ((dp - c) * inv_tau);
//        returns sum ds (s - m) * inv_tau (dtau's tile term). nan_row: p and ds NaN on
//        the visible entries, NaN returned.
template <typename C> struct AttnRows {
  AttnRowSum (*fwd)(C* s, int64_t n, int64_t cols, C* m, C inv_tau);
  double (*bwd)(C* s, C* dp, int64_t n, int64_t cols, C m, C r, C c, C inv_tau, int nan_row);
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
