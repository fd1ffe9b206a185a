"""The host side of a generated module: binding and checking the inputs, allocating outputs.

``run`` of a generated module (``source.py``) starts with ``_bind(args, kwargs)``,
which returns the input tensors in ``INPUTS`` order and their signature's entry
``(device, every input's strides, flattened[, the reused buffers])``. The first
call with an input signature (class, shape, dtype, device and strides of every
input) runs the full ``_check`` (a ``ValueError`` naming the input, what was
expected and what was given); the signature is then remembered in
``_CHECKED`` (64 at most) and later calls with it (inputs by position, or all by
name) are one dictionary look-up.

Strides reach the kernels as ``tl.constexpr`` values: the tensors the launcher
allocates are contiguous, so their strides are literals written here
(``contiguous_strides``); an input's come from its signature's entry (a
differently strided input is another signature, and Triton compiles another
variant of the kernel); a torch op's result is asked for its ``stride()`` once.

Outputs are allocated with ``first_input.new_empty(shape)`` (``torch.empty`` when
the program has no inputs). With ``reuse_outputs`` (``REUSE_OUTPUTS = True`` in
the module) every tensor the kernels write is allocated once per input
signature by ``_buffers`` and kept in the entry: each call writes and returns
the same tensors, which the next call with that signature overwrites.
"""

from __future__ import annotations

from collections.abc import Sequence

from .kernel import wrap

MAX_SIGNATURES = 64  # input signatures remembered per module

_CHECK = '''

def _signature(tensors):
    """The key of ``tensors`` in _CHECKED: class, shape, dtype, device and strides of each."""
    return tuple(v for x in tensors for v in (x.__class__, x.shape, x.dtype, x.device,
                                              x.stride()))


def _check(args, kwargs):
    """The input tensors in INPUTS order, checked, and their device."""
    names = list(INPUTS)
    if len(args) == 1 and isinstance(args[0], dict) and not kwargs:
        args, kwargs = (), dict(args[0])
    if len(args) > len(names):
        raise ValueError(f"run() takes {len(names)} inputs ({', '.join(names)}); "
                         f"got {len(args)} positional arguments")
    given = dict(zip(names, args))
    for name in kwargs:
        if name not in INPUTS:
            raise ValueError(f"unknown input {name!r} (inputs: {', '.join(names)})")
        if name in given:
            raise ValueError(f"input {name!r} given both by position and by name")
    given.update(kwargs)
    missing = [name for name in names if name not in given]
    if missing:
        raise ValueError(f"missing input(s) {', '.join(map(repr, missing))} "
                         f"(inputs: {', '.join(names)})")
    tensors, device = [], None
    for name, (shape, dtype) in INPUTS.items():
        x = given[name]
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"input {name!r}: expected a torch.Tensor of shape {shape} and "
                             f"dtype {dtype}, got {type(x).__name__}")
        if tuple(x.shape) != shape:
            raise ValueError(f"input {name!r}: expected shape {shape}, got {tuple(x.shape)}")
        if x.dtype != dtype:
            raise ValueError(f"input {name!r}: expected dtype {dtype}, got {x.dtype}")
        if device is None:
            device = x.device
        elif x.device != device:
            raise ValueError(f"input {name!r}: expected device {device} (the device of "
                             f"{names[0]!r}), got {x.device}")
        tensors.append(x)
    if device is None:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if NEEDS_TRITON and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"inputs are on device {device}: the Triton kernels need a CUDA "
                         "device, or TRITON_INTERPRET=1 set before triton is imported")
    return tensors, device
'''


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """The strides (in elements) of a contiguous row-major tensor of ``shape``, as torch
    gives them (a dim of size 1 included)."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(int(size), 1)
    return tuple(reversed(strides))


_SAME = "        if tuple(x.shape) != shape:\n"
# a shape family's INPUTS name its size (e.g. "L") where an axis may have any length
_ANY = ("        if len(x.shape) != len(shape) or any(\n"
        "                w.__class__ is int and g != w for g, w in zip(x.shape, shape)):\n")


def _key(x: str, dynamic: tuple[int, tuple[int, ...]] | None) -> list[str]:
    """The signature parts of input ``x``; a shape family's input with axes of size L
    (``dynamic``: its rank and those axes) is keyed without those sizes and its strides
    (the launcher reads them at every call): every length shares one signature."""
    if dynamic is None:
        return [f"{x}.{a}" for a in ("__class__", "shape", "dtype", "device", "stride()")]
    rank, axes = dynamic
    return [f"{x}.{a}" for a in ("__class__", "dtype", "device")] + [
        f"{x}.shape[{d}]" for d in range(rank) if d not in axes]


def bind_source(inputs: Sequence[str], reuse: bool,
                dynamic: dict[int, tuple[int, tuple[int, ...]]] | None = None) -> str:
    """``_CHECKED``, ``_bind``, ``_signature`` and ``_check`` of a module whose inputs are
    the host variables ``inputs`` (in INPUTS order); ``reuse``: entries carry the
    buffers of ``_buffers``; ``dynamic``: input position -> (rank, axes) of the inputs with
    axes of any length, in a shape family's module (named by its size in INPUTS; see
    ``_key``), whose entries carry, with ``reuse``, a dict padded size -> the buffers
    ``_buffers`` allocated for it."""
    dynamic = dynamic or {}
    n = len(inputs)
    buffers = "[, the buffers _buffers allocated]" if reuse else ""
    out = ["# input signature -> (device, the inputs' strides, flattened"
           f"{buffers}): the signatures _check passed",
           "_CHECKED = {}", "", "",
           "def _bind(args, kwargs):",
           '    """The input tensors in INPUTS order and their signature\'s entry in _CHECKED '
           "(checked\n    by _check on the first call with that signature, looked up after).\"\"\"",
           *([f"    if kwargs and not args and len(kwargs) == {n}:  # all by name: the same "
              "fast path",
              "        try:",
              "            args, kwargs = tuple(kwargs[name] for name in INPUTS), {}",
              "        except KeyError:  # a name that is no input: _check says which",
              "            pass"] if n else []),
           f"    if not kwargs and len(args) == {n}:"]
    if n:
        key = [k for i, x in enumerate(inputs) for k in _key(x, dynamic.get(i))]
        out += unpack(inputs, "args", " " * 8)
        out.append("        try:")
        lines = wrap(key, "", ",", 100 - 36)
        lines[-1] = lines[-1].rstrip(",")
        out.append(f"            return args, _CHECKED[{lines[0]}")
        out += [" " * 34 + line for line in lines[1:]]  # under the first key
        out[-1] += "]"
        out += ["        except (AttributeError, KeyError, TypeError):  # not tensors, or new",
                "            pass"]
    else:
        out += ["        entry = _CHECKED.get(())", "        if entry is not None:",
                "            return args, entry"]
    if dynamic:
        parts = [k for i in range(n) for k in _key(f"tensors[{i}]", dynamic.get(i))]
        signature = ["    key = (" + wrap(parts, "", ",", 88)[0]] + [
            " " * 11 + line for line in wrap(parts, "", ",", 88)[1:]]
        signature[-1] = signature[-1].rstrip(",") + ")"
    else:
        signature = ["    key = _signature(tensors)"]
    out += ["    tensors, device = _check(args, kwargs)", *signature,
            "    entry = _CHECKED.get(key)",
            "    if entry is None:",
            "        entry = (device,) + tuple(s for x in tensors for s in x.stride())"]
    if reuse:
        out.append("        entry += ({},)  # padded size -> the buffers _buffers allocated"
                   if dynamic else "        entry += _buffers(device, *tensors)")
    out += [f"        if len(_CHECKED) < {MAX_SIGNATURES}:",
            "            _CHECKED[key] = entry",
            "    return tensors, entry"]
    return "\n".join(out) + "\n" + (_CHECK.replace(_SAME, _ANY) if dynamic else _CHECK)


