"""Elastic attention: Elastic-Softmax weights over scaled dot-product scores (docs/attention.md).

- `layout`: how q, k, v, tau and beta are shaped, and the causal alignment;
- `composite`: the eager composite (scores, Elastic-Softmax, weights @ v), the readable
  reference implementation;
- `flash`: the tiled torch implementation (online max and sum over kept scores, O(length)
  extra memory) with its hand-written backward;
- `cpp`: the fused CPU kernel of the native tier (kernels/cpp/attention.cpp) behind the
  same contract;
- `special`: queries with a +inf score, off every kernel's hot path;
- `autograd`: the custom ops and autograd function behind
  `elasticbench.functional.elastic_attention`, and the choice of implementation per call
  (native C++, Triton, torch: elasticbench.dispatch).
"""
