"""The pipeline as one call: ``em.optimize``, its results cache, and ``em.optimize_many``.

``optimize.py``: ``em.optimize``, the one entry: its keywords checked once, then one
piece, a shape family (``family.py``) or a whole program (``whole.py``) fed to the search.
``options.py``: ``SearchOptions`` and ``EntryOptions`` (every option with its default and
description, checked once; the signature, the CLI's flags and the cache key's data come
from them), ``Budget`` (the time limit's shares per pass) and ``VerifyPlan``.
``search.py``: ``Search``, one program searched as one piece, its passes as methods in
order (check, rules, saturate, extract, forms, plan, build and verify), and ``search``,
which runs one through the results cache.
``records.py``: each pass's typed record (``res.passes``), from which ``res.stats`` is written.
``whole.py``: a whole program cut into Lax pieces, each searched, stitched and checked.
``family.py``: a shape family's padded program fed to the search (the family stage does
the rest).
``build.py``: the compile check of each candidate MuGraph.
``result.py``: ``OptimizeResult`` and its plain-data (JSON) form.
``cache.py``: the SQLite results cache (keys, entries, the checked lookup).
``integrity.py``: the cache's integrity tags (an HMAC under this user's secret).
``many.py``: many programs in parallel (processes or Ray) through one cache.

Takes: a ``Graph`` and options (target, rules, limits, level).
Gives: an ``OptimizeResult`` (program, costs, stats, verification, Triton source).
May import: every stage before it (ir ... render).
"""
