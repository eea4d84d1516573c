"""elasticbench.integrations.transformers: the family through transformers' AttentionInterface
(registration, per-head parameters that train, the functional form bit for bit, masks, GQA,
cached decoding against the full forward, refusals). Skipped where transformers is absent."""

from __future__ import annotations

import ast
import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed "
                                   "(pip install elasticbench[transformers])")

from elasticbench import devices, dispatch  # noqa: E402
from elasticbench import functional as F  # noqa: E402
from elasticbench.attention.operands import visible  # noqa: E402
from elasticbench.integrations import transformers as eb_hf  # noqa: E402
from elasticbench.nn import ElasticAttention, SigmoidAttention, SymaxAttention  # noqa: E402

PARAMS = {"elastic": ("log_tau_scale", "log_beta_scale"), "symax": ("log_eta_scale",),
          "sigmoid": ("bias_shift",), "softmax1": (), "stablemax": ()}
FUNCTIONS = {"elastic": F.elastic_attention, "softmax1": F.softmax1_attention,
             "symax": F.symax_attention, "stablemax": F.stablemax_attention,
             "sigmoid": F.sigmoid_attention}


def tiny_llama(layers: int = 1, seed: int = 0) -> transformers.LlamaForCausalLM:
    """4 query heads sharing 2 key heads (GQA), head dim 8, context 32."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=31, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return transformers.LlamaForCausalLM(config)


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    return x.repeat_interleave(groups, dim=1)


class Layer(torch.nn.Module):
    """What an attention layer offers the registered functions: is_causal and, when given,
    the family's parameters (per head, moved off their initial values)."""

    def __init__(self, name: str, heads: int):
        super().__init__()
        self.is_causal = True
        held = {"elastic": lambda: ElasticAttention(param_shape=(heads,)),
                "symax": lambda: SymaxAttention(param_shape=(heads,)),
                "sigmoid": lambda: SigmoidAttention(bias=-2.0, param_shape=(heads,))}
        if name in held:
            self.family_attention = held[name]()
            with torch.no_grad():
                for p in self.family_attention.parameters():
                    p.copy_(torch.linspace(-0.3, 0.4, p.numel()).reshape(p.shape))


def direct_params(layer: Layer, name: str, lk: int) -> dict:
    m = getattr(layer, "family_attention", None)
    if name == "elastic":
        tau, beta = m.params()
        return {"tau": tau, "beta": beta}
    return {"symax": lambda: {"eta": m.eta}, "sigmoid": lambda: {"bias": m.bias(lk)}}.get(
        name, dict)()


