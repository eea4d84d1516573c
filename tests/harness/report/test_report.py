"""`elasticbench report`: every format rendered from stored results files, checked by content.

The fixtures are real results files made with the CLI and trimmed (tests/fixtures/README.md).
"""

from __future__ import annotations

import base64
import csv
import io
import json
import re
import sys
from pathlib import Path

import pytest

from elasticbench.harness.cli import main

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
VERIFY = str(FIXTURES / "verify_small.json")
RUN = str(FIXTURES / "run_small.json")
PNG = b"\x89PNG\r\n\x1a\n"
ANSI = re.compile(r"\x1b\[")


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """Run the CLI in-process; (exit code, stdout, stderr)."""
    try:
        main(list(args))
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(autouse=True)
def wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "240")
    for var in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(var, raising=False)


def records(path: str) -> list[dict]:
    return json.loads(Path(path).read_text())["records"]


def run_record(kernel: str, shape: list[int], dtype: str) -> dict:
    return next(r for r in records(RUN)
                if r["kernel"] == kernel and r["shape"] == shape and r["dtype"] == dtype)


# ---------------------------------------------------------------- terminal tables

def test_table_of_a_verification(capsys):
    code, out, _ = cli(capsys, "report", VERIFY)
    assert code == 0
    assert not ANSI.search(out), "not a terminal: no control codes"
    assert "elastic: worst error in ulps (share of budget)" in out
    assert "elastic (bwd): worst dx error in ulps (share of budget)" in out
    rows = {line.split("│")[1].strip(): line for line in out.splitlines()
            if line.startswith("│") and line.split("│")[1].strip()}
    worst = max(r["max_ulp"] for r in records(VERIFY)
                if r["kernel"] == "numpy_elastic" and r["dtype"] == "fp32")
    assert f"{worst:.3g}" in rows["numpy_elastic"] and "pass" in rows["numpy_elastic"]
    assert "3/3 failed: inf ulp, 3 special" in rows["unscaled_beta"]
    assert rows["unscaled_beta"].count("FAIL") == 2  # special and verdict
    assert "1/3 failed" in rows["seed_where_mask"]
    assert "pass" in rows["numpy_elastic_bwd"]
    assert ("FAIL seed_where_mask specials 7x16 tau=10 beta=1 fp32: special: NaN in row 0 not "
            "propagated") in out
    assert ("reproduce: elasticbench verify --case cases/verify-quick.toml --only "
            "seed_where_mask --dtype fp32 --input specials --size 7x16 --param tau=10 "
            "--param beta=1 --layout packed --kernel-file examples/seed_variants.py") in out
    assert out.rstrip().endswith(f"{VERIFY}: 30 cases, 22 passed, 8 failed")


def test_table_of_a_run_and_mixed_files(capsys):
    code, out, _ = cli(capsys, "report", RUN, VERIFY)
    assert code == 0
    assert out.index(RUN) < out.index(VERIFY)
    line = next(ln for ln in out.splitlines()
                if ln.split()[:2] == ["numpy_elastic", "64x256"] and "fp32" in ln)
    r = run_record("numpy_elastic", [64, 256], "fp32")
    assert f"{r['gbps']:.2f}" in line and f"{r['speedup']:.2f}" in line and "pass" in line
    assert re.search(r"short_rows_only\s+8x4096 fp32\s+-.*ERROR", out)
    assert "ERROR short_rows_only [8, 4096]: raised MemoryError" in out
    assert out.count("FAIL unscaled_beta fp32 (not ranked)") == 1  # said once, not per size
    assert "ceilings: copy 11.2 GB/s" in out
    last = out.rstrip().splitlines()[-1]
    assert last == (f"{RUN}: 20 timings of 5 kernels, 6 failed verification or raised; "
                    f"{VERIFY}: 30 cases, 22 passed, 8 failed")


def test_quiet_prints_only_the_summary_line(capsys):
    code, out, _ = cli(capsys, "--quiet", "report", VERIFY, RUN)
    assert code == 0
    assert out.splitlines() == [f"{VERIFY}: 30 cases, 22 passed, 8 failed; "
                                f"{RUN}: 20 timings of 5 kernels, 6 failed verification "
                                "or raised"]


def test_quiet_terminal_silences_the_verify_and_run_tables():
    from elasticbench.harness.records import load_results
    from elasticbench.harness.report.run_table import render_run
    from elasticbench.harness.report.terminal import Terminal
    from elasticbench.harness.report.verify_table import render

    verify, run = load_results(VERIFY).records, load_results(RUN).records
    buf = io.StringIO()
    quiet = Terminal(file=buf, summary_only=True)
    summary = render(verify, quiet)
    render_run(run, None, quiet)
    assert buf.getvalue() == "" and (summary.cases, summary.failed) == (30, 8)
    loud = Terminal(file=buf, width=120)
    render(verify, loud)
    assert "unscaled_beta" in buf.getvalue()


