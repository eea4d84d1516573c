"""The first steps of scripts/gpu_checks.sh: the machine, and whether the library is right on it.

    python3 scripts/gpu_library.py env     # (a) the machine, the packages, the commit
    python3 scripts/gpu_library.py install # (a) pip install -e ., then the library's imports
    python3 scripts/gpu_library.py api     # (a) one call of every public function and module
    python3 scripts/gpu_library.py right [--budget S]   # (b) right against the torch reference

env   nvidia-smi, Python, every package the project imports (version or "missing", and what
      needs it), torch's CUDA and device (name, capability, SMs), Triton, the commit. Exit 1
      when torch does not import or (outside the dry run) sees no CUDA device: nothing after
      it can run.
install
      python3 -m pip install --no-deps --no-build-isolation --no-index -e . (again with
      --break-system-packages where pip calls the system Python externally managed; where pip
      still fails, the package's layout as symbolic links in a scratch directory that the
      later steps put on PYTHONPATH; the dry run installs nothing), then whether elasticbench, .functional, .nn, the CLI, the Triton
      attention kernels and verify import, asked of a fresh interpreter. Exit 1 when pip
      fails (its last line says why) or elasticbench does not import.
api   every name of elasticbench.functional.__all__ and elasticbench.nn.__all__, called once on
      the device (bf16, small shapes) forward and backward: ok, or failed with the error's
      first line; the first call's seconds (it compiles) and the launches it noted
      (elasticbench.launches). Exit 1 when any failed.
right every public attention function (no mask, causal, a bool key-padding mask, both) and
      elastic_softmax, softmax and softmax1 (a short and a long row), forward and backward
      (gradients of q, k, v and of a per-head or per-row tensor tau and beta, eta or bias),
      in fp32, fp16 and bf16, against the torch reference of the same inputs in fp64 on the
      same device (elasticbench.attention.composite for attention; the library's torch code,
      ELASTICBENCH_IMPLEMENTATION=torch, for the rows). The error of a tensor is normwise:
      max |got - ref| / max |ref|; PASS RULE: at most TOLERANCE[dtype][pass] (below). Those
      bounds catch wrong code (a wrong tile, mask or statistic gives errors near 1), not the
      last bits: the exact reference and the project's budgets are `elasticbench verify`'s,
      which the `exact` and `verify` steps run. Elastic attention comes first, every dtype;
      when --budget seconds are spent the rest is listed as not run. Exit 1 when any failed.

Every figure goes to figures.jsonl as it is measured (scripts/gpu_figures.py); each part's
JSON (env.json, api.json, right.json) to the step's work folder. In the dry run
(GPU_CHECKS_DRY_RUN=1) the device is the CPU, the shapes tiny, and the driver has set
TRITON_INTERPRET=1 and ELASTICBENCH_IMPLEMENTATION=triton, so the Triton path is what runs.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_figures import ROOT, Figures, commit, dry_run, one_line, work_file

# What the project imports, and what breaks without it (pyproject.toml's dependencies).
PACKAGES = {
    "torch": "everything",
    "triton": "the GPU kernels",
    "numpy": "everything",
    "mpmath": "import elasticbench.functional (elasticbench.harness.functions), verify's reference",
    "gmpy2": "mpmath's speed only (verify's oracle is slower without it)",
    "ml_dtypes": "verify and run (bf16 in numpy)",
    "scipy": "the gates' statistics",
    "rich": "the CLI's tables",
    "click": "the CLI",
    "ninja": "the native CPU tier's build only (not used on the GPU)",
    "pytest": "the GPU tests",
    "xdist": "the GPU tests in parallel (pytest-xdist)",
}
ROWS = ("elastic_softmax", "softmax", "softmax1")
ATTENTION = ("elastic_attention", "softmax1_attention", "symax_attention",
             "stablemax_attention", "sigmoid_attention")
# normwise max |got - ref| / max |ref| allowed: catches wrong code, not the last bits
TOLERANCE = {"fp32": {"fwd": 1e-5, "bwd": 1e-4},
             "fp16": {"fwd": 4e-3, "bwd": 2e-2},
             "bf16": {"fwd": 3e-2, "bwd": 1e-1}}
UNIT = "max|err|/max|ref|"


def _dump(name: str, doc: dict) -> None:
    path = work_file(name)
    if path:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1, default=str)
        os.replace(tmp, path)


# ---------------------------------------------------------------------------------------
# env


def _version(module: str) -> str:
    """The installed distribution's version of an importable module, else "present"."""
    from importlib import metadata

    try:
        return metadata.version({"xdist": "pytest-xdist"}.get(module, module))
    except metadata.PackageNotFoundError:
        return "present"


