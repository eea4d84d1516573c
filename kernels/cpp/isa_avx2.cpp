// The row kernels built for one instruction set (see simd.h).
#pragma GCC target("avx2,fma,f16c")
#define EB_NS eb_avx2
#define EB_VEC_BYTES 32
#include "rows.h"

const eb::Table* eb_avx2::table() { return make_table("avx2"); }
