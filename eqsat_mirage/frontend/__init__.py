"""Stage 1, build: programs enter here.

``graph.py``: the ``Graph`` builder and ``Tensor`` with its operators and methods
(``em.Graph``, ``x.sum(...)``, ...); ``functions.py``: the NumPy-like functions (``em.exp``,
``em.softmax``, ``em.rms_norm``, ...). ``from_torch.py``: ``em.from_torch`` traces a torch
function or module with torch.fx; ``torch_ops.py`` is its op table, ``torch_movement.py``
its movement and shape handlers, ``torch_masks.py`` its bool masks (``masked_fill``,
``where``, ``~``, comparisons of module buffers folded at trace time: nanoGPT's causal
``bias == 0`` becomes the causal mask from positions) (torch loads only here).

Takes: Python calls, or a torch function/module with example inputs.
Gives: a checked kernel-level ``Graph``.
May import: ir.
"""
