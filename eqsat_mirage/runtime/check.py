"""The checked first launch: the code that runs is checked, not only the MuGraph it came from.

``checked(run, reference, names, rtol, kernels)`` wraps a compiled program's callable
(``res.compile()``'s launcher, a shape family's runner, the backend's torch
implementation). The first call with each input signature (shape, dtype and device of
every input) also calls ``reference`` (a plain callable, ``reference(**tensors) ->
{output: tensor}``: the search side passes the input program run through torch, one
torch op per kernel-level op, ``semantics.torch_reference``) on the same tensors, and
compares every output:

- the compiled output must be finite wherever the reference is, and NaN wherever the
  reference is NaN (where the reference is infinite, in the input program's own dtypes,
  nothing is required);
- elsewhere ``|got - want| <= rtol * (|want| + max |want|)``: ``rtol`` is the input
  program's dtype tolerance (``tolerance``: its coarsest value dtype, float32 1e-4,
  float16 2e-2, bfloat16 6e-2), scaled by the output's largest finite magnitude (a sum
  with cancellation is compared at the scale of its terms); bool outputs must be equal.

A mismatch raises ``LaunchCheckError`` naming the output, the kernel that writes it
(``kernels``: output name -> kernel name) and the worst element (its index and both
values). Later calls with a checked signature run the compiled program alone: the cost is
one reference run per signature. This module needs torch (on first use) and nothing of
the search.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping

from ..ir.errors import MirageError

# the input program's dtype tolerance, relative, scaled by each output's largest magnitude
RTOL = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 6e-2}


class LaunchCheckError(MirageError):
    """A compiled program's first launch disagrees with its input program run by torch
    (names the output, the kernel that writes it and the worst element)."""


def tolerance(dtypes: Iterable[str]) -> float:
    """The relative tolerance of the coarsest of ``dtypes`` (the input program's value
    dtypes' names; ``RTOL``; float32's when none of them is a float dtype)."""
    return max([RTOL[d] for d in dtypes if d in RTOL] or [RTOL["float32"]])


def _signature(tensors: list) -> tuple:
    return tuple((t.shape, t.dtype, t.device) for t in tensors)


def compare(got: Mapping, want: Mapping, rtol: float, kernels: Mapping[str, str],
            what: str = "the compiled program") -> None:
    """Raise ``LaunchCheckError`` unless every output in ``want`` matches ``got`` (module
    docstring); ``kernels``: output name -> the kernel that writes it."""
    import torch

    for name, w in want.items():
        where = f"{what}: output {name!r}" + (f" (written by kernel {kernels[name]!r})"
                                              if kernels.get(name) else "")
        if name not in got:
            raise LaunchCheckError(f"{where} is missing from the compiled program's outputs")
        g = got[name]
        if tuple(g.shape) != tuple(w.shape):
            raise LaunchCheckError(f"{where} has shape {list(g.shape)}; the input program "
                                   f"gives {list(w.shape)}")
        if w.dtype == torch.bool or g.dtype == torch.bool:
            diff = (g.to(w.device) != w).reshape(-1)
            if diff.any():
                i = int(diff.nonzero()[0])
                idx = _index(i, w.shape)
                raise LaunchCheckError(f"{where} differs from the input program run by torch at "
                                       f"{idx}: got {bool(g.reshape(-1)[i])}, expected "
                                       f"{bool(w.reshape(-1)[i])}")
            continue
        w64, g64 = w.detach().double().reshape(-1), g.detach().to(w.device).double().reshape(-1)
        lost = torch.isnan(w64) & ~torch.isnan(g64)  # NaN propagates as torch propagates it
        if lost.any():
            i = int(lost.nonzero()[0])
            raise LaunchCheckError(
                f"{where} is not NaN where the input program run by torch is: at index "
                f"{_index(i, w.shape)}, got {float(g64[i]):.7g} ({int(lost.sum())} of "
                f"{w64.numel()} element(s)). compile(check=False) skips this check")
        finite = torch.isfinite(w64)
        if not finite.any():
            continue
        scale = float(w64[finite].abs().max())
        allowed = rtol * (w64.abs() + scale)
        err = torch.where(finite, (g64 - w64).abs(), torch.zeros_like(w64))
        err = torch.where(finite & ~torch.isfinite(g64), torch.full_like(w64, float("inf")), err)
        bad = err > allowed
        if not bad.any():
            continue
        ratio = torch.where(bad, err / allowed.clamp_min(torch.finfo(torch.float64).tiny),
                            torch.zeros_like(w64))
        i = int(ratio.argmax())
        idx = _index(i, w.shape)
        kind = ("is not finite where the input program run by torch is"
                if not torch.isfinite(g64[i]) else "differs from the input program run by torch")
        raise LaunchCheckError(
            f"{where} {kind}: at index {idx}, got {float(g64[i]):.7g}, expected "
            f"{float(w64[i]):.7g} "
            f"(|difference| {float(err[i]):.3g} > tolerance {float(allowed[i]):.3g}: relative "
            f"{rtol:g} of the input program's dtype, scaled by the output's largest magnitude "
            f"{scale:.3g}); {int(bad.sum())} of {w64.numel()} element(s) outside the tolerance. "
            "compile(check=False) skips this check")


def _index(i: int, shape) -> tuple[int, ...]:
    out = []
    for d in reversed(tuple(shape)):
        out.append(i % d if d else 0)
        i //= d if d else 1
    return tuple(reversed(out))


class CheckedLaunch:
    """``run`` whose first call per input signature is checked against ``reference``.

    ``reference(**tensors) -> {output: tensor}``: what ``run`` must compute (the input
    program run by torch; a shape family's at the size the inputs carry). ``names``: the
    inputs in order (for calls by position); ``key``: tensors -> what makes a call a first
    one (default: the input signature; a family's: its padded size, so a decode loop whose
    length grows by one is checked once per padded size, not at every step). Attributes
    of ``run`` (``source``, ``path``, ``module``, ...) read through."""

    def __init__(self, run: Callable, names: list[str], reference: Callable[..., Mapping],
                 rtol: float, kernels: Mapping[str, str] | None = None,
                 key: Callable[[Mapping], tuple] | None = None) -> None:
        self.run, self.names, self.reference = run, list(names), reference
        self.rtol, self.kernels = rtol, dict(kernels or {})
        self.key = key or (lambda tensors: _signature([tensors[n] for n in self.names]))
        self.checked: set[tuple] = set()  # input signatures whose first launch passed
        self.lock = threading.Lock()

    def __getattr__(self, attr: str):
        if attr == "run":  # not set yet (during unpickling or __init__)
            raise AttributeError(attr)
        return getattr(self.run, attr)

    def _bind(self, args: tuple, kwargs: Mapping) -> dict | None:
        if len(args) == 1 and not kwargs and isinstance(args[0], Mapping):
            kwargs, args = dict(args[0]), ()
        if len(args) > len(self.names):
            return None
        given = dict(zip(self.names, args))
        for k, v in kwargs.items():
            if k in given:
                return None
            given[k] = v
        if set(given) != set(self.names) or not all(hasattr(t, "shape") for t in given.values()):
            return None  # the program itself names what is wrong
        return given

    def __call__(self, /, *args, **kwargs):
        out = self.run(*args, **kwargs)
        tensors = self._bind(args, kwargs)
        if tensors is None:
            return out
        key = self.key(tensors)
        if key in self.checked:
            return out
        with self.lock:
            if key not in self.checked:
                self._check(tensors, out)
                self.checked.add(key)
        return out

    def _check(self, tensors: dict, out: Mapping) -> None:
        import torch

        with torch.no_grad():
            want = self.reference(**tensors)
        compare(out, want, self.rtol, self.kernels)


def checked(run: Callable, reference: Callable[..., Mapping], names: list[str],
            rtol: float = RTOL["float32"], kernels: Mapping[str, str] | None = None
            ) -> CheckedLaunch:
    """``run`` (a compiled program, e.g. ``res.compile()``'s launcher, taking the inputs
    ``names``) with a checked first launch per input signature against ``reference``
    (``reference(**tensors) -> {output: tensor}``; module docstring); ``rtol``: the
    input program's dtype tolerance (``tolerance``); ``kernels``: output name -> the
    kernel that writes it, named by the error."""
    return CheckedLaunch(run, names, reference, rtol, kernels)
