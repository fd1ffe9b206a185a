"""What programs mean: one semantics table per backend, and the runner that folds a table.

``interp.py``: runs a ``Graph`` under a table. ``floating.py``: float64 and native-dtype
(``em.evaluate``). ``field.py``: Z_p x Z_q, the verifier's arithmetic. ``torch_reference.py``:
the same ops as torch calls (the CPU fallback of the torch.compile backend, and the
reference of the checked first launch: ``checked_against``).

Takes: a ``Graph`` (or a program that evaluates itself) and input arrays.
Gives: output arrays or field pairs.
May import: ir, runtime (the checked first launch), frontend.
"""