def test_narrow_terminal_folds_tables_into_parts(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "60")
    code, out, _ = cli(capsys, "report", RUN, VERIFY)
    assert code == 0
    *body, summary = out.splitlines()
    assert max(len(line) for line in body) <= 60
    assert summary.startswith(f"{RUN}: 20 timings")  # one line for scripts; the terminal wraps it
    assert "elastic (fwd) (1/2)" in out and "elastic (fwd) (2/2)" in out
    for kernel in ("short_rows_only", "numpy_elastic_bwd", "seed_where_mask"):
        assert re.search(rf"\b{kernel}\b", out), f"{kernel} cut or folded"
    assert "…" not in out


@pytest.mark.parametrize("no_color", [False, True])
def test_no_color_on_a_terminal(capsys, monkeypatch, no_color):
    monkeypatch.setenv("FORCE_COLOR", "1")
    if no_color:
        monkeypatch.setenv("NO_COLOR", "1")
    _, out, _ = cli(capsys, "report", VERIFY)
    colour = re.compile(r"\x1b\[[0-9;]*3[0-7]m")  # foreground colour codes
    assert bool(colour.search(out)) is not no_color


# ---------------------------------------------------------------- documents

def test_markdown(capsys):
    code, out, err = cli(capsys, "report", VERIFY, RUN, "--format", "markdown")
    assert code == 0
    assert f"{VERIFY}: 30 cases" in err  # the summary goes to stderr: stdout is the document
    assert f"## {VERIFY}" in out and "**elastic: worst error in ulps (share of budget)**" in out
    assert "| kernel | contract | fp32 | bf16 | special | verdict |" in out
    assert "|:---|---:|---:|:---:|:---:|" in out
    row = next(ln for ln in out.splitlines() if ln.startswith("| unscaled_beta |"))
    assert row.count("**FAIL**") == 2 and row.count("**3/3 failed**: inf ulp, 3 special") == 2
    assert ("`elasticbench verify --case cases/verify-quick.toml --only seed_where_mask --dtype "
            "fp32 --input specials --size 7x16 --param tau=10 --param beta=1 --layout packed "
            "--kernel-file examples/seed_variants.py`") in out
    assert "| short_rows_only | 8x4096 fp32 | - | - | - | - | - | **ERROR** |" in out
    assert "64x256 fp32\\*" in out  # the in-cache mark is escaped, not emphasis
    assert "**30 cases, 22 passed, 8 failed**" in out


def test_csv_parses_back_to_the_raw_values(capsys, tmp_path):
    target = tmp_path / "report.csv"
    code, out, _ = cli(capsys, "report", RUN, VERIFY, "-F", "csv", "-o", str(target))
    assert code == 0 and f"wrote csv in {target}" in out
    rows = list(csv.DictReader(target.open()))
    r = run_record("elastic_online", [8, 4096], "bf16")
    row = next(x for x in rows if x["table"] == "elastic (fwd)" and x["kernel"] == "elastic_online"
               and x["n"] == "4096" and x["dtype"] == "bf16")
    assert row["file"] == RUN and row["rows"] == "8" and row["cache"] == "in-cache"
    assert float(row["gbps"]) == r["gbps"] and float(row["median_s"]) == r["median_s"]
    assert float(row["pct_roof"]) == r["pct_roof"] and row["binding"] == r["binding"]
    assert row["verify"] == "pass" and row["fp32 max ulp"] == ""
    err = next(x for x in rows if x["kernel"] == "short_rows_only" and x["n"] == "4096")
    assert err["verify"] == "ERROR" and err["gbps"] == ""
    v = next(x for x in rows if x["table"] == "elastic" and x["kernel"] == "unscaled_beta")
    assert v["file"] == VERIFY and v["verdict"] == "FAIL" and v["special"] == "FAIL"
    assert (v["fp32 failed"], v["fp32 cases"], v["fp32 max ulp"]) == ("3", "3", "inf")
    ok = next(x for x in rows if x["table"] == "elastic" and x["kernel"] == "numpy_elastic")
    worst = max(r["max_ulp"] for r in records(VERIFY)
                if r["kernel"] == "numpy_elastic" and r["dtype"] == "bf16")
    assert float(ok["bf16 max ulp"]) == worst and ok["verdict"] == "pass"
    bwd = next(x for x in rows if x["table"] == "elastic (bwd)")
    assert float(bwd["worst rel dtau"]) > 0


