"""Every code block of the docs pages listed in PAGES runs as written, or is checked as
stated where running it would install packages or needs a GPU, and what a page shows as
output is what the code prints.

Blocks are found by name (``tests/docblocks.py``); ``test_every_docs_block_has_a_test``
fails for a block that no test here names. A block named like a file (``lora.py``,
``my_rules.egg``) is written to a temporary folder under that name for the blocks that
use it. Searches get the time they need; one that still runs out of time is the
machine's (a loaded machine) and must say so, and everything else is checked.
"""

import contextlib
import dataclasses
import io
import os
import re
import shlex
import subprocess
import sys
import warnings

import numpy as np
import pytest
from docblocks import ROOT, block, named_blocks, run_python

import eqsat_mirage as em

PAGES = ("docs/install.md", "docs/api.md", "docs/pytorch.md", "docs/dynamic.md",
         "docs/cli.md", "docs/cache.md", "docs/limits.md", "docs/rules.md",
         "docs/verifier.md", "docs/whole_programs.md")
TESTED: set[tuple[str, str]] = set()


def runs(page: str, *names: str):
    """Mark a test as the one that runs (or checks) the blocks ``names`` of ``page``."""
    TESTED.update((page, n) for n in names)
    return lambda fn: fn


def test_every_docs_block_has_a_test():
    for page in PAGES:
        blocks = named_blocks(page)
        unnamed = [b.line for b in blocks if not b.name]
        assert not unnamed, f"{page}: blocks without a name (```lang name) at lines {unnamed}"
        untested = [b.name for b in blocks if (page, b.name) not in TESTED]
        assert not untested, f"{page}: blocks no test runs: {untested}"


def test_docs_pages_link_inside_the_repository():
    for page in PAGES:
        text = (ROOT / page).read_text()
        assert "DESIGN.md" not in text and "/work/" not in text, page
        for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
            assert not link.startswith(("/", "http")), (page, link)
            assert (ROOT / page).parent.joinpath(link).exists(), (page, link)


def _files(tmp_path, *pages: str) -> None:
    """Write the file-named blocks of ``pages`` into ``tmp_path``."""
    for page in pages:
        for b in named_blocks(page):
            if "." in b.name:
                (tmp_path / b.name).write_text(b.text)


