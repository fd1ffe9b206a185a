"""The kernel-level IR, the stage every other stage speaks.

``node.py``: one small immutable ``Node`` type, the ``Op`` enum and its op groups,
dtypes and shape inference (``make``). ``check.py``: the ``check`` pass (shapes,
dtypes) and ``check_lax``. ``printing.py``: the SSA listing. ``errors.py``: the
project errors (``MirageError``, a ``ValueError``, and its subclasses). ``limits.py``:
the budgets of a search (a wall-clock ``Deadline``, the memory budget).

Takes: nothing (it is the bottom of the pipeline).
Gives: ``Node``/``Op``, ``check``, the error types, ``Deadline`` and ``check_memory``.
May import: nothing of the package.
"""
