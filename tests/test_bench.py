"""The benchmark programs (bench/programs.py), the verification table script and the CLI."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

import eqsat_mirage as em
from bench import programs as bp
from bench import verify_bench
from eqsat_mirage.cli.main import main

# DESIGN.md's table, written out independently of bench/programs.py (b = batch size).
EXPECTED_INPUTS = {
    "gqa": lambda b: {"Q": (2 * b, 256, 64), "K": (2 * b, 64, 4096), "V": (2 * b, 4096, 64)},
    "qknorm": lambda b: {"Q": (2 * b, 256, 64), "K": (2 * b, 64, 4096), "V": (2 * b, 4096, 64)},
    "rmsnorm": lambda b: {"X": (2 * b, 4096), "W": (4096, 6144)},
    "lora": lambda b: {"X": (16, 256), "W": (256, 4096), "A": (256, 16), "B": (16, 4096)},
    "gatedmlp": lambda b: {"X": (8, 4096), "W1": (4096, 4096), "W2": (4096, 4096)},
    "ntrans": lambda b: {"H": (8 * b, 4096), "X": (8 * b, 4096), "alpha": (8 * b, 4096)},
}
EXPECTED_OUTPUT = {
    "gqa": lambda b: (2 * b, 256, 64),
    "qknorm": lambda b: (2 * b, 256, 64),
    "rmsnorm": lambda b: (2 * b, 6144),
    "lora": lambda b: (16, 4096),
    "gatedmlp": lambda b: (8, 4096),
    "ntrans": lambda b: (8 * b, 4096),
}
CASES = list(bp.cases())


def test_registry_and_cases():
    assert list(bp.BENCHMARKS) == ["gqa", "qknorm", "rmsnorm", "lora", "gatedmlp", "ntrans"]
    assert CASES == [(n, b) for n in bp.BENCHMARKS for b in (1, 8)]
    assert set(bp.REWRITTEN) == set(bp.BENCHMARKS)


@pytest.mark.parametrize("name,batch", CASES)
@pytest.mark.parametrize("build", [bp.program, bp.rewritten], ids=["program", "rewritten"])
def test_programs_build_check_and_match_design_shapes(build, name, batch):
    g = build(name, batch)
    em.check(g)
    em.check_lax(g)
    assert {k: v.shape for k, v in g.inputs.items()} == EXPECTED_INPUTS[name](batch)
    assert {k: v.dtype for k, v in g.inputs.items()} == dict.fromkeys(g.inputs, "float16")
    assert list(g.outputs) == ["O"]
    assert g.outputs["O"].shape == EXPECTED_OUTPUT[name](batch)
    assert {k: v(batch) for k, v in bp.SHAPES.items()}[name] == EXPECTED_INPUTS[name](batch)


def test_batch_independent_benchmarks_keep_design_shapes():
    for name in ("lora", "gatedmlp"):
        assert ({k: v.shape for k, v in bp.program(name, 1).inputs.items()}
                == {k: v.shape for k, v in bp.program(name, 8).inputs.items()})


def test_unknown_benchmark_and_bad_batch_are_project_errors():
    with pytest.raises(em.MirageError, match="unknown benchmark 'attention'"):
        bp.program("attention", 1)
    with pytest.raises(em.MirageError, match="batch size"):
        bp.rewritten("gqa", 0)


@pytest.mark.parametrize("name", ["lora", "ntrans"])
def test_rewritten_form_verifies_quickly(name):
    res = em.verify(bp.program(name, 1), bp.rewritten(name, 1), trials=4, seed=0)
    assert res.equivalent, str(res)
    assert res.false_positive_bound < 1e-20
    assert res.false_positive_bound == pytest.approx(res.per_trial_bound ** 4)
    assert res.seconds < 30


def test_ntrans_float_semantics_agree():
    rng = np.random.default_rng(0)
    inputs = {k: rng.standard_normal(s) for k, s in EXPECTED_INPUTS["ntrans"](1).items()}
    a = em.evaluate(bp.program("ntrans", 1), inputs)["O"]
    b = em.evaluate(bp.rewritten("ntrans", 1), inputs)["O"]
    np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    assert np.allclose(np.mean(a * a, axis=-1), 1.0, atol=1e-4)  # an RMS-normalized result


def test_lora_mutant_is_rejected():
    g = em.Graph("lora_mutant")
    x, w, a, b = (g.input(k, s) for k, s in EXPECTED_INPUTS["lora"](1).items())
    g.output(x @ w - (x @ a) @ b, "O")
    res = em.verify(bp.program("lora", 1), g, trials=2, seed=0)
    assert not res.equivalent and res.counterexample is not None


# ---------------------------------------------------------------- verify_bench


def test_verify_bench_table_and_results_section(tmp_path, capsys):
    rows = verify_bench.run_cases([("lora", 1), ("ntrans", 1)], trials=2, seed=0)
    assert [r.result.equivalent for r in rows] == [True, True]
    text = verify_bench.format_table(rows)
    assert text.splitlines()[0].split()[:3] == ["benchmark", "batch", "verdict"]
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n## Verification\nold table\n\n## Search\nkeep me\n")
    section = verify_bench.section(rows, "python bench/verify_bench.py --trials 2", 2, 0)
    verify_bench.write_section(results, section)
    verify_bench.write_section(results, section)  # idempotent: replaced, not appended
    out = results.read_text()
    assert out.count("## Verification") == 1 and "old table" not in out
    assert "## Search\nkeep me" in out
    assert "Command: `python bench/verify_bench.py --trials 2`" in out
    assert "| lora | 1 | equivalent |" in out and "Machine: " in out


def test_verify_bench_script_main(tmp_path, capsys):
    out_file = tmp_path / "R.md"
    rc = verify_bench.main(["--bench", "ntrans", "--batch", "1", "--trials", "1",
                            "--write", str(out_file)])
    assert rc == 0
    assert "ntrans" in capsys.readouterr().out
    assert "| ntrans | 1 | equivalent |" in out_file.read_text()
    assert verify_bench.main(["--bench", "nope"]) == 2
    assert "error: no benchmark case matches" in capsys.readouterr().err


# ---------------------------------------------------------------- CLI

PROGRAM = """
import eqsat_mirage as em

