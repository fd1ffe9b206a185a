"""``em.backend(...)`` checks its options when it is built, not inside ``torch.compile``:
an unknown keyword names itself and the valid options, a bad value names its option."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import eqsat_mirage as em  # noqa: E402


def test_an_unknown_keyword_is_named_with_the_valid_ones():
    with pytest.raises(em.MirageError, match=r"unknown option\(s\) 'nonsense'; valid options: "
                                             r"target, time_limit_s, min_ops, .*level"):
        em.backend(nonsense=1)
    with pytest.raises(em.MirageError, match="'iter_limt'"):  # a misspelt one, on a copy
        em.backend(time_limit_s=5)(iter_limt=4)


@pytest.mark.parametrize("options, named", [
    (dict(level="fast"), "level"), (dict(node_limit=-1), "node_limit"),
    (dict(partition="maybe"), "partition"), (dict(min_ops=0), "min_ops"),
    (dict(warn="yes"), "warn"), (dict(warmup=-1), "warmup"), (dict(size_max=0), "size_max"),
    (dict(time_limit_s="soon"), "time_limit_s")])
def test_a_bad_value_names_its_option(options, named):
    with pytest.raises(em.MirageError, match=named):
        em.backend(**options)


def test_good_options_are_kept():
    be = em.backend(level="kernel", iter_limit=4, cache=False, min_ops=1, warn=False)
    assert be.options["level"] == "kernel" and be.min_ops == 1 and not be.warn
