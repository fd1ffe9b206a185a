"""``support.symbolic_view_sizes``: an ``expand`` or ``reshape`` whose size arguments are
symbolic sizes of the family computed in the graph (``s + 1`` after a ``torch.cat``) takes
-1 there when -1 means the same for every value, so the view can join a partition (issue
52: transformers' ``repeat_kv`` over a grown length stayed eager). The backend passes the
family's symbols and the specialized ones (a decode step's cache length, held at its value
and searched again as a family when it moves)."""

import pytest

import eqsat_mirage as em

torch = pytest.importorskip("torch")

from eqsat_mirage.dynamo.specs import SymbolicSizes  # noqa: E402
from eqsat_mirage.dynamo.support import symbolic_view_sizes  # noqa: E402


def repeat_kv_after_cat(k, new):
    """transformers' repeat_kv (n_rep 2) of a cache grown by one: its length is ``s + 1``."""
    kc = torch.cat([k, new], dim=2)
    b, h, s, d = kc.shape
    e = kc[:, :, None, :, :].expand(b, h, 2, s, d)
    return e.reshape(b, h * 2, s, d) * 2.0


def _graphs(fn, *args):
    """The FX graphs Dynamo makes of ``fn`` (the first argument's dim 0 or 2 symbolic, as
    automatic dynamic shapes make a cache's length), after the pass, and how many nodes it
    changed in each."""
    seen = []

    def capture(gm, example_inputs):
        seen.append((symbolic_view_sizes(gm, SymbolicSizes(gm).family), gm))
        return gm.forward

    torch._dynamo.reset()
    torch._dynamo.mark_dynamic(args[0], 2 if args[0].dim() == 4 else 0)
    with torch.no_grad():
        out = torch.compile(fn, backend=capture)(*args)
    torch._dynamo.reset()
    return seen, out


def test_expand_and_reshape_of_a_grown_cache_take_minus_one():
    k, new = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 1, 8)
    seen, out = _graphs(repeat_kv_after_cat, k, new)
    ((changed, gm),) = seen
    assert changed == 2, gm.graph
    views = [n for n in gm.graph.nodes if n.target in ("expand", "reshape")]
    assert len(views) == 2
    for n in views:  # the only node operand left is the tensor itself
        assert n.all_input_nodes == [n.args[0]], n.format_node()
        assert -1 in (n.args[1] if len(n.args) == 2 else n.args[1:])
    assert torch.equal(out, repeat_kv_after_cat(k, new))


def test_a_size_unrelated_to_the_operand_is_kept():
    """An expand to a size of another tensor is no -1: the argument stays."""
    def fn(y, x):
        n = y.shape[0] + 1
        return x.expand(n, x.shape[1]) * 1.0

    seen, out = _graphs(fn, torch.randn(6, 2), torch.randn(1, 4))
    assert all(changed == 0 for changed, _ in seen)
    assert out.shape == (7, 4)


def test_the_backend_optimizes_the_views_of_a_grown_cache():
    """Through em.backend: the expand and reshape run in the optimized partition, equal to
    eager at two lengths (one search: the length is the family)."""
    be = em.backend(time_limit_s=120, warn=False, warmup=0, cache=False)
    torch._dynamo.reset()
    fn = torch.compile(repeat_kv_after_cat, backend=be)
    with torch.no_grad():
        for length in (5, 9):
            k, new = torch.randn(1, 2, length, 8), torch.randn(1, 2, 1, 8)
            torch._dynamo.mark_dynamic(k, 2)
            assert torch.allclose(fn(k, new), repeat_kv_after_cat(k, new))
    eager = be.summary()["eager"]
    assert not any("expand" in e or "reshape" in e for e in eager), eager
    torch._dynamo.reset()