g = em.Graph("{name}")
X = g.input("X", (4, 8), dtype="float32")
W = g.input("W", (8, 6), dtype="float32")
A = g.input("A", (8, 2), dtype="float32")
B = g.input("B", (2, 6), dtype="float32")
g.output({expr}, "O")
program = g
"""


def _write(tmp_path, fname, text):
    path = tmp_path / fname
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_cli_demo_lora_rewritten(capsys):
    assert main(["demo", "--bench", "lora", "--rewritten"]) == 0
    out = capsys.readouterr().out
    assert "equivalent" in out and "NOT" not in out
    assert "graph lora_b1(" in out and "graph lora_b1_rewritten(" in out
    assert "false-positive bound" in out


def test_cli_demo_lora_optimizes(capsys):
    assert main(["demo", "--bench", "lora", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "graph lora_b1(" in out and "chosen program:" in out
    assert "verified     equivalent" in out and "one kernel per op" in out


def test_cli_verify_equivalent_mutant_and_missing_program(tmp_path, capsys):
    a = _write(tmp_path, "a.py", PROGRAM.format(name="a", expr="X @ W + (X @ A) @ B"))
    b = _write(tmp_path, "b.py", PROGRAM.format(
        name="b", expr="em.concat([X, X @ A], axis=1) @ em.concat([W, B], axis=0)"))
    mutant = _write(tmp_path, "mutant.py", PROGRAM.format(name="m", expr="X @ W + (X @ A) @ B * 2"))
    empty = _write(tmp_path, "empty.py", "import eqsat_mirage as em\nx = 1\n")

    assert main(["verify", a, b, "--seed", "0"]) == 0
    assert "equivalent" in capsys.readouterr().out
    assert main(["verify", a, mutant, "--trials", "2", "--seed", "1"]) == 1
    assert "NOT equivalent" in capsys.readouterr().out
    assert main(["verify", a, empty]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "empty.py" in err and "program" in err
    assert "Traceback" not in err


def test_cli_verify_build_function_and_errors(tmp_path, capsys):
    a = _write(tmp_path, "a.py", PROGRAM.format(name="a", expr="X @ W + (X @ A) @ B"))
    built = _write(tmp_path, "built.py", """
        import eqsat_mirage as em

        def build():
            g = em.Graph("built")
            X = g.input("X", (4, 8), dtype="float32")
            W = g.input("W", (8, 6), dtype="float32")
            A = g.input("A", (8, 2), dtype="float32")
            B = g.input("B", (2, 6), dtype="float32")
            g.output(X @ (W + A @ B), "O")
            return g
        """)
    assert main(["verify", built, a, "--seed", "3"]) == 0
    capsys.readouterr()

    bad_shape = _write(tmp_path, "bad_shape.py", """
        import eqsat_mirage as em
        g = em.Graph("bad")
        X = g.input("X", (4, 8))
        program = X @ X
        """)
    assert main(["verify", a, bad_shape]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "bad_shape.py" in err and "Traceback" not in err

    not_graph = _write(tmp_path, "not_graph.py", "program = 42\n")
    assert main(["verify", a, not_graph]) == 2
    assert "not_graph.py" in capsys.readouterr().err

    assert main(["verify", a, str(tmp_path / "missing.py")]) == 2
    assert "missing.py: no such file" in capsys.readouterr().err

    crashing = _write(tmp_path, "crashing.py", "x = 1\ny = x / 0\n")
    assert main(["verify", a, crashing]) == 2
    err = capsys.readouterr().err
    assert "crashing.py (line 2)" in err and "ZeroDivisionError" in err


def test_cli_verify_non_lax_program_is_an_error(tmp_path, capsys):
    a = _write(tmp_path, "a.py", """
        import eqsat_mirage as em
        g = em.Graph("a")
        X = g.input("X", (3, 3))
        g.output(em.exp(em.exp(X)), "O")
        program = g
        """)
    assert main(["verify", a, a]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Lax" in err


def test_cli_bench_verify_and_help(capsys):
    assert main(["bench-verify", "--bench", "lora", "--batch", "1", "--trials", "1"]) == 0
    out = capsys.readouterr().out
    assert "lora" in out and "equivalent" in out
    for cmd in (["--help"], ["demo", "--help"], ["verify", "--help"], ["bench-verify", "--help"]):
        with pytest.raises(SystemExit) as exc:
            main(cmd)
        assert exc.value.code == 0
    assert "usage: eqsat-mirage" in capsys.readouterr().out


def test_cli_benchmark_choices_match_the_registry():
    from eqsat_mirage.cli.parser import BENCH_NAMES

    assert set(BENCH_NAMES) == set(bp.BENCHMARKS) | set(bp.SAFE)


def test_egraph_bench_row_and_table():
    from bench.egraph_bench import PHASES, one, table

    row = one("lora", 1, True)
    nodes = [p["enodes"] for p in row["phases"]]
    assert [p["name"] for p in row["phases"]] == list(PHASES)
    assert nodes == sorted(nodes) and nodes[0] > 0  # phases only add e-nodes
    assert row["json_bytes"] > 0 and row["peak"] >= row["loaded"] >= 0
    lines = table([row]).splitlines()
    assert len(lines) == 3 and lines[2].startswith("| lora b=1 | on | " + " | ".join(
        str(n) for n in nodes))
