"""Stage 6, verify: random testing over finite fields, with a false-positive bound.

``verify.py``: ``em.verify`` (field trials, the float64 and native-dtype checks, the
counterexample). ``bound.py``: the degree analysis behind the bound. ``floatcheck.py``:
the float checks; ``draws.py``: their input draws (scaled, folded, peaks, offsets);
``scales.py``: which scales the exponent-range and trough draws and the logits draw
are at;
``conditioning.py``: whether rounding alone decides an output on a draw
(the end-to-end check of ``endtoend.py`` then asks only for finiteness there).
``runner.py``: jobs on a pool of threads under a deadline; ``blas.py``: NumPy's BLAS on one
thread while such a pool runs.

Takes: two programs with the same inputs and outputs (a ``Graph``, or any program that
provides ``evaluate``/``evaluate_field``/``check_lax``/``degrees``, such as a MuGraph).
Gives: a ``VerifyResult``.
May import: ir, frontend, semantics.
"""
