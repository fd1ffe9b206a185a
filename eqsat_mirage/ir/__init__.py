"""The kernel-level IR, the stage every other stage speaks.

``ops.py``: the ``Op`` enum and one ``OpSpec`` per op, every op's facets declared
once (the op groups and each backend's table are derived from them). ``node.py``:
one small immutable ``Node`` type, dtypes and shape inference (``make``).
``check.py``: the ``check`` pass (shapes, dtypes) and ``check_lax``. ``printing.py``: the
SSA listing. ``errors.py``: the project errors (``MirageError``, a ``ValueError``, and its
subclasses). ``limits.py``: the budgets of a search (a wall-clock ``Deadline``, the memory budget).

Takes: nothing (it is the bottom of the pipeline).
Gives: ``Node``/``Op``, ``check``, the error types, ``Deadline`` and ``check_memory``.
May import: nothing of the package.
"""
