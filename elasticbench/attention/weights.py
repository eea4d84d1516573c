"""Which row function a fused attention kernel applies to a query's scores: the weight.

Every fused implementation (the tiled torch code, the native kernel, the Triton kernel)
takes the weight as a compile-time choice and two per-(batch, head) parameters p_score and
p_den, (batch, heads) tensors in the work dtype, always given (an unused one is ignored and
its gradient is zero). p_score is the parameter each score meets (Elastic's tau in
exp(s/tau), sigmoid's bias in sigmoid(s + bias)); p_den is the one the denominator adds
(Elastic's beta in beta + sum, symax's eta in eta + sum |s|):

    forward(q, k, v, p_score, p_den, scale, causal, key_mask=None, weight=Weight.ELASTIC,
            gate=None, keep_ungated=False)
        -> (out in q's dtype, m, den), m and den (batch, heads, length_q) in the work dtype;
           with keep_ungated (and a gate), (out, m, den, ungated)
    backward(q, k, v, out, dout, m, den, p_score, p_den, scale, causal, key_mask=None,
             weight=Weight.ELASTIC) -> (dq, dk, dv, dp_score, dp_den)

gate is None or a (batch, heads, length_q, value_dim) tensor in q's dtype (any strides): the
epilogue writes out = round(O * gate), O the ungated output in the work dtype, and, with
keep_ungated, ungated = round(O) beside it, with no extra pass over the output. The backward
is the ungated one: the autograd layer calls it with out = ungated and dout = dY * gate, and
takes d gate = dY * ungated itself.

m and den are the query statistics the backward recomputes the weights from
(docs/attention.md section 9):

    weight     m_i                      den_i                                 w_ij recomputed
    ELASTIC    max(0, max kept s)       sum_kept exp((s-m)/tau) + beta e^(-m/tau)
                                                                       exp((s - m)/tau)/den
    SOFTMAX1   max(0, max s)            exp(-m) + sum exp(s - m)              exp(s - m)/den
    SYMAX      0                        eta + sum |s|                         |s|/den
    STABLEMAX  0                        sum st(s)                             st(s)/den
    SIGMOID    0                        1                                     sigmoid(s + bias)
    COG        max |s| (0: no key)      sum exp(|s| - m)                      sign(s) exp(|s| - m)/den

(sums over the visible keys). For the normalized weights, m = +inf marks a query with an
infinite weight (docs/attention.md section 3: `special` finishes it; for COG an infinite
|s|, +inf or -inf) and m = NaN one with a NaN score (NaN wins); sigmoid's weights are
bounded and need neither. dp_score and dp_den are per (batch, head), summed over the
queries; a parameter the weight does not use gets a zero gradient.
"""

from __future__ import annotations

import enum


class Weight(enum.IntEnum):
    """w_ij from the scores s_ij of query i over the keys it sees, with p_score the
    parameter each score meets and p_den the one the denominator adds, as each member names
    them."""

    ELASTIC = 0  # exp(s/tau) over kept s >= 0, / (beta + sum): tau = p_score, beta = p_den
    SOFTMAX1 = 1  # exp(s) / (1 + sum exp(s)): no parameter
    SYMAX = 2  # |s| / (eta + sum |s|): eta = p_den
    STABLEMAX = 3  # st(s) / sum st(s), st(s) = s + 1 (s >= 0), 1/(1 - s) (s < 0)
    SIGMOID = 4  # sigmoid(s + bias) each, no normalizer: bias = p_score
    COG = 5  # sign(s) exp(|s|) / sum exp(|s|): signed weights, no parameter

    @property
    def normalized(self) -> bool:
        """Whether a query's weights share one denominator (all but sigmoid)."""
        return self is not Weight.SIGMOID

    @property
    def exponential(self) -> bool:
        """Whether the weight is an exponential kept stable by a running max."""
        return self in (Weight.ELASTIC, Weight.SOFTMAX1, Weight.COG)