def test_register_is_idempotent():
    eb_hf.register()
    first = {n: transformers.AttentionInterface._global_mapping[n] for n in eb_hf.FAMILY}
    eb_hf.register()
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    for name in eb_hf.FAMILY:
        assert transformers.AttentionInterface._global_mapping[name] is first[name]
        assert first[name] is eb_hf.attention_function(name)
        assert AttentionMaskInterface._global_mapping[name] is sdpa_mask
    # once registered, a name is taken where transformers takes an implementation's name
    model = transformers.AutoModelForCausalLM.from_config(tiny_llama().config,
                                                          attn_implementation="symax")
    assert model.config._attn_implementation == "symax"
    x = torch.randint(0, 31, (1, 6), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        symax = model(x).logits
        model.set_attn_implementation("sdpa")
        assert torch.isfinite(symax).all() and not torch.allclose(symax, model(x).logits)


@pytest.mark.parametrize("name", eb_hf.FAMILY)
def test_each_function_trains_its_parameters(name):
    model = eb_hf.use_family(tiny_llama(), name)
    assert model.config._attn_implementation == name
    held = dict(model.named_parameters())
    ours = [k for k in held if ".family_attention." in k]
    assert sorted(k.rsplit(".", 1)[1] for k in ours) == sorted(PARAMS[name])
    for k in ours:
        assert held[k].shape == (4,)  # one per query head
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.Generator().manual_seed(1)
    x = torch.randint(0, 31, (4, 12), generator=data)
    losses = []
    for _ in range(3):
        loss = model(x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        for k in ours:
            g = held[k].grad
            assert g is not None and torch.isfinite(g).all() and g.abs().max() > 0, k
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]


@pytest.mark.parametrize("name", eb_hf.FAMILY)
def test_interface_is_the_functional_bit_for_bit(name):
    from transformers.masking_utils import sdpa_mask
    gen = torch.Generator().manual_seed(2)
    b, h, hkv, lq, d = 2, 4, 2, 6, 8
    layer = Layer(name, h)
    fn = eb_hf.attention_function(name)
    for lk, mask in ((lq, None),  # prefill: causal
                     (9, torch.rand(b, 1, lq, 9, generator=gen) > 0.3)):  # any mask
        q = torch.randn(b, h, lq, d, generator=gen)
        k, v = (torch.randn(b, hkv, lk, d, generator=gen) for _ in range(2))
        out, weights = fn(layer, q, k, v, mask, scaling=0.3)
        assert weights is None and out.shape == (b, q.shape[2], h, d)
        want = FUNCTIONS[name](q, repeat_kv(k, 2), repeat_kv(v, 2), scale=0.3,
                         causal=mask is None and q.shape[2] > 1, attn_mask=mask,
                         **direct_params(layer, name, lk))
        assert torch.equal(out, want.transpose(1, 2))
    # a padded causal prefill: the mask leaves as causal + key padding (the fused path)
    pad = torch.ones(b, lq, dtype=torch.bool)
    pad[1, :2] = False
    mask = sdpa_mask(batch_size=b, q_length=lq, kv_length=lq, attention_mask=pad)
    q, k, v = (torch.randn(b, n, lq, d, generator=gen) for n in (h, hkv, hkv))
    out, _ = fn(layer, q, k, v, mask)
    want = FUNCTIONS[name](q, repeat_kv(k, 2), repeat_kv(v, 2), causal=True,
                     attn_mask=pad[:, None, None, :], **direct_params(layer, name, lq))
    assert torch.equal(out, want.transpose(1, 2))
    materialized = FUNCTIONS[name](q, repeat_kv(k, 2), repeat_kv(v, 2), attn_mask=mask,
                             **direct_params(layer, name, lq))
    torch.testing.assert_close(out, materialized.transpose(1, 2), rtol=1e-5, atol=1e-6)
    # a chunk of 3 queries at the end of 9 padded keys (a cache): bottom-right + key padding
    pad = torch.ones(b, 9, dtype=torch.bool)
    pad[1, :2] = False
    mask = sdpa_mask(batch_size=b, q_length=3, kv_length=9, q_offset=6, attention_mask=pad)
    q, k, v = (torch.randn(b, n, length, d, generator=gen)
               for n, length in ((h, 3), (hkv, 9), (hkv, 9)))
    out, _ = fn(layer, q, k, v, mask)
    materialized = FUNCTIONS[name](q, repeat_kv(k, 2), repeat_kv(v, 2), attn_mask=mask,
                                   **direct_params(layer, name, 9))
    torch.testing.assert_close(out, materialized.transpose(1, 2), rtol=1e-5, atol=1e-6)
    if eb_hf.bottom_right_supported():
        want = FUNCTIONS[name](q, repeat_kv(k, 2), repeat_kv(v, 2), causal="bottom_right",
                               attn_mask=pad[:, None, None, :], **direct_params(layer, name, 9))
        assert torch.equal(out, want.transpose(1, 2))


@pytest.mark.parametrize("name", eb_hf.FAMILY)
@pytest.mark.parametrize("per", ["head", "kv_head"])
def test_a_decode_step_reads_the_cache_as_it_is(name, per):
    """One query per head against 9 cached keys of 2 key heads, a padded batch row. Where
    the parameters are the same for a key head's query heads (softmax1 and stablemax have
    none; "kv_head" gives one per key head) the query heads are packed as queries of their
    key head: the functional call on (B, Hkv, G, D) bit for bit, and the call on keys
    repeated per head within rounding. Per-head parameters: that call, bit for bit."""
    gen = torch.Generator().manual_seed(5)
    b, h, hkv, lk, d = 2, 4, 2, 9, 8
    layer = Layer(name, h if per == "head" else hkv)
    pad = torch.ones(b, 1, 1, lk, dtype=torch.bool)
    pad[1, ..., :3] = False
    q = torch.randn(b, h, 1, d, generator=gen)
    k, v = (torch.randn(b, hkv, lk, d, generator=gen) for _ in range(2))
    params = direct_params(layer, name, lk)
    out, _ = eb_hf.attention_function(name)(layer, q, k, v, pad)
    per_head = {p: x.repeat_interleave(h // x.shape[0]) if isinstance(x, torch.Tensor) else x
                for p, x in params.items()}
    repeated = FUNCTIONS[name](q, repeat_kv(k, 2), repeat_kv(v, 2), attn_mask=pad,
                               **per_head).transpose(1, 2)
    if per == "kv_head" or name in ("softmax1", "stablemax"):
        packed = FUNCTIONS[name](q.reshape(b, hkv, 2, d), k, v, attn_mask=pad, **params)
        assert torch.equal(out, packed.reshape(b, h, 1, d).transpose(1, 2))
        torch.testing.assert_close(out, repeated, rtol=1e-6, atol=1e-6)
    else:
        assert torch.equal(out, repeated)


def test_one_parameter_per_key_head():
    """param_shape="kv_head": one tau and beta per key head, trained, and the packed decode
    steps give the full forward's logits."""
    model = eb_hf.use_family(tiny_llama(layers=2), "elastic", param_shape="kv_head")
    held = model.model.layers[0].self_attn.family_attention
    assert held.log_tau_scale.shape == (2,)
    prompt = torch.randint(0, 31, (2, 5), generator=torch.Generator().manual_seed(8))
    model(prompt, labels=prompt).loss.backward()
    assert held.log_tau_scale.grad.abs().min() > 0
    with torch.no_grad():
        held.log_beta_scale.copy_(torch.tensor([-0.5, 0.7]))
    out = model.eval().generate(prompt, attention_mask=torch.ones_like(prompt),
                                max_new_tokens=5, do_sample=False, output_logits=True,
                                return_dict_in_generate=True, pad_token_id=0)
    with torch.no_grad():
        full = model(out.sequences).logits
    budget = 64 * torch.finfo(torch.float32).eps * max(1.0, full.abs().max().item())
    for step, logits in enumerate(out.logits):
        assert (logits - full[:, 4 + step]).abs().max() <= budget
    with pytest.raises(ValueError, match="param_shape"):
        eb_hf.use_family(tiny_llama(), "elastic", param_shape="query")


def test_masks_reach_the_fused_kernels_when_they_can():
    from transformers.masking_utils import sdpa_mask
    causal = sdpa_mask(batch_size=2, q_length=5, kv_length=5,
                       attention_mask=torch.ones(2, 5, dtype=torch.bool))
    assert causal is None  # transformers' own skip: causal=True
    pad = torch.tensor([[True] * 5, [False, False, True, True, True]])
    mask = sdpa_mask(batch_size=2, q_length=5, kv_length=5, attention_mask=pad)
    got, kind = eb_hf._canonical(mask, 5, 5, True)
    assert kind is True and torch.equal(got, pad[:, None, None, :])
    additive = torch.zeros(2, 1, 5, 5).masked_fill(~mask, torch.finfo(torch.float32).min)
    got, kind = eb_hf._canonical(additive, 5, 5, True)
    assert kind is True and torch.equal(got, pad[:, None, None, :])
    # read once per mask tensor, again after an in-place change
    assert eb_hf._canonical(mask, 5, 5, True)[1] is True
    mask[0, 0, 4, 0] = False
    got, kind = eb_hf._canonical(mask, 5, 5, True)
    assert kind is False and got is mask
    # a query block at the end of the cache: bottom-right, kept as a mask until supported
    br = sdpa_mask(batch_size=1, q_length=2, kv_length=5, q_offset=3,
                   attention_mask=torch.ones(1, 5, dtype=torch.bool))
    got, kind = eb_hf._canonical(br, 2, 5, True)
    if eb_hf.bottom_right_supported():
        assert kind == "bottom_right" and got is None
    else:
        assert kind is False and torch.equal(got, br)


@pytest.mark.parametrize("name", eb_hf.FAMILY)
def test_cached_decoding_is_the_full_forward(name):
    model = eb_hf.use_family(tiny_llama(layers=2), name).eval()
    with torch.no_grad():  # parameters off their initial values
        for p in model.parameters():
            if p.ndim == 1 and p.shape == (4,):
                p.add_(torch.linspace(-0.2, 0.3, 4))
    prompt = torch.randint(0, 31, (2, 5), generator=torch.Generator().manual_seed(3))
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=6,
                         do_sample=False, use_cache=True, output_logits=True,
                         return_dict_in_generate=True, pad_token_id=0)
    seq = out.sequences
    with torch.no_grad():
        full = model(seq).logits
        # a chunk of 3 queries against a cache of 6 keys (the bottom-right mask)
        cache = transformers.DynamicCache(config=model.config)
        model(seq[:, :6], cache=cache, use_cache=True)
        chunk = model(seq[:, 6:9], cache=cache, use_cache=True).logits
    # fp32 through two layers: a few units of rounding of logits of size about 1
    budget = 64 * torch.finfo(torch.float32).eps * max(1.0, full.abs().max().item())
    for step, logits in enumerate(out.logits):
        assert (logits - full[:, 4 + step]).abs().max() <= budget
    assert torch.equal(full[:, 4:-1].argmax(-1), seq[:, 5:])
    assert (chunk - full[:, 6:9]).abs().max() <= budget


def test_bf16_models_and_autocast():
    """A bf16 model decodes with the cache as without it, within bf16's rounding of the
    logits; under CPU autocast (q and k lifted to fp32 by the rotary embedding, v in bf16)
    a step trains the parameters."""
    model = eb_hf.use_family(tiny_llama(layers=2), "elastic").to(torch.bfloat16).eval()
    assert model.model.layers[0].self_attn.family_attention.log_tau_scale.dtype == torch.bfloat16
    prompt = torch.randint(0, 31, (2, 5), generator=torch.Generator().manual_seed(6))
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=4,
                         do_sample=False, output_logits=True, return_dict_in_generate=True,
                         pad_token_id=0)
    with torch.no_grad():
        full = model(out.sequences).logits.float()
    budget = 8 * torch.finfo(torch.bfloat16).eps * max(1.0, full.abs().max().item())
    for step, logits in enumerate(out.logits):
        assert (logits.float() - full[:, 4 + step]).abs().max() <= budget
    model = eb_hf.use_family(tiny_llama(), "elastic")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(prompt, labels=prompt).loss
    loss.backward()
    grad = model.model.layers[0].self_attn.family_attention.log_tau_scale.grad
    assert torch.isfinite(loss) and grad is not None and grad.abs().max() > 0


