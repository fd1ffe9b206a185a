"""The end-to-end check of a stitched program of repeated pieces: its per-input draws
(peak, peakfold) on one occurrence of each piece context (docs/verifier.md, section 5),
and what they still catch."""

from __future__ import annotations

import pytest

import eqsat_mirage as em
from eqsat_mirage.partition import contexts as repeats
from eqsat_mirage.partition import partition
from eqsat_mirage.pipeline import whole
from eqsat_mirage.pipeline.cache import program_text
from eqsat_mirage.verifier.endtoend import float_check


def _contexts(graph):
    pieces = partition(graph)
    texts = [program_text(p.graph) for p in pieces]
    return pieces, texts, repeats.contexts(pieces, texts), graph


def _read(pieces) -> set[str]:
    """The whole program's inputs that ``pieces`` read."""
    return {n.arg for p in pieces for n in p.inputs.values() if n.op.name == "INPUT"}


def test_a_stack_repeats_the_contexts_of_its_second_block():
    pytest.importorskip("torch")
    from bench.whole_programs import decoder_stack

    one = _contexts(em.from_torch(*decoder_stack(1, d=64, heads=2, f=128, seq=16)))
    pieces, texts, ctx, graph = _contexts(em.from_torch(*decoder_stack(4, d=64, heads=2,
                                                                       f=128, seq=16)))
    n = len(one[0])
    assert len(pieces) == 4 * n and len(set(one[2])) == n
    # the first block reads the program's input; the second reads the first block: a context
    # of its own (its first piece at least); the third and fourth repeat the second
    assert ctx[n:2 * n] == ctx[2 * n:3 * n] == ctx[3 * n:] and ctx[0] != ctx[n]
    peaked = repeats.peaked_inputs(graph, pieces, texts)
    assert set(peaked) == _read(pieces[:n]) | _read(
        [p for p, c in zip(pieces[n:2 * n], ctx[n:2 * n]) if c not in ctx[:n]])
    assert not set(peaked) & (_read(pieces[2 * n:]) - _read(pieces[:2 * n]))
    assert _read(pieces) == set(graph.inputs) and len(peaked) < len(graph.inputs)
    assert peaked == [name for name in graph.inputs if name in set(peaked)]  # in order
    # nothing repeats in one block: every input gets its per-input draws
    assert repeats.peaked_inputs(one[3], one[0], one[1]) is None


def _stack(name: str, unsafe: bool, blocks: int = 3) -> em.Graph:
    """``blocks`` times h <- (h / 256)^2 w in float16; ``unsafe``: (h h) / 65536 w, equal
    over the reals, overflowing float16 where h passes 256 and the first does not."""
    g = em.Graph(name)
    h = g.input("x", (8, 16), dtype="float16")
    for i in range(blocks):
        w = g.input(f"w{i}", (8, 16), dtype="float16")
        h = ((h * h) * (1.0 / 65536.0)) * w if unsafe else \
            ((h * (1.0 / 256.0)) * (h * (1.0 / 256.0))) * w
    g.output(h, "out")
    return g


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_draws_of_the_first_contexts_still_catch_an_unsafe_repeated_piece(seed):
    """Every block runs the same (unsafe) program, as a stitched stack runs one verified
    program per distinct piece: the per-input draws of the first blocks' inputs catch it
    as the draws of every input do; without per-input draws no other draw does."""
    a, b = _stack("a", False), _stack("b", True)
    every = float_check(a, b, seed=seed)
    first = float_check(a, b, seed=seed, peaked=["x", "w0", "w1"])
    for ran in (every, first):
        cex = ran.counterexample
        assert cex is not None and cex.domain == "native dtype", ran.message
        assert "non-finite where the first program is finite" in cex.detail
        assert "largest value keeping the first program finite" in cex.detail
    assert "per-input draws on 3 of 4 inputs" in first.message
    assert float_check(a, b, seed=seed, peaked=[]).passed  # the per-input draws catch it
    assert float_check(a, _stack("c", False), seed=seed, peaked=["x", "w0", "w1"]).passed


def test_peaked_names_an_input_the_program_has():
    a = _stack("a", False, blocks=1)
    with pytest.raises(em.MirageError, match=r"peaked names inputs \['w7'\]"):
        float_check(a, a, peaked=["x", "w7"])


