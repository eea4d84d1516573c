"""Issue 57: a third-party kernel's contract is checked where it can be: its signature when
it registers (rows and attention), and every tensor argument it writes to, named."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
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
    ("softmax_attention", "fwd", lambda: (lambda q, k, v, *, scale, causal, attn_mask: q),
     "missing a required argument: 'attn_mask' (cases without a mask do not pass "
     "attn_mask: give it a default, attn_mask=None)"),
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


def _attention_inputs(lq: int = 3, lk: int = 4, d: int = 2):
    g = np.random.default_rng(5)
    q, k, v = (g.standard_normal((1, 2, n, d)).astype(np.float32) for n in (lq, lk, lk))
    mask = np.ones((1, 1, lq, lk), dtype=bool)
    mask[..., -1] = False
    return q, k, v, mask


def _softmax_attention(q, k, v, attn_mask, scale):
    s = np.where(attn_mask, scale * q @ np.swapaxes(k, -1, -2), -np.inf)
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    return (w / w.sum(axis=-1, keepdims=True)) @ v


@pytest.mark.parametrize("writes, named", [
    ("attn_mask[...] = True", "modified its input attn_mask"),
    ("q[0, 0, 0, 0] = 7.0", "modified its input q"),
    ("v *= 2.0\n    attn_mask[..., 0] = False", "modified its inputs v, attn_mask"),
])
def test_a_write_to_any_attention_argument_is_caught_and_named(writes, named):
    from elasticbench.harness.execute import modified_reason
    from elasticbench.harness.kinds.attention.verify_job import call_attention

    namespace: dict = {"np": np, "softmax": _softmax_attention}
    exec(f"def writer(q, k, v, *, scale, causal, attn_mask=None):\n"
         f"    out = softmax(q, k, v, attn_mask, scale)\n    {writes}\n    return out",
         namespace)
    q, k, v, mask = _attention_inputs()
    with scoped_kernels():
        register_kernel(function="softmax_attention", backend="numpy", name="writer")(
            namespace["writer"])
        from elasticbench.harness.registry import get_kernel

        out = call_attention(get_kernel("writer"), q, k, v, {"causal": 0.0}, "fp32", 0.5,
                             None, mask)
    assert out.error is None and out.modified_input
    assert modified_reason(out.modified_args) == named
    assert mask[..., -1].any() == False  # noqa: E712  the caller's mask is a copy, untouched


def test_a_backward_kernel_that_writes_its_row_parameter_or_dout_is_named():
    from elasticbench.harness.kinds.attention.verify_job import call_attention
    from elasticbench.harness.registry import get_kernel

    def bwd(q, k, v, *, scale, causal, tau, beta):
        tau[...] = 0.0

        def step(dout):
            dout[...] = 0.0
            return q, k, v, tau[:, :], beta.copy()

        return step

    q, k, v, _ = _attention_inputs()
    dout = np.ones((1, 2, 3, 2), dtype=np.float32)
    with scoped_kernels():
        register_kernel(function="elastic_attention", backend="numpy", name="w",
                        mode="bwd")(bwd)
        out = call_attention(get_kernel("w", "bwd"), q, k, v, {"tau": 1.0, "beta": 0.5},
                             "fp32", 0.5, dout)
    assert out.modified_args == ["tau", "dout"]
    assert (dout == 1.0).all()


def test_a_row_backward_kernel_that_writes_g_is_named():
    from elasticbench.harness.registry import get_kernel
    from elasticbench.harness.verify.backward import call_backward

    def bwd(x, y, g):
        g[0, 0] = 1.0
        return np.zeros_like(x)

    x = np.zeros((2, 3), dtype=np.float32)
    with scoped_kernels():
        register_kernel(function="softmax", backend="numpy", name="w", mode="bwd")(bwd)
        out = call_backward(get_kernel("w", "bwd"), x, x.copy(), x.copy(), {})
    assert out.modified_input and out.modified_args == ["g"]
