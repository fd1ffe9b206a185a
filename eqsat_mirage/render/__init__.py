"""Pictures: the input program and the chosen MuGraph side by side, and the bench chart.

``scene.py``: what to draw (kernels, tiles, tensors, costs). ``layout.py``: where.
``draw.py``: graphviz or matplotlib output (``res.render``, ``optimize --render``).

Takes: a ``Graph`` and/or a ``MuGraph`` (with the cost model's times).
Gives: .svg/.png/.pdf files.
May import: ir, frontend, mugraph, cost.
"""
