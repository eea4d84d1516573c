"""How the Triton row kernels are launched: options, row paths, launch geometry and occupancy.

Everything here runs on the host. `LaunchOptions` are the launcher's arguments: every wrapper
takes `options=`; without it the options of the innermost `launch_options(...)` block apply,
else the defaults, which `$ELASTICBENCH_TRITON_*` can move: read with the process's settings,
once (elasticbench.settings; `settings.refresh()` reads them again), so a call reads no
environment variable. TRITON_INTERPRET is read when this module is imported, as Triton reads
it when `triton.jit` decorates the kernels; the interpreter's patch
(elasticbench.triton_interpreter) is imported only when it is on.

Every launch goes to the device of its first tensor argument, on that device's current stream
(`run`), whichever device is current. docs/triton.md describes the resident path's barrier
counters under CUDA-graph capture (`row_counters`) and the bounded wait (rows.arrive_and_wait).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any

import torch

from elasticbench import launches
from elasticbench.devices import triton_interpreted
from elasticbench.settings import LaunchOptions, settings

# Read once, as Triton reads it once (when `triton.jit` decorates a kernel): the kernels of
# this process are interpreted or compiled for their whole life.
INTERPRETED = triton_interpreted()

DTYPES = ("fp32", "fp16", "bf16")  # fp64 is not a GPU softmax format; the suite skips it
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


_OPTIONS: ContextVar[LaunchOptions | None] = ContextVar("triton_launch_options", default=None)


def current_options() -> LaunchOptions:
    """The options of the innermost `launch_options` block, else those the process's
    settings give ($ELASTICBENCH_TRITON_*, elasticbench.settings): no environment variable
    is read here."""
    return _OPTIONS.get() or settings().launch


@contextmanager
def launch_options(**changes: int) -> Iterator[LaunchOptions]:
    """Within the block, wrappers called without `options=` use these (tests force the online
    path with small thresholds)."""
    token = _OPTIONS.set(replace(current_options(), **changes))
    try:
        yield _OPTIONS.get()  # type: ignore[misc]
    finally:
        _OPTIONS.reset(token)


# ---------------------------------------------------------------------------------------
# Launch geometry and occupancy


def num_warps(block: int) -> int:
    """Warps per program for a block of `block` elements."""
    if block <= 1024:
        return 4
    if block <= 4096:
        return 8
    return 16


@dataclass(frozen=True)
class SMLimits:
    """What one streaming multiprocessor holds (defaults: sm_80 and sm_90)."""

    regs: int = 65536
    warps: int = 64
    shared: int = 233472  # bytes; 228 KiB on sm_90, 164 KiB on sm_80
    programs: int = 32
    shared_reserved: int = 1024  # the runtime's own shared memory per program (sm_80+)


def resident_programs(n_regs: int, shared: int, num_warps: int, sm: SMLimits) -> int:
    """Programs of a compiled kernel that fit on one SM at once (at least 1).

    Registers are granted per warp in blocks of 256 (8 per thread), so n_regs rounds up to 8.
    """
    regs_per_program = -(-max(1, n_regs) // 8) * 8 * 32 * num_warps
    fits = [sm.regs // regs_per_program, sm.warps // num_warps, sm.programs]
    if shared:
        fits.append(sm.shared // (shared + sm.shared_reserved))
    return max(1, min(fits))


_OCCUPANCY: dict[tuple, int] = {}

# Launch values that are arguments of the kernels, not constexprs: they pass with the
# constexprs but name no compiled kernel (the kernels take them unspecialized), so they stay
# out of the keys of what is cached per compiled kernel (occupancy, refused cooperative
# launches). PROGRAMS is the grid's size, the stride of every row kernel's loop over its
# work items: passed, not read as tl.num_programs(0), because Triton 3.6.0's ptxas keeps
# %nctaid on the stack across the IEEE division's slow-path call (8 bytes of local memory)
# where it reloads a parameter from the constant bank (docs/triton.md, "Triton 3.6.0").
RUNTIME_VALUES = frozenset({"SPAN", "SPLITS", "PROGRAMS"})


def _row_launch(grid: int) -> dict[str, int]:
    """What every row kernel's launch adds to its constexprs: its grid's size."""
    return {"PROGRAMS": grid}


def _compiled_key(consts: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in consts.items() if k not in RUNTIME_VALUES))


@functools.cache
def device_properties(index: int) -> Any:
    """torch.cuda.get_device_properties of CUDA device `index`, asked once per device."""
    return torch.cuda.get_device_properties(index)


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


INTERPRETED_RESIDENT = 2  # programs per "SM" a cooperative launch gets under the interpreter


def _programs(kernel: Any, rows: int, args: tuple, warps: int, consts: dict,
              cooperative: bool = False) -> int:
    """Persistent grid size: rows capped by SMs x resident programs per SM.

    Resident programs per SM come from the compiled kernel's registers and shared memory;
    under the interpreter a handful of programs is enough to exercise the row loop (a
    cooperative launch gets two per "SM", so that several rows' programs wait at once).
    """
    if INTERPRETED or not args[0].is_cuda:  # (CPU tensors, not interpreted: the audit)
        return max(1, min(rows, device_sms(args[0]) * INTERPRETED_RESIDENT if cooperative
                          else INTERPRETED_SMS))
    index = _index(args[0].device)
    key = (kernel, index, warps, args[0].dtype, cooperative, _compiled_key(consts))
    if key not in _OCCUPANCY:
        props = device_properties(index)
        sm = SMLimits(regs=getattr(props, "regs_per_multiprocessor", SMLimits.regs),
                      warps=getattr(props, "max_threads_per_multi_processor", 2048) // 32,
                      shared=getattr(props, "shared_memory_per_multiprocessor", SMLimits.shared))
        try:
            coop = {"launch_cooperative_grid": True} if cooperative else {}
            with torch.cuda.device(index):  # the JIT compiles for the current device
                compiled = kernel.warmup(*args, grid=(1,), num_warps=warps,
                                         enable_fp_fusion=True, **coop, **consts,
                                         **_row_launch(1))
                compiled._init_handles()
            per_sm = resident_programs(compiled.n_regs, compiled.metadata.shared, warps, sm)
        except Exception:  # occupancy is a tuning hint; a failed query must not fail the call
            per_sm = max(1, sm.warps // warps)
        _OCCUPANCY[key] = props.multi_processor_count * per_sm
    return max(1, min(rows, _OCCUPANCY[key]))


# ---------------------------------------------------------------------------------------
# Launching


def run(kernel: Any, grid: tuple[int], args: tuple, warps: int, consts: dict,
        stages: int | None = None, cooperative: bool = False) -> None:
    """Launch kernel[grid](*args) on `warps` warps (and `stages` pipeline stages, where
    given; a cooperative grid, every program resident at once, where asked), on the device
    of args[0] (a tensor) and that device's current stream: Triton launches on the current
    device, so another one is made current for the launch. Under the interpreter with the
    GPU's bf16 and, for a cooperative grid, all programs at once (the audit records these
    launches instead, elasticbench.harness.audit.capture). `consts` also carries the kernels'
    runtime values named in RUNTIME_VALUES."""
    options: dict[str, Any] = {} if stages is None else {"num_stages": stages}
    if cooperative:
        options["launch_cooperative_grid"] = True
    if INTERPRETED:
        from elasticbench.triton_interpreter import cooperative_grid, exact_bf16

        with exact_bf16(), cooperative_grid() if cooperative else nullcontext():
            kernel[grid](*args, num_warps=warps, enable_fp_fusion=True, **options, **consts)
        return
    device = args[0].device
    if device.type == "cuda" and device.index is not None and \
            device.index != torch.cuda.current_device():
        with torch.cuda.device(device.index):
            kernel[grid](*args, num_warps=warps, enable_fp_fusion=True, **options, **consts)
        return
    kernel[grid](*args, num_warps=warps, enable_fp_fusion=True, **options, **consts)


def launch_items(kernel: Any, items: int, args: tuple, warps: int, consts: dict) -> None:
    """Launch a row kernel that walks `items` work items (rows, row blocks, or (row, split)
    pairs) on a persistent grid of at most SMs x resident programs (its size passed as
    PROGRAMS)."""
    grid = _programs(kernel, items, args, warps, consts)
    run(kernel, (grid,), args, warps, {**consts, **_row_launch(grid)})


_REFUSED: dict[tuple, str] = {}  # cooperative launches the driver refused, and why


def launch_resident(kernel: Any, rows: int, splits: int, args: tuple, warps: int,
                    consts: dict, counters: torch.Tensor) -> bool:
    """Launch a resident-path kernel (`splits` programs per row that wait for each other) as
    a cooperative grid of whole rows' programs, at most what is resident at once, so a
    program only waits for programs of the same wave. False, with nothing launched, where
    no such grid exists or the driver refused it (remembered: later calls do not retry);
    under the interpreter, or off a GPU, an error propagates (the counters zeroed first)."""
    on_gpu = args[0].is_cuda and not INTERPRETED
    key = (kernel, args[0].device, warps, args[0].dtype, _compiled_key(consts))
    if key in _REFUSED:
        return False
    capacity = _programs(kernel, rows * splits, args, warps, consts, cooperative=True)
    grid = capacity // splits * splits
    if not grid:
        _REFUSED[key] = f"{capacity} resident programs, fewer than a row's {splits}"
        return False
    try:
        run(kernel, (grid,), args, warps, {**consts, **_row_launch(grid)}, cooperative=True)
    except RuntimeError as e:
        if not on_gpu:
            counters.zero_()  # a program stopped mid-barrier must not stall the next call
            raise
        _REFUSED[key] = str(e).splitlines()[0] if str(e) else type(e).__name__
        return False
    return True


_COUNTERS: dict[tuple, torch.Tensor] = {}


def capturing(device: torch.device) -> bool:
    """Whether `device`'s current stream is capturing a CUDA graph now (a capture makes its
    stream the current one). False off CUDA."""
    if device.type != "cuda":
        return False
    if device.index is not None and device.index != torch.cuda.current_device():
        with torch.cuda.device(device.index):
            return torch.cuda.is_current_stream_capturing()
    return torch.cuda.is_current_stream_capturing()


def row_counters(x: torch.Tensor, rows: int) -> torch.Tensor:
    """The resident path's per-row arrival counters (int32), zero on entry to every launch.

    Outside a CUDA-graph capture: one buffer per device and stream, allocated zeroed (the
    fill runs at once) and reused by every launch on that stream, each of which leaves it at
    zero (a row's last program to leave its barrier resets the row's counter), so no call
    fills it; launches on one stream run in order, so none sees another's counts.

    While capturing: a buffer of the call's own, allocated from the graph's memory pool
    and zeroed by a fill that the graph records before the kernel. Each replay then zeroes
    it before its launch, whatever an earlier replay (or an aborted one) left, and no two
    graphs, nor a graph and eager calls, share counters, so graphs may be replayed in any
    order and on any stream. The cached buffer is neither created nor used under capture (a
    buffer first allocated there would belong to the graph's pool and be zero only once its
    recorded fill had replayed). The cost is a fill of rows x 4 bytes per replay."""
    if capturing(x.device):
        return torch.zeros(rows, dtype=torch.int32, device=x.device)
    if x.is_cuda:
        key: tuple = (x.device.index, torch.cuda.current_stream(x.device).cuda_stream)
    else:
        key = ("cpu", 0)
    have = _COUNTERS.get(key)
    if have is None or have.numel() < rows:
        have = torch.zeros(max(rows, 2 * (0 if have is None else have.numel())),
                           dtype=torch.int32, device=x.device)
        _COUNTERS[key] = have
    return have


def resident_available(x: torch.Tensor) -> bool:
    """Whether the resident path can launch for x: under the interpreter where it can run
    a cooperative grid's programs at once (elasticbench.triton_interpreter); on a GPU (and
    for the compile audit) where this Triton has the cooperative launch option."""
    if INTERPRETED:
        from elasticbench.triton_interpreter import cooperative_supported

        return cooperative_supported()
    return _cooperative_option()


@functools.lru_cache(maxsize=1)
def _cooperative_option() -> bool:
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except Exception:  # no Triton, or no NVIDIA backend: no cooperative launch
        return False
    return "launch_cooperative_grid" in getattr(CUDAOptions, "__dataclass_fields__", {})


# ---------------------------------------------------------------------------------------
# Rows: what the wrappers accept and which path a row length takes


def check_rows(x: torch.Tensor) -> tuple[int, int]:
    """(rows, n) of a 2-D fp32/fp16/bf16 tensor; TypeError for anything else."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise TypeError("triton kernels take a 2-D torch tensor (rows, n)")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"triton kernels support fp32, fp16 and bf16, not {x.dtype} "
                        "(verify with -d fp32,fp16,bf16)")
    return x.shape[0], x.shape[1]


def pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def plan(n: int, max_fused: int, chunk: int) -> tuple[bool, int]:
    """(fused?, block): the fused path covers the row in one block, else stream chunks."""
    block = pow2_at_least(n)
    if block <= max_fused:
        return True, block
    return False, min(chunk, block)


# The launch table (docs/triton.md, "Launch plans"). Short rows: a program holds ROW_TILE
# elements (several rows) at once, as long as that leaves SHORT_ROWS_PER_SM programs per SM;
# a row's block above SHORT_BLOCK is a program of its own. Streamed rows: split into several
# programs each while the rows alone would give fewer than PROGRAMS_PER_SM programs per SM.
SHORT_BLOCK = 1024
ROW_TILE = {4: 2048, 2: 4096}  # elements per program by element size: 8 KiB of input
SHORT_ROWS_PER_SM = 4
PROGRAMS_PER_SM = 4
H100_SMS = 132  # what the compile audit plans for (CPU tensors, no interpreter)
INTERPRETED_SMS = 4  # the interpreter's "GPU": a few programs, as _programs gives it


@dataclass(frozen=True)
class RowPlan:
    """How one call's rows are launched: the path, the block's columns (the row's power of
    two, or a chunk), rows per program, programs per row and the columns each covers."""

    path: str  # "fused", "rows" (row_block rows per program), "online", "split" or "resident"
    block: int
    warps: int
    row_block: int = 1
    splits: int = 1
    span: int = 0  # split: columns per program, a multiple of block

    def describe(self) -> str:
        """One line for logs and records: `split 8x32768 (4096-chunks, 8 warps)`."""
        if self.path == "rows":
            return f"rows {self.row_block}x{self.block} ({self.warps} warps)"
        if self.path == "split":
            return f"split {self.splits}x{self.span} ({self.block}-chunks, {self.warps} warps)"
        if self.path == "resident":
            return f"resident {self.splits}x{self.block} ({self.warps} warps)"
        return f"{self.path} {self.block} ({self.warps} warps)"


