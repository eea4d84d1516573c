"""ElasticSoftmax: exact at init, parameters stay in range, and it trains in attention."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from elasticbench import functional as F
from elasticbench.functional import elastic_softmax
from elasticbench.nn import ElasticAttention, ElasticSoftmax, SymaxAttention


def test_exact_at_init():
    m = ElasticSoftmax(tau=0.7, beta=0.3)
    assert m.tau.item() == torch.tensor(0.7).item() and m.beta.item() == torch.tensor(0.3).item()
    x = torch.randn(3, 8)
    # the parameters are stored in fp32: the functional at those values (the double 0.7 is
    # another tau, 1e-8 away, which the native kernels, computing D in fp64, can tell apart)
    assert torch.equal(m(x), elastic_softmax(x, m.tau.item(), m.beta.item()))


@pytest.mark.parametrize("seed", range(8))
def test_parameters_stay_in_range_under_violent_steps(seed):
    torch.manual_seed(seed)
    m = ElasticSoftmax(tau=1.0, beta=1.0)
    opt = torch.optim.SGD(m.parameters(), lr=1e4)
    for _ in range(5):
        opt.zero_grad()
        (m(torch.randn(4, 16) * 3) ** 2).sum().neg().backward()
        opt.step()
    tau, beta = m.tau.item(), m.beta.item()
    assert 0 < tau < float("inf") and 0 < beta < float("inf")
    assert torch.isfinite(m(torch.randn(2, 8))).all()


def test_learnable_beta_zero_is_refused_and_fixed_is_fixed():
    with pytest.raises(ValueError, match="learned beta needs beta > 0"):
        ElasticSoftmax(beta=0.0)
    m = ElasticSoftmax(beta=0.0, learnable=False)
    assert list(m.parameters()) == [] and m.beta.item() == 0.0


def test_tau_learned_with_beta_kept_at_zero():
    m = ElasticSoftmax(tau=1.0, beta=0.0, learn_beta=False)
    assert [n for n, _ in m.named_parameters()] == ["log_tau_scale"]
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    for _ in range(3):
        opt.zero_grad()
        (m(torch.randn(4, 16) * 3) ** 2).sum().backward()
        opt.step()
    assert m.tau.item() != 1.0 and m.beta.item() == 0.0
    fixed_tau = ElasticSoftmax(tau=2.0, beta=0.5, learn_tau=False)
    assert [n for n, _ in fixed_tau.named_parameters()] == ["log_beta_scale"]
    assert "learn_tau=False, learn_beta=True" in repr(fixed_tau)


def test_per_head_parameters_get_per_head_gradients():
    m = ElasticSoftmax(tau=1.0, beta=0.5, param_shape=(3, 1, 1))
    x = torch.randn(2, 3, 4, 4)
    m(x).pow(2).sum().backward()
    assert m.log_tau_scale.grad.shape == (3, 1, 1)
    assert (m.log_tau_scale.grad != 0).all() and (m.log_beta_scale.grad != 0).all()


class TinyAttention(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.attn = ElasticSoftmax(tau=1.0, beta=1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.q(x) @ self.k(x).transpose(-1, -2) / x.shape[-1] ** 0.5
        return self.attn(scores) @ self.v(x)


def test_tiny_attention_trains_and_learns_tau_and_beta():
    torch.manual_seed(0)
    d, length = 8, 6
    teacher = TinyAttention(d)
    teacher.attn = ElasticSoftmax(tau=0.3, beta=0.05, learnable=False)
    x = torch.randn(64, length, d)
    with torch.no_grad():
        target = teacher(x)
    student = TinyAttention(d)
    opt = torch.optim.Adam(student.parameters(), lr=2e-2)
    losses = []
    for _ in range(40):
        opt.zero_grad()
        loss = nn.functional.mse_loss(student(x), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    assert abs(student.attn.tau.item() - 1.0) > 1e-3
    assert abs(student.attn.beta.item() - 1.0) > 1e-3


def test_training_example_runs_both_attentions(tmp_path):
    """examples/train.py, briefly: both models print finite losses; Elastic prints tau, beta."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "examples" / "train.py"
    out = subprocess.run([sys.executable, str(script), "--steps", "4", "--every", "2",
                          "--length", "8", "--batch", "4"], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    rows = re.findall(r"^(sdpa|elastic)\s+step\s+(\d+)\s+loss (\S+)\s+acc\s+(\S+)%(.*)$", out,
                      re.M)
    assert [(k, int(s)) for k, s, *_ in rows] == [("sdpa", 2), ("sdpa", 4), ("elastic", 2),
                                                  ("elastic", 4)]
    assert all(0 < float(loss) < 10 for _, _, loss, _, _ in rows)
    assert all("tau" in rest and "beta" in rest for k, *_, rest in rows if k == "elastic")


def _modules_with_one_value() -> list[nn.Module]:
    from elasticbench.nn import ElasticAttention, SigmoidAttention, SymaxAttention

    return [ElasticSoftmax(tau=0.7, beta=0.3), ElasticAttention(tau=0.7, beta=0.3),
            ElasticSoftmax(tau=0.7, beta=0.0, learn_beta=False), SymaxAttention(eta=0.6),
            SymaxAttention(eta=0.6, learnable=False), SigmoidAttention(bias=-1.5),
            SigmoidAttention(learnable=False)]


@pytest.mark.parametrize("index", range(7))
def test_one_value_is_stored_1d_and_computed_0d(index):
    """param_shape (): the log-scales (or shift) are stored (1,) (FSDP2 shards no 0-d
    parameter), tau, beta, eta and the bias are 0-d as before."""
    m = _modules_with_one_value()[index]
    stored = {n: t for n, t in m.state_dict().items() if n in m._scalar_names}
    assert stored and all(t.shape == (1,) for t in stored.values())
    assert all(p.ndim == 1 for p in m.parameters())
    values = (m.params() if hasattr(m, "params") else
              [m.eta] if hasattr(m, "eta") else [m.bias(16)])
    assert all(v.ndim == 0 for v in values)
    assert "shape" not in repr(m)


@pytest.mark.parametrize("index", range(7))
def test_a_checkpoint_of_0d_parameters_loads(index):
    """A state dict saved when these were 0-d (before they were stored (1,)) loads strictly,
    with its values, and the module computes as the one it was saved from."""
    torch.manual_seed(index)
    saved_from = _modules_with_one_value()[index]
    with torch.no_grad():
        for name in saved_from._scalar_names:
            getattr(saved_from, name).add_(torch.randn(1) * 0.3)
    old = {n: (t.reshape(()) if n in saved_from._scalar_names else t)
           for n, t in saved_from.state_dict().items()}
    assert any(t.ndim == 0 for n, t in old.items() if n in saved_from._scalar_names)
    m = _modules_with_one_value()[index]
    m.load_state_dict(old)
    for name in m._scalar_names:
        assert torch.equal(getattr(m, name), getattr(saved_from, name))
        assert getattr(m, name).shape == (1,)
    if isinstance(m, ElasticSoftmax):
        x = torch.randn(3, 8)
        assert torch.equal(m(x), saved_from(x))
    else:
        q, k, v = torch.randn(3, 2, 2, 5, 4).unbind(0)
        assert torch.equal(m(q, k, v), saved_from(q, k, v))


def test_a_checkpoint_nested_in_a_model_loads_and_a_per_head_one_is_unchanged():
    from elasticbench.nn import ElasticAttention

    model = nn.ModuleDict({"a": ElasticAttention(), "b": ElasticAttention(param_shape=(3,))})
    old = {n: (t.reshape(()) if n.startswith("a.log_") else t)
           for n, t in model.state_dict().items()}
    assert old["a.log_tau_scale"].ndim == 0 and old["b.log_tau_scale"].shape == (3,)
    model.load_state_dict(old)
    assert model["a"].log_tau_scale.shape == (1,) and model["b"].log_tau_scale.shape == (3,)
    with pytest.raises(RuntimeError, match="size mismatch"):
        model.load_state_dict({**old, "b.log_tau_scale": torch.zeros(())})


def test_one_value_gradients_and_values_are_those_of_the_0d_composite():
    """The stored (1,) log-scales receive, in shape (1,), the gradient the composite gives a
    0-d log-scale: tau0 exp(s) differentiated by hand."""
    from elasticbench.nn import _scale

    m = ElasticSoftmax(tau=0.7, beta=0.3)
    with torch.no_grad():
        m.log_tau_scale.fill_(0.2)
        m.log_beta_scale.fill_(-0.4)
    x = torch.randn(4, 9, generator=torch.Generator().manual_seed(3))
    m(x).pow(2).sum().backward()
    s_tau = m.log_tau_scale.detach().reshape(()).clone().requires_grad_()
    s_beta = m.log_beta_scale.detach().reshape(()).clone().requires_grad_()
    elastic_softmax(x, _scale(m.tau0, s_tau), _scale(m.beta0, s_beta)).pow(2).sum().backward()
    assert m.log_tau_scale.grad.shape == (1,) and m.log_beta_scale.grad.shape == (1,)
    torch.testing.assert_close(m.log_tau_scale.grad.reshape(()), s_tau.grad, rtol=1e-5,
                               atol=1e-7)
    torch.testing.assert_close(m.log_beta_scale.grad.reshape(()), s_beta.grad, rtol=1e-5,
                               atol=1e-7)


def test_fully_shard_takes_every_module_in_one_process():
    """FSDP2 (one gloo process: fully_shard's checks and DTensors without a second process)
    takes each module with its default one-value parameters, which it refused when they were
    0-d; repr shows sharded parameters by shape; the sharded model computes as the plain one."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("this torch has no torch.distributed with gloo")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from elasticbench.nn import ElasticAttention, SigmoidAttention, SymaxAttention

    def modules() -> nn.ModuleDict:
        return nn.ModuleDict({"softmax": ElasticSoftmax(tau=0.7, beta=0.3),
                              "elastic": ElasticAttention(), "symax": SymaxAttention(),
                              "sigmoid": SigmoidAttention()})

    def run(m: nn.ModuleDict) -> list[torch.Tensor]:
        gen = torch.Generator().manual_seed(1)
        q, k, v = (torch.randn(2, 3, 5, 4, generator=gen) for _ in range(3))
        return [m["softmax"](q)] + [m[n](q, k, v) for n in ("elastic", "symax", "sigmoid")]

    plain = modules()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        sharded = modules()
        mesh = init_device_mesh("cpu", (1,))
        for m in sharded.values():  # each its own unit (a ModuleDict has no forward)
            fully_shard(m, mesh=mesh)
        assert "tau=sharded, shape (), beta=sharded, shape ()" in repr(sharded["elastic"])
        assert "eta=sharded, shape ()" in repr(sharded["symax"])
        for a, b in zip(run(sharded), run(plain), strict=True):
            assert torch.equal(a, b)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("module, call", [
    (lambda c: ElasticAttention(tau=0.8, beta=1.0, causal=c),
     lambda q, k, v, c: F.elastic_attention(q, k, v, tau=0.8, beta=1.0, causal=c)),
    (lambda c: SymaxAttention(eta=0.5, causal=c),
     lambda q, k, v, c: F.symax_attention(q, k, v, eta=0.5, causal=c)),
])
def test_attention_modules_pass_the_causal_alignment_through(module, call):
    """A module's causal="bottom_right" (or is_causal in its call) is the functional form's,
    not folded into top-left; two different alignments are refused."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, n, 8, generator=g) for n in (3, 7, 7))
    want = call(q, k, v, "bottom_right")
    assert torch.equal(module("bottom_right")(q, k, v), want)
    assert torch.equal(module(False)(q, k, v, is_causal="bottom_right"), want)
    assert not torch.equal(want, call(q, k, v, True))
    with pytest.raises(ValueError, match="differently"):
        module(True)(q, k, v, is_causal="bottom_right")
