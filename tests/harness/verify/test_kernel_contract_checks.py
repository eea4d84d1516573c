"""Issue 57: a third-party kernel's contract is checked where it can be: its signature when
it registers (rows and attention), and every tensor argument it writes to, named."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from elasticbench.harness.registry import register_kernel, scoped_kernels


def _kernel_file(tmp_path: Path, body: str) -> str:
    p = tmp_path / "third_party.py"
    p.write_text("import numpy as np\nfrom elasticbench import register_kernel\n\n"
                 + textwrap.dedent(body))
    return str(p)


@pytest.mark.parametrize("function, mode, define, why", [
    ("elastic", "fwd", lambda: (lambda x, *, tau: x), "unexpected keyword argument 'beta'"),
    ("elastic", "bwd", lambda: (lambda x, *, tau, beta: x), "too many positional arguments"),
    ("softmax", "fwd", lambda: (lambda x, *, temperature: x),
     "missing a required argument: 'temperature'"),
    ("elastic_attention", "fwd", lambda: (lambda q, k, v, *, scale, causal, tau: q),
     "unexpected keyword argument 'beta'"),
    ("softmax_attention", "bwd", lambda: (lambda q, k, v, *, scale, causal, bias: q),
     "missing a required argument: 'bias'"),
])
def test_a_signature_that_the_contract_cannot_call_is_refused_at_registration(
        function, mode, define, why):
    with scoped_kernels(), pytest.raises(ValueError) as e:
        register_kernel(function=function, backend="numpy", name="third_party", mode=mode)(
            define())
    message = str(e.value)
    assert "\n" not in message and f"'third_party' ({mode})" in message
    assert message.endswith(why)


def test_signatures_the_contract_calls_are_accepted():
    with scoped_kernels():
        register_kernel(function="elastic", backend="numpy", name="a")(
            lambda x, *, tau, beta, extra=1: x)
        register_kernel(function="elastic", backend="numpy", name="a", mode="bwd")(
            lambda x, y, g, **params: x)
        register_kernel(function="elastic_attention", backend="numpy", name="b")(
            lambda q, k, v, *, scale, causal, tau, beta, attn_mask=None: q)
        register_kernel(function="softmax_attention", backend="numpy", name="c")(
            lambda *args, **kw: args[0])


def test_verify_of_a_kernel_file_with_a_signature_error_exits_2_before_any_case(
        cli, tmp_path):
    path = _kernel_file(tmp_path, """
        @register_kernel(function="softmax_attention", backend="numpy", name="biased")
        def biased(q, k, v, *, scale, causal, bias):
            return q
    """)
    r = cli("verify", "--quick", "--kernel-file", path)
    assert r.code == 2
    assert r.out == ""  # no case ran, no table
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and "third_party.py:" in lines[0] and "bias" in lines[0]