def test_a_gemma2_model_softcap_refused_sliding_window_honoured():
    """Gemma2 soft-caps its logits (refused in one line through the model) and alternates
    sliding-window layers, whose window the model's masks express: without softcapping, a
    cached decode past the window is the full forward."""
    def gemma(softcap: float | None):
        torch.manual_seed(0)
        config = transformers.Gemma2Config(
            vocab_size=31, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            max_position_embeddings=32, sliding_window=4, attn_logit_softcapping=softcap,
            bos_token_id=None, eos_token_id=None, pad_token_id=None)
        return eb_hf.use_family(transformers.Gemma2ForCausalLM(config), "elastic").eval()

    prompt = torch.randint(0, 31, (1, 10), generator=torch.Generator().manual_seed(7))
    with pytest.raises(ValueError, match="softcap") as err, torch.no_grad():
        gemma(50.0)(prompt)
    assert "\n" not in str(err.value)
    model = gemma(None)
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=6,
                         do_sample=False, output_logits=True, return_dict_in_generate=True,
                         pad_token_id=0)
    with torch.no_grad():
        full = model(out.sequences).logits
    budget = 64 * torch.finfo(torch.float32).eps * max(1.0, full.abs().max().item())
    for step, logits in enumerate(out.logits):
        assert (logits - full[:, 9 + step]).abs().max() <= budget


