"""The typed search state: SearchOptions, Budget, the pass records, the float-check record."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

import eqsat_mirage as em
from eqsat_mirage.ir.limits import Deadline
from eqsat_mirage.pipeline.cache import make_key
from eqsat_mirage.pipeline.options import DEFAULTS, Budget, EntryOptions, SearchOptions
from eqsat_mirage.pipeline.records import PlanningRecord, SearchRecord, VerificationRecord
from eqsat_mirage.verifier.endtoend import FloatCheck, float_check


def tiny(scale: float = 1.0) -> em.Graph:
    g = em.Graph("tiny")
    x, w = g.input("X", (8, 16)), g.input("W", (16, 8))
    g.output(em.exp(x @ w) * scale, "O")
    return g


def test_options_are_frozen():
    opts = SearchOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.trials = 5  # type: ignore[misc]
    assert opts.replace(trials=5).trials == 5 and opts.trials == 3


def test_the_defaults_are_stated_once():
    """em.optimize's keywords are SearchOptions' and EntryOptions' fields, keyword only,
    with their defaults (the signature is the contract), and its docstring tells each."""
    params = inspect.signature(em.optimize).parameters
    assert list(params) == ["graph", *SearchOptions.names(), *EntryOptions.names()]
    for name in SearchOptions.names():
        assert params[name].default == getattr(DEFAULTS, name), name
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, name
    for name in EntryOptions.names():
        assert params[name].default == getattr(EntryOptions(), name), name
        assert f"``{name}`` (default" in em.optimize.__doc__, name
    with pytest.raises(TypeError):
        em.optimize(tiny(), "h100")  # options are keywords


def test_the_command_line_flags_come_from_the_options():
    """The CLI's search flags and their defaults are made from SearchOptions' fields."""
    from eqsat_mirage.cli.main import parser as cli_parser
    from eqsat_mirage.cli.parser import search_keywords

    parser = cli_parser()
    args = parser.parse_args(["optimize", "--bench", "gqa"])
    assert search_keywords(args) == {"target": DEFAULTS.target, "guards": DEFAULTS.guards,
                                     "time_limit_s": DEFAULTS.time_limit_s,
                                     "node_limit": DEFAULTS.node_limit,
                                     "iter_limit": DEFAULTS.iter_limit,
                                     "level": DEFAULTS.level, "tune": DEFAULTS.tune}
    args = parser.parse_args(["optimize", "--no-guards", "--time-limit", "12", "--rules", "a",
                              "--rules", "b", "--node-limit", "9", "--level", "kernel"])
    got = search_keywords(args)
    assert got["guards"] is False and got["time_limit_s"] == 12.0 and got["node_limit"] == 9
    assert got["rules"] == ["a", "b"] and got["level"] == "kernel"
    SearchOptions(**got)  # every value is one the options accept


@pytest.mark.parametrize("bad", [
    {"level": "block"}, {"time_limit_s": 0}, {"time_limit_s": float("nan")},
    {"node_limit": -1}, {"iter_limit": 2.5}, {"k": "4"}, {"trials": True},
    {"split_factors": (1,)}, {"split_factors": "4"}, {"guards": 1}, {"seed": 1.5},
    {"max_bound": 0}, {"max_bound": 2.0}, {"allow_unchecked_rules": None},
    {"compile_check": "yes"}, {"launch": "stream"}, {"tune": "fast"}, {"tune": 1},
    {"tune_candidates": 0}])
def test_options_are_checked_when_built(bad):
    (name,) = bad
    with pytest.raises(em.MirageError, match=f"optimize: {name} must (be|hold)"):
        SearchOptions(**bad)
    with pytest.raises(em.MirageError, match=f"optimize: {name} must (be|hold)"):
        em.optimize(tiny(), cache=False, **bad)  # checked at the entry, before any search


def test_an_unknown_keyword_is_named():
    with pytest.raises(em.MirageError, match="bogus"):
        em.optimize(tiny(), bogus=1)


def test_the_key_is_plain_data_and_stable():
    data = SearchOptions().key_data()
    assert list(data) == list(SearchOptions.names())
    assert make_key(tiny(), SearchOptions()) == make_key(tiny(), SearchOptions())
    assert make_key(tiny(), SearchOptions()) == make_key(tiny(), SearchOptions().key_data())


def test_the_key_changes_with_every_option(tmp_path):
    from eqsat_mirage.fusion.planner import DEFAULT_STRATEGY

    rules = tmp_path / "mine.egg"
    rules.write_text("(ruleset user)\n")
    changes = {"target": "a100", "rules": ["rules", str(rules)], "guards": False,
               "time_limit_s": 30.0, "node_limit": 1000, "iter_limit": 3, "k": 2,
               "trials": 2, "seed": 1, "split_factors": (4,), "level": "kernel",
               "strategy": DEFAULT_STRATEGY, "max_bound": 1e-6,
               "allow_unchecked_rules": True, "compile_check": True, "launch": "graph",
               "allow_float_unsafe_rules": True, "tune": "model", "tune_candidates": 2}
    assert set(changes) == set(SearchOptions.names())
    base = make_key(tiny(), DEFAULTS)
    keys = {name: make_key(tiny(), DEFAULTS.replace(**{name: value}))
            for name, value in changes.items()}
    assert base not in keys.values() and len(set(keys.values())) == len(changes)


def test_resolved_decides_the_compile_check():
    assert DEFAULTS.compile_check is None
    assert isinstance(DEFAULTS.resolved().compile_check, bool)
    on = DEFAULTS.replace(compile_check=True)
    assert on.resolved() is on


def test_the_budget_shares():
    budget = Budget(Deadline(10.0, 0.0))
    ends = [budget.rule_checks(), budget.saturation(), budget.extraction(),
            budget.compile_check(), budget.planning(), budget.verification()]
    assert [d.end for d in ends] == pytest.approx([3.0, 5.0, 7.0, 10.0, 8.5, 10.0])
    assert budget.seconds == 10.0 and budget.expired()


def test_a_pause_moves_every_share_and_the_cap_together():
    """Time spent under a deadline of its own (a family's checks at sizes inside a search)
    moves the search's shares later; the compile check's deadline is the cap itself, so
    the builds and the verification move as one."""
    budget = Budget(Deadline(10.0, 0.0))
    cap = budget.compile_check()
    assert cap is budget.verification()
    budget.pause(4.0)
    assert cap.end == 14.0 and budget.saturation().end == 9.0 and budget.deadline.start == 4.0


def test_the_time_limited_flag_reads_records_not_words():
    assert not SearchRecord(verification=VerificationRecord()).time_limited
    assert SearchRecord(planning=PlanningRecord(skipped=1)).time_limited
    assert SearchRecord(search_timed_out=True).time_limited
    ver = VerificationRecord(note="an earlier note")
    ver.time_out("a later note", overwrite=False)
    assert ver.timed_out and ver.note == "an earlier note"
    assert SearchRecord(verification=ver).time_limited


def test_a_search_carries_its_records():
    res = em.optimize(tiny(), cache=False, level="kernel", trials=1)
    rec = res.passes
    assert rec.saturation.enodes == res.stats["enodes"]
    assert rec.extraction.candidates == res.stats["candidates"]
    assert rec.verification.tried == res.stats["candidates_tried"]
    assert rec.time_limited is res.stats["time_limited"] is False


def test_the_float_check_says_what_ran_in_fields():
    ok = float_check(tiny(), tiny())
    assert isinstance(ok, FloatCheck) and ok.passed and ok.counterexample is None
    assert ok.native and not ok.cut_short and "native dtype" in ok.message
    wrong = float_check(tiny(), tiny(2.0))
    assert wrong.counterexample is not None and not wrong.passed and not wrong.cut_short
    late = float_check(tiny(), tiny(), time_limit_s=Deadline(0.0))
    assert late.cut_short and late.counterexample is None and not late.passed
    assert not late.native and "cut short" in late.message


def test_progress_true_prints_each_step_to_stderr(capsys):
    em.optimize(tiny(), cache=False, progress=True, time_limit_s=60)
    err = capsys.readouterr().err
    assert "eqsat-mirage: " in err and "iteration" in err


def test_progress_takes_a_callable_or_nothing(capsys):
    lines: list[str] = []
    em.optimize(tiny(), cache=False, progress=lines.append, time_limit_s=60)
    assert lines and all(isinstance(x, str) for x in lines)
    for quiet in (None, False):
        em.optimize(tiny(), cache=False, progress=quiet, time_limit_s=60)
    assert capsys.readouterr().err == ""
    with pytest.raises(em.MirageError, match="progress must be"):
        em.optimize(tiny(), cache=False, progress="yes")
