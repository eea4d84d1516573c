"""The driver of scripts/gpu_checks.sh (which holds the step table and documents the run).

    python3 scripts/gpu_checks.py OUT SECONDS [--dry-run] --step "NAME SHARE PRIORITY WHAT"...

Runs each step of the table in order as a child process with its own time limit (its share
of SECONDS plus what the steps before it left unused, never past the deadline; a step left
with under MIN_STEP_S seconds is skipped, one line), its output appended to OUT/log.txt as
it comes. Only the standard library is imported here: a machine where torch is broken still
gets a log that says so.

OUT receives at most five files (the device tool brings back eight):

  log.txt            every step's output; per step a line `== NAME start (limit L s): CMD`
                     before it and one header `== NAME: rc R in S s [status]` after it
  figures.jsonl      one JSON object per figure, appended and flushed as measured (step,
                     name, value, unit, shape/dtype where they apply, device, commit)
  summary.json/.md   every step's rc, seconds, limit and status, rewritten after each step
  gpu_checks.tar.gz  every step's own files (per-step JSON, verify records, the tuning
                     table), rewritten after every step and on SIGTERM/SIGINT, so a run cut
                     short still brings back what its finished steps wrote

The exit status is 0 when every step that ran passed (a step "not available" passes), else 1;
2 for bad arguments. Torch failing to import or seeing no GPU fails the `env` step, and the
steps after it are skipped (so the run exits 1 quickly, saying why).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_figures

ROOT = Path(__file__).resolve().parent.parent
ARCHIVE = "gpu_checks.tar.gz"
OUT_FILES = ("log.txt", "figures.jsonl", "summary.json", "summary.md", ARCHIVE)
MIN_STEP_S = 8  # a step with less than this left is skipped
# the least a step gets, whatever its share (torch's import and CUDA's start alone take
# seconds on a cold machine; pip's editable install some more)
FLOOR_S = {"env": 25, "install": 40}
# the dry run's steps are tiny and fixed: each gets this at least, even past SECONDS (a busy
# machine may run them slower than SECONDS's shares foresee)
DRY_FLOOR_S = 25
KILL_GRACE_S = 5  # SIGTERM, then SIGKILL after this
STEPS = ("env", "install", "api", "right", "exact", "user_path", "headline", "train_step",
         "rows_sweep", "tune", "verify", "gpu_tests", "sweep", "gates")
# GPU-relevant tests: the ones that run their kernels on CUDA when there is one; the
# interpreter re-runs and compile audits (marked ci) are left out (docs/triton.md)
GPU_TESTS = ("tests/library/test_triton.py", "tests/library/test_triton_attention.py",
             "tests/library/test_triton_rows_params.py",
             "tests/library/test_triton_resident.py", "tests/library/test_torch_ops.py",
             "tests/library/test_host_reads.py", "tests/library/test_family_attention_api.py",
             "tests/harness/builtin/test_flex_attention.py")


@dataclass
class Step:
    """One row of the table: name, share of SECONDS (percent), priority letter, what."""

    name: str
    share: int
    priority: str
    what: str
    rc: int | None = None
    seconds: float = 0.0
    limit: int = 0
    status: str = "not run"
    command: list[str] = field(default_factory=list)


class Run:
    """The output folder, the work folder, the clock, the current child."""

    def __init__(self, args: argparse.Namespace, steps: list[Step]):
        self.args, self.steps = args, steps
        self.out: Path = args.out
        self.py = args.python
        self.dry = args.dry_run
        self.start = time.monotonic()
        self.deadline = self.start + args.seconds
        self.work = Path(tempfile.mkdtemp(prefix="gpu_checks."))
        self.child: subprocess.Popen | None = None
        self.commit = gpu_figures.commit()
        self.device: str | None = None
        self.missing: list[str] = []
        self.imports: dict[str, str] = {}
        self.pythonpath: str | None = None  # set where pip could not install (install.json)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def log(self, text: str) -> None:
        with open(self.out / "log.txt", "a") as f:
            f.write(text.rstrip("\n") + "\n")
        print(text, flush=True)

    def step_work(self, step: Step) -> Path:
        path = self.work / step.name
        path.mkdir(exist_ok=True)
        return path

    # -- the commands -----------------------------------------------------------------

    def command(self, step: Step, limit: int) -> list[str] | str:
        """The step's command, or a string: why it does not run (status "not available" or
        "failed: ..."), decided before starting anything."""
        py, work, dry = self.py, self.step_work(step), self.dry
        inner = max(limit - 10, 5)  # what a script's own --budget gets inside its limit
        lib = [py, str(ROOT / "scripts/gpu_library.py")]
        cli = [py, "-m", "elasticbench"]
        name = step.name
        if name == "env":
            return [*lib, "env"]
        if name == "install":
            return [*lib, "install"]
        need_library = name not in ("gpu_tests",)
        if need_library and self.imports.get("elasticbench.functional", "ok") != "ok":
            return (f"failed: elasticbench.functional does not import "
                    f"({self.imports['elasticbench.functional']}); missing: "
                    f"{', '.join(self.missing) or 'nothing'}")
        if name == "api":
            return [*lib, "api"]
        if name == "right":
            return [*lib, "right", "--budget", str(inner)]
        if name in ("exact", "verify"):
            if "mpmath" in self.missing or "ml_dtypes" in self.missing:
                return "failed: verify needs mpmath and ml_dtypes: missing here"
            if name == "exact":
                what = (["-f", "softmax", "-d", "fp32", "-s", "2x16", "--input", "normal"]
                        if dry else
                        ["-f", "elastic,softmax,elastic_attention", "-d", "fp32,bf16"])
                return [*cli, "verify", "--backend", "triton", "--quick", *what, "--mode",
                        "both", "--json", str(work / "exact.json")]
            what = (["--quick", "-f", "softmax1", "-d", "bf16", "-s", "2x16", "--input",
                     "normal"] if dry else
                    ["-d", "fp32,fp16,bf16"])
            return [*cli, "verify", "--backend", "triton", *what, "--mode", "both", "--json",
                    str(work / "verify.json")]
        if name == "user_path":
            # the timed sections are the headline step's; compile takes minutes on a CPU
            extra = (["--device", "cpu", "--quick", "--only", "sync,graph"] if dry else
                     ["--only", "sync,graph,compile"])
            return [py, str(ROOT / "scripts/gpu_user_path.py"), *extra, "--json",
                    str(work / "user_path.json"), "--budget", str(inner)]
        if name == "headline":
            return [py, str(ROOT / "scripts/gpu_headline.py"), "--budget", str(inner)]
        if name == "train_step":
            if dry:
                return [py, str(ROOT / "scripts/train_step.py"), "--layers", "1",
                        "--d-model", "32", "--heads", "2", "--batch", "1", "--length", "32",
                        "--vocab", "64", "--device", "cpu", "--dtype", "fp32", "--threads",
                        "1", "--warmup", "1", "--steps", "1", "--repeats", "1",
                        "--attention", "sdpa,elastic", "--no-check", "--json",
                        str(work / "train_step.json")]
            return [py, str(ROOT / "scripts/train_step.py"), "--compile", "both", "--json",
                    str(work / "train_step.json")]
        if name == "rows_sweep":
            return [py, str(ROOT / "scripts/gpu_rows_sweep.py"), str(work), "--budget-s",
                    str(inner), *(["--dry-run"] if dry else [])]
        if name == "tune":
            probe = subprocess.run([*cli, "tune", "--help"], capture_output=True, text=True,
                                   cwd=ROOT, timeout=min(120, limit), env=self.env(step))
            if probe.returncode != 0:
                lines = (probe.stderr or probe.stdout).strip().splitlines()
                return f"not available: `elasticbench tune --help` exits {probe.returncode}" + (
                    f" ({lines[-1].strip()})" if lines else "")
            # the dry run: tune's own plumbing under the interpreter (its --quick subset)
            return [*cli, "tune", "--out", str(work / "attention-table.json"), "--budget",
                    *(["2", "--quick"] if dry else [str(inner)])]
        if name == "gpu_tests":
            if "pytest" in self.missing:
                return "failed: pytest is missing here"
            jobs = [] if dry or "xdist" in self.missing else ["-n", "8"]
            # the dry run collects one file's selection: the command's plumbing, not the tests
            select = ["--collect-only", "-qq", GPU_TESTS[1]] if dry else list(GPU_TESTS)
            return [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", *jobs,
                    f"--junitxml={work / 'gpu_tests.xml'}",
                    "-m", "not ci", "-k", "not interpreter", *select]
        if name == "sweep":
            extra = (["--dims", "16", "--lengths", "64", "--tokens", "64", "--heads", "2"]
                     if dry else [])
            return [py, str(ROOT / "scripts/gpu_attention_sweep.py"), *extra, "--budget",
                    str(inner), "--json", str(work / "attention_sweep.json")]
        if name == "gates":
            return [py, str(ROOT / "scripts/gpu_gates.py"), "--budget", str(inner), "--json",
                    str(work / "gates.json")]
        raise ValueError(f"no command for step {name!r}")

    # -- running ----------------------------------------------------------------------

    def env(self, step: Step) -> dict[str, str]:
        env = dict(os.environ)
        env.update(GPU_CHECKS_FIGURES=str(self.out / "figures.jsonl"),
                   GPU_CHECKS_WORK=str(self.step_work(step)), GPU_CHECKS_STEP=step.name,
                   GPU_CHECKS_COMMIT=self.commit or "", PYTHONUNBUFFERED="1",
                   PYTHONWARNINGS="ignore:Editable installation")
        if self.device:
            env["GPU_CHECKS_DEVICE"] = self.device
        if self.pythonpath:  # pip could not install: the package's linked layout
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (self.pythonpath, env.get("PYTHONPATH")) if p)
        if self.dry:
            env.update(GPU_CHECKS_DRY_RUN="1", TRITON_INTERPRET="1",
                       ELASTICBENCH_IMPLEMENTATION="triton")
        else:
            env["ELASTICBENCH_TORCH_DEVICE"] = "cuda"
            env.pop("TRITON_INTERPRET", None)
        return env

    def execute(self, step: Step, limit: int) -> None:
        """Run the step's command for at most limit seconds; its output into the log."""
        t0 = time.monotonic()
        try:
            cmd = self.command(step, limit)
        except (OSError, subprocess.SubprocessError) as e:  # e.g. tune's probe hung
            cmd = f"failed: its command could not be formed: {gpu_figures.one_line(e)}"
        if isinstance(cmd, str):
            step.rc = 0 if cmd.startswith("not available") else 1
            step.status = cmd
            self.log(f"== {step.name}: {cmd}")
            return
        step.command = cmd
        self.log(f"== {step.name} start (limit {limit} s): {shlex.join(cmd)}")
        with open(self.out / "log.txt", "a") as log:
            try:
                self.child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                              cwd=ROOT, env=self.env(step),
                                              start_new_session=True)
            except OSError as e:  # the interpreter itself is missing or not executable
                step.rc, step.status = 127, f"failed: {gpu_figures.one_line(e)}"
                return
            try:
                step.rc = self.child.wait(timeout=limit)
                step.status = "passed" if step.rc == 0 else "failed"
            except subprocess.TimeoutExpired:
                self.stop_child()
                step.rc = 124
                step.status = f"failed: cut at its limit of {limit} s (what it wrote is kept)"
            finally:
                self.child = None
        step.seconds = round(time.monotonic() - t0, 1)

    def stop_child(self) -> None:
        """SIGTERM the child's process group, SIGKILL it after KILL_GRACE_S."""
        child = self.child
        if child is None or child.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 5)):
            try:
                os.killpg(child.pid, sig)
            except ProcessLookupError:
                return
            try:
                child.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def after(self, step: Step) -> None:
        """What follows every step: its figures harvested from its JSON, the header, the
        summary and the archive rewritten."""
        if step.name in ("env", "install"):
            self.read_env()
        try:
            harvest(step, self.step_work(step), gpu_figures.Figures(step.name, self.device),
                    self.out / "figures.jsonl")
        except Exception as e:  # a figure we could not read is not a failed step
            self.log(f"   ({step.name}: its JSON could not be read into figures: "
                     f"{gpu_figures.one_line(e)})")
        self.log(f"== {step.name}: rc {step.rc} in {step.seconds:.0f} s [{step.status}]")
        self.save()

    def read_env(self) -> None:
        """What env and install found: missing packages, the device, the library's imports."""
        env, install = (self.work / "env" / "env.json", self.work / "install" / "install.json")
        if env.exists():
            doc = json.loads(env.read_text())
            self.missing = doc.get("missing", [])
            self.device = doc.get("device") or ("cpu (dry run)" if self.dry else None)
        if install.exists():
            doc = json.loads(install.read_text())
            self.imports = doc.get("imports", {})
            self.pythonpath = doc.get("pythonpath")

    def save(self) -> None:
        """summary.json, summary.md and the archive, each written whole then renamed."""
        doc = {"out": str(self.out), "seconds": self.args.seconds, "dry_run": self.dry,
               "commit": self.commit, "device": self.device, "missing": self.missing,
               "elapsed_s": round(time.monotonic() - self.start, 1),
               "steps": [{k: getattr(s, k) for k in ("name", "priority", "share", "limit",
                                                       "rc", "seconds", "status", "what")}
                         for s in self.steps]}
        _write(self.out / "summary.json", json.dumps(doc, indent=1) + "\n")
        lines = [f"# gpu_checks: {self.device or 'device unknown'}, commit {self.commit}",
                 "", f"{doc['elapsed_s']} s of {self.args.seconds}"
                 f"{' (dry run)' if self.dry else ''}", "",
                 "| step | priority | share | limit s | rc | s | status |",
                 "|:--|:--|--:|--:|--:|--:|:--|"]
        lines += [f"| {s.name} | {s.priority} | {s.share}% | {s.limit} | "
                  f"{'' if s.rc is None else s.rc} | {s.seconds:.0f} | {s.status} |"
                  for s in self.steps]
        _write(self.out / "summary.md", "\n".join(lines) + "\n")
        tmp = self.out / (ARCHIVE + ".tmp")
        with tarfile.open(tmp, "w:gz") as tar:
            tar.add(self.work, arcname="gpu_checks")
        os.replace(tmp, self.out / ARCHIVE)

    def run(self) -> int:
        unused = 0.0
        for i, step in enumerate(self.steps):
            share = self.args.seconds * step.share / 100
            first_failed = next((s for s in self.steps[:i] if s.name in ("env", "install")
                                 and s.rc not in (0, None)), None)
            if first_failed is not None:
                step.status = f"skipped: {first_failed.name} failed"
                self.log(f"== {step.name}: skipped, {first_failed.name} failed")
                continue
            if self.dry:  # every step's plumbing is the point: none is skipped for time
                limit = int(max(min(share + unused, self.left()), DRY_FLOOR_S))
            else:
                limit = int(min(max(share + unused, FLOOR_S.get(step.name, 0)), self.left()))
            step.limit = limit
            if limit < MIN_STEP_S:
                step.status = f"skipped: {max(self.left(), 0):.0f} s left"
                self.log(f"== {step.name}: skipped, {max(self.left(), 0):.0f} s left")
                continue
            self.execute(step, limit)
            unused = max(0.0, share + unused - step.seconds)
            self.after(step)
        ran = [s for s in self.steps if s.rc is not None]
        failed = [s for s in self.steps if s.rc not in (0, None)
                  or s.status.startswith("skipped: env") or s.status.startswith(
                      "skipped: install")]
        self.log(f"== done in {time.monotonic() - self.start:.0f} s of {self.args.seconds}: "
                 f"{len(ran)} steps ran, failed: {', '.join(s.name for s in failed) or 'none'}")
        self.save()
        return 1 if failed else 0


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------
# Figures read from the JSON of the steps that write their own


