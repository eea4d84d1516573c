"""The sdist and the wheel built from it carry everything elasticbench reads at run time, the
build says nothing setuptools would warn about, and the wheel installed into a fresh venv
runs every kind of command from a directory outside the checkout (issue 28: a hand-written
package list missed elasticbench.harness.hunt and every command of an installed copy failed)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

from elasticbench import native

ROOT = Path(__file__).resolve().parents[2]
KERNEL = textwrap.dedent("""
    from elasticbench import register_kernel
    from elasticbench.harness.builtin.numpy_kernels import numpy_elastic

    @register_kernel(function="elastic", backend="numpy", name="wheel_elastic")
    def wheel_elastic(x, *, tau, beta):
        return numpy_elastic(x, tau=tau, beta=beta)
""")
# Printed by the installed interpreter: where its elasticbench is, and where its native build
# would go (nothing is built: build_key only hashes).
PROBE = (
    "import elasticbench.nn, elasticbench.native as n; "
    "print(elasticbench.nn.__file__); print(n.source_dir()); "
    "print(all(s.is_file() for s in n.sources())); print(n.build_root() / n.build_key())"
)


def _build(outdir: Path) -> tuple[Path, Path, str]:
    """python -m build, offline: the sdist, then the wheel built from the unpacked sdist (so
    the wheel can only hold what the sdist carries, and no stale build/ of the checkout)."""
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(outdir), str(ROOT)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (sdist,) = outdir.glob("elasticbench-*.tar.gz")
    (wheel,) = outdir.glob("elasticbench-*.whl")
    return sdist, wheel, done.stdout + done.stderr


def _fresh_venv(where: Path) -> Path:
    """A venv that sees this environment's packages (torch, numpy, ...) through a .pth file,
    so installing the wheel with --no-deps downloads nothing; pip comes from there too.
    A .pth file's directories are only added to the path, their own .pth files are not run,
    so this environment's editable elasticbench stays invisible to the new one."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    ours = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    (Path(site) / "outer-environment.pth").write_text("\n".join(sorted(ours)) + "\n")
    return python


@pytest.mark.slow
@pytest.mark.ci  # building and installing the wheel: 36 s, more than make test can spare
def test_the_wheel_installs_into_a_fresh_venv_and_every_command_runs(tmp_path):
    sdist, wheel, log = _build(tmp_path / "dist")
    # no SetuptoolsDeprecationWarning, "package would be ignored" and the like (the one
    # "warning:" left is distutils saying PYTHONDONTWRITEBYTECODE turned byte-compiling off)
    warned = [ln for ln in log.splitlines()
              if "warning" in ln.lower() and "byte-compiling is disabled" not in ln]
    assert warned == [], "\n".join(warned)

    cpp = sorted(p.name for p in native.source_dir().iterdir() if p.suffix in (".cpp", ".h"))
    cases = sorted(p.name for p in (ROOT / "cases").glob("*.toml"))
    with tarfile.open(sdist) as tar:
        in_sdist = set(tar.getnames())
    top = sdist.name.removesuffix(".tar.gz")
    assert {f"{top}/kernels/cpp/{n}" for n in cpp} <= in_sdist
    assert {f"{top}/cases/{n}" for n in cases} <= in_sdist
    with zipfile.ZipFile(wheel) as whl:
        in_wheel = set(whl.namelist())
    assert {f"elasticbench/kernels/cpp/{n}" for n in cpp} <= in_wheel
    assert {f"elasticbench/cases/{n}" for n in cases} <= in_wheel
    assert "elasticbench/harness/hunt/__init__.py" in in_wheel  # the package the hand-written list missed
    assert "elasticbench/kernels/triton/launch.py" in in_wheel  # subpackages of kernels/ too
    # every Python file of the checkout's packages, under the name it imports as
    here = {f"elasticbench/{p.relative_to(ROOT / 'elasticbench').as_posix()}"
            for p in (ROOT / "elasticbench").rglob("*.py")}
    here |= {f"elasticbench/{p.relative_to(ROOT).as_posix()}"
             for d in ("kernels", "cases") for p in (ROOT / d).rglob("*.py")}
    assert sorted(here - in_wheel) == []
    assert not any(n.startswith(("kernels/", "cases/")) for n in in_wheel)  # no top-level names

    venv = tmp_path / "venv"
    python = _fresh_venv(venv)
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--ignore-installed", str(wheel)], check=True, capture_output=True)

    work = tmp_path / "work"  # outside the checkout: nothing can come from ROOT
    work.mkdir()
    (work / "k.py").write_text(KERNEL)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"

    def run(*args: str | Path, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(a) for a in args], cwd=work, env={**env, **extra},
                              capture_output=True, text=True, timeout=120)

    probe = run(python, "-c", PROBE)
    assert probe.returncode == 0, probe.stderr
    nn_file, source_dir, sources_present, build_dir = probe.stdout.splitlines()
    site = str(venv.resolve())
    assert nn_file.startswith(site) and source_dir.startswith(site)
    assert sources_present == "True"  # the C++ sources native.py compiles are all installed
    # same compiler, torch, Python and sources as this checkout: only the path tells them apart
    assert build_dir != str(native.build_root() / native.build_key())

    # Compiling the installed copy's native kernels takes minutes on 2 cores: with CXX
    # pointing nowhere it skips them, as on a machine without a compiler, and every command
    # below sticks to kernels that need no compiler (numpy and eager torch).
    no_compiler = {"CXX": str(tmp_path / "no-c++")}
    helped = run("elasticbench", "--help", **no_compiler)
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("Usage: elasticbench")
    assert {"verify", "run", "hunt", "list"} <= set(re.findall(r"^  (\w+)", helped.stdout, re.M))

    listed = run("elasticbench", "list", "kernels", **no_compiler)
    assert listed.returncode == 0, listed.stderr
    names = {ln.split()[0] for ln in listed.stdout.splitlines() if ln.strip()}
    assert {"numpy_elastic", "torch_elastic", "torch_softmax"} <= names

    verified = run("elasticbench", "verify", "--quick", "-f", "elastic", "-d", "fp32",
                   "-b", "numpy", **no_compiler)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    counts = re.search(r"(\d+) cases, (\d+) passed, (\d+) failed", verified.stdout)
    assert counts and int(counts[1]) == int(counts[2]) > 0 and counts[3] == "0", verified.stdout

    hunted = run("elasticbench", "hunt", "--budget", "5", "--kernel-file", "k.py", "-d", "fp32",
                 "--json", "hunt.json", **no_compiler)
    assert hunted.returncode == 0, hunted.stdout + hunted.stderr
    assert re.search(r"pass wheel_elastic: \d+ configurations", hunted.stdout), hunted.stdout
    trials = json.loads((work / "hunt.json").read_text())["records"]
    assert trials and all(t["passed"] for t in trials)

    timed = run("elasticbench", "run", "--quick", "-f", "elastic", "-b", "numpy",
                "-s", "64x4096", "--json", "run.json", **no_compiler)
    assert timed.returncode == 0, timed.stdout + timed.stderr
    assert "0 failed verification or raised" in timed.stdout
    records = json.loads((work / "run.json").read_text())["records"]
    timed_kernels = {r["kernel"] for r in records}
    assert "numpy_elastic" in timed_kernels, timed_kernels