def _unsafe_block(piece) -> em.Graph:
    """``piece`` (one block of ``_stack``) rewritten as the unsafe block reads the same
    inputs: (h h) / 65536 w."""
    g = em.Graph("unsafe_block")
    names = {k: ("w" if n.op.name == "INPUT" and n.arg.startswith("w") else "h")
             for k, n in piece.inputs.items()}
    t = {role: g.input(k, piece.inputs[k].shape, dtype="float16") for k, role in names.items()}
    h, w = t["h"], t["w"]
    g.output(((h * h) * (1.0 / 65536.0)) * w, next(iter(piece.graph.outputs)))
    return g


def test_the_end_to_end_check_runs_on_the_first_contexts_and_still_catches_a_repeated_piece():
    """A stack of four blocks, cut one block a piece: the third and fourth blocks repeat the
    second's context, so the end-to-end check runs on the first two blocks (the tensor the
    third reads is an output there); stitched with every block unsafe it still finds the
    overflow, and stitched with the pieces as they are it passes."""
    from eqsat_mirage.partition import stitch

    a = _stack("a", False, blocks=4)
    pieces = partition(a, 4)
    texts = [program_text(p.graph) for p in pieces]
    head = repeats.first_contexts(a, pieces, texts)
    assert [len(p.ops) for p in pieces] == [4, 4, 4, 4] and len(head.pieces) == 2
    assert list(head.graph.inputs) == ["x", "w0", "w1"] and head.cut == ("cut0",)
    assert list(head.graph.outputs) == ["cut0"]
    assert head.graph.outputs["cut0"] is pieces[1].outputs["out0"]
    for seed in (0, 1):
        unsafe = [_unsafe_block(p) for p in pieces]
        ran = whole.end_to_end(a, pieces, texts, unsafe, stitch(a, pieces, unsafe), seed, 60)
        assert ran.counterexample is not None, ran.message
        assert "on the first 2 of 4 pieces" in ran.message
        assert "non-finite where the first program is finite" in ran.counterexample.detail
        same = [p.graph for p in pieces]
        ran = whole.end_to_end(a, pieces, texts, same, stitch(a, pieces, same), seed, 60)
        assert ran.passed and ran.message.startswith("on the first 2 of 4 pieces"), ran.message


def test_a_program_whose_contexts_do_not_repeat_is_checked_whole():
    """No prefix when the last piece has a new context (one block, or every block reading
    the program's input)."""
    a = _stack("a", False, blocks=1)
    pieces = partition(a, 4)
    assert repeats.first_contexts(a, pieces, [program_text(p.graph) for p in pieces]) is None
    g = em.Graph("fan")
    x = g.input("x", (8, 16), dtype="float16")
    for i in range(3):
        g.output((x * (1.0 / 256.0)) * g.input(f"w{i}", (8, 16), dtype="float16"), f"o{i}")
    pieces = partition(g, 2)
    texts = [program_text(p.graph) for p in pieces]
    assert len(pieces) == 3 and len(set(repeats.contexts(pieces, texts))) == 1
    head = repeats.first_contexts(g, pieces, texts)  # all three the same context: the first
    assert len(head.pieces) == 1 and list(head.graph.outputs) == ["o0"] and head.cut == ()


