"""How the Triton attention kernels' configuration is chosen (docs/attention.md section 7): a
table lookup keyed by GPU, kernel, dtype, head dim, causal, padding, weight and length
class, a deterministic rule for keys no table names, tuning only on request and never
while a CUDA graph is captured, and only "does not fit" errors swallowed. The decision
takes the GPU as an argument, so all of it runs here without one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from elasticbench import settings

pytestmark = pytest.mark.needs("triton")

H100 = ("NVIDIA H100 80GB HBM3", (9, 0))


@pytest.fixture
def ac(monkeypatch):
    """attention_configs with its tables and choices forgotten before and after, and no
    table, tuning or TMA variable in the settings (the environment restored and read again
    after)."""
    from elasticbench.kernels.triton import attention_configs as module

    monkeypatch.delenv(module.TABLE_ENV, raising=False)
    monkeypatch.delenv(module.TUNE_ENV, raising=False)
    monkeypatch.delenv(module.TMA_ENV, raising=False)
    settings.refresh()
    module.reset()
    yield module
    monkeypatch.undo()
    settings.refresh()
    module.reset()


def _setenv(monkeypatch, name: str, value: str) -> None:
    """Set the variable and read the settings again, as a process started with it would."""
    monkeypatch.setenv(name, value)
    settings.refresh()


def _gpu(ac, name: str = H100[0], cap: tuple[int, int] = H100[1]):
    return ac.Gpu(cap, name)


def _q(dtype=torch.bfloat16, d: int = 128) -> torch.Tensor:
    return torch.zeros(1, 1, 4, d, dtype=dtype)


def _table(path: Path, entries: list[dict], **meta) -> Path:
    data = {"format": "elasticbench-attention-table", "version": 1, "interpreter": False,
            **meta, "entries": entries}
    path.write_text(json.dumps(data))
    return path


def _entry(ac, tiles, kernel="fwd", length=4096, name=H100[0], **over) -> dict:
    key = ac.Key(ac.Gpu(H100[1], name), kernel, over.pop("dtype", "bf16"),
                 over.pop("head_dim", 128), over.pop("causal", False),
                 over.pop("padded", False), over.pop("weight", "elastic"), length)
    return ac.entry_record(key, tiles)


def _never(*_args, **_kwargs):
    raise AssertionError("timed or synchronized inside a call on the table path")


def test_length_classes_are_powers_of_four_from_64(ac):
    assert [ac.length_class(n) for n in (0, 1, 64, 65, 256, 257, 1024, 4096, 4097, 8192,
                                         16384, 100000)] == [
        64, 64, 64, 256, 256, 1024, 1024, 4096, 16384, 16384, 16384, 262144]


def test_a_key_no_table_names_takes_the_rule_the_first_pointer_configuration(ac):
    gpu = _gpu(ac)
    assert ac.tables() == ()  # the package ships no GPU table yet (none measured)
    for kernel in ac.KERNELS:
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for causal, padded in ((False, False), (True, True)):
                got = ac.choose(kernel, 128, _q(dtype), causal, padded, _never, tma=True,
                                length=8192, gpu=gpu)
                plain = ac.configs(kernel, 128, dtype, causal, padded=padded)
                assert got == plain[0] and not got.tma, (kernel, dtype, causal)
    # the interpreter and CPU tensors: the smallest, as before
    assert ac.choose("fwd", 128, _q(), False, False, _never) == ac.smallest(
        ac.configs("fwd", 128, torch.bfloat16, False))


def test_a_user_table_overrides_per_key_and_length_class(ac, tmp_path, monkeypatch):
    fwd = ac.configs("fwd", 128, torch.bfloat16, False)
    tma = ac.configs("dq", 64, torch.bfloat16, True, tma=True)
    assert len(fwd) > 2 and tma
    path = _table(tmp_path / "mine.json", [
        _entry(ac, fwd[2], length=1024), _entry(ac, fwd[1], length=16384),
        _entry(ac, fwd[1], length=4096, name="*", dtype="fp16"),
        _entry(ac, tma[-1], kernel="dq", head_dim=64, causal=True)])
    _setenv(monkeypatch, ac.TABLE_ENV, str(path))
    gpu = _gpu(ac)
    q = _q()

    def pick(length, **kw):
        return ac.choose(kw.pop("kernel", "fwd"), kw.pop("d", 128), kw.pop("q", q),
                         kw.pop("causal", False), False, _never, tma=kw.pop("tma", False),
                         length=length, gpu=kw.pop("gpu", gpu))

    assert pick(1000) == fwd[2] and pick(700) == fwd[2]  # class 1024
    assert pick(10000) == fwd[1] and pick(16384) == fwd[1]  # class 16384
    assert pick(4000) == fwd[0]  # class 4096: not in the table, the rule
    assert pick(4000, gpu=_gpu(ac, "NVIDIA H200")) == fwd[0]  # another GPU's name
    assert pick(4000, q=_q(torch.float16), gpu=_gpu(ac, "NVIDIA H200")) == fwd[1]  # "*"
    assert pick(4000, q=_q(torch.float16), gpu=_gpu(ac, "x", (8, 0))) == fwd[0]
    # a TMA entry where the call may use descriptors, its pointer form where it may not
    assert pick(4096, kernel="dq", d=64, causal=True, tma=True) == tma[-1]
    from dataclasses import replace
    want = replace(tma[-1], tma=False)
    got = pick(4096, kernel="dq", d=64, causal=True, tma=False)
    assert got == (want if want in ac.configs("dq", 64, torch.bfloat16, True)
                   else ac.configs("dq", 64, torch.bfloat16, True)[0])


def test_the_table_variable_is_read_once(ac, tmp_path, monkeypatch):
    fwd = ac.configs("fwd", 128, torch.bfloat16, False)
    _setenv(monkeypatch, ac.TABLE_ENV, str(_table(tmp_path / "t.json", [_entry(ac, fwd[1])])))
    gpu = _gpu(ac)
    assert ac.choose("fwd", 128, _q(), False, False, None, length=4096, gpu=gpu) == fwd[1]
    monkeypatch.setenv(ac.TABLE_ENV, str(tmp_path / "missing.json"))
    assert ac.choose("fwd", 128, _q(), True, False, None, length=4096, gpu=gpu) == \
        ac.configs("fwd", 128, torch.bfloat16, True)[0]  # no error: not read again
    assert ac.tables()[0].path == str(tmp_path / "t.json")


@pytest.mark.parametrize(("text", "why"), [
    ("{", "not JSON"),
    ('{"format": "other"}', "not an attention table"),
    ('{"format": "elasticbench-attention-table", "version": 9, "entries": []}', "version 9"),
    ('{"format": "elasticbench-attention-table", "version": 1, "entries": {}}',
     '"entries" must be a list'),
    ("ENTRY:tiles=128x128 w4 s9", "not an offered configuration"),
    ("ENTRY:tiles=big", "is not a configuration"),
    ("ENTRY:length=5000", "not a length class"),
    ("ENTRY:kernel=bwd", "kernel 'bwd'"),
    ("ENTRY:head_dim=96", "not a head-dim class"),
    ("ENTRY:causal=1", "'causal' missing or not a bool"),
    ("TWICE", "a second entry"),
])
def test_a_bad_table_fails_with_one_line_naming_the_file(ac, tmp_path, monkeypatch, text, why):
    path = tmp_path / "bad.json"
    good = _entry(ac, ac.configs("fwd", 128, torch.bfloat16, False)[0])
    if text.startswith("ENTRY:"):
        field, value = text[6:].split("=")
        bad = {**good, field: int(value) if value.isdigit() and field != "causal" else value}
        if field == "causal":
            bad[field] = 1
        _table(path, [bad])
    elif text == "TWICE":
        _table(path, [good, good])
    else:
        path.write_text(text)
    with pytest.raises(ac.TableError) as caught:
        ac.load_table(path)
    message = str(caught.value)
    assert str(path) in message and why in message and "\n" not in message, message
    _setenv(monkeypatch, ac.TABLE_ENV, str(path))
    with pytest.raises(ac.TableError, match=ac.TABLE_ENV):
        ac.choose("fwd", 128, _q(), False, False, None, length=64, gpu=_gpu(ac))
    _setenv(monkeypatch, ac.TABLE_ENV, str(tmp_path / "none.json"))
    ac.reset()
    with pytest.raises(ac.TableError, match="cannot be read"):
        ac.tables()


def test_the_table_path_does_no_timing_no_synchronization(ac, tmp_path, monkeypatch):
    """A wrapper call on the table path (and on the rule's) with its launches captured, as
    if on an H100: do_bench, every synchronize and the timing callback raise if touched."""
    import triton.testing

    from elasticbench.harness.audit.capture import capture_launches
    from elasticbench.kernels.triton.flash_attention import attention_backward, attention_forward

    kv = ac.configs("dkdv", 64, torch.bfloat16, True)
    _setenv(monkeypatch, ac.TABLE_ENV, str(_table(tmp_path / "t.json", [
        _entry(ac, kv[-1], kernel="dkdv", head_dim=64, causal=True, length=256)])))
    monkeypatch.setattr(ac, "_gpu_for", lambda q: _gpu(ac))
    for target, name in ((triton.testing, "do_bench"), (torch.cuda, "synchronize"),
                         (torch.cuda.Event, "synchronize"), (torch.cuda.Stream, "synchronize"),
                         (torch.cuda, "is_current_stream_capturing")):
        monkeypatch.setattr(target, name, _never)
    q = torch.zeros(1, 2, 200, 64, dtype=torch.bfloat16)
    heads = torch.ones(1, 2)
    stats = torch.zeros(1, 2, 200)
    with capture_launches() as launches:
        attention_forward(q, q, q, heads, heads, 0.125, True)
        attention_backward(q, q, q, q, q, stats, stats + 1, heads, heads, 0.125, True)
    blocks = {la.name: la.kwargs["BLOCK_M"] for la in launches}
    assert blocks["attention_forward_kernel"] == \
        ac.configs("fwd", 64, torch.bfloat16, True)[0].block_m
    assert blocks["attention_dkdv_kernel"] == kv[-1].block_m
    assert [la.kwargs["num_warps"] for la in launches
            if la.name == "attention_dkdv_kernel"] == [kv[-1].warps]
    assert len(ac.chosen()) == 3


def test_tuning_is_opt_in_and_refused_while_capturing(ac, monkeypatch):
    options = ac.offered("dq", 128, torch.bfloat16, False)
    speed = {t: 1.0 + i for i, t in enumerate(reversed(options))}  # the last is fastest
    calls = []

    def time_one(t):
        calls.append(t)
        return speed[t]

    gpu = _gpu(ac)
    assert ac.choose("dq", 128, _q(), False, False, time_one, length=64, gpu=gpu) == options[0]
    assert calls == []  # not asked for: the rule
    ac.reset()
    _setenv(monkeypatch, ac.TUNE_ENV, "1")
    monkeypatch.setattr(ac, "_capturing", lambda: True)
    assert ac.choose("dq", 128, _q(), False, False, time_one, length=64, gpu=gpu) == options[0]
    assert calls == [] and ac.chosen() == {}  # capturing: the rule, not kept
    monkeypatch.setattr(ac, "_capturing", lambda: False)
    assert ac.choose("dq", 128, _q(), False, False, time_one, length=64, gpu=gpu) == \
        options[-1]
    assert calls == list(options)
    assert ac.choose("dq", 128, _q(), False, False, time_one, length=64, gpu=gpu) == \
        options[-1]
    assert calls == list(options)  # timed once per key
    monkeypatch.setenv(ac.TUNE_ENV, "yes")
    with pytest.raises(ValueError, match=ac.TUNE_ENV):
        settings.refresh()


def test_only_does_not_fit_errors_are_swallowed(ac):
    from triton.runtime.errors import OutOfResources, PTXASError

    options = ac.offered("fwd", 128, torch.bfloat16, False)
    too_big = OutOfResources(300000, 232448, "shared memory")

    def first_too_big(t):
        if t == options[0]:
            raise too_big
        return 2.0 if t == options[1] else 3.0

    assert ac.tune(options, first_too_big)[0] == options[1]
    assert ac.tune(options, first_too_big)[1][options[0]] == float("inf")
    for error in (RuntimeError("CUDA error: an illegal memory access was encountered"),
                  torch.OutOfMemoryError("CUDA out of memory"),
                  ValueError("grid y dimension 70000 past 65535"),
                  PTXASError("ptxas fatal: unresolved extern function")):
        def fails(t, error=error):
            raise error
        with pytest.raises(type(error)):
            ac.tune(options, fails)
    assert ac.does_not_fit(PTXASError("Entry function 'k' uses too much shared data"))
    assert ac.does_not_fit(RuntimeError("Triton Error [CUDA]: too many resources requested "
                                        "for launch"))
    with pytest.raises(RuntimeError, match="no fwd attention configuration fits"):
        ac.tune(options, lambda t: (_ for _ in ()).throw(too_big), "fwd attention")


@pytest.mark.ci  # two child processes importing torch: 5-20 s
def test_the_same_key_maps_to_the_same_configuration_in_another_process(ac, tmp_path):
    fwd = ac.configs("fwd", 64, torch.float16, True)
    path = _table(tmp_path / "t.json", [_entry(ac, fwd[-1], head_dim=64, dtype="fp16",
                                               causal=True, length=16384)])
    code = f"""
import torch
from elasticbench.kernels.triton import attention_configs as ac
g = ac.Gpu((9, 0), {H100[0]!r})
out = []
for kernel in ac.KERNELS:
    for dtype in (torch.bfloat16, torch.float16):
        for n in (100, 5000, 10000):
            q = torch.zeros(1, 1, 4, 64, dtype=dtype)
            out.append(str(ac.choose(kernel, 64, q, True, n < 200, None, length=n, gpu=g)))
print(";".join(out))
"""
    env = {"PATH": "/usr/bin:/bin", ac.TABLE_ENV: str(path)}
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, timeout=120, check=True).stdout.strip()
            for _ in range(2)]
    assert runs[0] == runs[1] and str(fwd[-1]) in runs[0].split(";")


def test_the_package_ships_its_tables_directory(ac):
    import tomllib

    assert ac.PACKAGED_TABLES.is_dir()
    root = Path(__file__).resolve().parents[2]
    data = tomllib.loads((root / "pyproject.toml").read_text())
    assert data["tool"]["setuptools"]["package-data"][
        "elasticbench.kernels.triton.tables"] == ["*.json"]
    for path in ac.PACKAGED_TABLES.glob("*.json"):  # a committed table is a GPU table
        assert not ac.load_table(path).interpreter, path


def test_tune_and_audit_refuse_what_they_cannot_do_in_one_line(cli, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for args, why in ((("tune", "--quick"), "needs a CUDA GPU"),
                      (("tune", "--budget", "-3"), "--budget"),
                      (("audit",), "--attention"),
                      (("audit", "--attention", "--head-dims", "96"), "--head-dims"),
                      (("audit", "--attention", "-d", "fp8"), "unknown dtype")):
        r = cli(*args)
        assert r.code == 2 and why in r.err and len(r.err.strip().splitlines()) == 1, (args, r)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    r = cli("audit", "--attention")
    assert r.code == 2 and "unset TRITON_INTERPRET" in r.err


@pytest.mark.ci  # two child processes under the interpreter: about 25 s of a core
def test_tune_under_the_interpreter_writes_a_loadable_table_marked_as_such(ac, tmp_path):
    """`elasticbench tune --quick` under TRITON_INTERPRET=1 (scripts/gpu_checks.sh's dry
    run): a table of the three kernels at head dim 64 that load_table reads, each choice on
    its key's offered list, marked as interpreter timings; a spent budget writes what it
    has (nothing) and says so."""
    from elasticbench import devices

    env = devices.interpreter_env(on=True)
    for name in (ac.TABLE_ENV, ac.TUNE_ENV, ac.TMA_ENV):
        env.pop(name, None)
    out = tmp_path / "table.json"
    done = subprocess.run([sys.executable, "-m", "elasticbench", "tune", "--quick", "--out",
                           str(out), "--budget", "120"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "tuned 3 of 3 keys on Triton interpreter" in done.stdout
    table = ac.load_table(out)
    data = json.loads(out.read_text())
    assert table.interpreter and data["complete"] and "never to be committed" in data["note"]
    assert sorted(k.kernel for k in table.entries) == ["dkdv", "dq", "fwd"]
    for key, tiles in table.entries.items():
        assert (key.dtype, key.head_dim, key.causal, key.padded, key.length) == (
            "bf16", 64, False, False, 64)
        offered = ac.offered(key.kernel, 64, torch.bfloat16, False, tma=ac.tma_available())
        assert tiles in offered
    spent = tmp_path / "spent.json"
    done = subprocess.run([sys.executable, "-m", "elasticbench", "tune", "--quick", "--out",
                           str(spent), "--budget", "0.001"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and "the budget (0.001 s) stopped it" in done.stdout
    assert json.loads(spent.read_text())["complete"] is False
    assert ac.load_table(spent).entries == {}


def test_the_family_weights_offer_the_rules_and_the_smallest_configuration_alone(ac):
    """Each family weight's list (pointer and TMA) is Elastic's less what spills for that
    weight, trimmed to its first and its smallest configuration: the rule and the
    interpreter choose as from the whole list (the module docstring says why)."""
    from elasticbench.attention.weights import Weight

    family = [w for w in Weight if w != Weight.ELASTIC]
    assert len(family) == 5
    lengths = []
    for kernel in ac.KERNELS:
        for cls in (64, 128):
            for dtype in (torch.bfloat16, torch.float16):
                for causal in (False, True):
                    for padded in (False, True):
                        for tma in (False, True):
                            full = ac.configs(kernel, cls, dtype, causal, Weight.ELASTIC,
                                              tma, padded)
                            for w in family:
                                untrimmed = tuple(
                                    t for t in full
                                    if (kernel, cls, causal, w, t) not in ac._SPILLS_FOR)
                                got = ac.configs(kernel, cls, dtype, causal, w, tma, padded)
                                lengths.append(len(got))
                                if not untrimmed:
                                    assert got == ()
                                    continue
                                assert got[0] == untrimmed[0]
                                assert ac.smallest(got) == ac.smallest(untrimmed)
                                assert set(got) == {untrimmed[0], ac.smallest(untrimmed)}
                                assert list(got) == [t for t in untrimmed if t in got]
    assert max(lengths) == 2 and 0 in lengths  # dk/dv at 128 has no TMA list
    # fp32: one configuration, Elastic's but where it spills for the family (the forward)
    for cls in (64, 128):
        for w in family:
            want = (32, 16, 4, 3) if cls == 64 else (
                (32, 16, 8, 2) if w in (Weight.SIGMOID, Weight.STABLEMAX) else (32, 16, 8, 3))
            assert ac.configs("fwd", cls, torch.float32, True, w) == (ac.Tiles(*want),)
            for kernel in ("dkdv", "dq"):  # Elastic's, or one of its own where that spills
                assert ac.configs(kernel, cls, torch.float32, True, w) == ac._FP32_FOR.get(
                    (kernel, cls, w), ac.configs(kernel, cls, torch.float32, True,
                                                 Weight.ELASTIC))
        assert ac.configs("fwd", cls, torch.float32, True) == (ac.Tiles(32, 32, 4, 3),)