def _nvidia_smi() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.sm,"
             "clocks.max.sm,compute_cap", "--format=csv"],
            capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return f"nvidia-smi: {one_line(e)}"
    return (out.stdout + out.stderr).strip()


def part_env(args: argparse.Namespace) -> int:
    figures = Figures()
    doc: dict[str, Any] = {"python": platform.python_version(), "executable": sys.executable,
                           "commit": commit(), "dry_run": dry_run(),
                           "environment": {k: os.environ.get(k) for k in (
                               "TRITON_INTERPRET", "ELASTICBENCH_IMPLEMENTATION",
                               "ELASTICBENCH_TORCH_DEVICE", "CUDA_VISIBLE_DEVICES")}}
    doc["nvidia_smi"] = _nvidia_smi()
    print(doc["nvidia_smi"])
    print(f"python {doc['python']} ({sys.executable}), commit {doc['commit']}")
    packages: dict[str, str | None] = {}
    for name, why in PACKAGES.items():
        try:
            importlib.import_module(name)
            packages[name] = _version(name)
            print(f"  {name:10} {packages[name]}")
        except Exception as e:
            packages[name] = None
            print(f"  {name:10} MISSING ({one_line(e)}): needed by {why}")
        figures.add(f"package {name}", packages[name] is not None, "present",
                    version=packages[name])
    doc["packages"] = packages
    doc["missing"] = [k for k, v in packages.items() if v is None]
    if packages["torch"] is None:
        doc["status"] = "failed: torch does not import"
        _dump("env.json", doc)
        print("FAILED: torch does not import: nothing on the GPU can run")
        return 1
    import torch

    doc["torch"], doc["cuda"] = torch.__version__, torch.version.cuda
    doc["cuda_available"] = torch.cuda.is_available()
    if doc["cuda_available"]:
        props = torch.cuda.get_device_properties(0)
        figures.device = props.name
        doc.update(device=props.name, capability=f"{props.major}.{props.minor}",
                   sms=props.multi_processor_count, memory_gib=round(props.total_memory / 2**30, 1),
                   devices=torch.cuda.device_count())
        figures.add("SMs", props.multi_processor_count, "count", note=props.name)
        figures.add("GPU memory", doc["memory_gib"], "GiB", note=props.name)
    print(f"torch {doc['torch']} (CUDA {doc['cuda']}), CUDA available: {doc['cuda_available']}"
          + (f", {doc['device']} sm_{doc['capability']} {doc['sms']} SMs" if
             doc["cuda_available"] else ""))
    _dump("env.json", doc)
    if not doc["cuda_available"] and not dry_run():
        print("FAILED: torch sees no CUDA device: the GPU checks cannot run")
        return 1
    return 0


# ---------------------------------------------------------------------------------------
# install

LIBRARY = ("elasticbench", "elasticbench.functional", "elasticbench.nn", "elasticbench.harness.cli",
           "elasticbench.kernels.triton.flash_attention", "elasticbench.harness.verify")
_IMPORTS = """
import importlib, json, sys
out = {}
for name in sys.argv[1:]:
    try:
        mod = importlib.import_module(name)
        out[name] = "ok"
        if name == "elasticbench":
            out["file"] = mod.__file__
    except Exception as e:
        lines = [s.strip() for s in str(e).splitlines() if s.strip()]
        out[name] = "failed: " + type(e).__name__ + (": " + lines[0] if lines else "")
print(json.dumps(out))
"""


