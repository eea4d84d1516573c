"""ElasticSoftmax: exact at init, parameters stay in range, and it trains in attention."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from elasticbench.functional import elastic_softmax
from elasticbench.nn import ElasticSoftmax


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

    script = Path(__file__).resolve().parents[1] / "examples" / "train.py"
    out = subprocess.run([sys.executable, str(script), "--steps", "4", "--every", "2",
                          "--length", "8", "--batch", "4"], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    rows = re.findall(r"^(sdpa|elastic)\s+step\s+(\d+)\s+loss (\S+)\s+acc\s+(\S+)%(.*)$", out,
                      re.M)
    assert [(k, int(s)) for k, s, *_ in rows] == [("sdpa", 2), ("sdpa", 4), ("elastic", 2),
                                                  ("elastic", 4)]
    assert all(0 < float(loss) < 10 for _, _, loss, _, _ in rows)
    assert all("tau" in rest and "beta" in rest for k, *_, rest in rows if k == "elastic")
