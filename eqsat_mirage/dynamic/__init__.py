"""Shape families (dynamic sizes): one search serves every value of an ``em.Dim``.

``padding.py``: the family as one padded program with length masks. ``scale.py``: which
grids and loops of a plan grow with the size, the plan at any size, and that plan seen at
the real sizes (what the verifier checks). ``runner.py``: running any size on torch tensors.

Takes: a family ``Graph`` (inputs with ``em.Dim``), a MuGraph planned at the padded hint.
Gives: the padded program, a ``Scaling``, ``FamilyMember`` programs, a ``FamilyRunner``.
May import: ir, frontend, semantics, mugraph, codegen.
"""
