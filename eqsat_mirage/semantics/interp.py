"""The generic interpreter: walks a program in order and applies one semantics table.

Every backend (float, finite field, and later the tiled muGraph executor)
is a dict ``Op -> fn(ctx, node, *operand_values)``; this module holds the
walk and the input validation they share.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..ir.errors import InputError
from ..ir.node import FP8_DTYPES, FP8_MAX, QUANT_DTYPES, QUANT_RANGE, Node, Op, fmt_shape, toposort

Table = Mapping[Op, Callable[..., Any]]


class Outputs:
    """Some nodes as the outputs of the program that computes only them: what ``run``
    walks (``nodes()`` in order, and ``outputs``). A custom kernel's stages
    (``mugraph/tiled.py``), the exp arguments of a program (``Draws.logit_scale``)."""

    def __init__(self, outputs: Mapping[str, Node]) -> None:
        self.outputs = dict(outputs)
        self._nodes = toposort(list(self.outputs.values()))

    def nodes(self) -> list[Node]:
        """The nodes the outputs are computed from, producers first."""
        return self._nodes


_REAL_KINDS = "biufO"  # NumPy kinds of real values (bool, ints, floats; objects converted)


def as_array(value: Any, name: str) -> np.ndarray:
    """Convert a NumPy array, torch tensor or nested list of real numbers to a float64
    array; an ``InputError`` naming the input for anything else: a complex value (its
    imaginary part would be dropped), text, dates."""
    if hasattr(value, "detach"):  # torch tensor
        if value.is_complex():
            raise InputError(f"input {name!r}: a complex tensor ({value.dtype}); inputs are "
                             "real (pass .real or .abs() if that is what is meant)")
        value = value.detach().to("cpu").float().numpy()
    try:
        given = np.asarray(value)
        real = given.dtype.kind in _REAL_KINDS
        arr = np.asarray(given, dtype=np.float64) if real else None
    except (TypeError, ValueError) as exc:
        raise InputError(f"input {name!r}: cannot convert {type(value).__name__} to an array "
                         "of real numbers") from exc
    if arr is None and given.dtype.kind == "c":
        raise InputError(f"input {name!r}: a complex array ({given.dtype}); inputs are real "
                         "(pass .real or abs() if that is what is meant)")
    if arr is None:  # text, dates, ...
        raise InputError(f"input {name!r}: cannot convert {type(value).__name__} to an array "
                         f"of real numbers (it holds {given.dtype})")
    return arr


def check_inputs(program, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Match ``inputs`` to the program's declared inputs by name and shape."""
    if not isinstance(inputs, Mapping):
        raise InputError(f"inputs must be a dict of name -> array; got {type(inputs).__name__}")
    missing = [n for n in program.inputs if n not in inputs]
    extra = [n for n in inputs if n not in program.inputs]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {missing}")
        if extra:
            parts.append(f"unknown {extra}")
        raise InputError(f"inputs of {program.name!r}: {'; '.join(parts)} "
                         f"(expected {list(program.inputs)})")
    out = {}
    for name, node in program.inputs.items():
        arr = as_array(inputs[name], name)
        if arr.shape != node.shape:
            raise InputError(f"input {name!r} of {program.name!r}: expected shape "
                             f"{fmt_shape(node.shape)}, got {fmt_shape(arr.shape)}")
        check_values(arr, name, node.dtype)
        out[name] = arr
    return out


def check_values(arr: np.ndarray, name: str, dtype: str) -> None:
    """An ``InputError`` unless the values of input ``name`` (an int8/uint8 or fp8 input,
    ``dtype``; any other: nothing to check) are values of its dtype."""
    if dtype in QUANT_DTYPES:
        _check_ints(np.asarray(arr, dtype=np.float64), name, dtype)
    if dtype in FP8_DTYPES:
        _check_fp8(np.asarray(arr, dtype=np.float64), name, dtype)


