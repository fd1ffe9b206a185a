"""The pipeline as one call: ``em.optimize``, its results cache, and ``em.optimize_many``.

``options.py``: ``SearchOptions`` (every option, checked once; the cache key's data),
``Budget`` (the time limit's shares per pass) and ``VerifyPlan``.
``optimize.py``: check, saturate, extract, plan, verify and return an ``OptimizeResult``.
``records.py``: each pass's typed record (``res.passes``), from which ``res.stats`` is written.
``whole.py``: ``em.optimize``, the one entry: options checked, then one piece, a shape
family (``family.py``) or a whole program cut into pieces.
``build.py``: the compile check of each candidate MuGraph.
``result.py``: ``OptimizeResult`` and its plain-data (JSON) form.
``cache.py``: the SQLite results cache (keys, entries, the checked lookup around a search).
``integrity.py``: the cache's integrity tags (an HMAC under this user's secret).
``many.py``: many programs in parallel (processes or Ray) through one cache.

Takes: a ``Graph`` and options (target, rules, limits, level).
Gives: an ``OptimizeResult`` (program, costs, stats, verification, Triton source).
May import: every stage before it (ir ... render).
"""
