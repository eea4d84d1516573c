// The row kernels built for one instruction set (see simd.h).
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")
#define EB_NS eb_avx512
#define EB_VEC_BYTES 64
#include "rows.h"

const eb::Table* eb_avx512::table() { return make_table("avx512"); }