def test_json_is_strict_and_normalized(capsys):
    code, out, _ = cli(capsys, "report", VERIFY, RUN, "--format", "json")
    assert code == 0
    doc = json.loads(out, parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}"))
    assert doc["schema"] == "elasticbench.report/1"
    v, r = doc["files"]
    assert (v["kind"], v["failed"], r["kind"], r["failed"]) == ("verify", 8, "run", 6)
    assert [t["name"] for t in v["tables"]] == ["elastic", "elastic (bwd)"]
    assert [t["name"] for t in r["tables"]] == ["softmax (fwd)", "elastic (fwd)"]
    rows = {row["kernel"]: row for row in v["tables"][0]["rows"]}
    assert rows["unscaled_beta"]["fp32 max ulp"] == "inf" and rows["numpy_elastic"]["verdict"] \
        == "pass"
    base = r["tables"][0]["rows"][0]
    rec = run_record("torch_softmax", [64, 256], "fp32")
    assert base["median_s"] == rec["median_s"] and base["speedup"] == 1.0
    assert any(n["text"].startswith("FAIL seed_where_mask specials 7x16 tau=10 beta=1 fp32")
               for n in v["notes"])


# ---------------------------------------------------------------- plots and HTML

@pytest.fixture(scope="module")
def plotted(tmp_path_factory):
    """One report writing the HTML page and the PNG files of both fixtures."""
    pytest.importorskip("matplotlib")
    d = tmp_path_factory.mktemp("report")
    try:
        main(["report", VERIFY, RUN, "--format", "html", "--output", str(d / "r.html"),
              "--plot", str(d / "plots")])
    except SystemExit as e:
        assert e.code == 0
    return d


def test_plots_are_written_as_png(plotted):
    names = sorted(p.name for p in (plotted / "plots").iterdir())
    assert names == ["run_small-roofline-fwd-bf16.png", "run_small-roofline-fwd-fp32.png",
                     "run_small-time-vs-n.png", "verify_small-accuracy-bwd.png",
                     "verify_small-accuracy-fwd.png"]
    for name in names:
        data = (plotted / "plots" / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        assert width >= 500 and height >= 300


def test_html_is_self_contained_with_tables_and_plots(plotted):
    page = (plotted / "r.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert '<table data-table="elastic">' in page and '<table data-table="elastic (fwd)">' in page
    assert "<td class=\"left\">unscaled_beta</td>" in page
    assert '<span class="fail">3/3 failed</span>: inf ulp, 3 special' in page
    assert '<span class="pass">pass</span>' in page
    assert "<code>elasticbench verify --case cases/verify-quick.toml --only seed_where_mask" in page
    assert not re.search(r'(src|href)="(https?:)?//', page), "nothing fetched from elsewhere"
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 5
    assert all(base64.b64decode(i).startswith(PNG) for i in images)


def test_markdown_links_the_written_plots(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "docs" / "report.md"
    code, _, _ = cli(capsys, "report", VERIFY, "-F", "markdown", "-o", str(out),
                     "--plot", str(tmp_path / "plots"))
    assert code == 0
    assert "![Kernel by input" in out.read_text()
    assert "(../plots/verify_small-accuracy-fwd.png)" in out.read_text()


def test_without_matplotlib(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    code, out, err = cli(capsys, "report", VERIFY, "--plot", str(tmp_path / "p"))
    assert code == 2 and out == ""
    assert err == "elasticbench: error: plots need matplotlib: pip install 'elasticbench[plot]'\n"
    code, out, _ = cli(capsys, "report", VERIFY, "-F", "html")
    assert code == 0 and "<table" in out and "No plots: plots need matplotlib" in out


# ---------------------------------------------------------------- bad input

def _bad(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize("make,message", [
    (lambda d: str(d / "missing.json"), "does not exist"),
    (lambda d: _bad(d, "x.json", "{not json"), "is not valid JSON"),
    (lambda d: _bad(d, "s.json", '{"schema": "other/1", "records": []}'), "has schema 'other/1'"),
    (lambda d: _bad(d, "r.json", '{"schema": "elasticbench.verify/1", "kind": "verify", '
                                 '"records": [{"kernel": "k"}]}'), "record 0 (k) lacks"),
    (lambda d: str(d), "is a directory"),
])
def test_bad_results_files_are_one_line_exit_2(capsys, tmp_path, make, message):
    code, out, err = cli(capsys, "report", make(tmp_path))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("elasticbench: error: ") and message in err


def test_unknown_format_is_one_line_exit_2(capsys):
    code, out, err = cli(capsys, "report", VERIFY, "--format", "pdf")
    assert code == 2 and out == "" and err.count("\n") == 1 and "'pdf' is not one of" in err
