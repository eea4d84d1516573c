"""Pieces every row kernel shares: a row's address, each path's work items, special rows and
the rounding of the quotient.

A streamed row's sum is carried across its chunks with a compensation term (`add_compensated`):
each chunk's tree sum has log2(BLOCK) roundings, but adding n/BLOCK chunk sums one after the
other would make n/BLOCK more, which on a long row of similar values (errors that do not
cancel) outgrows the log2(n) the accuracy budget allows (docs/numerics.md section 3).

A row's special values are found from one NaN-propagating maximum (`memory.max_nan`): NaN
anywhere makes it NaN, a +inf (with no NaN) makes it +inf. Ordinary rows take the fast branch;
the rare special rows a branch of their own, so the common path carries no per-element
special-value selects.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .memory import max_nan


@triton.jit
def ordinary(top):
    """The row holds neither NaN nor +inf (top: its NaN-propagating maximum)."""
    return (top == top) & (top < float("inf"))


@triton.jit
def special_y(is_inf, n_inf, top):
    """y of a special row: all NaN if it holds a NaN, else 1/k on each of its k infinities."""
    y = tl.where(is_inf, tl.math.div_rn(1.0, n_inf), 0.0)
    return tl.where(top != top, float("nan"), y)


@triton.jit
def reciprocal(den, EXACT: tl.constexpr):
    """1/den for the quotient: exact division is kept for fp32 outputs (see quotient)."""
    r = den if EXACT else tl.math.div_rn(1.0, den)
    return r


@triton.jit
def quotient(w, r, EXACT: tl.constexpr):
    """w / den, r from reciprocal. fp32 outputs divide (0.5 ulp); 16-bit outputs multiply by
    the rounded reciprocal (1 ulp of fp32, far below the 16-bit rounding that follows) and save
    the ~10 instructions of an IEEE division per element."""
    q = tl.math.div_rn(w, r) if EXACT else w * r
    return q


@triton.jit
def special_row(v, top):
    """y of a special row held whole in registers: special_y of its values v (x, or the
    weights) and their count of +inf."""
    is_inf = v == float("inf")
    return special_y(is_inf, tl.sum(is_inf.to(tl.float32), axis=0), top)


@triton.jit
def special_rows(y, ok, v, top):
    """A block of rows (one a row of the tile): y where the row is ok (ordinary), else its
    special_y from its values v and its top. A block whose rows are all ordinary takes no
    special-value select."""
    if tl.min(ok.to(tl.int32)) == 0:  # a special row in the block
        is_inf = v == float("inf")
        special = special_y(is_inf, tl.sum(is_inf.to(tl.float32), axis=1)[:, None], top)
        y = tl.where(ok, y, special)
    return y


@triton.jit
def add_compensated(total, comp, part):
    """(total + part, new compensation) by Kahan's step: comp carries what earlier additions
    lost; the caller scales both by the same factor when it rescales the sum."""
    y = part - comp
    t = total + y
    return t, (t - total) - y


@triton.jit
def row_start(ptr, row, stride):
    """The pointer to the first element of row `row` (rows `stride` elements apart), with the
    offset in int64: row * stride passes 2^31 on large tensors."""
    return ptr + tl.cast(row, tl.int64) * stride


@triton.jit
def row_block(blk, ROWS: tl.constexpr):
    """Short rows, ROWS a program: (the row indices of block blk, the same as an int64
    (ROWS, 1) column, which addresses the block's rows of a 2-D tensor)."""
    row = blk * ROWS + tl.arange(0, ROWS)
    return row, row.to(tl.int64)[:, None]


# The resident path's barrier (launch.plan_rows): a row's SPLITS programs, all resident at
# once (a cooperative launch), meet at the row's counter. Partials go through atomics, which
# one thread of a program performs, so that the release of its arrival orders them. SPLITS is
# a runtime value (one compiled kernel serves every row length of a block width).
#
# The wait is bounded (docs/triton.md, "The resident path's barrier"): an honest wait is for
# programs that are resident and running, microseconds; SPIN_LIMIT polls (each an L2 atomic,
# about half a microsecond or more: seconds in all) can only run out when the invariant is
# broken (counters not zero at launch, a row's programs not all resident). Then the program
# executes `trap`, which fails the launch with a CUDA error at the host's next synchronization:
# never a hang, never a result computed from partials that are not all there. Under the
# interpreter, elasticbench.triton_interpreter.cooperative_grid raises BarrierTrap instead.

SPIN_LIMIT = 1 << 24


@triton.jit
def publish(ptr, value):
    """Store a program's fp32 partial for the other programs of its row (before arriving).
    As its bits: Triton's interpreter has no floating-point exchange."""
    tl.atomic_xchg(ptr.to(tl.pointer_type(tl.int32)), value.to(tl.int32, bitcast=True),
                   sem="relaxed")


@triton.jit
def trap(value):
    """Abort the launch (PTX `trap`): the kernel fails, the host sees a CUDA error. value is
    any int32 scalar (inline assembly needs an operand) and is returned unchanged."""
    return tl.inline_asm_elementwise("trap; // elasticbench: resident-row barrier\n"
                                     "mov.b32 $0, $1;", "=r,r", [value], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def arrive_and_wait(cnt_ptr, SPLITS, LIMIT: tl.constexpr = SPIN_LIMIT):
    """Count this program in at its row's counter and spin until the row's SPLITS programs
    are; what each published before arriving is then visible (release, acquire). After LIMIT
    polls without them, trap (the launch fails): the barrier's invariant is broken."""
    tl.atomic_add(cnt_ptr, 1, sem="release")
    seen = tl.atomic_add(cnt_ptr, 0, sem="acquire")
    polls = 0
    while (seen < SPLITS) & (polls < LIMIT):
        seen = tl.atomic_add(cnt_ptr, 0, sem="acquire")
        polls += 1
    if seen < SPLITS:
        trap(seen)


@triton.jit
def leave(cnt_ptr, SPLITS):
    """After arrive_and_wait: count this program out. The row's last program to leave gets
    True (with everything the others published before leaving visible) and resets the
    counter to 0, as the next launch expects it; every program has stopped spinning by then."""
    gone = tl.atomic_add(cnt_ptr, 1, sem="acq_rel")
    last = gone == 2 * SPLITS - 1
    if last:
        tl.atomic_xchg(cnt_ptr, 0, sem="relaxed")
    return last


# Split and resident rows (launch.plan_rows): a row's SPLITS programs each write FIELDS fp32
# partials, field 0 the NaN-propagating maximum of its columns; the row's combine reads them
# back. These are the pieces every family's split and resident kernels share.


@triton.jit
def split_lanes(BLOCK: tl.constexpr, SPLITS, SPLITS_P2: tl.constexpr):
    """(column offsets of a chunk, a row's split indices padded to SPLITS_P2, which of those
    are real splits)."""
    offs = tl.arange(0, BLOCK)
    parts = tl.arange(0, SPLITS_P2)
    return offs, parts, parts < SPLITS


@triton.jit
def split_item(item, SPLITS, SPAN, n):
    """(row, first column, end column) of a split work item: split item % SPLITS of row
    item // SPLITS, SPAN columns cut at the row's end n."""
    row = item // SPLITS
    start = (item % SPLITS) * SPAN
    return row, start, tl.minimum(start + SPAN, n)


@triton.jit
def finish_item(turn, rows, SPLITS, SPAN, n):
    """(item, row, first column, end column) of phase 2's turn-th work item: the items in
    reverse, the last split first, as its x may still be in L2 after phase 1."""
    item = rows * SPLITS - 1 - turn
    row, start, end = split_item(item, SPLITS, SPAN, n)
    return item, row, start, end


@triton.jit
def store_partials(part_ptr, item, top, den, n_inf):
    """Phase 1's three partials of a (row, split) work item: max, sum, +inf count."""
    at = tl.cast(item, tl.int64) * 3
    tl.store(part_ptr + at, top)
    tl.store(part_ptr + at + 1, den)
    tl.store(part_ptr + at + 2, n_inf)


@triton.jit
def row_partials(part_ptr, row, parts, live, SPLITS, FIELDS: tl.constexpr,
                 LOW: tl.constexpr, VOLATILE: tl.constexpr):
    """(base pointers of row's splits' partials, their maxima (LOW past SPLITS), the row's
    NaN-propagating maximum). VOLATILE: written by programs running beside this one (the
    resident path)."""
    base = part_ptr + (tl.cast(row, tl.int64) * SPLITS + parts) * FIELDS
    tops = tl.load(base, mask=live, other=LOW, volatile=VOLATILE)
    return base, tops, max_nan(tops)


@triton.jit
def partial_sum(base, FIELD: tl.constexpr, live, VOLATILE: tl.constexpr):
    """The sum over a row's splits of their partial FIELD (base from row_partials)."""
    return tl.sum(tl.load(base + FIELD, mask=live, other=0.0, volatile=VOLATILE), axis=0)


@triton.jit
def resident_item(item, offs, n, SPLITS, BLOCK: tl.constexpr):
    """(row, column indices, which of them are inside the row) of a resident work item:
    block item % SPLITS of row item // SPLITS; offs: tl.arange(0, BLOCK)."""
    row = item // SPLITS
    idx = (item % SPLITS) * BLOCK + offs
    return row, idx, idx < n


@triton.jit
def publish_and_gather(part_ptr, cnt_ptr, item, row, top, den, v, parts, live, SPLITS,
                       LOW: tl.constexpr):
    """Resident rows: publish this program's three partials (its block's maximum top, its
    sum den, the +inf count of its values v), wait for the row's other programs, and
    return row_partials of the row."""
    n_inf = tl.full([], 0.0, tl.float32)
    if top == float("inf"):  # counted only where there is one
        n_inf = tl.sum((v == float("inf")).to(tl.float32), axis=0)
    mine = part_ptr + tl.cast(item, tl.int64) * 3
    publish(mine, top)
    publish(mine + 1, den)
    publish(mine + 2, n_inf)
    arrive_and_wait(cnt_ptr + row, SPLITS)
    return row_partials(part_ptr, row, parts, live, SPLITS, 3, LOW, True)


@triton.jit
def gathered_special_y(v, base, live, top):
    """y of a special row on the resident path: special_y of this program's values v (x, or
    the weights) with the row's +inf count from the partials publish_and_gather read."""
    return special_y(v == float("inf"), partial_sum(base, 2, live, True), top)
