"""Issue 51: a rule's name is a comment in a user's file; the check-rules table, its
reasons, ``assert_sound``'s error and the CLI's "rules fired" write its control characters
(ESC, BEL, NUL, a direction override) as escapes, so an unsound rule cannot display as sound."""

from __future__ import annotations

import pytest

import eqsat_mirage as em
from eqsat_mirage.cli.main import main, summary
from eqsat_mirage.egraph.rule_report import printable

EVIL = "\x1b[2K\x1b[1G\x1b[32msound\x1b[0m all fine\x07\x00\u202e"


def shows_no_control(text: str) -> None:
    bad = [c for c in text if not c.isprintable() and c != "\n"]
    assert not bad, bad


def rule_file(tmp_path, rewrite: str):
    path = tmp_path / "evil\x1b[1m.egg"
    path.write_text(f"(ruleset user)\n; {EVIL}\n(rewrite {rewrite} :ruleset user)\n")
    return path


def test_printable_escapes_what_does_not_print():
    assert printable("plain name, (a + b)") == "plain name, (a + b)"
    assert printable("a\x1bb\x07\x00\n\u202e") == "a\\x1bb\\x07\\x00\\n\\u202e"


def test_the_report_and_assert_sound_escape_a_rule_name(tmp_path):
    path = rule_file(tmp_path, "(Add a b) (Mul a b)")  # unsound
    report = em.check_rules(str(path))
    assert report.results[0].status == "unsound"
    text = str(report)
    shows_no_control(text)
    assert "\\x1b[2K\\x1b[1G\\x1b[32msound" in text and "unsound" in text
    with pytest.raises(em.RuleError) as err:
        em.assert_sound(str(path))
    shows_no_control(str(err.value))


def test_the_cli_check_rules_output_escapes_a_rule_name(tmp_path, capsys):
    path = rule_file(tmp_path, "(Add a b) (Mul a b)")
    assert main(["check-rules", str(path)]) == 1
    out = capsys.readouterr().out
    shows_no_control(out)
    assert "\\x07\\x00\\u202e" in out


def test_the_cli_summary_escapes_the_rules_fired(tmp_path):
    path = rule_file(tmp_path, "(Add a b) (Add b a)")  # sound: it loads and fires
    g = em.Graph("g")
    x, y = g.input("x", (4, 8), dtype="float32"), g.input("y", (4, 8), dtype="float32")
    g.output(em.exp(x + y), "o")
    res = em.optimize(g, rules=["rules", str(path)], cache=False, compile_check=False)
    fired = {r for ph in res.stats["phases"] for r in ph.get("rules_fired", {})}
    assert any("\x1b" in r for r in fired)  # the name as written is kept in the stats
    text = summary(res)
    shows_no_control(text)
    assert "\\x1b[32msound" in text
