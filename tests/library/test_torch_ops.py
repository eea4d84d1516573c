"""The kernels as torch custom ops (elasticbench::exp_family, ::attention and their
backwards): opcheck passes, a model using ElasticSoftmax and ElasticAttention compiles
whole (fullgraph, no graph break) with eager's gradients, and torch.export exports it."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.library import opcheck

import elasticbench.attention.autograd  # registers elasticbench::attention
import elasticbench.rows.ops  # noqa: F401  (registers elasticbench::exp_family)
from elasticbench.nn import ElasticAttention, ElasticSoftmax

DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
# the ops dispatch by device: CUDA tensors take the GPU tiers (Triton rows, the attention's
# torch code), which opcheck must pass as well
DEVICES = ("cpu", pytest.param("cuda", marks=pytest.mark.needs("gpu")))


def _work(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_opcheck_exp_family(dtype, device):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(4, 33, generator=g) * 3).to(device, dtype).requires_grad_()
    wd = _work(dtype)
    tau = torch.tensor(0.7, dtype=wd, device=device, requires_grad=True)
    beta = torch.tensor(0.3, dtype=wd, device=device, requires_grad=True)
    per_row = torch.full((4, 1), 0.7, dtype=wd, device=device, requires_grad=True)
    op = torch.ops.elasticbench.exp_family.default
    for args in ((x, tau, beta, True, -math.inf), (x, per_row, None, False, 0.0),
                 (x, per_row, beta, True, -math.inf)):
        assert set(opcheck(op, args).values()) == {"SUCCESS"}
    y = op(x.detach(), tau.detach(), beta.detach(), True, -math.inf)
    bwd = torch.ops.elasticbench.exp_family_backward.default
    args = (x.detach(), y, torch.randn(4, 33, generator=g).to(device, dtype), tau.detach(),
            beta.detach(), True, -math.inf, True)
    assert set(opcheck(bwd, args).values()) == {"SUCCESS"}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("dtype", "causal"), [(torch.float64, False), (torch.float32, True),
                                               (torch.bfloat16, False)])
def test_opcheck_attention(dtype, causal, device):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g).to(device, dtype).requires_grad_()
               for _ in range(3))
    wd = _work(dtype)
    tau = torch.full((2, 3), 0.8, dtype=wd, device=device, requires_grad=True)
    beta = torch.full((2, 3), 0.2, dtype=wd, device=device, requires_grad=True)
    op = torch.ops.elasticbench.attention.default
    assert set(opcheck(op, (q, k, v, tau, beta, 0.5, causal)).values()) == {"SUCCESS"}
    out, m, den, _ = op(q.detach(), k.detach(), v.detach(), tau.detach(), beta.detach(), 0.5,
                        causal)
    bwd = torch.ops.elasticbench.attention_backward.default
    args = (q.detach(), k.detach(), v.detach(), out, torch.randn_like(out), m, den,
            tau.detach(), beta.detach(), 0.5, causal)
    assert set(opcheck(bwd, args).values()) == {"SUCCESS"}


@pytest.mark.needs("gpu")
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_cuda_values_match_the_cpu(dtype):
    """The same model's output and gradients on CUDA (the GPU tiers) and in float64 on the
    CPU, within the dtype's rounding of a few operations."""
    torch.manual_seed(0)
    model = Block().double()
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    want = _step(model, x)
    got = _step(model.to("cuda", dtype), x.to("cuda", dtype))
    tol = {torch.float32: 1e-4, torch.bfloat16: 5e-2}[dtype]
    for name in want:
        torch.testing.assert_close(got[name].double().cpu(), want[name], rtol=tol, atol=tol,
                                   msg=name)


class Block(nn.Module):
    def __init__(self, d: int = 16, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.attn = ElasticAttention(param_shape=(heads,), causal=True)
        self.gate = ElasticSoftmax(tau=0.5, beta=0.5, param_shape=(heads, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = (t.view(b, n, self.heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        o = self.attn(q, k, v) + self.gate(q @ k.transpose(-1, -2)) @ v
        return self.proj(o.transpose(1, 2).reshape(b, n, d))


def _step(model: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad()
    model(x).square().mean().backward()
    return {n.removeprefix("_orig_mod."): p.grad.clone() for n, p in model.named_parameters()}


def test_a_model_compiles_whole_with_eager_gradients():
    torch.manual_seed(0)
    model = Block()
    x = torch.randn(2, 6, 16)
    eager = _step(model, x)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")  # a break raises
    got = _step(compiled, x)
    assert set(got) == set(eager) and "attn.log_tau_scale" in got
    for name in eager:
        torch.testing.assert_close(got[name], eager[name], rtol=1e-5, atol=1e-7, msg=name)


def test_torch_export_exports_the_model():
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(2, 6, 16)
    exported = torch.export.export(model, (x,))
    targets = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
    assert "elasticbench.attention.default" in targets
    assert "elasticbench.exp_family.default" in targets
    torch.testing.assert_close(exported.module()(x), model(x), rtol=0, atol=0)
