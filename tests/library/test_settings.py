"""elasticbench.settings: every ELASTICBENCH_* variable parsed and validated once, into one
frozen object, and read by no other module of the package."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import pytest

from elasticbench import settings
from elasticbench.settings import LaunchOptions, Settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _read_again_after(monkeypatch) -> Iterator[None]:
    yield
    monkeypatch.undo()  # the environment back, then read as it is
    settings.refresh()


def test_values_are_parsed() -> None:
    got = settings.read({
        "ELASTICBENCH_IMPLEMENTATION": " Triton ", "ELASTICBENCH_BUILD_DIR": "/tmp/b",
        "ELASTICBENCH_TRITON_ATTENTION_TMA": "0", "ELASTICBENCH_ATTENTION_TUNE": "1",
        "ELASTICBENCH_TRITON_CHUNK": "64", "ELASTICBENCH_TRITON_RESIDENT": "-1",
        "ELASTICBENCH_TORCH_DEVICE": "cuda:1", "ELASTICBENCH_FLEX_CPU_BACKWARD": "1",
        "ELASTICBENCH_LLC_BYTES": "32M", "ELASTICBENCH_CACHE_MB": "0.5",
        "ELASTICBENCH_REFERENCE": "numpy", "ELASTICBENCH_ATTENTION_TABLE": ""})
    assert got == Settings(implementation="triton", build_dir=Path("/tmp/b"),
                           triton_attention_tma="0", attention_tune=True, triton_chunk=64,
                           triton_resident=-1, torch_device="cuda:1", flex_cpu_backward=True,
                           llc_bytes=32 << 20, cache_mb=0.5, reference="numpy")
    assert got.launch == LaunchOptions(chunk=64, resident=-1)
    assert settings.read({}) == Settings() and Settings().launch == LaunchOptions()
    assert settings.read({"ELASTICBENCH_IMPLEMENTATION": "auto"}).implementation is None
    with pytest.raises(AttributeError):
        got.cache_mb = 1.0  # type: ignore[misc]  # frozen


@pytest.mark.parametrize(("name", "value"), [
    ("ELASTICBENCH_IMPLEMENTATION", "fast"), ("ELASTICBENCH_TRITON_ATTENTION_TMA", "yes"),
    ("ELASTICBENCH_ATTENTION_TUNE", "2"), ("ELASTICBENCH_TRITON_MAX_FUSED", "48"),
    ("ELASTICBENCH_TRITON_CHUNK", "big"), ("ELASTICBENCH_TRITON_SPLITS", "-1"),
    ("ELASTICBENCH_TRITON_ROW_BLOCK", "3"), ("ELASTICBENCH_TRITON_RESIDENT", "2"),
    ("ELASTICBENCH_TRITON_EXP2_ULPS", "-3"), ("ELASTICBENCH_FLEX_CPU_BACKWARD", "on"),
    ("ELASTICBENCH_LLC_BYTES", "lots"), ("ELASTICBENCH_CACHE_MB", "-1"),
    ("ELASTICBENCH_REFERENCE", "native")])
def test_a_bad_value_is_one_line_naming_the_variable(name, value) -> None:
    with pytest.raises(ValueError) as caught:
        settings.read({name: value})
    message = str(caught.value)
    assert name in message and "\n" not in message, message


def test_every_variable_is_in_the_table_once() -> None:
    assert [f.name for f in settings.VARIABLES.values()] == [
        f.name for f in fields(Settings)]
    for name, f in settings.VARIABLES.items():
        assert name.startswith("ELASTICBENCH_") and f.metadata["variable"].meaning, name
        assert settings.parse(name, "  ") == f.default  # blank: the default


def test_read_once_until_refreshed(monkeypatch) -> None:
    monkeypatch.setenv("ELASTICBENCH_CACHE_MB", "7")
    first = settings.refresh()
    assert first.cache_mb == 7.0 and settings.settings() is first
    monkeypatch.setenv("ELASTICBENCH_CACHE_MB", "8")
    assert settings.settings() is first  # not read again
    assert settings.refresh().cache_mb == 8.0 and settings.settings().cache_mb == 8.0
    monkeypatch.setenv("ELASTICBENCH_CACHE_MB", "lots")
    with pytest.raises(ValueError, match="ELASTICBENCH_CACHE_MB"):
        settings.refresh()
    with pytest.raises(ValueError, match="ELASTICBENCH_CACHE_MB"):
        settings.settings()  # a failed read keeps nothing: every call reports it
    monkeypatch.setenv("ELASTICBENCH_CACHE_MB", "9")
    assert settings.settings().cache_mb == 9.0


def test_overriding_replaces_fields_for_a_block(monkeypatch) -> None:
    monkeypatch.delenv("ELASTICBENCH_REFERENCE", raising=False)
    before = settings.refresh()
    with settings.overriding(reference="numpy") as inside:
        assert settings.settings() is inside and inside.reference == "numpy"
        assert inside.cache_mb == before.cache_mb
    assert settings.settings() is before
    with pytest.raises(TypeError), settings.overriding(no_such_field=1):
        pass
    assert settings.settings() is before


def test_the_module_imports_nothing_heavy() -> None:
    code = ("import sys, elasticbench.settings; "
            "print(sorted(m for m in ('torch', 'triton', 'numpy', 'elasticbench.harness') "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=ROOT)
    assert done.stdout.strip() == "[]", done.stdout


def _elasticbench_constants(tree: ast.AST) -> set[str]:
    """The names a module binds to an ELASTICBENCH_* string."""
    return {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            and node.value.value.startswith("ELASTICBENCH_")
            for t in node.targets if isinstance(t, ast.Name)}


def _reads(tree: ast.AST, constants: set[str]) -> list[int]:
    """The lines of a module that call os.environ.get / environ.get / os.getenv with an
    ELASTICBENCH_* name, written out or through one of `constants`."""
    lines = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.args):
            continue
        f, arg = node.func, node.args[0]
        owner = f.value.attr if isinstance(f.value, ast.Attribute) else getattr(
            f.value, "id", None)
        if not ((f.attr == "get" and owner == "environ") or (f.attr == "getenv" and owner == "os")):
            continue
        if (isinstance(arg, ast.Constant) and str(arg.value).startswith("ELASTICBENCH_")) or \
                (isinstance(arg, ast.Name) and arg.id in constants):
            lines.append(node.lineno)
    return lines


def test_no_other_module_reads_an_elasticbench_variable() -> None:
    """Outside settings.py no module of the package (library or harness) calls
    os.environ.get or os.getenv for an ELASTICBENCH_* variable, written out or through a
    constant that holds its name."""
    probe = ast.parse('CACHE_ENV = "ELASTICBENCH_CACHE"\nos.environ.get(CACHE_ENV)\n'
                      'os.getenv("ELASTICBENCH_CACHE_MB")\nos.environ.get("TRITON_INTERPRET")')
    assert _reads(probe, _elasticbench_constants(probe)) == [2, 3]  # the check sees them
    own = ROOT / "elasticbench" / "settings.py"
    trees = {p: ast.parse(p.read_text()) for folder in ("elasticbench", "kernels")
             for p in (ROOT / folder).rglob("*.py") if p != own}
    assert len(trees) > 50
    constants = set().union(*(_elasticbench_constants(t) for t in trees.values()))
    offenders = [f"{p.relative_to(ROOT)}:{line}" for p, t in trees.items()
                 for line in _reads(t, constants)]
    assert not offenders, offenders
