"""Every code block of README.md runs as written (or is checked as stated where running it
would mean installing or running this very test suite), and what it shows is real.

Blocks are found by name (``tests/docblocks.py``); ``test_every_readme_block_has_a_test``
fails for a block that no test here names. Searches get the time they need; a piece of a
search that still runs out of time is the machine's (a loaded machine), and every other
piece must verify.
"""

import contextlib
import io
import re
import subprocess
import warnings
from pathlib import Path

import pytest
from docblocks import ROOT, block, named_blocks, run_python

README = "README.md"
TESTED: set[str] = set()


def runs(*names: str):
    """Mark a test as the one that runs (or checks) the README blocks ``names``."""
    TESTED.update(names)
    return lambda fn: fn


def test_every_readme_block_has_a_test():
    blocks = named_blocks(README)
    assert blocks, "README has no code block"
    unnamed = [b.line for b in blocks if not b.name]
    assert not unnamed, f"README blocks without a name (```lang name) at lines {unnamed}"
    untested = [b.name for b in blocks if b.name not in TESTED]
    assert not untested, f"README blocks no test runs: {untested}"


def test_readme_is_short_and_opens_with_the_two_commands():
    text = (ROOT / README).read_text()
    assert len(text.splitlines()) <= 210
    head = "\n".join(text.splitlines()[:6])
    assert "make demo" in head and "make test" in head
    assert "DESIGN.md" not in text  # not in the repository


def test_readme_links_point_into_the_repository():
    text = (ROOT / README).read_text()
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert links
    for link in links:
        assert not link.startswith(("/", "http")), link
        assert (ROOT / link).exists(), link


def test_readme_status_table_rows_are_one_short_line():
    text = (ROOT / README).read_text()
    table = text.split("## Status", 1)[1].split("\n\n")[1]
    rows = [r for r in table.splitlines() if r.startswith("|")][2:]
    assert len(rows) >= 8
    for row in rows:
        assert len(row.split()) <= 30, row


@runs("make")
def test_readme_make_commands(capsys):
    """The recipes are what the README says (a dry run: running ``make test`` here would
    run this suite inside itself, and the first ``make`` installs for minutes); the demo
    command that ``make demo`` runs is run for real, quietly."""
    shown = block(README, "make").text
    assert [ln.split()[:2] for ln in shown.splitlines()] == [["make", "demo"], ["make", "test"]]
    dry = subprocess.run(["make", "-n", "-B", "demo", "test", "VENV=.venv"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert "python3 -m venv .venv" in dry and '-c constraints.txt -e ".[dev]"' in dry
    assert ".venv/bin/eqsat-mirage demo" in dry
    assert ".venv/bin/python -m ruff check eqsat_mirage tests bench" in dry
    pytest_line = next(ln for ln in dry.splitlines() if "-m pytest" in ln)
    # every test (no -m selection), in two workers on the 2-core reference machine
    assert pytest_line.split("-m pytest", 1)[1].split() == ["-q", "-n", "2", "--dist",
                                                            "loadfile"], pytest_line
    from eqsat_mirage.cli.main import main

    assert main(["demo", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "verified     equivalent" in out or "time limit" in out, out[-2000:]


def test_readme_quick_run_skips_the_slow_tests_that_make_test_runs():
    """The README names the quick run (-m "not slow"), and the marker it names is declared."""
    assert '-m "not slow"' in (ROOT / README).read_text()
    assert '"slow: ' in (ROOT / "pyproject.toml").read_text()


def _verified_or_out_of_time(res) -> None:
    """The result verified and is cheaper, or its search ran out of time and says so."""
    if res.stats.get("time_limited") and res.verified is None:
        assert "time limit" in (res.stats.get("note") or ""), res.stats.get("note")
        return
    assert res.verified.equivalent, res.verified
    assert res.cost_us < res.baseline_cost_us


@runs("quickstart")
def test_readme_quickstart_program():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        ns = run_python(block(README, "quickstart"))
    res = ns["res"]
    _verified_or_out_of_time(res)
    assert f"{res.baseline_cost_us:.2f} us -> {res.cost_us:.2f} us" in out.getvalue()


@pytest.mark.slow  # a Hugging Face layer through torch.compile: minutes on a loaded machine
@runs("quickstart-hf")
def test_readme_quickstart_hugging_face_layer():
    """The layer runs as written and equals eager; its one warning counts what the summary
    counts; every piece verified or ran out of time; and docs/pytorch.md's warning line,
    from a run where every piece verified, has the form and the op count of this one."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    torch._dynamo.reset()
    out = io.StringIO()
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out):
        warnings.simplefilter("always")
        ns = run_python(block(README, "quickstart-hf"))
    torch._dynamo.reset()
    layer, x, rope, pos = ns["layer"], ns["x"], ns["rope"], ns["pos"]
    with torch.no_grad():
        ref = layer(x, position_embeddings=rope, position_ids=pos)
    got, ref = (v[0] if isinstance(v, tuple) else v for v in (ns["out"], ref))
    assert torch.allclose(got, ref, rtol=1e-3, atol=1e-3)
    s = ns["be"].summary()
    assert out.getvalue().strip() == f"{s['optimized_ops']} of {s['ops']} ops optimized"
    pattern = r"eqsat-mirage: (\d+) of (\d+) ops in (\d+) optimized partitions"
    warned = [str(w.message) for w in caught if str(w.message).startswith("eqsat-mirage: ")]
    got_line = re.match(pattern, warned[0]) if len(warned) == 1 else None
    assert got_line and (int(got_line[1]), int(got_line[2]), int(got_line[3])) == (
        s["optimized_ops"], s["ops"], s["optimized_partitions"]), (warned, s)
    pieces = [p for e in ns["be"].report if e.result is not None
              for p in e.result.stats.get("pieces", [])]
    assert pieces and all(p["status"] == "optimized" or p.get("time_limited")
                          for p in pieces), pieces
    assert s["optimized_ops"] == 0 or s["predicted_us"][1] < s["predicted_us"][0]
    shown = block("docs/pytorch.md", "backend-warning").text.strip()
    m = re.match(pattern + r" \(predicted ([\d.]+) us -> ([\d.]+) us\)$", shown)
    assert m and int(m[1]) == int(m[2]) == s["ops"] and int(m[3]) == 1, shown
    assert float(m[5]) < float(m[4])


@runs("layout")
def test_readme_layout_names_what_is_there():
    for line in block(README, "layout").text.splitlines():
        name = line.split()[0]
        assert (ROOT / name).exists(), name
    folders = {ln.split()[0].rstrip("/") for ln in block(README, "layout").text.splitlines()}
    top = {p.name for p in Path(ROOT).iterdir() if p.is_dir() and not p.name.startswith(".")}
    assert {"eqsat_mirage", "rules", "extract", "tests", "bench", "docs"} <= folders & top


@runs("loops16.egg")
def test_readme_block_rule_file_is_the_one_the_rules_docs_run():
    """The README's block-level rule file is docs/rules.md's, which
    tests/test_docs_examples.py loads into a search that then loops 16 steps only."""
    assert block(README, "loops16.egg").text == block("docs/rules.md", "loops16.egg").text
