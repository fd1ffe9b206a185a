"""Shape families (symbolic sizes): one search serves every value of an ``em.Dim``.

The front end declares the size (``ir/dims.py``: ``Dim``; ``Graph.at`` rebuilds a
family at a size) and the torch.compile stage maps Dynamo's symbols to it; everything
else a family needs is here. ``padding.py``: which axes follow the size, the family as
one padded program with length masks, and the padded size the search plans at.
``scale.py``: which grids and loops of a plan grow with the size, the plan at any size,
and that plan seen at the real sizes (what the verifier checks). ``sizes.py``: the plan
verified at six sizes (the hint, hint +/- 1, a prime, one below a tile, the largest),
with the fallback to one kernel per op, its costs at several sizes and the report.
``launcher.py``: one generated module for every size, its launcher's literals fitted as
polynomials of the padded size (``family_source``). ``runner.py``: ``FamilyRunner``,
running any size on torch tensors. Feeding the padded program to the search is the
pipeline's (``pipeline/family.py``).

Takes: a family ``Graph`` (inputs with ``em.Dim``), a MuGraph planned at the padded hint.
Gives: the padded program, a ``Scaling``, a ``SizeCheck`` (verdicts at six sizes),
``FamilyMember`` programs, one module's source for every size, a ``FamilyRunner``.
May import: ir, frontend, semantics, verifier, mugraph, cost, codegen, runtime.
"""