def test_a_piece_the_end_to_end_check_refuses_is_put_back_alone():
    """One failing piece never sends a whole program eager: when the stitched program fails
    the end-to-end check, the distinct optimized pieces are put back one at a time and the
    first set that passes is kept (``whole.isolate``): here only the unsafe first piece."""
    from eqsat_mirage.ir.limits import Deadline
    from eqsat_mirage.partition import stitch

    g = em.Graph("two")
    h = g.input("x", (8, 16), dtype="float16")
    w0 = g.input("w0", (8, 16), dtype="float16")
    h = ((h * (1.0 / 256.0)) * (h * (1.0 / 256.0))) * w0
    w1, w2 = g.input("w1", (8, 16), dtype="float16"), g.input("w2", (8, 16), dtype="float16")
    g.output(((h + w1) * w2) * 0.5 + w1, "out")
    pieces = partition(g, 4)
    texts = [program_text(p.graph) for p in pieces]
    assert len(set(texts)) == len(pieces) > 2
    programs = [_unsafe_block(pieces[0])] + [p.graph for p in pieces[1:]]
    ran = whole.end_to_end(g, pieces, texts, programs, stitch(g, pieces, programs), 0, 60)
    assert ran.counterexample is not None  # the stitched program as it is: refused
    kept = whole.isolate(g, pieces, texts, programs, [True] * len(pieces), 0, Deadline(60))
    assert kept is not None
    progs, did, _, passed = kept
    assert did == [False] + [True] * (len(pieces) - 1) and passed.passed
    assert progs[0] is not programs[0] and progs[1:] == programs[1:]
    # a single optimized piece is not put back alone: the input is returned, as before
    why = []
    assert whole.isolate(g, pieces, texts, programs, [True] + [False] * (len(pieces) - 1), 0,
                         Deadline(60), why=why) is None
    assert len(why) == 1 and why[0].startswith("every optimized piece would go back")


def test_two_pieces_the_end_to_end_check_refuses_are_both_put_back():
    """Two distinct unsafe pieces: putting back either alone still fails. The isolation
    replays the counterexample's own check first (one draw), keeps a put-back that fixes
    it, and goes on from the next counterexample: both unsafe pieces are put back, every
    other piece stays optimized."""
    from eqsat_mirage.ir.limits import Deadline
    from eqsat_mirage.partition import stitch

    def block(t, w, c):
        return ((t * c) * (t * c)) * w

    def unsafe(piece, c):  # the same block with c * c applied after the square
        g = em.Graph("unsafe")
        t, w = (g.input(k, piece.inputs[k].shape, dtype="float16") for k in piece.inputs)
        g.output(((t * t) * (c * c)) * w, next(iter(piece.graph.outputs)))
        return g

    g = em.Graph("two_unsafe")
    x = g.input("x", (8, 16), dtype="float16")
    w = [g.input(f"w{i}", (8, 16), dtype="float16") for i in range(3)]
    y = ((block(x, w[0], 1.0 / 256.0) + w[1]) * w[2]) * 0.5 + w[1]
    g.output(block(em.exp(y * 0.125), w[0], 1.0 / 128.0) * 0.25 + w[2], "out")
    pieces = partition(g, 4)
    texts = [program_text(p.graph) for p in pieces]
    blocks = [i for i, p in enumerate(pieces) if p.op_names() == ["mul"] * 4]
    assert len(blocks) == 2 and texts[blocks[0]] != texts[blocks[1]]
    programs = [p.graph for p in pieces]
    for i, c in zip(blocks, (1.0 / 256.0, 1.0 / 128.0)):
        programs[i] = unsafe(pieces[i], c)
    ran = whole.end_to_end(g, pieces, texts, programs, stitch(g, pieces, programs), 0, 60)
    assert ran.counterexample is not None and ran.counterexample.check
    replay = whole.end_to_end(g, pieces, texts, programs, stitch(g, pieces, programs), 0, 60,
                              only=ran.counterexample.check)  # that one draw, same verdict
    first, again = ran.counterexample, replay.counterexample
    assert again is not None and (again.output, again.index, again.value_b) == (
        first.output, first.index, first.value_b)
    for i in blocks:  # either put back alone: still refused
        alone = [prog if k != i else p.graph for k, (p, prog) in enumerate(zip(pieces,
                                                                               programs))]
        assert whole.end_to_end(g, pieces, texts, alone, stitch(g, pieces, alone), 0,
                                60).counterexample is not None
    kept = whole.isolate(g, pieces, texts, programs, [True] * len(pieces), 0, Deadline(120),
                         ran.counterexample)
    assert kept is not None
    progs, did, _, passed = kept
    assert passed.passed and [not d for d in did] == [i in blocks for i in range(len(pieces))]