def _check_ints(arr: np.ndarray, name: str, dtype: str) -> None:
    """An int8/uint8 input's values must be integers of its range (never wrapped here)."""
    lo, hi = QUANT_RANGE[dtype]
    if arr.size and not (np.all(arr == np.round(arr)) and arr.min() >= lo and arr.max() <= hi):
        raise InputError(f"input {name!r} ({dtype}): expected integers in [{lo}, {hi}]; "
                         f"got values in [{arr.min()}, {arr.max()}]"
                         + ("" if np.all(arr == np.round(arr)) else ", not all integers"))


def _check_fp8(arr: np.ndarray, name: str, dtype: str) -> None:
    """An fp8 input's values must be finite values of its dtype (never rounded here)."""
    from .fp8 import is_fp8

    bad = ~is_fp8(arr, dtype)
    if bad.any():
        raise InputError(f"input {name!r} ({dtype}): expected finite {dtype} values (in "
                         f"[-{FP8_MAX[dtype]:g}, {FP8_MAX[dtype]:g}]); got {arr[bad][0]!r} "
                         f"({int(bad.sum())} such)")


def last_reads(nodes, keep) -> dict[int, list[int]]:
    """Position in ``nodes`` -> ids of the values last read there (never those of ``keep``,
    the outputs): what an interpreter can drop once that node has run."""
    kept = {id(n) for n in keep}
    last: dict[int, int] = {}
    for i, node in enumerate(nodes):
        for s in node.srcs:
            last[id(s)] = i
    done: dict[int, list[int]] = {}
    for key, i in last.items():
        if key not in kept:
            done.setdefault(i, []).append(key)
    return done


class Later:
    """An input's value, read from the inputs where a reader first needs it (``run``): a
    reader that does not (an op whose other operand is NaN everywhere, ``lazy_args``)
    leaves an input that is made when read (``floating.LazyInputs``) unmade."""

    __slots__ = ("make", "_value")

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make, self._value = make, None

    def value(self) -> Any:
        """The value, made on the first call (the maker then dropped, with whatever it
        read: a deferred cast holds its value, not the input it was cast from)."""
        if self.make is not None:
            self._value, self.make = self.make(), None
        return self._value


def made(x: Any) -> Any:
    """``x``, or the value of a ``Later`` (made in turn where that is one)."""
    while isinstance(x, Later):
        x = x.value()
    return x


def run(program, table: Table, ctx: Any, outputs: bool = True) -> dict:
    """Evaluate every node of ``program`` with ``table``.

    Returns ``{output name: value}`` (or ``{id(node): value}`` for all nodes
    when ``outputs`` is False). ``ctx`` is handed to every table entry. A value is
    dropped as soon as its last reader has run (``outputs`` False: every value is kept).
    An input is read where its first reader runs (``Later``); an entry with ``lazy_args``
    set gets such inputs as ``Later`` values and makes them only if it needs them.
    """
    env: dict[int, Any] = {}
    nodes = program.nodes()
    if not outputs:
        done = None
    elif hasattr(program, "derived"):  # a Graph: kept while its outputs are the same nodes
        done = program.derived("last reads", lambda g: last_reads(g.nodes(), g.outputs.values()))
    else:
        done = last_reads(nodes, program.outputs.values())
    for i, node in enumerate(nodes):
        fn = table.get(node.op)
        if fn is None:
            raise NotImplementedError(f"no semantics for {node.op} in this backend")
        if node.op is Op.INPUT:
            env[id(node)] = Later(lambda fn=fn, node=node: fn(ctx, node))
        elif getattr(fn, "lazy_args", False):
            env[id(node)] = fn(ctx, node, *(env[id(s)] for s in node.srcs))
        else:
            env[id(node)] = fn(ctx, node, *(made(env[id(s)]) for s in node.srcs))
        for key in done.get(i, ()) if done is not None else ():
            del env[key]  # nothing later reads it: its memory goes back now
    if not outputs:
        return {key: made(v) for key, v in env.items()}
    return {name: made(env[id(node)]) for name, node in program.outputs.items()}

