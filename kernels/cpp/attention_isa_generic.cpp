// The attention row kernels built for one instruction set (see attention_rows.h).
#define EB_NS eb_attn_generic
#define EB_VEC_BYTES 16
#include "attention_rows.h"

const eb::AttnTable* eb_attn_generic::attn_table() { return make_attn_table("generic"); }
