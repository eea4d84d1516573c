"""`verify --mode bwd` says per kernel whether second-order gradients are supported
(elasticbench/harness/verify/second_order.py): declared, or probed by gradcheck of the kernel's
gradients in fp64; a differentiable but wrong backward is told apart from a constant one."""

from __future__ import annotations

import json

import pytest
import torch

from elasticbench.harness.execute import Isolation
from elasticbench.harness.registry import KernelSpec, get_kernel
from elasticbench.harness.verify.second_order import second_order
from elasticbench.rows.exp_normalize import exp_normalize_backward


def _spec(fn, name: str) -> KernelSpec:
    return KernelSpec(name, "elastic", "torch", fn, "bwd")


def test_the_torch_backward_is_differentiable_and_numpy_is_not():
    assert second_order(get_kernel("torch_elastic_bwd", "bwd")) == "yes"
    assert second_order(get_kernel("numpy_elastic_bwd", "bwd")) == "no"
    assert second_order(get_kernel("torch_attention_flash", "bwd")) == "yes"


@pytest.mark.needs("native")
def test_fused_native_backwards_carry_no_graph():
    assert second_order(get_kernel("cpp_elastic_bwd", "bwd")) == "no"
    assert second_order(get_kernel("cpp_attention", "bwd")) == "no"


def test_a_graph_that_gradcheck_refutes_is_wrong_and_a_declaration_wins():
    def detached_y(x, y, g, *, tau, beta):  # y's own dependence dropped: d(dx)/dy is wrong
        dx, dtau, dbeta = exp_normalize_backward(x, y.detach() * 1 + 0 * y, g, x >= 0, tau,
                                                 beta, params=True)
        return dx, dtau.sum(), dbeta.sum()

    assert second_order(_spec(detached_y, "probe_detached")) == "wrong"
    detached_y.second_order = "no"  # type: ignore[attr-defined]
    assert second_order(_spec(detached_y, "probe_declared")) == "no"
    isolated = Isolation(enabled=True)
    assert second_order(get_kernel("torch_safe_softmax_bwd", "bwd"), isolated).startswith(
        "not probed")


def test_backward_records_carry_the_answer(cli, tmp_path):
    out = tmp_path / "bwd.json"
    r = cli("verify", "--only", "torch_elastic_bwd,numpy_elastic_bwd", "--mode", "bwd",
            "--quick", "-d", "fp64", "--input", "normal", "--json", str(out))
    assert r.code == 0, r.out + r.err
    said = {x["kernel"]: x["second_order"] for x in json.loads(out.read_text())["records"]}
    assert said == {"torch_elastic_bwd": "yes", "numpy_elastic_bwd": "no"}
    assert torch.get_default_dtype() == torch.float32  # the probe leaves torch as it was