def _pip(extra: list[str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
           "--no-build-isolation", "--no-index", *extra, "-e", str(ROOT)]
    print("$ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def _linked_tree() -> Path:
    """The installed layout (pyproject.toml's package-dir: kernels/ and cases/ inside
    elasticbench/) as a tree of symbolic links to this checkout, in a scratch directory
    outside OUT: a directory to put first on PYTHONPATH where pip cannot install."""
    site = Path(tempfile.gettempdir()) / "elasticbench-site"
    shutil.rmtree(site, ignore_errors=True)
    package = site / "elasticbench"
    shutil.copytree(ROOT / "elasticbench", package, copy_function=os.symlink,
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("kernels", "cases"):
        shutil.copytree(ROOT / name, package / name, copy_function=os.symlink,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return site


def part_install(args: argparse.Namespace) -> int:
    """pip's editable install (the dry run: none, the venv is installed), then the library's
    imports asked of a fresh interpreter (this one started before the install)."""
    figures = Figures()
    doc: dict[str, Any] = {"dry_run": dry_run()}
    if not dry_run():
        done = _pip([])
        if done.returncode != 0 and "externally-managed" in done.stdout + done.stderr:
            print("pip refuses the system Python (externally managed): again with "
                  "--break-system-packages (an editable install of this repository only)")
            done = _pip(["--break-system-packages"])
        print((done.stdout + done.stderr).strip()[-4000:])
        doc["pip_rc"] = done.returncode
        if done.returncode != 0:
            lines = [ln for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
            why = lines[-1].strip() if lines else f"exit {done.returncode}"
            print(f"pip install -e . exits {done.returncode}: {why}")
            # a device call must not come back empty for want of a build backend: the
            # package as it installs, laid out from symbolic links, on PYTHONPATH
            doc["pip_failed"] = why
            doc["pythonpath"] = str(_linked_tree())
            print(f"the later steps import the package from {doc['pythonpath']} instead")
    names = LIBRARY[:3] if dry_run() else LIBRARY  # the dry run: the plumbing, quickly
    env = dict(os.environ)
    if doc.get("pythonpath"):
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (doc["pythonpath"], env.get("PYTHONPATH")) if p)
    child = subprocess.run([sys.executable, "-c", _IMPORTS, *names], capture_output=True,
                           text=True, timeout=300, cwd=str(Path.home()), env=env)
    try:
        imports = json.loads(child.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (child.stderr.strip().splitlines() or ["no output"])[-1]
        imports = {name: f"failed: {tail}" for name in names}
    doc["imports"] = imports
    doc["elasticbench_file"] = imports.pop("file", None)
    for name, status in imports.items():
        print(f"  import {name}: {status}")
        figures.add(f"import {name}", status == "ok", "ok",
                    error=None if status == "ok" else status)
    print(f"elasticbench imports from {doc['elasticbench_file']}")
    _dump("install.json", doc)
    return 0 if imports.get("elasticbench") == "ok" else 1


# ---------------------------------------------------------------------------------------
# Shared: the device, the shapes, timing a first call


def device() -> str:
    return "cpu" if dry_run() else "cuda"


def sync() -> None:
    import torch

    if device() == "cuda":
        torch.cuda.synchronize()


def implementation(name: str):
    """Calls within the block run implementation `name` (docs/dispatch.md section 2: the
    library reads ELASTICBENCH_IMPLEMENTATION once, so a change in-process goes through
    dispatch.forcing)."""
    from elasticbench import dispatch

    return dispatch.forcing(name)


def dtypes() -> dict[str, Any]:
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def attention_shape() -> tuple[int, int, int, int]:
    """(B, H, L, D): a length that is no multiple of any tile, so edges are exercised."""
    return (1, 2, 20, 16) if dry_run() else (2, 3, 200, 64)


def row_shapes() -> list[tuple[int, int]]:
    """A short row and a long row (a streamed or split plan on the GPU)."""
    return [(6, 40)] if dry_run() else [(96, 1000), (4, 40000)]


def key_mask(b: int, length: int) -> Any:
    """(B, 1, 1, L) bool: batch i keeps its first L - (i % 3 + 1) L / 4 keys (every batch
    has padding, at least one key kept)."""
    import torch

    keep = torch.tensor([max(1, length - (i % 3 + 1) * length // 4) for i in range(b)])
    return (torch.arange(length)[None, :] < keep[:, None])[:, None, None, :].to(device())


# ---------------------------------------------------------------------------------------
# api: one call of every public name


def _api_calls() -> dict[str, Callable[[], list[Any]]]:
    """name -> a function that calls it once forward and backward and returns its outputs
    and gradients."""
    import torch

    from elasticbench import functional, nn

    dev = device()
    dt = torch.bfloat16
    b, h, length, d = attention_shape()
    rows_shape = (4, 64) if dry_run() else (64, 1000)
    g = torch.Generator().manual_seed(0)

    def qkv() -> list[torch.Tensor]:
        return [torch.randn(b, h, length, d, generator=g).to(dev, dt).requires_grad_(True)
                for _ in range(3)]

    def attention_fn(fn: Callable, **kw: Any) -> Callable[[], list[Any]]:
        def call() -> list[Any]:
            q, k, v = qkv()
            out = fn(q, k, v, causal=True, **kw)
            grads = torch.autograd.grad(out.float().square().sum(), (q, k, v))
            return [out, *grads]
        return call

    def rows_fn(fn: Callable, *params: float) -> Callable[[], list[Any]]:
        def call() -> list[Any]:
            x = torch.randn(*rows_shape, generator=g).to(dev, dt).requires_grad_(True)
            y = fn(x, *params)
            return [y, *torch.autograd.grad(y.float().square().sum(), (x,))]
        return call

    def module_fn(cls: type, attention: bool) -> Callable[[], list[Any]]:
        def call() -> list[Any]:
            m = cls().to(dev)
            if attention:
                q, k, v = qkv()
                out, inputs = m(q, k, v), [q, k, v]
            else:
                x = torch.randn(*rows_shape, generator=g).to(dev, dt).requires_grad_(True)
                out, inputs = m(x), [x]
            params = [p for p in m.parameters() if p.requires_grad]
            return [out, *torch.autograd.grad(out.float().square().sum(), inputs + params)]
        return call

    calls: dict[str, Callable[[], list[Any]]] = {}
    for name in functional.__all__:
        fn = getattr(functional, name)
        if name.endswith("_attention"):
            kw = {"tau": 1.0, "beta": 1.0} if name == "elastic_attention" else {}
            calls[f"functional.{name}"] = attention_fn(fn, **kw)
        elif name == "elastic_softmax":
            calls[f"functional.{name}"] = rows_fn(fn, 1.0, 1.0)
        else:
            calls[f"functional.{name}"] = rows_fn(fn)
    for name in nn.__all__:
        calls[f"nn.{name}"] = module_fn(getattr(nn, name), name.endswith("Attention"))
    return calls


def part_api(args: argparse.Namespace) -> int:
    import torch

    from elasticbench import launches

    figures = Figures()
    doc: dict[str, Any] = {"device": device(), "dtype": "bf16", "calls": {}}
    failed = 0
    for name, call in _api_calls().items():
        t0 = time.perf_counter()
        try:
            with launches.noting() as notes:
                outs = call()
            sync()
            finite = all(bool(torch.isfinite(t.float()).all()) for t in outs)
            rec = {"status": "ok" if finite else "failed",
                   "error": None if finite else "an output or gradient is not finite",
                   "launches": list(notes)}
        except Exception as e:
            rec = {"status": "failed", "error": one_line(e), "launches": []}
        rec["first_call_s"] = round(time.perf_counter() - t0, 3)
        failed += rec["status"] != "ok"
        doc["calls"][name] = rec
        _dump("api.json", doc)
        print(f"  {name:32} {rec['status']:6} {rec['first_call_s']:7.2f} s  "
              f"{rec['error'] or '; '.join(rec['launches'])}", flush=True)
        figures.add(f"api {name}", rec["status"] == "ok", "ok", dtype="bf16",
                    error=rec["error"], first_call_s=rec["first_call_s"],
                    launches=launches.summary(rec["launches"]))
    print(f"api: {len(doc['calls']) - failed} of {len(doc['calls'])} ok")
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------
# right: against the torch reference


def _normwise(got: Any, ref: Any) -> float:
    """max |got - ref| / max |ref| in fp64 (0 when both are 0; inf where got is not finite
    and ref is)."""
    import torch

    got, ref = got.detach().double(), ref.detach().double()
    if not bool(torch.isfinite(got).all()):
        return float("inf")
    scale = float(ref.abs().max()) if ref.numel() else 0.0
    err = float((got - ref).abs().max()) if ref.numel() else 0.0
    return err / scale if scale > 0 else (0.0 if err == 0 else float("inf"))


def _attention_params(name: str, h: int, dev: str) -> dict[str, Any]:
    """The function's tensor parameters, per head (H,) fp32, requiring grad."""
    import torch

    g = torch.Generator().manual_seed(7)

    def per_head(lo: float, hi: float) -> Any:
        return (lo + (hi - lo) * torch.rand(h, generator=g)).to(dev).requires_grad_(True)

    if name == "elastic_attention":
        return {"tau": per_head(0.5, 2.0), "beta": per_head(0.1, 2.0)}
    if name == "symax_attention":
        return {"eta": per_head(0.5, 2.0)}
    if name == "sigmoid_attention":
        return {"bias": per_head(-4.0, -1.0)}
    return {}


def _reference_attention(name: str, q: Any, k: Any, v: Any, params: dict[str, Any],
                         causal: bool, mask: Any | None) -> Any:
    """The composite in fp64 (docs/attention.md section 9: p_score, p_den as functional passes
    them)."""
    from elasticbench.attention import composite
    from elasticbench.attention.weights import Weight

    hp = {k_: p.double()[None, :, None, None] for k_, p in params.items()}
    weight, p_score, p_den = {
        "elastic_attention": (Weight.ELASTIC, hp.get("tau"), hp.get("beta")),
        "softmax1_attention": (Weight.SOFTMAX1, 1.0, 1.0),
        "symax_attention": (Weight.SYMAX, 0.0, hp.get("eta")),
        "stablemax_attention": (Weight.STABLEMAX, 0.0, 0.0),
        "sigmoid_attention": (Weight.SIGMOID, hp.get("bias"), 0.0),
    }[name]
    scale = q.shape[-1] ** -0.5
    return composite.attention_composite(weight, q, k, v, p_score=p_score, p_den=p_den,
                                         scale=scale, causal=causal, attn_mask=mask)


def _cases() -> Iterator[tuple[str, str, bool, bool, tuple[int, int] | None]]:
    """(function, dtype, causal, padded, row shape) in priority order, breadth first: bf16
    (what models train in) for Elastic attention's four variants, the rows and the family's
    attention, then fp16, then fp32. The dry run checks one case of each kind (the
    interpreter is slow)."""
    if dry_run():
        yield "elastic_attention", "bf16", True, True, None
        yield "elastic_attention", "fp32", False, False, None
        yield "elastic_softmax", "bf16", False, False, row_shapes()[0]
        yield "softmax1_attention", "fp16", False, True, None
        return
    for dn in ("bf16", "fp16", "fp32"):
        for causal in (False, True):
            for padded in (False, True):
                yield "elastic_attention", dn, causal, padded, None
        for fn in ROWS:
            for shape in row_shapes():
                yield fn, dn, False, False, shape
        for fn in ATTENTION[1:]:
            for causal, padded in ((True, False), (False, True)):
                yield fn, dn, causal, padded, None


def _check_attention(name: str, dn: str, causal: bool, padded: bool) -> dict[str, float]:
    import torch

    from elasticbench import functional

    dev, dt = device(), dtypes()[dn]
    b, h, length, d = attention_shape()
    g = torch.Generator().manual_seed(1)
    q, k, v, dout = (torch.randn(b, h, length, d, generator=g).to(dev, dt) for _ in range(4))
    mask = key_mask(b, length) if padded else None
    params = _attention_params(name, h, dev)
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    out = getattr(functional, name)(*leaves, causal=causal, attn_mask=mask, **params)
    plist = list(params.values())
    grads = torch.autograd.grad(out, leaves + plist, dout)
    sync()
    ref_leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    ref_params = {k_: p.detach().double().requires_grad_(True) for k_, p in params.items()}
    with implementation("torch"):
        ref = _reference_attention(name, *ref_leaves, ref_params, causal, mask)
        ref_grads = torch.autograd.grad(ref, ref_leaves + list(ref_params.values()),
                                        dout.double())
    errors = {"out": _normwise(out, ref)}
    for label, got, want in zip(["dq", "dk", "dv", *(f"d{k_}" for k_ in params)], grads,
                                ref_grads, strict=True):
        errors[label] = _normwise(got, want)
    return errors


def _check_rows(name: str, dn: str, shape: tuple[int, int]) -> dict[str, float]:
    import torch

    from elasticbench import functional

    dev, dt = device(), dtypes()[dn]
    g = torch.Generator().manual_seed(2)
    x = (3 * torch.randn(*shape, generator=g)).to(dev, dt)
    gy = torch.randn(*shape, generator=g).to(dev, dt)
    params: list[Any] = []
    if name == "elastic_softmax":
        params = [(0.5 + 1.5 * torch.rand(shape[0], 1, generator=g)).to(dev),
                  (0.1 + 2 * torch.rand(shape[0], 1, generator=g)).to(dev)]
    fn = getattr(functional, name)
    leaves = [x.detach().requires_grad_(True), *(p.detach().requires_grad_(True)
                                                 for p in params)]
    y = fn(*leaves)
    grads = torch.autograd.grad(y, leaves, gy)
    sync()
    ref_leaves = [t.detach().double().requires_grad_(True) for t in leaves]
    with implementation("torch"):
        ref = fn(*ref_leaves)
        ref_grads = torch.autograd.grad(ref, ref_leaves, gy.double())
    errors = {"out": _normwise(y, ref)}
    for label, got, want in zip(["dx", "dtau", "dbeta"], grads, ref_grads, strict=False):
        errors[label] = _normwise(got, want)
    return errors


def part_right(args: argparse.Namespace) -> int:
    figures = Figures()
    start = time.monotonic()
    doc: dict[str, Any] = {"device": device(), "unit": UNIT, "tolerance": TOLERANCE,
                           "rule": "pass when every tensor's error <= tolerance[dtype][pass]",
                           "cases": [], "not_run": []}
    failed = 0
    for fn, dn, causal, padded, shape in _cases():
        label = {"function": fn, "dtype": dn, "causal": causal, "padded": padded,
                 "shape": list(shape) if shape else list(attention_shape())}
        if time.monotonic() - start > args.budget:
            doc["not_run"].append(label)
            continue
        t0 = time.perf_counter()
        try:
            errors = (_check_rows(fn, dn, shape) if shape else
                      _check_attention(fn, dn, causal, padded))
            worst = {p: max((e for t, e in errors.items() if (t == "out") == (p == "fwd")),
                            default=0.0) for p in ("fwd", "bwd")}
            ok = all(worst[p] <= TOLERANCE[dn][p] for p in worst)
            rec = {**label, "status": "passed" if ok else "failed", "errors": errors}
        except Exception as e:
            errors, rec = {}, {**label, "status": "failed", "error": one_line(e)}
        rec["seconds"] = round(time.perf_counter() - t0, 2)
        failed += rec["status"] != "passed"
        doc["cases"].append(rec)
        _dump("right.json", doc)
        what = f"{fn} {dn}" + (f" {shape[0]}x{shape[1]}" if shape else
                               f"{' causal' if causal else ''}{' padded' if padded else ''}")
        detail = rec.get("error") or " ".join(f"{t} {e:.2e}" for t, e in errors.items())
        print(f"  {what:44} {rec['status']:6} {rec['seconds']:6.1f} s  {detail}", flush=True)
        for tensor, err in errors.items():
            p = "fwd" if tensor == "out" else "bwd"
            figures.add(f"right {what} {tensor}", err, UNIT, dtype=dn, shape=label["shape"],
                        bound=TOLERANCE[dn][p], status="passed" if err <= TOLERANCE[dn][p]
                        else "failed")
        if not errors:
            figures.add(f"right {what}", None, UNIT, dtype=dn, shape=label["shape"],
                        status="failed", error=rec["error"])
    if doc["not_run"]:
        print(f"right: budget of {args.budget:.0f} s spent: {len(doc['not_run'])} cases not "
              f"run (right.json lists them)")
    print(f"right: {len(doc['cases']) - failed} of {len(doc['cases'])} cases passed")
    _dump("right.json", doc)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("part", choices=("env", "install", "api", "right"))
    p.add_argument("--budget", type=float, default=120.0,
                   help="right: seconds after which no new case starts (default 120)")
    args = p.parse_args(argv)
    return {"env": part_env, "install": part_install, "api": part_api,
            "right": part_right}[args.part](args)


if __name__ == "__main__":
    sys.exit(main())