def _load(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def harvest(step: Step, work: Path, figures: gpu_figures.Figures, where: Path) -> None:
    """Append figures read from the JSON a step wrote (the scripts that write their own
    figures as they go need none)."""
    name = step.name
    if name == "user_path" and (doc := _load(work / "user_path.json")):
        for section, out in doc.get("sections", {}).items():
            figures.add(f"user_path {section}", out.get("status") in ("passed", "ok"),
                        "passed", status=out.get("status"), error=out.get("reason"),
                        launches=out.get("launches"), dtype=out.get("dtype"))
            for e in out.get("entries", []):
                what = " ".join(str(e[k]) for k in ("dtype", "length", "causal", "impl", "pass")
                                if k in e)
                figures.add(f"user_path {section} {what}", e.get("ms"), "ms",
                            status=e.get("status"), tflops=e.get("tflops"))
    elif name == "train_step" and (doc := _load(work / "train_step.json")):
        opts = doc.get("options", {})
        shape = [opts.get(k) for k in ("layers", "d_model", "heads", "batch", "length")]
        for v in doc.get("variants", []):
            label = f"train_step {v.get('variant')}"
            figures.add(label, v.get("ms_per_step"), "ms/step", status=v.get("status"),
                        error=v.get("reason"), ratio_to_sdpa=v.get("ratio_to_sdpa"),
                        peak_mib=v.get("peak_mib"), dtype=opts.get("dtype"), shape=shape,
                        note="shape: layers, d_model, heads, batch, length")
            figures.add(f"{label} first step", v.get("first_step_ms"), "ms",
                        status=v.get("status"), dtype=opts.get("dtype"), shape=shape)
    elif name in ("exact", "verify") and (doc := _load(work / f"{name}.json")):
        cells: dict[tuple, dict] = {}
        for r in doc.get("records", []):
            key = (r.get("kernel"), r.get("mode"), r.get("dtype"))
            c = cells.setdefault(key, {"cases": 0, "failed": 0, "worst": 0.0})
            c["cases"] += 1
            c["failed"] += not r.get("passed")
            c["worst"] = max(c["worst"], r.get("max_budget_frac") or 0.0)
        for (kernel, mode, dtype), c in cells.items():
            figures.add(f"{name} {kernel} {mode}", c["worst"], "share of budget", dtype=dtype,
                        cases=c["cases"], failed=c["failed"],
                        status="passed" if not c["failed"] else "failed")
    elif name == "gates" and (doc := _load(work / "gates.json")):
        for key in ("summary", "rates"):
            if isinstance(doc.get(key), dict):
                for k, v in doc[key].items():
                    if isinstance(v, int | float):
                        figures.add(f"gates {k}", v, "rate")
    elif name == "sweep" and (doc := _load(work / "attention_sweep.json")):
        for e in doc.get("entries", doc.get("results", [])):
            if isinstance(e, dict) and "ms" in e:
                what = " ".join(str(e[k]) for k in ("kernel", "dtype", "dim", "length",
                                                     "causal", "config") if k in e)
                figures.add(f"sweep {what}", e.get("ms"), "ms", tflops=e.get("tflops"))


# ---------------------------------------------------------------------------------------
# Main


def parse_steps(rows: list[str]) -> list[Step]:
    """The table of gpu_checks.sh: NAME SHARE PRIORITY WHAT...; every known step once,
    shares adding up to 100."""
    steps = []
    for row in rows:
        parts = row.split(None, 3)
        if len(parts) < 4 or not parts[1].isdigit():
            raise ValueError(f"step row {row!r}: want NAME SHARE PRIORITY WHAT")
        steps.append(Step(parts[0], int(parts[1]), parts[2], parts[3]))
    names = [s.name for s in steps]
    if sorted(names) != sorted(STEPS):
        raise ValueError(f"steps {names} are not the known ones {list(STEPS)}")
    if names[:2] != ["env", "install"]:
        raise ValueError("env and install must come first")
    if sum(s.share for s in steps) != 100:
        raise ValueError(f"the shares add up to {sum(s.share for s in steps)}, not 100")
    return steps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpu_checks", description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("seconds", type=int)
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--step", action="append", default=[], dest="steps")
    try:
        args = p.parse_args(argv)
        steps = parse_steps(args.steps)
        if args.seconds < 30:
            raise ValueError(f"SECONDS must be at least 30, got {args.seconds}")
    except ValueError as e:
        print(f"gpu_checks: error: {e}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    stray = [f.name for f in args.out.iterdir() if f.name not in OUT_FILES]
    if stray:
        print(f"gpu_checks: error: {args.out} holds other files ({', '.join(stray[:3])}): "
              "give an empty or new folder", file=sys.stderr)
        return 2
    for name in OUT_FILES:
        (args.out / name).unlink(missing_ok=True)
    run = Run(args, steps)

    def on_signal(signum: int, _frame: Any) -> None:
        run.stop_child()
        run.log(f"== interrupted by signal {signum}: archive and summary written")
        run.save()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        return run.run()
    finally:
        shutil.rmtree(run.work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
