"""OpenMP's wait policy: passive for the judging commands, untouched otherwise."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from elasticbench.harness.threads import command_of, is_elasticbench, passive_openmp


@pytest.mark.parametrize("argv, command", [
    (["verify", "-d", "bf16"], "verify"), (["-q", "hunt", "--budget", "5"], "hunt"),
    (["--version"], None), ([], None)])
def test_command_of(argv, command):
    assert command_of(argv) == command


@pytest.mark.parametrize("program, ours", [
    ("/venv/bin/elasticbench", True), ("/x/elasticbench/__main__.py", True),
    ("/x/pytest/__main__.py", False), ("/venv/bin/python", False)])
def test_is_elasticbench(program, ours):
    assert is_elasticbench(program) is ours


@pytest.mark.parametrize("argv, env, policy", [
    (["/b/elasticbench", "verify", "-d", "fp32"], {}, "passive"),
    (["/b/elasticbench", "-q", "hunt"], {}, "passive"),
    (["/b/elasticbench", "selftest"], {}, "passive"),
    (["/b/elasticbench", "run", "--quick"], {}, None),  # timings keep the default
    (["/b/elasticbench", "ab", "a.json"], {}, None),
    (["/b/elasticbench", "verify"], {"OMP_WAIT_POLICY": "active"}, "active"),  # the user's
    (["/b/pytest", "-k", "verify"], {}, None),  # not the command: nothing changes
])
def test_passive_openmp(argv, env, policy):
    chosen_by_us = policy == "passive" and not env
    assert passive_openmp(argv, env) is chosen_by_us
    assert env.get("OMP_WAIT_POLICY") == policy


def test_the_command_sets_it_before_torch_loads():
    """`python -m elasticbench verify` asks for it before any command module imports torch."""
    code = ("import sys; sys.argv = ['elasticbench', 'verify']; import os; "
            "import elasticbench.__main__; print(os.environ.get('OMP_WAIT_POLICY'))")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True)
    assert out.stdout.strip() == "passive"