def test_refusals_are_one_line():
    fn = eb_hf.attention_function("elastic")
    layer = Layer("elastic", 2)
    q = k = v = torch.randn(1, 2, 4, 8)
    for kwargs, word in (({"softcap": 30.0}, "softcap"), ({"dropout": 0.1}, "dropout"),
                         ({"sliding_window": 2}, "sliding_window"),
                         ({"output_attentions": True}, "output_attentions")):
        with pytest.raises(ValueError, match=word) as err:
            fn(layer, q, k, v, None, **kwargs)
        assert "\n" not in str(err.value)
    fn(layer.eval(), q, k, v, None, dropout=0.1)  # dropout is only ever drawn in training
    with pytest.raises(ValueError, match="unknown attention"):
        eb_hf.use_family(tiny_llama(), "softmax2")
    with pytest.raises(ValueError, match="no attention layer"):
        eb_hf.use_family(torch.nn.Linear(2, 2), "elastic")
    with pytest.raises(ValueError, match="holds SymaxAttention"):
        eb_hf.attention_function("elastic")(Layer("symax", 2), q, k, v, None)


def test_parameters_save_and_load_with_the_model():
    a = eb_hf.use_family(tiny_llama(), "elastic")
    with torch.no_grad():
        a.model.layers[0].self_attn.family_attention.log_tau_scale.fill_(0.25)
    b = eb_hf.use_family(tiny_llama(seed=1), "elastic")
    b.load_state_dict(a.state_dict())
    x = torch.randint(0, 31, (1, 7), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.equal(a(x).logits, b(x).logits)
    eb_hf.use_family(b, "elastic")  # the same kind again keeps what was learned
    assert b.model.layers[0].self_attn.family_attention.log_tau_scale.eq(0.25).all()
    # from_pretrained drops the family's entries; load_family_state puts them back
    c = eb_hf.use_family(tiny_llama(), "elastic")
    eb_hf.load_family_state(c, dict(a.state_dict()))
    assert c.model.layers[0].self_attn.family_attention.log_tau_scale.eq(0.25).all()
    assert sorted(eb_hf.family_state(c)) == sorted(eb_hf.family_state(a))
    with pytest.raises(ValueError, match="not in the state dict"):
        eb_hf.load_family_state(c, {})


def test_only_the_integration_imports_transformers():
    """No module of elasticbench but integrations/transformers.py names transformers in an
    import, and the integrations package does not import that module: the library loads
    without it (a fresh interpreter's view is tests/project/test_library_alone.py's)."""
    root = Path(eb_hf.__file__).resolve().parents[1]
    importing = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if "transformers" not in text:  # no import can name it
            continue
        for node in ast.walk(ast.parse(text)):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [n.name for n in node.names] if isinstance(node, ast.ImportFrom)
                     else [])
            if any(n == "transformers" or n.startswith("transformers.") for n in names):
                importing.append(path.relative_to(root).as_posix())
    assert sorted(set(importing)) == ["integrations/transformers.py"]


