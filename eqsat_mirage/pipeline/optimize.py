"""``em.optimize``: the one entry, which chooses what feeds the search.

Its keywords are ``SearchOptions``' and ``EntryOptions``' fields (``options.py``), checked
once here. A program with symbolic sizes goes to the shape-family search
(``family.optimize_family``); one that needs no cutting is one ``Search``
(``search.search``, through the results cache); any other is cut into Lax pieces, each
searched, and stitched (``whole.optimize_whole``).
"""

from __future__ import annotations

import time

from ..ir.check import check
from ..partition.pieces import needs_partition
from .options import optimize_signature, options_doc, progress_fn, split_options
from .result import OptimizeResult
from .search import search
from .whole import optimize_whole


def optimize(graph, **options) -> OptimizeResult:
    """Superoptimize ``graph`` for a target; returns the best verified program.

    Every returned program other than the input itself passed ``em.verify`` against
    ``graph`` with a false-positive bound of at most ``max_bound``; when no candidate
    verifies in time, the input is returned, one kernel per op. A program too large to
    verify within the memory budget (``ir/limits.py``) is refused at once with a
    ``BudgetError``; a bad option with a ``MirageError`` naming it.

    Options (keyword only):

    {options}
    """
    start = time.perf_counter()  # the time limit bounds the whole call
    search_options, entry = split_options(options)
    progress = progress_fn(entry.progress)
    if getattr(graph, "is_family", False):  # symbolic sizes: one search for every size
        from .family import optimize_family

        return optimize_family(graph, search_options, progress, entry.cache)
    if entry.partition is not False:
        check(graph)
    if entry.partition is False or (entry.partition == "auto"
                                    and not needs_partition(graph, entry.piece_ops)):
        return search(graph, search_options, progress=progress, cache=entry.cache,
                      timer=entry.timer, start=start)
    return optimize_whole(graph, search_options, entry.cache, progress,
                          piece_ops=entry.piece_ops, jobs=entry.jobs, timer=entry.timer,
                          start=start)


optimize.__signature__ = optimize_signature(OptimizeResult)
optimize.__doc__ = optimize.__doc__.replace("    {options}", "\n".join(
    "    " + line if line else line for line in options_doc().splitlines()))
