// The row kernels built for one instruction set (see simd.h).

#define EB_NS eb_generic
#define EB_VEC_BYTES 16
#include "rows.h"

const eb::Table* eb_generic::table() { return make_table("generic"); }