if not devices.triton_interpreted():

    @pytest.mark.ci  # about 40 s of a core under the interpreter
    @pytest.mark.needs("triton")
    def test_the_triton_kernel_under_the_interpreter(under_interpreter):
        under_interpreter(__file__, "-k", "triton_kernel_reads", timeout=600)

else:

    @pytest.mark.needs("triton")
    def test_the_triton_kernel_reads_the_folded_heads():
        """GQA folded into the batch, keys a stride-0 view across the query heads: the
        Triton kernel's output and gradients (q, k, v and the parameters) are those of the
        functional call on keys repeated per head, bit for bit."""
        from elasticbench.attention.autograd import choose
        gen = torch.Generator().manual_seed(0)
        b, h, hkv, length, d = 1, 4, 2, 16, 16
        with dispatch.forcing("triton"):
            for name in eb_hf.FAMILY:
                layer = Layer(name, h)
                q = torch.randn(b, h, length, d, generator=gen, requires_grad=True)
                k, v = (torch.randn(b, hkv, length, d, generator=gen, requires_grad=True)
                        for _ in range(2))
                assert choose(q).name == "triton"
                wrt = [q, k, v, *layer.parameters()]
                out, _ = eb_hf.attention_function(name)(layer, q, k, v, None)
                got = torch.autograd.grad(out.sum(), wrt)
                want = FUNCTIONS[name](q, repeat_kv(k, 2), repeat_kv(v, 2), causal=True,
                                       **direct_params(layer, name, length)).transpose(1, 2)
                assert torch.equal(out, want), name
                for g, w in zip(got, torch.autograd.grad(want.sum(), wrt), strict=True):
                    assert torch.equal(g, w), name
                if eb_hf.bottom_right_supported():  # 4 queries at the end of the 16 keys
                    qe = q[:, :, -4:].detach()
                    mask = visible(4, length, qe.device, q0=length - 4)[None, None]
                    out, _ = eb_hf.attention_function(name)(layer, qe, k, v, mask)
                    want = FUNCTIONS[name](qe, repeat_kv(k, 2), repeat_kv(v, 2),
                                           causal="bottom_right",
                                           **direct_params(layer, name, length))
                    assert torch.equal(out, want.transpose(1, 2)), name