def unpack(names: Sequence[str], value: str, indent: str = "    ") -> list[str]:
    """``names = value`` as lines of at most 100 characters (a tuple target)."""
    one = f"{indent}{', '.join(names)}{',' if len(names) == 1 else ''} = {value}"
    if len(one) <= 100:
        return [one]
    lines = wrap(list(names), "", ",", 100 - len(indent) - 1)
    lines[-1] = lines[-1].rstrip(",")
    out = [f"{indent}({lines[0]}"] + [f"{indent} {line}" for line in lines[1:]]
    out[-1] += f") = {value}"
    return out


def bf16_dot_lines() -> list[str]:
    """The generated module's ``BF16_DOT``: the dtype a bfloat16 ``tl.dot`` reads its
    operands in, bfloat16 on a GPU and float32 under ``TRITON_INTERPRET=1`` (Triton 3.8's
    interpreter multiplies bfloat16 bit patterns as integers in ``tl.dot``)."""
    return ["", "# bfloat16 tl.dot operands: bfloat16 on a GPU; float32 under TRITON_INTERPRET=1 "
            "(Triton 3.8's", "# interpreter multiplies bfloat16 bit patterns as integers in "
            "tl.dot)", 'BF16_DOT = tl.constexpr(tl.float32 if os.environ.get("TRITON_INTERPRET") '
            '== "1" else tl.bfloat16)']


TAKE_ALONG = "_take_along"  # the generated module's torch.gather with its indices checked


def take_along_lines() -> list[str]:
    """The generated module's ``_take_along(x, dim, idx)``: ``torch.gather`` (a
    take_along_axis kernel), an index out of ``[0, x.shape[dim])`` an ``IndexError`` as
    ``torch.index_select``'s is (a gather's kernel; ``torch.gather``'s is a RuntimeError
    on a CPU), so a call with a bad index runs eagerly, where torch raises it. On a GPU
    torch's device assert checks them (a check here would wait for the device)."""
    return ["", "", f"def {TAKE_ALONG}(x, dim, idx):",
            '    """torch.gather(x, dim, idx); an index out of range: IndexError (on a CPU)."""',
            '    if idx.device.type == "cpu" and idx.numel():',
            "        bad = (idx < 0) | (idx >= x.shape[dim])",
            "        if bool(bad.any()):",
            "            raise IndexError(f\"index {int(idx[bad][0])} is out of range for an axis "
            "of {x.shape[dim]}\")",
            "    return torch.gather(x, dim, idx if idx.dtype == torch.int64 else idx.long())"]
