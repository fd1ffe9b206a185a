"""Stages 3-5, encode, saturate, extract: the e-graph search over rules kept in files.

``rulefiles.py``: the schema and rule files (rules/*.egg). ``encode.py``: ``Graph`` to egglog
terms and back. ``saturate.py``: rulesets in phases under limits, with the
abstract-expression guards. ``view.py``: the serialized e-graph read in Python.
``extract.py``: DAG-aware extraction (greedy, then ILP). ``boundaries.py``: which edges
the tiling rules let a kernel boundary cut. ``kernels.py``: the block level read from the
e-graph (Kern nodes, facts) and each candidate planned under it by the fusion search the
pipeline passes in. ``check_rules.py``: ``em.check_rules``.

Takes: a ``Graph``, rule files and a per-op cost model.
Gives: the k best kernel-level candidates, the edges each may cut, and their MuGraphs.
May import: ir, frontend, semantics, verifier, mugraph, cost.
"""