def _example():
    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("hf_models_example",
                                                  root / "examples" / "hf_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_trains_checks_decoding_and_renders(tmp_path, capsys):
    """examples/hf_models.py at toy sizes: both models, sdpa and elastic, 3 steps; the JSON,
    the table, the doc's block between its markers; a bad option is one line, status 2."""
    example = _example()
    doc = tmp_path / "page.md"
    doc.write_text(f"before\n{example.BEGIN}\nold\n{example.END}\nafter\n")
    out = tmp_path / "run.json"
    example.main(["--attention", "sdpa,elastic", "--steps", "3", "--warmup", "1", "--every",
                  "3", "--length", "16", "--prompt", "4", "--gen-tokens", "4", "--batch", "2",
                  "--eval-batch", "2", "--d-model", "16", "--heads", "2", "--kv-heads", "1",
                  "--layers", "1", "--json", str(out), "--doc", str(doc)])
    runs = json.loads(out.read_text())["runs"]
    assert [(r["model"], r["attention"]) for r in runs] == [
        ("llama", "sdpa"), ("llama", "elastic"), ("gpt2", "sdpa"), ("gpt2", "elastic")]
    for r in runs:
        assert len(r["train_loss"]) == 3 and all(math.isfinite(v) for v in r["train_loss"])
        assert r["decode"]["tokens_equal"] and len(r["decode"]["cached_tokens"][0]) == 4
    assert sorted(runs[1]["evals"][-1]["params"]) == ["beta", "tau"]
    page = doc.read_text()
    assert page.startswith(f"before\n{example.BEGIN}\n**llama**") and "old" not in page
    assert page.endswith(f"{example.END}\nafter\n") and "| elastic | cpp |" in page
    capsys.readouterr()
    with pytest.raises(SystemExit) as bad:
        example.main(["--model", "bert"])
    assert bad.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1
