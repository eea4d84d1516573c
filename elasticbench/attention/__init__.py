"""Attention of the family: Elastic-Softmax, softmax1, symax, stablemax, sigmoid or Cog
(signed) weights over scaled dot-product scores, optionally times an output gate
(docs/attention.md; the weight and the gate's contract: `weights`).

- `operands`: how q, k, v, tau and beta are shaped, and the causal alignment;
- `composite`: the eager composites (scores, the weight, weights @ v), the readable
  reference implementations;
- `weights`: the weight as a compile-time choice, and the fused implementations' contract;
- `flash`: the tiled torch implementation of every weight (an online max for the exp
  family and Cog, running sums for symax and stablemax, none for sigmoid; O(length) extra
  memory) with its hand-written backward;
- `native_attention`: the fused CPU kernel of the native tier (kernels/cpp/attention.cpp) behind the
  same contract;
- `special`: queries with an infinite weight, off every kernel's hot path;
- `autograd`: the custom ops and autograd function behind the attention functions of
  `elasticbench.functional`, and the choice of implementation per call and weight (native
  C++, Triton, torch: elasticbench.dispatch).
"""
