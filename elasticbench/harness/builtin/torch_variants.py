"""CPU Elastic-Softmax kernels whose pass structure is explicit, plus the two softmax
reference points: torch.softmax and torch.compile's fusion of the safe softmax.

Each pass below is one torch.compile'd function (inductor's C++ backend), called from
Python, so inductor cannot merge passes: a pass is exactly one sweep over the (rows, n)
array in memory. Inside a pass, rows are cut into blocks of BLOCK = 256 elements and a last
block of 1 to BLOCK (2 to BLOCK + 1 in _fused); what a pass does to one block stays in L1.
Every sum over a row is a sum of block sums, added by eager torch (pairwise; within
compiled_elastic's single function, by inductor): inductor sums a row, or a block, as one
serial chain per vector lane, whose error grows like n u where the budgets allow log2(n) u
(docs/numerics.md section 3); a block of 256 keeps each chain at about 64 terms at most
(docs/benchmarking.md section 5). The declared models (elasticbench.harness.passes):

| kernel               | passes over memory                              | R | W | exps |
|----------------------|-------------------------------------------------|---|---|------|
| elastic_three_pass   | max | sum exp | exp, divide                     | 3 | 1 | 2    |
| elastic_online       | block max+sum, rescaled (Milakov-Gimelshein) | exp, divide | 2 | 1 | 2 |
| elastic_two_pass     | block (mantissa sum, 2^k exponent) pairs, no max pass (Dukhan-Ablavatski) | exp, divide | 2 | 1 | 2 |
| elastic_exp_once     | block max, exp stored, sum | scale stored      | 2 | 2 | 1    |
| compiled_elastic     | inductor's own fusion of the composite          | 3 | 2 | 1    |
| elastic_accurate     | compiled_elastic computed in fp64               | 3 | 2 | 1 (fp64) |

The passes see the row's length, block count and last-block width as unbacked sizes
(`_compile`): one graph per dtype and row-count class (one row, more); compiled_elastic
keeps backed sizes, which inductor fuses faster, and five classes of them (numerics.md 6.7).

Rows whose kept maximum is not finite (NaN, +inf, nothing kept) or whose exponent is out
of the exact-reduction range are redone by the eager torch kernel (docs/definitions.md section 3),
so every kernel follows the special-value policy; those rows are rare and cheap to find.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from typing import Any

import torch

from elasticbench.harness.builtin.torch_kernels import torch_elastic
from elasticbench.harness.kernel_spec import register_kernel
from elasticbench.harness.passes import PassModel
from elasticbench.rows.exp_normalize import exp_normalize_forward

LOG2E = 1.0 / math.log(2.0)
BLOCK = 256
_compiled: dict[str, Callable] = {}


def _unbacked(t: Any, dims: tuple[int, ...]) -> Any:
    """t with dims unbacked for dynamo: marked on an alias (detach), so that neither the
    caller's tensor nor a view's base carries the mark into other compiled code."""
    if not dims:
        return t
    from torch._dynamo.decorators import mark_unbacked  # imported on first use: dynamo is slow

    t = t.detach()
    for d in dims:
        mark_unbacked(t, d)
    return t


def _compile(*varying: tuple[int, ...]) -> Callable[[Callable], Callable]:
    """torch.compile on first use, so importing this module stays cheap. varying[i] names the
    dimensions of positional argument i whose sizes are unbacked (mark_unbacked): the row
    length, block count and last-block width, so that one graph per dtype and row-count class
    serves every such size instead of one per 0/1 specialization (docs/numerics.md 6.7)."""

    def wrap(fn: Callable) -> Callable:
        def call(*args: Any) -> Any:
            c = _compiled.get(fn.__name__)
            if c is None:
                c = _compiled[fn.__name__] = _first_compile(fn)
            return c(*(_unbacked(a, dims) for a, dims in zip(args, varying, strict=True)))

        call.__name__ = fn.__name__
        return call

    return wrap


def _first_compile(fn: Callable) -> Callable:
    """torch.compile(fn), dynamo configured on first use. torch's import of inductor warns of a
    deprecation of its own (torch.jit.script_method): not the kernel's doing, so not recorded
    as a warning of the kernel that happened to compile first."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import torch._dynamo

        # several graphs per function remain (dtypes, row counts, _fused's shapes); past the
        # limit dynamo would run the rest eagerly: not the code a record names
        cfg = torch._dynamo.config
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(cfg, name):
                setattr(cfg, name, max(getattr(cfg, name), 1024))
        # without duck shapes, strides or offsets equal by coincidence (n = BLOCK) are not
        # guarded as equal, which would compile one graph per coincidence
        from torch.fx.experimental import _config as fx_config

        fx_config.use_duck_shape = False
        return torch.compile(fn, dynamic=True)


