"""What the attention reference holds for one input: exact outputs (and gradients) as
double-doubles with their structural zeros, in one record that the certified phase, the
mpmath oracle and the cache all fill or read (numerics/truth/attention_truth.py evaluates it).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

import numpy as np

FORWARD_FIELDS = ("out_hi", "out_lo", "out_zero", "out_nan_ok", "w", "zabs", "zbar", "kind")


@dataclass
class AttentionTruth:
    """Exact out (and, with dO, exact gradients) of one attention input."""

    out_hi: np.ndarray  # (B, H, Lq, Dv); NaN where out must be NaN
    out_lo: np.ndarray
    out_zero: np.ndarray  # bool: exactly 0 by structure (a query that keeps nothing)
    out_nan_ok: np.ndarray  # bool: NaN is acceptable (a non-finite v_j at weight 0)
    w: np.ndarray  # (B, H, Lq, Lk) float64 weights, 0 at hidden or masked keys
    zabs: np.ndarray  # (B, H, Lq, Lk) |z_ij| = |s_ij - m_i| / tau, 0 where not kept
    zbar: np.ndarray  # (B, H, Lq) the row's output-weighted mean |z|, sink included
    kind: np.ndarray  # (B, H, Lq) str: finite / nan / inf / masked
    # gradients (empty arrays when no dO was given)
    dq_hi: np.ndarray
    dq_lo: np.ndarray
    dk_hi: np.ndarray
    dk_lo: np.ndarray
    dv_hi: np.ndarray
    dv_lo: np.ndarray
    dzero_q: np.ndarray  # bool: exactly 0 by structure (nothing reaches it)
    dzero_k: np.ndarray
    dzero_v: np.ndarray
    dp_hi: np.ndarray  # (B, H, P): each row parameter's gradient per batch and head
    dp_lo: np.ndarray
    grad_nan_ok: np.ndarray  # (B, H) bool: a head with a non-finite input (0 x inf allowed)

    FIELDS: ClassVar[tuple[str, ...]] = ()  # set below: every field, in order (TruthStore)

    def arrays(self) -> dict[str, np.ndarray]:
        out = {f: getattr(self, f) for f in self.FIELDS}
        out["kind"] = self.kind.astype("U8")
        return out


AttentionTruth.FIELDS = tuple(f.name for f in fields(AttentionTruth))


def empty_truth(q: np.ndarray, k: np.ndarray, v: np.ndarray, npar: int, grads: bool
                ) -> AttentionTruth:
    """An AttentionTruth of the inputs' shapes, every value 0 (gradients empty without dO),
    grad_nan_ok already set: the heads with a non-finite q, k or v."""
    b_, h_, lq, _ = q.shape
    lk, dv = k.shape[2], v.shape[3]
    z = np.zeros
    gshape = (lambda s: s) if grads else (lambda s: (0,))
    finite = (np.isfinite(q).all(axis=(2, 3)) & np.isfinite(k).all(axis=(2, 3))
              & np.isfinite(v).all(axis=(2, 3)))
    return AttentionTruth(
        z((b_, h_, lq, dv)), z((b_, h_, lq, dv)), z((b_, h_, lq, dv), bool),
        z((b_, h_, lq, dv), bool), z((b_, h_, lq, lk)), z((b_, h_, lq, lk)), z((b_, h_, lq)),
        np.full((b_, h_, lq), "", dtype="U8"),
        z(gshape(q.shape)), z(gshape(q.shape)), z(gshape(k.shape)), z(gshape(k.shape)),
        z(gshape(v.shape)), z(gshape(v.shape)), *(z(gshape(t.shape), bool) for t in (q, k, v)),
        z((b_, h_, npar)), z((b_, h_, npar)), ~finite)