def device_sms(x: torch.Tensor) -> int:
    """SMs the plan fills: the device's on CUDA; the interpreter's few programs; else (the
    compile audit, CPU tensors) an H100's, so the audit compiles what an H100 runs."""
    if x.is_cuda:
        return device_properties(_index(x.device)).multi_processor_count
    return INTERPRETED_SMS if INTERPRETED else H100_SMS


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def plan_rows(rows: int, n: int, itemsize: int, options: LaunchOptions, sms: int,
              max_fused: int | None = None, resident: bool = False) -> RowPlan:
    """The launch plan of `rows` rows of n elements of `itemsize` bytes on `sms` SMs.

    max_fused: the longest register-resident block (default options.max_fused; the backward
    passes half). options.row_block and options.splits (when not 0) replace the table's
    choice; splits is capped at one program per chunk. resident: whether the resident path
    can launch here (`resident_available`); options.resident says whether to take it."""
    limit = options.max_fused if max_fused is None else max_fused
    block = pow2_at_least(n)
    if block <= limit:
        rb = options.row_block
        if not rb:
            rb = max(1, ROW_TILE.get(itemsize, 2048) // block) if block <= SHORT_BLOCK else 1
            while rb > 1 and _cdiv(rows, rb) < sms * SHORT_ROWS_PER_SM:
                rb //= 2
        rb = min(rb, pow2_at_least(rows))
        if rb > 1:
            return RowPlan("rows", block, num_warps(rb * block), row_block=rb)
        return RowPlan("fused", block, num_warps(block))
    chunk = min(options.chunk, block)
    if resident and options.splits != 1 and (options.resident == 1 or (
            options.resident == 0 and options.splits == 0)):
        held = _resident_plan(n, limit, chunk, options.splits, sms)
        if held is not None:
            return held
    chunks = _cdiv(n, chunk)
    want = options.splits
    if not want:
        want = 1 if rows >= sms * PROGRAMS_PER_SM else pow2_at_least(
            _cdiv(sms * PROGRAMS_PER_SM, rows))
    per = _cdiv(chunks, min(want, chunks))  # chunks per program
    splits = _cdiv(chunks, per)
    if splits > 1:
        return RowPlan("split", chunk, num_warps(chunk), splits=splits, span=per * chunk)
    return RowPlan("online", chunk, num_warps(chunk))


def _resident_plan(n: int, limit: int, chunk: int, splits: int, sms: int) -> RowPlan | None:
    """A streamed row on the resident path: parts of one power-of-two block each, held in
    registers (so at most `limit` wide), at least `chunk` wide, at most one program per SM
    per row (so that a row's programs always fit on the GPU at once); `splits` > 1 asks
    for that many parts. None where no such block exists."""
    width = pow2_at_least(_cdiv(n, splits)) if splits > 1 else max(
        chunk, pow2_at_least(_cdiv(n, sms)))
    parts = _cdiv(n, width)
    if width > limit or not 2 <= parts <= sms:
        return None
    return RowPlan("resident", width, num_warps(width), splits=parts, span=width)


PLANS: dict[tuple[str, int, int, torch.dtype], RowPlan] = {}  # (kernel, rows, n, dtype)
MAX_PLANS = 256  # shapes remembered; a model with ever new shapes must not grow it for ever


def note_plan(kernel: Any, x: torch.Tensor, chosen: RowPlan) -> None:
    """Remember the plan a call took (`PLANS`, keyed by the family's fused kernel's name) and
    note it for the run's record (elasticbench.launches)."""
    if len(PLANS) >= MAX_PLANS:
        PLANS.clear()
    name = getattr(getattr(kernel, "fn", kernel), "__name__", "?")
    PLANS[(name, x.shape[0], x.shape[1], x.dtype)] = chosen
    launches.note(lambda: ("backward " if "bwd" in name else "") + chosen.describe())


def exp2_model_ulps(options: LaunchOptions) -> int:
    """The ex2 model's ulps for a kernel launch: only under the interpreter, else -1."""
    return options.exp2_ulps if INTERPRETED else -1


@dataclass(frozen=True)
class RowKernels:
    """A forward family's kernels, one per path (`plan_rows`); the split path's two: the
    chunks' partials (split_partials), then the combine and the write (split_finish); the
    resident path's one (its arguments: x, y, part, counters, rows, n, strides, scalars)."""

    fused: Any
    rows: Any
    online: Any
    split_partials: Any
    split_finish: Any
    fields: int  # fp32 partials per split program
    resident: Any = None


def split_args(plan_: RowPlan, rows: int, n: int, x: torch.Tensor, fields: int
               ) -> tuple[torch.Tensor, dict[str, Any]]:
    """The split path's partials buffer (fields fp32 per program) and its constexprs."""
    part = torch.empty(rows * plan_.splits * fields, dtype=torch.float32, device=x.device)
    return part, {"SPAN": plan_.span, "SPLITS": plan_.splits,
                  "SPLITS_P2": pow2_at_least(plan_.splits)}


def resident_args(plan_: RowPlan, rows: int, x: torch.Tensor, fields: int
                  ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """The resident path's partials buffer (fields fp32 per program), its row counters and
    its constexprs."""
    part = torch.empty(rows * plan_.splits * fields, dtype=torch.float32, device=x.device)
    return part, row_counters(x, rows), {"SPLITS": plan_.splits,
                                         "SPLITS_P2": pow2_at_least(plan_.splits)}


def normalize_rows(x: torch.Tensor, kernels: RowKernels, scalars: tuple,
                   options: LaunchOptions | None, **constexprs: Any) -> torch.Tensor:
    """A new y = f(x) row by row on the path `plan_rows` chooses; scalars (floats, or a
    family's one tuple of row parameters, params.RowParams.args) follow (x, y, rows, n,
    strides) in the kernels' arguments (the split kernels': (x, y, part, rows, n, strides))."""
    options = options or current_options()
    rows, n = check_rows(x)
    x = x.contiguous()
    y = torch.empty_like(x)
    if rows == 0 or n == 0:
        return y
    chosen = plan_rows(rows, n, x.element_size(), options, device_sms(x),
                       resident=kernels.resident is not None and resident_available(x))
    if chosen.path == "resident":
        part, counters, extra = resident_args(chosen, rows, x, kernels.fields)
        consts = {"BLOCK": chosen.block, "EVEN": n % chosen.block == 0,
                  "EXACT": x.dtype == torch.float32, **constexprs, **extra}
        args = (x, y, part, counters, rows, n, x.stride(0), y.stride(0), *scalars)
        if launch_resident(kernels.resident, rows, chosen.splits, args, chosen.warps, consts,
                           counters):
            note_plan(kernels.fused, x, chosen)
            return y
        chosen = plan_rows(rows, n, x.element_size(), options, device_sms(x))
    consts = {"BLOCK": chosen.block, "EVEN": n % chosen.block == 0,
              "EXACT": x.dtype == torch.float32, **constexprs}
    if chosen.path == "split":
        part, extra = split_args(chosen, rows, n, x, kernels.fields)
        args = (x, y, part, rows, n, x.stride(0), y.stride(0), *scalars)
        items = rows * chosen.splits
        launch_items(kernels.split_partials, items, args, chosen.warps, {**consts, **extra})
        launch_items(kernels.split_finish, items, args, chosen.warps, {**consts, **extra})
    else:
        kernel = {"fused": kernels.fused, "rows": kernels.rows,
                  "online": kernels.online}[chosen.path]
        if chosen.path == "rows":
            consts["ROWS"] = chosen.row_block
        args = (x, y, rows, n, x.stride(0), y.stride(0), *scalars)
        launch_items(kernel, _cdiv(rows, chosen.row_block), args, chosen.warps, consts)
    note_plan(kernels.fused, x, chosen)
    return y