def test_two_pieces_that_each_fail_the_same_draw_are_put_back_together(monkeypatch):
    """When no one piece put back fixes the counterexample's draw (two optimized pieces
    each fail it), the shortest prefix of the pieces that fixes it is put back, less the
    pieces the draw does not need; the rest stay optimized. (The end-to-end check is
    replaced by one that fails while either of two given pieces stays optimized.)"""
    from types import SimpleNamespace

    from eqsat_mirage.ir.limits import Deadline

    g = em.Graph("chain")
    h = g.input("x", (8, 16), dtype="float16")
    for i in range(4):
        h = em.exp(h * (1.0 / (i + 2))) * g.input(f"w{i}", (8, 16), dtype="float16")
    g.output(h, "out")
    pieces = partition(g, 2)
    texts = [program_text(p.graph) for p in pieces]
    unique = [i for i, t in enumerate(texts) if texts.count(t) == 1]
    assert len(unique) >= 3
    a, b = unique[0], unique[-1]
    programs = [p.graph for p in pieces]  # "optimized": these very objects
    calls = []

    def fake(graph, pcs, txts, progs, mugraph, seed, seconds, only=None):
        calls.append(only)
        bad = progs[a] is programs[a] or progs[b] is programs[b]
        cex = SimpleNamespace(check=("native", "offset", 0.0)) if bad else None
        return SimpleNamespace(counterexample=cex, cut_short=False, passed=not bad)

    monkeypatch.setattr(whole, "end_to_end", fake)
    first = SimpleNamespace(check=("native", "offset", 0.0))
    kept = whole.isolate(g, pieces, texts, programs, [True] * len(pieces), 0, Deadline(60),
                         first)
    assert kept is not None
    back = [i for i, d in enumerate(kept[1]) if not d]
    assert back == [a, b], (back, a, b)
    assert calls.count(None) == 1  # one whole check: the draw's own replays found the set


def test_a_whole_check_cut_short_after_the_put_back_keeps_the_other_pieces(monkeypatch):
    """The counterexample's own draw passes with the culprit put back, and the whole check
    that follows runs out of time with nothing found: the other pieces stay optimized on
    their own verification (as when the first end-to-end check is cut short), and the check's
    message says so. Before the culprit is found, running out of time returns the input."""
    from types import SimpleNamespace

    from eqsat_mirage.ir.limits import Deadline

    g = em.Graph("chain")
    h = g.input("x", (8, 16), dtype="float16")
    for i in range(3):
        h = em.exp(h * (1.0 / (i + 2))) * g.input(f"w{i}", (8, 16), dtype="float16")
    g.output(h, "out")
    pieces = partition(g, 2)
    texts = [program_text(p.graph) for p in pieces]
    a = next(i for i, t in enumerate(texts) if texts.count(t) == 1)
    programs = [p.graph for p in pieces]

    def fake(graph, pcs, txts, progs, mugraph, seed, seconds, only=None):
        bad = progs[a] is programs[a]
        if only is None and not bad:  # the whole check: out of time, nothing found
            return SimpleNamespace(counterexample=None, cut_short=True, native=True,
                                   seconds=seconds, message="cut short", passed=False)
        cex = SimpleNamespace(check=("native", "offset", 0.0)) if bad else None
        return SimpleNamespace(counterexample=cex, cut_short=False, passed=not bad)

    monkeypatch.setattr(whole, "end_to_end", fake)
    first = SimpleNamespace(check=("native", "offset", 0.0))
    kept = whole.isolate(g, pieces, texts, programs, [True] * len(pieces), 0, Deadline(60),
                         first)
    assert kept is not None
    progs, did, _, ran = kept
    assert [i for i, d in enumerate(did) if not d] == [a]
    assert ran.cut_short and not ran.passed and "own verification" in ran.message
    why = []
    assert whole.isolate(g, pieces, texts, programs, [True] * len(pieces), 0, Deadline(0.1),
                         first, why) is None  # no time to find the culprit: the input
    assert len(why) == 1 and why[0].startswith("the time limit ran out") and "0 replays" in why[0]

    def never(graph, pcs, txts, progs, mugraph, seed, seconds, only=None):  # nothing fixes it
        return SimpleNamespace(counterexample=first, cut_short=False, passed=False)

    monkeypatch.setattr(whole, "end_to_end", never)
    why = []
    assert whole.isolate(g, pieces, texts, programs, [True] * len(pieces), 0, Deadline(60),
                         first, why) is None
    assert len(why) == 1 and why[0].startswith("no set of pieces put back fixes")
