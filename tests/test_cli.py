"""The optimize, check-rules and targets subcommands of the CLI."""

from eqsat_mirage.cli import main

PROGRAM = """
import eqsat_mirage as em
program = em.Graph("chain")
A = program.input("A", (256, 256), dtype="float32")
B = program.input("B", (256, 256), dtype="float32")
C = program.input("C", (256, 4), dtype="float32")
program.output((A @ B) @ C, "O")
"""


def test_optimize_file_prints_program_and_summary(tmp_path, capsys):
    path = tmp_path / "chain.py"
    path.write_text(PROGRAM)
    assert main(["optimize", str(path), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "chosen program:" in out and "phase" in out and "verified     equivalent" in out
    assert "one kernel per op" in out


def test_optimize_shows_progress_on_stderr(tmp_path, capsys):
    path = tmp_path / "chain.py"
    path.write_text(PROGRAM)
    assert main(["optimize", str(path)]) == 0
    assert "algebraic: iteration 1" in capsys.readouterr().err


def test_optimize_needs_exactly_one_program(capsys):
    assert main(["optimize"]) == 2
    assert "either PROGRAM.py or --bench" in capsys.readouterr().err


def test_optimize_refuses_unsound_user_rules(tmp_path, capsys):
    path = tmp_path / "chain.py"
    path.write_text(PROGRAM)
    rules = tmp_path / "bad.egg"
    rules.write_text("(ruleset user)\n; matmul commutes\n(rewrite (MatMul a b) (MatMul b a)"
                     " :ruleset user)\n")
    assert main(["optimize", str(path), "--rules", "rules", "--rules", str(rules),
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "bad.egg:3" in err and "unsound" in err


def test_check_rules_exit_codes(tmp_path, capsys):
    good = tmp_path / "good.egg"
    good.write_text("(ruleset user)\n; add commutes\n(rewrite (Add a b) (Add b a) :ruleset user)\n")
    assert main(["check-rules", str(good)]) == 0
    bad = tmp_path / "bad.egg"
    bad.write_text("(ruleset user)\n; exp of a sum\n(rewrite (Exp (Add a b)) (Add (Exp a) (Exp b))"
                   " :ruleset user)\n")
    assert main(["check-rules", str(bad)]) == 1
    broken = tmp_path / "broken.egg"
    broken.write_text("(ruleset user)\n(rewrite (Frob a) a :ruleset user)\n")
    assert main(["check-rules", str(broken)]) == 2
    assert "broken.egg:2" in capsys.readouterr().err


def test_targets_lists_profiles(capsys):
    assert main(["targets"]) == 0
    out = capsys.readouterr().out
    assert "h100" in out and "a100" in out and "h200" in out
