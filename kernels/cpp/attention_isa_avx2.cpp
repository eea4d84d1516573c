// The attention row kernels built for one instruction set (see attention_rows.h).
#pragma GCC target("avx2,fma,f16c")
#define EB_NS eb_attn_avx2
#define EB_VEC_BYTES 32
#include "attention_rows.h"

const eb::AttnTable* eb_attn_avx2::attn_table() { return make_attn_table("avx2"); }
