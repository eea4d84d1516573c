"""A shrunk failure saved as a case file: `elasticbench verify --case FILE` judges it again
exactly as the hunt did (same values, layout, parameters, and the same rows checked)."""

from __future__ import annotations

from pathlib import Path

from elasticbench.harness.hunt.trial import MAX_CHECKED, MAX_CHECKED_ROWS, SEED, Input
from elasticbench.harness.inputs.explicit import Explicit, toml_value
from elasticbench.harness.records.files import write_text_atomic


def case_text(inp: Input, function: str, dtype: str, comments: list[str]) -> str:
    """The case file of one input: a [verify] table with that input alone."""
    lines = [f"# {c}" for c in comments]
    lines += ["", "[verify]", f"seed = {SEED}", f"dtypes = {toml_value([dtype])}",
              f"max_elements = {MAX_CHECKED}", f"max_rows = {MAX_CHECKED_ROWS}", "draws = 0",
              "", "[[verify.inputs]]", f"name = {toml_value(inp.name)}",
              f"layouts = {toml_value([inp.layout])}"]
    if inp.params:
        grid = {k: [v] for k, v in inp.params}
        lines.append(f"params.{function} = {toml_value(grid)}")
    for key, value in Explicit.of(inp.x).toml_fields().items():
        lines.append(f"{key} = {toml_value(value)}")
    return "\n".join(lines) + "\n"


def save_case(path: Path, inp: Input, function: str, dtype: str, comments: list[str]) -> None:
    write_text_atomic(path, case_text(inp, function, dtype, comments))
