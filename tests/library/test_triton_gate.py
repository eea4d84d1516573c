"""The Triton attention forward's gate (docs/attention.md section 7): with gate=g the
epilogue writes out = O g rounded once to q's dtype (O the fp32 ungated output), and with
keep_ungated also O rounded; the backward takes the ungated output and dO g. Under Triton's
interpreter, small shapes.

The interpreter must be on before `triton.jit` decorates the kernels, so an ordinary run
re-runs this module in a child pytest with TRITON_INTERPRET=1 (tests/conftest.py)."""

from __future__ import annotations

import pytest
import torch

from elasticbench import devices

pytestmark = pytest.mark.needs("triton")


if not devices.triton_interpreted():

    @pytest.mark.ci  # a child pytest under the interpreter: about 20 s of a core
    def test_the_gate_under_the_interpreter(under_interpreter) -> None:
        under_interpreter(__file__)

else:
    from elasticbench.attention.weights import Weight
    from elasticbench.kernels.triton import attention_configs as ac
    from elasticbench.kernels.triton.flash_attention import attention_backward, attention_forward

    SMALL = ac.Tiles(16, 16, 4, 1)

    def _inputs(dtype, lq=40, lk=30, seed=0):
        g = torch.Generator().manual_seed(seed)
        q = torch.randn(1, 2, lq, 16, generator=g).to(dtype)
        k, v = (torch.randn(1, 2, lk, 16, generator=g).to(dtype) for _ in range(2))
        gate = torch.rand(1, 2, lq, 16, generator=g).to(dtype)
        p_score, p_den = torch.tensor([[0.7, 1.3]]), torch.tensor([[0.5, 2.0]])
        mask = torch.ones(1, lk, dtype=torch.bool)
        mask[0, 4] = False
        return q, k, v, gate, p_score, p_den, mask

    @pytest.mark.parametrize(("dtype", "weight"), [
        (torch.float32, Weight.ELASTIC), (torch.float32, Weight.COG),
        (torch.bfloat16, Weight.COG), (torch.float16, Weight.SYMAX)],
        ids=lambda x: x.name.lower() if isinstance(x, Weight) else str(x).removeprefix("torch."))
    def test_the_epilogue_writes_the_gated_and_the_ungated_output(dtype, weight):
        """Causal bottom-right with length_q > length_k (leading queries see no key: 0) and
        key padding: ungated, m and den are the ungated call's bits; out is ungated times
        the gate (fp32: bit for bit; 16-bit: O g and O each rounded once, so within two
        roundings); without keep_ungated the same out and three results."""
        q, k, v, gate, p_score, p_den, mask = _inputs(dtype)
        args = (q, k, v, p_score, p_den, 0.3, True, mask, weight, SMALL, -10)
        plain = attention_forward(*args)
        out, m, den, ungated = attention_forward(*args, gate=gate, keep_ungated=True)
        assert ungated.data_ptr() != out.data_ptr() and ungated.is_contiguous()
        for a, b in zip((ungated, m, den), plain, strict=True):
            assert torch.equal(a, b)
        assert not out[:, :, :10].any() and ungated[:, :, 10:].any()
        want = ungated.float() * gate.float()
        if dtype == torch.float32:
            assert torch.equal(out, want)
        else:
            u = torch.finfo(dtype).eps / 2
            assert ((out.float() - want).abs() <= 2.5 * u * want.abs()).all()
        alone = attention_forward(*args, gate=gate)
        assert len(alone) == 3 and torch.equal(alone[0], out)

    def test_a_strided_or_broadcast_gate_is_read_where_it_lies():
        """A (batch, length, heads, dim) gate transposed, one gate per head and channel
        broadcast over the queries, a scalar per channel: each as its materialized copy."""
        q, k, v, gate, p_score, p_den, _ = _inputs(torch.float32, seed=1)
        args = (q, k, v, p_score, p_den, 0.3, False, None, Weight.COG, SMALL)
        blh = gate.transpose(1, 2).contiguous().transpose(1, 2)
        assert not blh.is_contiguous()
        per_head = gate[:, :, :1]
        per_channel = gate[0, 0, 0]
        for g in (blh, per_head, per_channel):
            got = attention_forward(*args, gate=g)[0]
            assert torch.equal(got, attention_forward(*args, gate=g.expand_as(gate).clone())[0])

    def test_tensor_descriptors_give_the_pointer_bits_with_a_gate():
        """A TMA configuration (out and ungated stored through descriptors, the gate read by
        pointers) gives the pointer configuration's out and ungated bit for bit."""
        from dataclasses import replace

        if not ac.tma_available():
            pytest.skip("this Triton has no tensor descriptors")
        q, k, v, gate, p_score, p_den, mask = _inputs(torch.bfloat16, seed=2)
        results = [attention_forward(q, k, v, p_score, p_den, 0.3, True, mask, Weight.ELASTIC,
                                     replace(SMALL, tma=tma), gate=gate, keep_ungated=True)
                   for tma in (False, True)]
        for a, b in zip(*results, strict=True):
            assert torch.equal(a, b)

    def test_keep_ungated_without_a_gate_returns_out_as_the_ungated_output():
        q, k, v, _, p_score, p_den, _ = _inputs(torch.float32, lq=5, lk=7)
        out, _, _, ungated = attention_forward(q, k, v, p_score, p_den, 0.3, False, tile=SMALL,
                                               keep_ungated=True)
        assert ungated is out
        empty = q[:, :, :0]
        got = attention_forward(empty, k, v, p_score, p_den, 0.3, False, gate=empty,
                                keep_ungated=True)
        assert len(got) == 4 and got[3].shape == (1, 2, 0, 16)

    def test_a_gate_the_kernel_cannot_read_is_refused():
        q, k, v, gate, p_score, p_den, _ = _inputs(torch.float32, lq=5, lk=7)
        with pytest.raises(ValueError, match="gate must broadcast"):
            attention_forward(q, k, v, p_score, p_den, 0.3, False, gate=gate[:, :, :, :3])
        with pytest.raises(TypeError, match="fp32, fp16 or bf16"):
            attention_forward(q, k, v, p_score, p_den, 0.3, False, gate=gate.double())
        with pytest.raises(TypeError, match="a tensor or None"):
            attention_forward(q, k, v, p_score, p_den, 0.3, False, gate=0.5)

    @pytest.mark.parametrize("weight", [Weight.ELASTIC, Weight.COG],
                             ids=lambda w: w.name.lower())
    def test_the_ungated_backward_gives_the_gated_gradients(weight):
        """Y = O g: the unchanged backward from (ungated, dY g) gives dq, dk, dv and the row
        parameters' gradients of Y, and dY ungated is d gate: against autograd of the fp64
        formula times the gate (causal, key padding)."""
        from elasticbench.attention.composite import attention_composite

        q, k, v, gate, p_score, p_den, mask = _inputs(torch.float32, lq=20, lk=30, seed=3)
        dy = torch.randn((*q.shape[:3], 16), generator=torch.Generator().manual_seed(4))
        out, m, den, ungated = attention_forward(q, k, v, p_score, p_den, 0.3, True, mask, weight,
                                                 SMALL, gate=gate, keep_ungated=True)
        grads = attention_backward(q, k, v, ungated, dy * gate, m, den, p_score, p_den, 0.3, True,
                                   mask, weight, (SMALL, SMALL))
        leaves = [t.double().requires_grad_() for t in (q, k, v, gate)]
        if weight is Weight.COG:  # fp64 formula: no composite needed (p_score, p_den unused)
            s = 0.3 * leaves[0] @ leaves[1].transpose(-1, -2)
            hidden = (torch.arange(30)[None, :] > torch.arange(20)[:, None]) | ~mask[:, None]
            e = torch.exp(s.abs()).masked_fill(hidden, 0.0)
            o = (torch.sign(s) * e / e.sum(-1, keepdim=True)) @ leaves[2]
            wanted = leaves
        else:
            pp = [t.double().requires_grad_() for t in (p_score, p_den)]
            o = attention_composite(weight, *leaves[:3], p_score=pp[0][..., None, None],
                                    p_den=pp[1][..., None, None], scale=0.3, causal=True,
                                    attn_mask=mask[:, None, None, :])
            wanted = [*leaves, *pp]
        y = o * leaves[3]
        torch.testing.assert_close(out.double(), y.detach(), rtol=1e-5, atol=1e-6)
        wants = torch.autograd.grad(y, wanted, dy.double())
        names = ("dq", "dk", "dv", "dgate", "dp_score", "dp_den")
        mine = (*grads[:3], dy * ungated, *grads[3:])
        for name, a, b in zip(names, mine, wants, strict=False):
            if name in ("dp_score", "dp_den"):
                a = a.sum(0)
                b = b.reshape(a.shape)
            torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-5, msg=name)
