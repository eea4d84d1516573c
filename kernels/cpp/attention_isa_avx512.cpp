// The attention row kernels built for one instruction set (see attention_rows.h).
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")
#define EB_NS eb_attn_avx512
#define EB_VEC_BYTES 64
#include "attention_rows.h"

const eb::AttnTable* eb_attn_avx512::attn_table() { return make_attn_table("avx512"); }
