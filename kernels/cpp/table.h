// The interface between the instruction-set builds of the row kernels (isa_*.cpp, plain
// C++ on raw pointers) and the torch binding (ops.cpp, with cpu.cpp and merge.h). No torch
// header is included here.
#pragma once
#include <cstdint>

namespace eb {

enum Dtype : int { F64 = 0, F32 = 1, F16 = 2, BF16 = 3, NUM_DTYPES = 4 };
// Pass structures of the exp-family forward (docs/native.md), bound by name as the
// extension's Structure (ops.cpp): Python never spells them as numbers.
enum Structure : int { THREE_PASS = 0, ONLINE = 1, FUSED = 2, ACCURATE = 3, NUM_STRUCTURES = 4 };
// What a row's reductions found (docs/definitions.md section 3).
enum RowClass : int { ROW_FINITE = 0, ROW_NAN = 1, ROW_INF = 2, ROW_EMPTY = 3 };

// exp((s - m)/tau) over kept s, m = max(max kept, floor), divided by their sum plus
// offset * exp(-m/tau). Kept: x >= 0 with mask_negative (elastic), else x > -inf (softmax,
// softmax1); NaN is never kept. softmax1: floor 0, offset 1.
struct ExpSpec {
  int mask_negative;
  double floor, tau, offset;
};

// A segment's reductions: its kept max m, the sum s of exp((x - m)/tau) over it, the count
// of +inf inputs and whether it holds a NaN.
struct ExpPartial {
  double m, s;
  int64_t ninf;
  int nan;
};

// The row's verdict after its segments are merged: class, shift m, denominator D.
struct ExpRow {
  int cls;
  double m, den;
  int64_t ninf;
};

// Weight family: w = stablemax's (x + 1 or 1/(1 - x)) or symax's |x|; y = w / (sum w + c).
struct WeightPartial {
  double top, s;  // largest weight; sum of w / scale with scale = max(top, 1) (fp64 compute)
  int64_t ninf;
  int nan;
};

// Backward (dx = y (g - c)/tau on kept positions). Pass 1 gives the kept max m of x, the row
// class, c = sum g y, max y, and (elastic's dtau) the sums of y, y (x - m) and g y (x - m)
// over kept positions; pass 2 writes dx from y and g alone. Given no x, pass 1 reads y and
// g alone and reports the smallest nonzero y beside the largest (m NaN, no census, no x
// sums): see exp_backward for when that settles the row's class.
struct BwdPartial {
  double m, c, ymax;
  int64_t ninf;
  int nan;
  double ymin = __builtin_inf();
  double ysum = 0, yd = 0, gyd = 0;  // sum y, sum y (x - m), sum g y (x - m)
};

// scratch: the fused kernel's per-block shifts (and, for a 16-bit y, its fp32 exps), at
// least fused_scratch(n, dtype, structure) doubles.
using ExpPartialFn = ExpPartial (*)(const void* x, void* y, int64_t n, const ExpSpec& p,
                                    double* scratch);
using ExpWriteFn = void (*)(const void* x, void* y, int64_t n, const ExpSpec& p,
                            const ExpRow& row, const double* scratch);
using WeightPartialFn = WeightPartial (*)(const void* x, int64_t n, int symax);
using WeightWriteFn = void (*)(const void* x, void* y, int64_t n, int symax, double top,
                               double den, int cls, int64_t ninf);
using BwdPartialFn = BwdPartial (*)(const void* x, const void* y, const void* g, int64_t n,
                                    int mask_negative);
// cls: the row's class (ROW_NAN: dx all NaN; ROW_INF, ROW_EMPTY: zeros).
using BwdWriteFn = void (*)(const void* y, const void* g, void* dx, int64_t n, int cls, double c,
                            double tau);

using ExpSumFn = double (*)(const void* x, int64_t n);  // sum of exp(x), x <= 0 (a probe)

struct Table {
  const char* isa;
  int vector_bytes;
  ExpPartialFn exp_partial[NUM_STRUCTURES][NUM_DTYPES];
  ExpWriteFn exp_write[NUM_STRUCTURES][NUM_DTYPES];
  WeightPartialFn weight_partial[NUM_DTYPES];
  WeightWriteFn weight_write[NUM_DTYPES];
  BwdPartialFn bwd_partial[NUM_DTYPES];
  BwdWriteFn bwd_write[NUM_DTYPES];
  ExpSumFn exp_sum[NUM_DTYPES];
};

constexpr int64_t FUSED_BLOCK = 1024;
constexpr int64_t STREAM_BYTES = 1 << 19;  // rows (segments) from here are written streaming
inline int64_t fused_blocks(int64_t n) { return (n + FUSED_BLOCK - 1) / FUSED_BLOCK + 1; }
// Whether the fused kernels keep a segment's exps in y itself: only where y holds their
// type and the segment is short enough not to be written streaming.
inline bool exps_in_y(int64_t n, int64_t y_bytes, int64_t exp_bytes) {
  return exp_bytes == y_bytes && n * y_bytes < STREAM_BYTES;
}
// Doubles of scratch a segment of n needs: the block shifts, plus the stored exps where y
// does not hold them: a 16-bit y would round them, the accurate kernel's are fp64 beside an
// fp32 y, and a segment long enough to be written streaming keeps them apart so that y is
// written once, around the cache.
inline int64_t fused_scratch(int64_t n, int dtype, int structure) {
  if (structure != FUSED && structure != ACCURATE) return 0;
  const int64_t in_bytes = dtype == F64 ? 8 : dtype == F32 ? 4 : 2;
  const int64_t exp_bytes = structure == ACCURATE || dtype == F64 ? 8 : 4;
  return fused_blocks(n) + (exps_in_y(n, in_bytes, exp_bytes) ? 0 : (n * exp_bytes + 7) / 8);
}

}  // namespace eb

namespace eb_generic { const eb::Table* table(); }
namespace eb_avx2 { const eb::Table* table(); }
namespace eb_avx512 { const eb::Table* table(); }
