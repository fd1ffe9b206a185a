"""The README's examples run as written, and its worked example's figures are real."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


@pytest.mark.slow  # three searches, a picture
def test_readme_python_api_example_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # res.render("gqa.svg") writes here
    blocks = _python_blocks()
    assert blocks, "README has no python example"
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)  # noqa: S102
    assert namespace["out"]["O"].shape == (2, 256, 64)
    assert namespace["r"].equivalent
    assert namespace["res"].cost_us <= namespace["res"].baseline_cost_us
    assert (tmp_path / "gqa.svg").stat().st_size > 1000
    pieces = namespace["wres"].stats["pieces"]
    assert [p["status"] for p in pieces] == ["optimized", "optimized"]
    assert pieces[1]["same_as"] == 0 and namespace["wres"].verified.equivalent


def test_readme_torch_example_runs():
    """The example runs, and its compiled model keeps matching the model on a new input."""
    torch = pytest.importorskip("torch")
    namespace: dict = {}
    exec(compile(_python_blocks()[1], "README.md", "exec"), namespace)  # noqa: S102
    assert namespace["res"].verified.equivalent
    fast, model = namespace["fast"], namespace["model"]
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x), rtol=1e-3, atol=1e-3)


def test_readme_optimize_many_example_runs():
    namespace: dict = {}
    exec(compile(_python_blocks()[2], "README.md", "exec"), namespace)  # noqa: S102
    results = namespace["results"]
    assert len(results) == 3 and results[0].cost_us == results[2].cost_us
    assert all(r.verified.equivalent for r in results)


@pytest.mark.slow  # a Hugging Face layer through torch.compile
def test_readme_hugging_face_example_runs():
    """The Hugging Face example runs as written, and its warning line is what it prints."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import warnings

    torch._dynamo.reset()
    namespace: dict = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(_python_blocks()[3], "README.md", "exec"), namespace)  # noqa: S102
    torch._dynamo.reset()
    out, ref, s = namespace["out"], namespace["ref"], namespace["summary"]
    out, ref = (v[0] if isinstance(v, tuple) else v for v in (out, ref))
    assert torch.allclose(out, ref, rtol=1e-3, atol=1e-3)
    shown = README.read_text().split("The warning, once per compiled graph:", 1)[1]
    line = shown.split("```\n", 2)[1].strip()
    pattern = r"eqsat-mirage: (\d+) of (\d+) ops in (\d+) optimized partitions"
    m = re.match(pattern, line)  # the README shows a run where every piece verified
    assert m and (int(m[1]), int(m[2]), int(m[3])) == (s["ops"], s["ops"], 1), line
    warned = [str(w.message) for w in caught if str(w.message).startswith("eqsat-mirage: ")]
    got = re.match(pattern, warned[0]) if len(warned) == 1 else None
    assert got and (int(got[1]), int(got[2]), int(got[3])) == (
        s["optimized_ops"], s["ops"], s["optimized_partitions"]), (warned, s)
    # every piece verified, or its search ran out of time (the machine's speed, said so)
    pieces = [p for e in namespace["be"].report if e.result is not None
              for p in e.result.stats.get("pieces", [])]
    assert pieces and all(p["status"] == "optimized" or p.get("time_limited")
                          for p in pieces), pieces
    assert not s["eager"]
    assert s["predicted_us"][1] < s["predicted_us"][0] or s["optimized_ops"] == 0


def test_readme_opens_with_the_two_commands():
    head = README.read_text().splitlines()[:6]
    assert "make demo" in "\n".join(head) and "make test" in "\n".join(head)


def test_readme_quick_run_skips_the_slow_tests_that_make_test_runs():
    """The README names the quick run (-m "not slow"); `make test` deselects nothing, and
    the marker it names is declared."""
    root = README.parent
    assert '-m "not slow"' in README.read_text()
    recipe = root.joinpath("Makefile").read_text().split("\ntest:", 1)[1].split("\n\n")[0]
    args = recipe.split("-m pytest", 1)[1].split("\n")[0]  # the options after pytest
    assert " -m " not in f"{args} " and "slow" not in args, args
    assert '"slow: ' in root.joinpath("pyproject.toml").read_text()


def test_readme_worked_example_is_real(capsys):
    from eqsat_mirage.cli.main import main

    text = README.read_text()
    block = text.split("## Worked example: GQA", 1)[1].split("```\n", 2)[1]
    assert main(["optimize", "--bench", "gqa", "--quiet", "--no-cache"]) == 0
    out = capsys.readouterr().out
    shown = block.split("\nphase ")[0]  # the input and the chosen program, verbatim
    assert shown.strip() and shown.strip() in out
    for prefix in ("kernels ", "cost ", "  fusion plan for", "tiling "):
        line = next(ln for ln in block.splitlines() if ln.startswith(prefix))
        if prefix == "tiling ":  # iterations and e-nodes, not the seconds
            line = " ".join(line.split()[:3])
            assert any(" ".join(ln.split()[:3]) == line for ln in out.splitlines())
        elif prefix == "  fusion plan for":
            assert line.split(";")[0] in out
        else:
            assert line in out, line
