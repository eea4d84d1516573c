"""Issue 57 item 7: `elasticbench list functions` and `list inputs` name the attention
functions and their generators beside the row ones."""

from __future__ import annotations

from elasticbench.harness.functions import ATTENTION_FUNCTIONS, FUNCTIONS
from elasticbench.harness.inputs import GENERATORS
from elasticbench.harness.kinds.attention.qkv_inputs import ATTENTION_GENERATORS


def _entries(out: str) -> list[tuple[str, bool]]:
    """(name, is attention) per line."""
    return [(ln.split()[0], ln.split()[1] == "attention:") for ln in out.splitlines()]


def test_list_functions_names_every_row_and_attention_function(cli):
    r = cli("list", "functions")
    assert r.code == 0
    assert _entries(r.out) == ([(n, False) for n in FUNCTIONS]
                               + [(n, True) for n in ATTENTION_FUNCTIONS])
    line = next(ln for ln in r.out.splitlines() if ln.startswith("elastic_attention "))
    assert line.endswith("[tau=1, beta=1, causal=0, gate=0]")


def test_list_inputs_names_every_row_and_attention_generator(cli):
    r = cli("list", "inputs")
    assert r.code == 0
    assert _entries(r.out) == ([(n, False) for n in GENERATORS]
                               + [(n, True) for n in ATTENTION_GENERATORS])
    assert {"key_padding", "bool_mask", "additive_mask", "causal_hidden"} <= set(
        ATTENTION_GENERATORS)
