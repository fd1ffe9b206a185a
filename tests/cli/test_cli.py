"""The optimize, check-rules and targets subcommands of the CLI."""

import pytest

from eqsat_mirage.cli.main import main

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


# ------------------------------------------------------------- results cache, several files

SINGLE = """
import eqsat_mirage as em
program = em.Graph("single")
A = program.input("A", (64, 64), dtype="float32")
B = program.input("B", (64, 64), dtype="float32")
program.output(A @ B, "O")
"""

NO_OUTPUT = """
import eqsat_mirage as em
program = em.Graph("hollow")
program.input("A", (64, 64), dtype="float32")
"""


def write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_optimize_twice_hits_the_cache(tmp_path, capsys):
    chain = write(tmp_path, "chain.py", PROGRAM)
    assert main(["optimize", chain, "--quiet", "--level", "kernel"]) == 0
    assert "cache        miss (stored as " in capsys.readouterr().out
    assert main(["optimize", chain, "--level", "kernel"]) == 0
    captured = capsys.readouterr()
    assert "cache        hit (key " in captured.out and "cache hit: chain" in captured.err
    assert main(["optimize", chain, "--quiet", "--level", "kernel", "--no-cache"]) == 0
    assert "cache        off" in capsys.readouterr().out


def test_cache_dir_and_the_cache_command(tmp_path, capsys):
    chain, mine = write(tmp_path, "chain.py", PROGRAM), tmp_path / "mine"
    assert main(["optimize", chain, "--quiet", "--level", "kernel", "--cache-dir",
                 str(mine)]) == 0
    assert (mine / "results.sqlite").is_file()
    capsys.readouterr()
    assert main(["cache", "path", "--cache-dir", str(mine)]) == 0
    assert capsys.readouterr().out.strip() == str(mine / "results.sqlite")
    assert main(["cache", "list", "--cache-dir", str(mine)]) == 0
    out = capsys.readouterr().out
    assert "1 cached results" in out and "chain" in out and "kernel" in out and "key" in out
    assert main(["cache", "list"]) == 0  # the default cache (the test's) is still empty
    assert "no cached results" in capsys.readouterr().out
    assert main(["cache", "clear", "--cache-dir", str(mine)]) == 0
    assert "removed 1 cached results" in capsys.readouterr().out
    assert main(["cache", "list", "--cache-dir", str(mine)]) == 0
    assert "no cached results" in capsys.readouterr().out


def test_cache_path_follows_the_environment(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("EQSAT_MIRAGE_CACHE_DIR", str(tmp_path / "env"))
    assert main(["cache", "path"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "env" / "results.sqlite")


def test_no_cache_and_cache_dir_exclude_each_other(tmp_path, capsys):
    chain = write(tmp_path, "chain.py", PROGRAM)
    with pytest.raises(SystemExit) as info:
        main(["optimize", chain, "--no-cache", "--cache-dir", str(tmp_path)])
    assert info.value.code == 2
    assert "not allowed with" in capsys.readouterr().err


def test_optimize_found_nothing_exits_1(tmp_path, capsys):
    single = write(tmp_path, "single.py", SINGLE)
    assert main(["optimize", single, "--quiet", "--level", "kernel"]) == 1
    assert "(1.00x" in capsys.readouterr().out


def test_help_documents_the_exit_status(capsys):
    for argv in (["--help"], ["optimize", "--help"], ["cache", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
        out = capsys.readouterr().out
        assert "exit status:" in out and "found nothing" in out and "2  usage or input" in out


def test_optimize_several_files_in_parallel(tmp_path, capsys):
    chain, single = write(tmp_path, "chain.py", PROGRAM), write(tmp_path, "single.py", SINGLE)
    assert main(["optimize", chain, single, "--jobs", "2", "--level", "kernel"]) == 1
    captured = capsys.readouterr()
    assert f"== {chain} ==" in captured.out and f"== {single} ==" in captured.out
    table = captured.out[captured.out.index("file "):]
    assert "chain" in table and "found" in table and "nothing" in table
    assert "[1/2]" in captured.err and "[2/2]" in captured.err
    assert main(["optimize", chain, chain, "--level", "kernel"]) == 0
    assert capsys.readouterr().err.count("(cache hit)") == 2


def test_optimize_several_files_with_an_error(tmp_path, capsys):
    chain, hollow = write(tmp_path, "chain.py", PROGRAM), write(tmp_path, "hollow.py", NO_OUTPUT)
    assert main(["optimize", chain, hollow, "--quiet", "--level", "kernel"]) == 2
    captured = capsys.readouterr()
    assert f"error: {hollow}: GraphError" in captured.err and "no outputs" in captured.err
    assert "found" in captured.out  # the other program was still optimized
    assert main(["optimize", chain, hollow, "--emit", str(tmp_path / "o.py")]) == 2
    assert "take a single program" in capsys.readouterr().err
    assert main(["optimize", chain, "--jobs", "0"]) == 2


def test_bench_cache_options_restore_the_environment(monkeypatch, capsys):
    import os

    before = dict(os.environ)
    assert main(["bench", "--gpu", "--bench", "lora", "--batch", "1", "--no-cache"]) == 2
    assert dict(os.environ) == before
    assert "error:" in capsys.readouterr().err


def test_optimize_renders_a_picture(tmp_path, capsys):
    path = tmp_path / "chain.py"
    path.write_text(PROGRAM)
    pic = tmp_path / "out.svg"
    assert main(["optimize", str(path), "--quiet", "--render", str(pic)]) == 0
    assert "wrote the picture" in capsys.readouterr().out
    text = pic.read_text()
    assert text.startswith("<?xml") and "legend" in text


def test_render_takes_one_program(tmp_path, capsys):
    path = tmp_path / "chain.py"
    path.write_text(PROGRAM)
    assert main(["optimize", str(path), str(path), "--render", str(tmp_path / "x.svg")]) == 2
    assert "--render take a single program" in capsys.readouterr().err


def test_verify_accepts_an_emitted_mugraph(tmp_path, capsys):
    path = tmp_path / "chain.py"
    path.write_text(PROGRAM)
    mg = tmp_path / "chosen.json"
    assert main(["optimize", str(path), "--quiet", "--emit-json", str(mg)]) == 0
    assert main(["verify", str(path), str(mg), "--trials", "2"]) == 0
    assert "equivalent" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text('{"kernels": 3}')
    assert main(["verify", str(path), str(bad)]) == 2
    assert "not a MuGraph JSON file" in capsys.readouterr().err


FAMILY = """
import eqsat_mirage as em
program = em.Graph("decode_attention")
q = program.input("Q", (2, 4, 64))
k = program.input("K", (2, 64, em.Dim("L", hint=256)))
v = program.input("V", (2, "L", 64))
program.output(em.softmax(q @ k, axis=-1) @ v, "O")
"""


def test_optimize_reports_a_shape_family(tmp_path, capsys):
    path = tmp_path / "family.py"
    path.write_text(FAMILY)
    assert main(["optimize", str(path), "--quiet", "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert "family       L(hint=256): planned at L = 256" in out
    assert "verified at L = 256, 255, 257, 263" in out and "cost at    L = 256:" in out
