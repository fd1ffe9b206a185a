"""Running a shape family's plan on torch tensors of any size.

``FamilyRunner(family, scaling)`` reads the size L from its inputs' dynamic axes (they
must agree, and L must be in the size's range) and runs the plan's one Triton module
(``launcher.family_source``): its launcher reads L, rounds it up to the padded
size, computes the grids, loop counts and shapes from that, zero-pads only the inputs a
torch op reads (the kernels' loads past L read 0) and cuts the outputs to L. Its
kernels take L, strides and loop counts as runtime arguments, so Triton compiles each
kernel once per family and one module serves every L. A launcher that cannot be
written that way (``FamilyLaunchError``) falls back, with a warning, to one module per
padded size. With ``engine="torch"`` it runs the plan as torch ops instead
(``semantics.torch_reference``: the Dynamo backend's CPU path), one build per size L,
the last ``TORCH_BUILDS`` kept. The first call at each padded size (with its dtypes and
devices) is checked against the family's program at the call's size run by torch
(``runtime.check``; ``check=False`` skips it).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Mapping

from ..codegen.family_layout import FamilyLayout
from ..ir.dims import DynamicShapeError
from ..ir.errors import InputError, MirageError
from .launcher import FamilyLaunchError
from .scale import Scaling, is_length_mask

TORCH_BUILDS = 8  # torch-engine plans kept (one per size; each is a few torch closures)
EVERY = 0  # the key of the one module serving every padded size in ``FamilyRunner.modules``


class FamilyRunner:
    """A callable running family ``family`` (planned as ``scaling``) at any size."""

    def __init__(self, family, scaling: Scaling, reuse_outputs: bool = False,
                 engine: str = "triton", check: bool = True) -> None:
        from ..runtime.check import CheckedLaunch
        from ..semantics.torch_reference import program_tolerance, writers

        if engine not in ("triton", "torch"):
            raise MirageError(f"FamilyRunner engine must be 'triton' or 'torch', got {engine!r}")
        # the checked first launch per input signature: the family's program at the size
        # the inputs carry, run by torch (runtime.check)
        self.checker = CheckedLaunch(self._run, list(family.inputs), self.reference,
                                     program_tolerance(family), writers(scaling.mg),
                                     key=self._padded_key) if check else None
        self.references: dict[int, object] = {}  # size -> the input program's torch function
        self.family, self.scaling, self.reuse_outputs = family, scaling, reuse_outputs
        self.engine = engine
        self.dim = family.dims[scaling.dim]
        self.names = list(family.inputs)
        self.modules: dict[int, object] = {}  # EVERY (or a padded size) -> module's run
        self.launcher = ""  # why there is one module per padded size ("": one for all)
        self.lock = threading.Lock()
        # dynamic inputs only custom kernels read go in unpadded (their loads are masked
        # at L); one a torch op reads is zero-padded by the launcher first
        torch_reads = {t for k in scaling.mg.kernels if k.kind == "predefined"
                       for t in k.reads()}
        self.short = frozenset(n for n in family.dynamic if n not in torch_reads) \
            if engine == "triton" else frozenset()

    def layout(self, padded: int | None = None) -> FamilyLayout:
        """The family's ``FamilyLayout`` (``padded``: a module serving that size only)."""
        from ..cost.tiles import stages_for, warps_for

        sc, dim = self.scaling, self.dim
        hint = [k for k in sc.at(dim.hint).kernels if k.kind == "custom"]
        return FamilyLayout(
            dim.name, sc.granule, dim.min, dim.max, dim.hint,
            {n: tuple(sorted(axes)) for n, axes in sc.tensors.items() if n in sc.mg.inputs},
            {t: frozenset(axes) for t, axes in sc.tensors.items()}, frozenset(sc.loop),
            self.short, {k.name: (warps_for(k) or 16, stages_for(k)) for k in hint}, padded)

    def _bind(self, args: tuple, kwargs: Mapping) -> dict:
        if len(args) == 1 and not kwargs and isinstance(args[0], Mapping):
            kwargs, args = dict(args[0]), ()
        if len(args) > len(self.names):
            raise InputError(f"{self.family.name!r} takes {len(self.names)} inputs "
                             f"({', '.join(self.names)}), got {len(args)}")
        bound = dict(zip(self.names, args))
        for k, v in kwargs.items():
            if k not in self.names or k in bound:
                raise InputError(f"{self.family.name!r}: unexpected or repeated input {k!r} "
                                 f"(inputs: {', '.join(self.names)})")
            bound[k] = v
        missing = [n for n in self.names if n not in bound]
        if missing:
            raise InputError(f"{self.family.name!r}: missing inputs {', '.join(missing)}")
        return bound

    def _check(self, tensors: Mapping) -> None:
        """Each input a torch tensor of the family's rank, static sizes and dtype (an
        ``InputError`` naming the input and the shape with its symbolic size otherwise)."""
        import torch

        for name, x in tensors.items():
            node, dyn = self.family.inputs[name], self.family.dynamic.get(name, {})
            shown = "(" + ", ".join(dyn.get(a, str(n)) for a, n in enumerate(node.shape)) + ")"
            where = f"{self.family.name!r}: input {name!r}"
            if not isinstance(x, torch.Tensor):
                raise InputError(f"{where} must be a torch.Tensor of shape {shown} and dtype "
                                 f"{node.dtype}, got {type(x).__name__}")
            if x.dim() != len(node.shape) or any(
                    a not in dyn and x.shape[a] != n for a, n in enumerate(node.shape)):
                raise InputError(f"{where}: expected shape {shown}, got {tuple(x.shape)}")
            if str(x.dtype).replace("torch.", "") != node.dtype:
                raise InputError(f"{where}: expected dtype {node.dtype}, got "
                                 f"{str(x.dtype).replace('torch.', '')}")

    def size(self, tensors: Mapping) -> int:
        """The size L the inputs carry (their dynamic axes must agree)."""
        seen = {f"{n}.shape[{a}]": int(tensors[n].shape[a])
                for n, axes in self.family.dynamic.items() for a in axes}
        values = set(seen.values())
        if len(values) != 1:
            raise DynamicShapeError(f"{self.family.name!r}: the inputs disagree on size "
                                    f"{self.dim.name}: " + ", ".join(f"{k} = {v}"
                                                                   for k, v in seen.items()))
        return self.dim.check(values.pop(), f"{self.family.name!r}: ")

    def module(self, length: int):
        """The generated module's ``run`` serving ``length``: the one module of the family
        (or, where its launcher could not be merged, the module of length's padded size)."""
        from ..runtime.load import load_source

        if self.engine == "torch":  # the mask's offset is baked in: one build per size
            if length not in self.modules:
                from ..semantics.torch_reference import torch_reference

                while len(self.modules) >= TORCH_BUILDS:
                    self.modules.pop(next(iter(self.modules)))
                self.modules[length] = torch_reference(self.scaling.at(length))
            return self.modules[length]
        run = self.modules.get(self._key(length))
        if run is None:
            with self.lock:  # one build, whichever thread asks first
                if self._key(length) not in self.modules:
                    text = self.source(length)  # (finds out whether the launcher scales)
                    self.modules[self._key(length)] = load_source(text)
                run = self.modules[self._key(length)]
        return run

    def _key(self, length: int) -> int:
        """The key in ``modules`` of the Triton module serving ``length``."""
        return EVERY if not self.launcher else self.scaling.padded(length)

    def _masks(self) -> frozenset[str]:
        """The plan's length masks (True where ``col < L``)."""
        sc = self.scaling
        return frozenset(k.output for k in sc.mg.kernels if k.kind == "predefined"
                         and is_length_mask(k.node, sc.lp0))

    def source(self, length: int | None = None) -> str:
        """The Triton module's source: one serving every L, or (where its launcher could
        not be merged: ``launcher`` says why) the one serving ``length``'s padded size."""
        from .launcher import family_source  # (looked up per call: tests replace it)

        if not self.launcher:
            try:
                return family_source(self.scaling.at, self.layout(), self._header(),
                                     self.reuse_outputs, self._masks())
            except FamilyLaunchError as exc:
                self.launcher = str(exc)
                warnings.warn(f"shape family {self.family.name!r}: one module per padded size "
                              f"(the launcher does not scale with {self.dim.name}: {exc})",
                              stacklevel=3)
        return self.padded_source(self.scaling.padded(self.dim.hint if length is None
                                                      else length))

    def padded_source(self, lp: int) -> str:
        """The source of a module serving padded size ``lp`` only (it refuses the others):
        the fallback when the one launcher cannot be written."""
        from ..codegen.source import triton_source

        return triton_source(self.scaling.at(lp), f"{self._header()} at padded size {lp}",
                             self.reuse_outputs, self._masks(), self.layout(lp))

    def _header(self) -> str:
        from ..codegen.tiles import named

        return f"shape family {named(self.family.name)}: {self.dim}"

    def _padded_key(self, tensors: Mapping) -> tuple:
        """A call's key for the checked first launch: the padded size it runs at, and its
        inputs' dtypes and devices (the static sizes are the family's)."""
        return (self.scaling.padded(self.size(tensors)),
                tuple((t.dtype, t.device) for t in tensors.values()))

    def reference(self, /, **tensors) -> dict:
        """The outputs of the input program at the size ``tensors`` carry, run by torch (the
        reference of the checked first launch)."""
        return self._reference(self.size(tensors))(**tensors)

    def _reference(self, length: int):
        """The input program at size ``length`` as a torch function (the last
        ``TORCH_BUILDS`` kept)."""
        from ..semantics.torch_reference import torch_reference

        if length not in self.references:
            while len(self.references) >= TORCH_BUILDS:
                self.references.pop(next(iter(self.references)))
            self.references[length] = torch_reference(
                self.family.at({self.dim.name: length}))
        return self.references[length]

    def __call__(self, /, *args, **kwargs) -> dict:
        """The outputs for these inputs (the first call per padded size, dtypes and devices
        checked against the input program run by torch, unless ``check=False``)."""
        if self.checker is not None:
            return self.checker(*args, **kwargs)
        return self._run(*args, **kwargs)

    def _run(self, /, *args, **kwargs) -> dict:
        import torch
        from torch.nn.functional import pad as zero_pad

        tensors = self._bind(args, kwargs)
        every = self.modules.get(EVERY) if self.engine == "triton" else None
        if every is not None and not (torch.is_grad_enabled() and any(
                getattr(t, "requires_grad", False) for t in tensors.values())):
            try:  # the module checks its inputs (once per signature) and L (every call)
                return every(*[tensors[n] for n in every.module.INPUTS])
            except ValueError:
                pass  # the checks below name what is wrong, as the project's errors
        self._check(tensors)
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors.values()):
            raise InputError(f"{self.family.name!r}: an input requires grad, and the generated "
                             "kernels have no backward: call under torch.no_grad() or "
                             "torch.inference_mode(), or detach() the inputs")
        length = self.size(tensors)
        run = self.module(length)
        if self.engine == "triton":  # the launcher pads, computes grids and cuts
            return run(**tensors)
        lp = self.scaling.padded(length)
        padded = {}
        for name, x in tensors.items():
            pad: list[int] = []
            for a in reversed(range(x.dim())):
                grow = lp - x.shape[a] if a in self.family.dynamic.get(name, {}) else 0
                pad += [0, grow]
            padded[name] = zero_pad(x, pad) if any(pad) else x
        out = run(**padded)
        cut = {}
        for name, t in self.scaling.mg.output_tensors.items():
            axes = self.scaling.tensors.get(t, set())
            cut[name] = out[name][tuple(slice(0, length) if a in axes else slice(None)
                                        for a in range(out[name].dim()))]
        return cut