def _packed(kernel: Callable) -> Callable:
    """The kernel on a contiguous copy of a strided input (padded, transposed): the compiled
    passes then see one layout, not a graph per stride pattern."""

    @functools.wraps(kernel)
    def call(x: torch.Tensor, **params: float) -> torch.Tensor:
        return kernel(x.contiguous(), **params)

    return call


def _elastic(model: PassModel) -> Callable[[Callable], Callable]:
    """Register an Elastic-Softmax kernel of the torch backend under its own name, with its
    pass model, run on a contiguous copy of its input (_packed)."""

    def wrap(kernel: Callable) -> Callable:
        return register_kernel(function="elastic", backend="torch", model=model)(_packed(kernel))

    return wrap


def _work_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _kept(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """NVM that keeps NaN: negatives (and -inf) become -inf; +-0, positives and NaN stay."""
    xw = x.to(dtype)
    return torch.where(xw < 0, -math.inf, xw)


def _blocks(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A contiguous (rows, n) x as its whole blocks but the last, (rows, q, BLOCK), and the
    last block (rows, 1, r), 1 <= r <= BLOCK, never empty, so its max is defined. Cut here
    rather than in a graph: inductor cannot slice at an unbacked offset."""
    rows, n = x.shape
    q = (n - 1) // BLOCK
    r = n - q * BLOCK
    off = x.storage_offset()
    # dynamo compiles apart what it sees laid out differently, so both views always look
    # the same: the head's row stride past BLOCK (free when the head is empty, or one row),
    # the last block contiguous and at offset 0 past the first block (a copy of at most BLOCK
    # elements a row; dynamo tells an offset of 0 apart), its row stride free for one row
    head = x.as_strided((rows, q, BLOCK), (n if q and rows > 1 else BLOCK + 1, BLOCK, 1), off)
    last = x.as_strided((rows, 1, r), (n if rows > 1 else r, r, 1), off + q * BLOCK)
    return head, last.clone() if q else last


def _per_block(head: torch.Tensor, last: torch.Tensor, f: Callable) -> tuple[torch.Tensor, ...]:
    """f's per-block results (each (rows, blocks, 1)) on both parts, joined: (rows, q + 1, 1)."""
    return tuple(torch.cat(pair, 1) for pair in zip(f(head), f(last), strict=True))


def _row_sum(block_sums: torch.Tensor) -> torch.Tensor:
    """(rows, blocks, 1) block sums to (rows, 1) row sums, added pairwise by eager torch."""
    return block_sums.squeeze(-1).sum(-1, keepdim=True)


def _scalar(v: float, dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(v, dtype=dtype)


# ---- passes (each one compiled function = one sweep over memory) --------------------------
# varying dimensions of each argument (_compile): a row array (rows, n), a per-row column
# (rows, 1), the whole blocks (rows, q, BLOCK), the last block (rows, 1, r), a 0-d scalar
X, COL, HEAD, LAST, SCALAR = (1,), (), (1,), (2,), ()


@_compile(X, SCALAR)
def _pass_max(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return _kept(x, like.dtype).amax(-1, keepdim=True)


@_compile(HEAD, LAST, COL, SCALAR)
def _pass_sum(head: torch.Tensor, last: torch.Tensor, m0: torch.Tensor, tau: torch.Tensor
              ) -> torch.Tensor:
    def sums(b):
        return (torch.exp((_kept(b, tau.dtype) - m0.unsqueeze(1)) / tau).sum(-1, keepdim=True),)

    return _per_block(head, last, sums)[0]


@_compile(X, COL, SCALAR, COL)
def _pass_out(x: torch.Tensor, m0: torch.Tensor, tau: torch.Tensor, d: torch.Tensor
              ) -> torch.Tensor:
    return (torch.exp((_kept(x, tau.dtype) - m0) / tau) / d).to(x.dtype)


@_compile(HEAD, LAST, SCALAR)
def _pass_block_online(head: torch.Tensor, last: torch.Tensor, tau: torch.Tensor):
    def max_and_sum(b):
        s = _kept(b, tau.dtype)
        bm = s.amax(-1, keepdim=True)
        bm0 = torch.where(bm == -math.inf, 0, bm)
        return bm, torch.exp((s - bm0) / tau).sum(-1, keepdim=True)

    return _per_block(head, last, max_and_sum)


@_compile(HEAD, LAST, SCALAR, SCALAR, SCALAR)
def _pass_block_pairs(head: torch.Tensor, last: torch.Tensor, tau: torch.Tensor,
                      hi: torch.Tensor, lo: torch.Tensor):
    # exponent k of the block (a power of two >= its largest term), mantissa sum below it;
    # the reduction (s - k*hi - k*lo)/tau keeps the argument exact: k*hi is exact.
    def pairs(b):
        s = _kept(b, tau.dtype)
        bm = s.amax(-1, keepdim=True)
        k = torch.ceil(torch.where(bm == -math.inf, 0, bm) / tau * LOG2E)  # inf: row redone
        r = ((s - k * hi) - k * lo) / tau
        return bm, k, torch.exp(r).sum(-1, keepdim=True)

    return _per_block(head, last, pairs)


@_compile(X, COL, SCALAR, SCALAR, SCALAR, COL)
def _pass_pairs_out(x: torch.Tensor, k: torch.Tensor, tau: torch.Tensor, hi: torch.Tensor,
                    lo: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    r = ((_kept(x, tau.dtype) - k * hi) - k * lo) / tau
    return (torch.exp(r) / d).to(x.dtype)


@_compile(HEAD, LAST, SCALAR)
def _pass_block_store(head: torch.Tensor, last: torch.Tensor, tau: torch.Tensor):
    """Every block's exps, stored ((rows, q, BLOCK) and (rows, 1, r)), with every block's max
    and sum."""
    def store(b):
        s = _kept(b, tau.dtype)
        bm = s.amax(-1, keepdim=True)
        e = torch.exp((s - torch.where(bm == -math.inf, 0, bm)) / tau)
        return e, bm, e.sum(-1, keepdim=True)

    eh, bmh, bsh = store(head)
    el, bml, bsl = store(last)
    return eh, el, torch.cat([bmh, bml], 1), torch.cat([bsh, bsl], 1)


@_compile(HEAD, LAST, HEAD, COL, SCALAR)
def _pass_scale(eh: torch.Tensor, el: torch.Tensor, scale_h: torch.Tensor,
                scale_l: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return torch.cat([(eh * scale_h).flatten(1), (el * scale_l.unsqueeze(1)).flatten(1)],
                     1).to(like.dtype)


# backed sizes: unbacked ones made inductor's fusion of it up to 2.6x slower (numerics.md 6.7)
@_compile(SCALAR, SCALAR, SCALAR)
def _fused(x: torch.Tensor, tau: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    s = _kept(x, tau.dtype)
    m = s.amax(-1, keepdim=True)
    m0 = torch.where(m.isfinite(), m, 0)
    # integer and fp64 sums: inductor guards an fp32 sum's length at 4096 (numerics.md 6.7)
    nbig = (s == math.inf).sum(-1, keepdim=True).to(tau.dtype)
    # block by block (cut in the graph, as _blocks does outside): each block's exps are
    # summed as they are stored, the row's sum is a sum of n / BLOCK block sums, and y is
    # written from the stored exps
    rows, n = s.shape
    q = max(n - 2, 0) // BLOCK  # a last block of 2 to BLOCK + 1: no width-1 graph of its own
    blocks = (s[:, : q * BLOCK].reshape(rows, q, BLOCK), s[:, q * BLOCK :].unsqueeze(1))
    es = [torch.exp((b - m0.unsqueeze(1)) / tau) for b in blocks]
    sums = torch.cat([e.sum(-1, keepdim=True) for e in es], 1)
    d = (sums.double().sum(1).to(tau.dtype) + beta * torch.exp(-m0 / tau)).unsqueeze(1)
    m3, nbig3 = m.unsqueeze(1), nbig.unsqueeze(1)

    def out(b: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        y = torch.where(d == 0, 0, e / d)
        y = torch.where(m3 == math.inf, (b == math.inf).to(tau.dtype) / nbig3, y)
        return y.to(x.dtype).flatten(1)

    return torch.cat([out(b, e) for b, e in zip(blocks, es, strict=True)], 1)


@_compile(X)
def _fused_softmax(x: torch.Tensor) -> torch.Tensor:
    return exp_normalize_forward(x, x > -math.inf)


# ---- glue ------------------------------------------------------------------------------


def _redo_rows(x: torch.Tensor, y: torch.Tensor, bad: torch.Tensor, tau: float, beta: float
               ) -> torch.Tensor:
    """Rows the fast path does not cover, recomputed by the eager kernel."""
    bad = bad.reshape(-1)
    if bool(bad.any()):
        y[bad] = torch_elastic(x[bad], tau=tau, beta=beta)
    return y


def _combine(bm: torch.Tensor, bs: torch.Tensor, tau: torch.Tensor):
    """Row max and the block sums rescaled to it: (M, M0, sum) of shape (rows, 1)."""
    m = bm.amax(1)
    m0 = torch.where(m.isfinite(), m, 0)
    w = torch.exp((torch.where(bm == -math.inf, 0, bm) - m0.unsqueeze(1)) / tau)
    return m, m0, _row_sum(bs * w), w


def _cody_waite(tau: float, dtype: torch.dtype) -> tuple[float, float, int]:
    """tau*ln2 split as hi + lo, hi with few enough bits that k*hi is exact for |k| < limit."""
    bits = 26 if dtype == torch.float64 else 12
    c = tau * math.log(2.0)
    mant, exp = math.frexp(c)
    hi = math.ldexp(round(math.ldexp(mant, bits)), exp - bits)
    return hi, c - hi, 1 << (52 - bits if dtype == torch.float64 else 23 - bits)


@_elastic(PassModel("three-pass", reads=3, writes=1, exps=2))
def elastic_three_pass(x: torch.Tensor, *, tau: float, beta: float) -> torch.Tensor:
    """Three passes: kept max; sum of exponentials; exponentials divided by the sum."""
    wd = _work_dtype(x)
    t = _scalar(tau, wd)
    m = _pass_max(x, t)
    m0 = torch.where(m.isfinite(), m, 0)
    d = _row_sum(_pass_sum(*_blocks(x), m0, t)) + beta * torch.exp(-m0 / t)
    y = _pass_out(x, m0, t, d)
    return _redo_rows(x, y, ~m.isfinite(), tau, beta)


@_elastic(PassModel("online two-pass", reads=2, writes=1, exps=2))
def elastic_online(x: torch.Tensor, *, tau: float, beta: float) -> torch.Tensor:
    """Online two-pass (Milakov & Gimelshein): max and rescaled sum in one sweep, then output."""
    wd = _work_dtype(x)
    t = _scalar(tau, wd)
    bm, bs = _pass_block_online(*_blocks(x), t)
    m, m0, s, _ = _combine(bm, bs, t)
    y = _pass_out(x, m0, t, s + beta * torch.exp(-m0 / t))
    return _redo_rows(x, y, ~m.isfinite(), tau, beta)


@_elastic(PassModel("two-pass (Dukhan-Ablavatski)", reads=2, writes=1, exps=2))
def elastic_two_pass(x: torch.Tensor, *, tau: float, beta: float) -> torch.Tensor:
    """Two-Pass (Dukhan & Ablavatski): (mantissa, 2^k) sums with no max pass, then output."""
    wd = _work_dtype(x)
    t = _scalar(tau, wd)
    hi_f, lo_f, limit = _cody_waite(tau, wd)
    hi, lo = _scalar(hi_f, wd), _scalar(lo_f, wd)
    bm, k, bs = _pass_block_pairs(*_blocks(x), t, hi, lo)
    big_k = k.amax(1)
    s = _row_sum(torch.ldexp(bs, k - big_k.unsqueeze(1)))  # exact power-of-two rescaling
    d = s + torch.ldexp(_scalar(beta, wd), -big_k)
    y = _pass_pairs_out(x, big_k, t, hi, lo, d)
    m = bm.amax(1)
    return _redo_rows(x, y, ~m.isfinite() | ~(big_k.abs() < limit), tau, beta)


@_elastic(PassModel("exp-once (stores exponentials)", reads=2, writes=2, exps=1))
def elastic_exp_once(x: torch.Tensor, *, tau: float, beta: float) -> torch.Tensor:
    """Exp-once: block-shifted exponentials stored with their sums; then one scaling sweep."""
    wd = _work_dtype(x)
    t = _scalar(tau, wd)
    eh, el, bm, bs = _pass_block_store(*_blocks(x), t)
    m, m0, s, w = _combine(bm, bs, t)
    scale = w / (s + beta * torch.exp(-m0 / t)).unsqueeze(1)  # (rows, q + 1, 1)
    # fresh tensors, not views of scale, whose base dynamo would guard on; an empty eh with
    # the strides of a one-block one, and the output's dtype carried by a 0-d tensor (x
    # itself would specialize its length 1): one graph for every layout of the blocks
    eh = eh if eh.numel() else eh.new_empty(eh.shape)
    y = _pass_scale(eh, el, scale[:, :-1].clone(), scale[:, -1].clone(), _scalar(0, x.dtype))
    return _redo_rows(x, y, ~m.isfinite(), tau, beta)


@_elastic(PassModel("inductor fused", reads=3, writes=2, exps=1))
def compiled_elastic(x: torch.Tensor, *, tau: float, beta: float) -> torch.Tensor:
    """The Elastic-Softmax composite fused by torch.compile (inductor C++), special values kept."""
    wd = _work_dtype(x)
    return _fused(x, _scalar(tau, wd), _scalar(beta, wd))


@_elastic(PassModel("inductor fused, fp64 argument", reads=3, writes=2, exps=1, compute="fp64"))
def elastic_accurate(x: torch.Tensor, *, tau: float, beta: float) -> torch.Tensor:
    """Fused Elastic-Softmax computed in fp64: the exponent argument is exact for fp32 inputs."""
    d = torch.float64
    return _fused(x, _scalar(tau, d), _scalar(beta, d))


@register_kernel(function="softmax", backend="torch", name="compiled_softmax", baseline=True)
@_packed
def compiled_softmax(x: torch.Tensor) -> torch.Tensor:
    """torch.compile's reference point for softmax: torch_safe_softmax's composite fused by
    inductor (dynamic shapes, as compiled_elastic), special values kept."""
    return _fused_softmax(x)


@register_kernel(function="softmax", backend="torch", name="torch_softmax", baseline=True)
def torch_softmax(x: torch.Tensor) -> torch.Tensor:
    """torch.softmax itself, the vendor baseline (all -inf rows give NaN, not zeros)."""
    return torch.softmax(x, dim=-1)


@register_kernel(function="softmax", backend="torch", name="torch_softmax", mode="bwd",
                 baseline=True)
def torch_softmax_bwd(x: torch.Tensor, y: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """torch's own softmax backward (the kernel autograd runs for torch.softmax), the vendor
    baseline of --mode bwd; it reads only y and g."""
    return torch._softmax_backward_data(g, y, -1, y.dtype)