def _printed(b, namespace: dict | None = None) -> tuple[dict, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        ns = run_python(b, namespace)
    return ns, out.getvalue()


def _verified_or_out_of_time(res) -> None:
    """The result verified and is no dearer, or its search ran out of time and says so."""
    if res.verified is None:
        assert res.stats.get("time_limited"), res.stats
        assert "time limit" in (res.stats.get("note") or ""), res.stats.get("note")
        return
    assert res.verified.equivalent, res.verified
    assert res.cost_us <= res.baseline_cost_us


# -- install.md ----------------------------------------------------------------------------


@runs("docs/install.md", "install")
def test_install_commands_are_the_makefiles():
    """Not run (installing takes minutes and a package index): the commands are the ones
    ``make`` runs, as its dry run prints them (less pip's -q and its own upgrade)."""
    dry = subprocess.run(["make", "-n", "-B", "install", "VENV=.venv"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    made = [" ".join(w for w in ln.split() if w != "-q") for ln in dry.splitlines()]
    for line in block("docs/install.md", "install").text.splitlines():
        assert line in made, (line, made)


@runs("docs/install.md", "install-gpu")
def test_install_gpu_extra_exists():
    """Not run (it needs a GPU machine with its own CUDA torch): the extra it names exists
    and asks for the triton the page names."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert block("docs/install.md", "install-gpu").text.strip() == 'pip install -e ".[torch]"'
    assert "triton>=3.6" in extras["torch"]
    assert set(extras) >= {"torch", "ray", "hf", "dev"}


@runs("docs/install.md", "quick-tests")
def test_quick_run_deselects_the_slow_tests():
    """The quick run's command, on one file of slow tests only (running it on every file
    would run this suite inside itself): everything is deselected."""
    words = shlex.split(block("docs/install.md", "quick-tests").text)
    assert words[0] == "TRITON_INTERPRET=1" and words[2:] == ["-m", "pytest", "-q", "-m",
                                                              "not slow"]
    cmd = [sys.executable, *words[2:], "--collect-only", "-p", "no:randomly",
           "tests/dynamo/test_hf_models.py"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "TRITON_INTERPRET": "1"})
    assert re.search(r"no tests collected \(\d+ deselected\)", done.stdout), done.stdout[-500:]


# -- api.md --------------------------------------------------------------------------------


@runs("docs/api.md", "api-build")
def test_api_build_and_evaluate():
    ns, out = _printed(block("docs/api.md", "api-build"))
    assert "graph gqa(" in out and ns["out"]["O"].shape == (2, 256, 64)
    ref, native = ns["out"]["O"], ns["native"]["O"]
    assert np.abs(native - ref).max() <= 2e-2 * np.abs(ref).max()


@runs("docs/api.md", "api-masks")
def test_api_masks_match_numpy():
    ns = run_python(block("docs/api.md", "api-masks"))
    x = ns["x"]
    s = x["q"] @ x["k"] * 0.125
    s = np.where(np.tril(np.ones((16, 16), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ x["v"]
    assert np.allclose(ns["o"], want, rtol=1e-9, atol=1e-12)


def test_api_masks_search_is_what_the_page_says():
    """Two kernels at 8.76 us against 30.03 one kernel per op (h100), and the causal mask
    printed as computed from positions, not written (the page's paragraph under the
    block)."""
    ns = run_python(block("docs/api.md", "api-masks"))
    res = em.optimize(ns["g"], target="h100", cache=False)
    text = str(res.program)
    kernels = [line for line in text.splitlines() if line.startswith("  kernel ")]
    assert len([k for k in kernels if " causal " not in k]) == 2, text
    (causal,) = [k for k in kernels if " causal " in k]
    assert "computed from positions in the kernels that read it; not written" in causal
    assert (round(res.cost_us, 2), round(res.baseline_cost_us, 2)) == (8.76, 30.03)


@runs("docs/api.md", "api-int8")
def test_api_int8_weights_one_kernel():
    ns = run_python(block("docs/api.md", "api-int8"))
    x = ns["inputs"]
    want = x["x"] @ ((x["Wq"] - x["z"]) * x["s"])
    assert np.allclose(ns["y"], want, rtol=1e-9, atol=1e-12)
    res = ns["res"]
    _verified_or_out_of_time(res)
    if res.verified and res.verified.equivalent:
        assert len(res.program.kernels) == 1 and "tl.load(Wq_ptrs" in res.triton_source()


@runs("docs/api.md", "api-fp8")
def test_api_fp8_weights_one_kernel():
    ns = run_python(block("docs/api.md", "api-fp8"))
    x = ns["inputs"]
    want = x["x"] @ (x["Wq"] * x["s"]).T
    assert np.allclose(ns["y"], want, rtol=1e-9, atol=1e-12)
    res = ns["res"]
    _verified_or_out_of_time(res)
    if res.verified and res.verified.equivalent:
        assert len(res.program.kernels) == 1 and "tl.load(Wq_ptrs" in res.triton_source()


@runs("docs/api.md", "api-int4")
def test_api_int4_weights():
    ns = run_python(block("docs/api.md", "api-int4"))
    x, k, n, g = ns["inputs"], ns["K"], ns["N"], ns["G"]
    q = np.stack([x["Wp"] & 0xF, x["Wp"] >> 4], axis=1).reshape(k, n)
    w = ((q.reshape(k // g, g, n) - 8.0) * x["s"][:, None, :]).reshape(k, n)
    assert np.allclose(ns["y"], x["x"] @ w, rtol=1e-9, atol=1e-12)
    res = ns["res"]
    _verified_or_out_of_time(res)
    if res.verified and res.verified.equivalent:
        assert "tl.load(Wp_ptrs" in res.triton_source()


@runs("docs/api.md", "api-int4-regrouped")
def test_api_int4_regrouped_equals_the_written_form():
    first = block("docs/api.md", "api-int4")  # its search left out: not what is tested here
    ns = run_python(dataclasses.replace(first, text=first.text.replace("em.optimize(g)", "g")))
    run_python(block("docs/api.md", "api-int4-regrouped"), ns)
    out = em.evaluate(ns["g"], ns["inputs"])
    assert np.allclose(out["y2"], out["y"], rtol=1e-9, atol=1e-12)


@pytest.mark.slow  # a GQA search, a kernel-level search, a verification and a picture
@runs("docs/api.md", "api-optimize")
def test_api_optimize(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ns, _ = _printed(block("docs/api.md", "api-build"))
    ns, out = _printed(block("docs/api.md", "api-optimize"), ns)
    _verified_or_out_of_time(ns["res"])
    assert "@triton.jit" in ns["src"] and (tmp_path / "gqa.svg").stat().st_size > 1000
    assert ns["r"].equivalent and out.strip().endswith("None")  # no counterexample


@pytest.mark.slow  # two attention layers: cut, searched once, stitched, checked end to end
@runs("docs/api.md", "api-whole")
def test_api_whole_program():
    ns, out = _printed(block("docs/api.md", "api-whole"))
    pieces = ns["wres"].stats["pieces"]
    assert len(pieces) == 2 and pieces[1]["same_as"] == 0  # the equal piece searched once
    assert len(out.splitlines()) == 2
    if all(p["status"] == "optimized" for p in pieces):
        assert ns["wres"].verified.equivalent
    else:  # only the machine's load may keep a piece as it was
        assert all(p["status"] == "optimized" or p.get("time_limited") for p in pieces), pieces


@runs("docs/api.md", "api-compile")
def test_api_compile_runs_and_matches_torch():
    torch = pytest.importorskip("torch")
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("res.compile() on a CPU needs TRITON_INTERPRET=1 (make test sets it)")
    ns = run_python(block("docs/api.md", "api-compile"))
    a = ns["args"]
    want = torch.nn.functional.silu(a["x"] @ a["w1"]) * (a["x"] @ a["w2"])
    torch.testing.assert_close(ns["y"]["y"], want, rtol=1e-4, atol=1e-4)


# -- pytorch.md ----------------------------------------------------------------------------


@runs("docs/pytorch.md", "from-torch")
def test_pytorch_from_torch():
    ns = run_python(block("docs/pytorch.md", "from-torch"))
    assert list(ns["g"].inputs) == ["q", "k", "v"] and list(ns["g"].outputs) == ["out"]
    _verified_or_out_of_time(ns["res"])


@runs("docs/pytorch.md", "unsupported")
def test_pytorch_unsupported_op_names_it():
    b = block("docs/pytorch.md", "unsupported")
    _, out = _printed(b)
    source = "return torch.sort(x, dim=-1).values[..., -4:]"
    line = b.line + 1 + [ln.strip() for ln in b.text.splitlines()].index(source)
    assert out.startswith(f"unsupported op torch.sort at pytorch.md:{line} (`{source}`)"), out


@runs("docs/pytorch.md", "moe")
@pytest.mark.slow  # a search of the experts' MLP
def test_pytorch_mixture_of_experts():
    """The MoE block prints what the page says: one module bound, equal to eager, every
    expert hit served by the optimized MLP (or, on a loaded machine, a search that ran out
    of time, which must say so)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    torch._dynamo.reset()
    ns, out = _printed(block("docs/pytorch.md", "moe"))
    torch._dynamo.reset()
    lines = out.splitlines()
    assert lines[:2] == ["1 experts module bound", "True"], out
    mlp = [r for r in ns["be"].report if "torch.nn.functional.silu" in r.ops]
    assert mlp, [r.ops for r in ns["be"].report]
    if all(r.status == "optimized" for r in mlp):
        assert lines[2] == "True 4 expert calls", out
    else:
        assert any("time limit" in r.reason for r in mlp), [r.reason for r in mlp]


@runs("docs/pytorch.md", "backend", "backend-warning")
def test_pytorch_backend(recwarn):
    """The block asserts the compiled model equals the model; the summary is consistent and
    the warning has the form of the page's warning block (that block's own figures are
    the README's Hugging Face layer: tests/test_readme.py checks them)."""
    torch = pytest.importorskip("torch")
    torch._dynamo.reset()
    ns, out = _printed(block("docs/pytorch.md", "backend"))
    torch._dynamo.reset()
    s = ns["be"].summary()
    assert s["ops"] == 4 and out.startswith("{'ops': 4"), out
    (entry,) = ns["be"].report
    if entry.status == "optimized":
        assert s["optimized_ops"] == 4 and s["predicted_us"][1] < s["predicted_us"][0]
    else:  # the search ran out of time on a loaded machine: the reason says so
        assert "time limit" in entry.reason, entry.reason
    warned = [str(w.message) for w in recwarn if str(w.message).startswith("eqsat-mirage: ")]
    assert len(warned) == 1 and re.match(
        rf"eqsat-mirage: {s['optimized_ops']} of 4 ops in {s['optimized_partitions']} "
        r"optimized partitions \((predicted [\d.]+ us -> [\d.]+ us|not priced: nothing "
        r"optimized)\)", warned[0]), warned


# -- dynamic.md ----------------------------------------------------------------------------


@pytest.mark.slow  # a family search verified at six sizes, then Triton at two lengths
@runs("docs/dynamic.md", "family")
def test_dynamic_family():
    torch = pytest.importorskip("torch")
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("res.compile() on a CPU needs TRITON_INTERPRET=1 (make test sets it)")
    torch.manual_seed(0)
    ns, out = _printed(block("docs/dynamic.md", "family"))
    res, fam = ns["res"], ns["res"].stats["family"]
    if res.verified is not None:
        assert all(fam["verified_sizes"].values()) and len(fam["verified_sizes"]) == 6
        assert out.startswith("{512: True, 511: True, 513: True"), out
    assert ns["plan"].inputs["k"].shape[2] >= 700
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 16, 64), torch.randn(2, 64, 700), torch.randn(2, 700, 64)
    want = torch.softmax((q @ k) * 0.125, -1) @ v
    torch.testing.assert_close(ns["fn"](q, k, v)["o"], want, rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # a family search through torch.compile, four decode steps
@runs("docs/dynamic.md", "dynamo-decode")
def test_dynamic_decode_through_torch_compile():
    torch = pytest.importorskip("torch")
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ns, out = _printed(block("docs/dynamic.md", "dynamo-decode"))
    torch._dynamo.reset()
    q, k, v = ns["q"], ns["k_cache"][:, :, :515], ns["v_cache"][:, :, :515]
    want = ns["decode_step"](q, k, v)
    torch.testing.assert_close(ns["out"], want, rtol=1e-4, atol=1e-4)
    shown = re.search(r"It prints `([^`]*)`", (ROOT / "docs/dynamic.md").read_text())
    pattern = r"symbolic size s\d+=512; specialized at s\d+=64, s\d+=4"
    assert shown and re.fullmatch(pattern, shown[1]), "docs/dynamic.md shows no sizes line"
    assert re.fullmatch(pattern, out.strip()), out
    warned = [str(w.message) for w in caught if str(w.message).startswith("eqsat-mirage: ")]
    assert len(warned) == 1 and f"{out.strip()}, one search serves every value" in warned[0]
    (entry,) = ns["be"].report  # one search for the four lengths
    assert entry.status == "optimized" or "time limit" in entry.reason, entry.reason


# -- cli.md and rules.md -------------------------------------------------------------------


@pytest.mark.slow  # a verification, a search with its Triton module and picture, rule checks
@runs("docs/cli.md", "lora.py", "lora_merged.py", "cli-examples", "check-rules-output")
@runs("docs/rules.md", "my_rules.egg")
def test_cli_examples(tmp_path, monkeypatch, capsys):
    from eqsat_mirage.cli.main import main

    _files(tmp_path, "docs/cli.md", "docs/rules.md")
    monkeypatch.chdir(tmp_path)
    outputs = {}
    for line in block("docs/cli.md", "cli-examples").text.splitlines():
        words = shlex.split(line)
        assert words[0] == "eqsat-mirage"
        code = main(words[1:])
        outputs[words[1]] = capsys.readouterr().out
        assert code == 0 or (words[1] == "optimize" and "time limit" in outputs["optimize"]), (
            line, outputs[words[1]][-1500:])
    assert "lora.py vs lora_merged.py:\n  equivalent" in outputs["verify"]
    if (tmp_path / "lora_triton.py").exists():  # written unless the search ran out of time
        assert "@triton.jit" in (tmp_path / "lora_triton.py").read_text()
    assert (tmp_path / "lora.svg").stat().st_size > 1000
    assert "h100" in outputs["targets"] and "lora" in outputs["cache"] or \
        "time limit" in outputs["optimize"]
    shown = block("docs/cli.md", "check-rules-output").text.splitlines()
    got = outputs["check-rules"].splitlines()
    assert got[:-1] == shown[:-1]  # the table and its verdicts, verbatim
    assert got[-1].split(" rules, ")[0] == shown[-1].split(" rules, ")[0]  # not the seconds


def test_cli_worked_example_is_real(capsys):
    """The worked example's programs verbatim, and its cost figures, from a fresh search
    (its command line is the page's, checked below)."""
    from eqsat_mirage.cli.main import main

    shown = block("docs/cli.md", "worked-example").text
    # the page's command with room for a loaded machine: a search ends when it is done
    assert main(["optimize", "--bench", "gqa", "--quiet", "--no-cache", "--time-limit", "600"]) == 0
    out = capsys.readouterr().out
    command = "`eqsat-mirage optimize --bench gqa --no-cache --quiet --render gqa.png`"
    assert command in (ROOT / "docs/cli.md").read_text().split("```text worked-example")[0]
    programs = shown.split("\nphase ")[0]
    assert programs.strip() and programs.strip() in out
    for prefix in ("kernels ", "cost ", "  fusion plan for", "tiling "):
        line = next(ln for ln in shown.splitlines() if ln.startswith(prefix))
        if prefix == "tiling ":  # iterations and e-nodes, not the seconds
            line = " ".join(line.split()[:3])
            assert any(" ".join(ln.split()[:3]) == line for ln in out.splitlines())
        elif prefix == "  fusion plan for":
            assert line.split(";")[0] in out
        else:
            assert line in out, line


TESTED.add(("docs/cli.md", "worked-example"))


@runs("docs/rules.md", "rules-api")
def test_rules_api(tmp_path, monkeypatch):
    _files(tmp_path, "docs/rules.md")
    monkeypatch.chdir(tmp_path)
    ns, out = _printed(block("docs/rules.md", "rules-api"))
    assert ns["report"].ok and "True ['sound', 'sound']" in out
    _verified_or_out_of_time(ns["res"])


@runs("docs/rules.md", "unsound.egg", "rules-unsound")
def test_rules_unsound_rule_is_refused(tmp_path, monkeypatch):
    _files(tmp_path, "docs/rules.md")
    monkeypatch.chdir(tmp_path)
    _, out = _printed(block("docs/rules.md", "rules-unsound"))
    assert "unsound.egg:3: unsound rule 'wrong: a quotient" in out, out


RULE_EXCERPTS = {"tiling-excerpt": "tiling.egg", "block-excerpt": "block.egg",
                 "online-excerpt": "block.egg", "thread-excerpt": "thread.egg"}


@runs("docs/rules.md", *RULE_EXCERPTS)
@pytest.mark.parametrize("name", sorted(RULE_EXCERPTS))
def test_rules_excerpt_is_in_its_rule_file(name):
    text = (ROOT / "rules" / RULE_EXCERPTS[name]).read_text()
    assert block("docs/rules.md", name).text in text


@pytest.mark.slow  # two searches with user block files
@runs("docs/rules.md", "loops16.egg", "rules-block")
def test_rules_block_files_change_the_plan(tmp_path, monkeypatch):
    _files(tmp_path, "docs/rules.md")
    monkeypatch.chdir(tmp_path)
    ns, out = _printed(block("docs/rules.md", "rules-block"))
    assert out == "[16]\nFalse\n", out
    _verified_or_out_of_time(ns["res"])


# -- cache.md and limits.md ----------------------------------------------------------------


@runs("docs/cache.md", "cache")
def test_cache_and_optimize_many():
    ns, out = _printed(block("docs/cache.md", "cache"))
    if not ns["first"].stats.get("time_limited"):
        assert out.startswith("miss hit\n") and ns["again"].stats["cache"] == "hit", out
    assert ns["fresh"].stats["cache"] == "off"
    results = ns["results"]
    assert len(results) == 3 and results[0].cost_us == results[2].cost_us
    assert all(r.verified.equivalent for r in results if r.verified is not None)


@runs("docs/cache.md", "cache-commands")
def test_cache_commands(capsys):
    from eqsat_mirage.cli.main import main
    from eqsat_mirage.pipeline.cache import default_path

    em.optimize(_small(), level="kernel")  # one entry to list
    for line in block("docs/cache.md", "cache-commands").text.splitlines():
        words = shlex.split(line)
        assert main(words[1:]) == 0, line
        out = capsys.readouterr().out
        if words[2] == "path":
            assert out.strip() == str(default_path())
        elif words[2] == "list":
            assert "small" in out or "no cached results" in out
        else:
            assert main(["cache", "list"]) == 0
            assert "no cached results" in capsys.readouterr().out


def _small():
    g = em.Graph("small")
    a, b = g.input("A", (32, 32)), g.input("B", (32, 32))
    g.output((a @ b) @ g.input("C", (32, 4)), "O")
    return g


@pytest.mark.slow  # a bounded search, then a program refused for its memory
@runs("docs/limits.md", "limits")
def test_limits(monkeypatch):
    # the block sets the budget in os.environ: recorded by setenv first, so that it is
    # removed again afterwards (a delenv of an unset variable records nothing to undo, and
    # the block's 256M then refused every later test's verification)
    monkeypatch.setenv("EQSAT_MIRAGE_MEMORY_BUDGET", "8G")
    monkeypatch.delenv("EQSAT_MIRAGE_MEMORY_BUDGET")
    ns, out = _printed(block("docs/limits.md", "limits"))
    _verified_or_out_of_time(ns["res"])
    first, refusal = out.splitlines()[0], out.splitlines()[-1]
    assert first.startswith("equivalent" if ns["res"].verified else "None True time limit")
    assert refusal.startswith("verifying 'big_scores' would hold") and "exp (8, 1024, 4096)" \
        in refusal, refusal


# -- verifier.md ---------------------------------------------------------------------------


@runs("docs/verifier.md", "verify-call")
def test_verify_call():
    ns, out = _printed(block("docs/verifier.md", "verify-call"))
    assert ns["r"].equivalent
    assert out.startswith("equivalent (false-positive bound 1.43e-25 after 4 trials"), out


@runs("docs/verifier.md", "primes-and-trials")
def test_primes_and_trials():
    _, out = _printed(block("docs/verifier.md", "primes-and-trials"))
    bound = {(int(b), int(t)): float(x) for b, t, x, _ in (ln.split() for ln in
                                                           out.splitlines())}
    assert sorted(bound) == [(16, 1), (16, 4), (30, 1), (30, 4)]
    for bits in (16, 30):  # more trials, a smaller bound; wider primes, a smaller one
        assert bound[bits, 4] < bound[bits, 1] < 1.0
    assert bound[30, 1] < bound[16, 1] and bound[30, 4] < bound[16, 4]


# -- whole_programs.md ---------------------------------------------------------------------


@runs("docs/whole_programs.md", "whole-program")
def test_whole_program():
    ns, out = _printed(block("docs/whole_programs.md", "whole-program"))
    res = ns["res"]
    assert len(res.stats["pieces"]) >= 2  # exp twice on a path: cut
    _verified_or_out_of_time(res)
    assert "kernel" in out and "output P" in out, out
