"""One custom kernel (a block graph) as the source of one ``@triton.jit`` kernel.

The generated kernel computes exactly what ``mugraph/tiled.py`` computes for one
thread block: ``pid_x = tl.program_id(0)`` (one per grid axis used), block input
tiles cut by ``imap`` (``offs = pid * tile + tl.arange(0, BLOCK)``, strides from
the host) and ``fmap`` (a pointer advanced by one tile per loop iteration; a dim
in both maps starts at ``pid * F * tile``), the
loop stage in ``for f in range(F)`` (no loop when F is 1) with fp32 accumulators
(``tl.zeros`` before, ``+=`` inside), loop-invariant tiles and ops hoisted before
the loop, the post stage after it, and ``tl.store`` by ``omap``/``fmap`` (a
loop-stage output without fmap is stored every iteration: the last write stays).
A concat of tiles is accumulated and stored part by part, each part at its offset.
Tile ops, padding and masks: ``tiles.py``; concat: ``concat.py``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ..cost.tiles import stages_for, warps_for
from ..ir.node import Node, Op, Shape, fmt_shape
from ..ir.printing import short_dtype
from ..mugraph.dots import squeezed
from ..mugraph.kernels import CustomKernel, TensorSpec, axis_name, fmt_map
from ..mugraph.online import causal_skip
from .concat import CodegenError, Val, split
from .family_layout import FamilyLayout
from .tiles import TL_DTYPE, Names, TileOps, exp2, index, shown

__all__ = ["CodegenError", "KernelWriter", "fit", "wrap"]


class KernelWriter(TileOps):
    """Writes the ``@triton.jit`` source of custom kernel ``k`` and its launch.

    ``KernelWriter.write(k, specs, fn_name)`` emits the kernel (twice when a ``tl.dot``
    needs a block padded to 16: block sizes are only known once every op is emitted).
    """

    def __init__(self, k: CustomKernel, specs: Mapping[str, TensorSpec], fn_name: str,
                 block: dict[int, int] | None = None,
                 causal: Mapping[str, tuple] | None = None,
                 family: FamilyLayout | None = None) -> None:
        self.k, self.specs, self.fn_name = k, specs, fn_name
        self.causal = dict(causal or {})  # tensor -> (rows, cols, offset): computed, not read
        # a shape family's kernel: the strides of tensors with a dynamic axis and a loop that
        # grows with the size are runtime arguments, so every padded size runs one binary
        dynamic, loops, short = (family.tensors, family.loop, family.short) if family \
            else ({}, frozenset(), frozenset())
        self.family, self.dynamic = family is not None, dynamic
        self.launched = family.launch.get(k.name) if family else None  # the hint's options
        self.short = set(short) & set(k.reads())  # inputs read unpadded, masked at L
        self.bounds: dict[str, str] = {}  # pointers -> positions-below-L condition
        # L is the runtime argument seq_len: a length mask's offset "(seq_len - 1)", or
        # the bound of an input read unpadded
        self.runtime_length = bool(self.short) or any(
            isinstance(c[2], str) and t in k.reads() for t, c in self.causal.items())
        grows = k.name in loops
        self.looped = k.forloop > 1 or grows
        self.f_count = "n_iter" if grows else str(k.forloop)
        names = Names()
        # a causal mask's tiles are computed from positions: no pointer, no strides
        self.reads = [t for t in k.reads() if t not in self.causal]
        self.writes = list(k.outputs)
        self.ptr = {t: names(f"{t}_ptr") for t in self.reads + self.writes}
        self.stride = {t: [names(f"stride_{t}_{d}") for d in range(len(specs[t].shape))]
                       for t in self.reads + self.writes}
        self.runtime_strides = [t for t in self.reads + self.writes if dynamic.get(t)]
        super().__init__(f"kernel {k.name!r}", names, block)
        self.pid = {a: names(f"pid_{axis_name(a)}") for a in range(len(k.grid))}
        self.pre: list[str] = []  # before the loop (or the whole body when F is 1)
        self.loop: list[str] = []
        self.post: list[str] = []
        self.advance: list[str] = []  # pointer increments at the end of an iteration
        self.tiles: dict[str, Val] = {}
        self.in_loop = True  # emitting the loop stage (False: the post stage)
        self.text = ""

    @classmethod
    def write(cls, k: CustomKernel, specs: Mapping[str, TensorSpec],
              fn_name: str, causal: Mapping[str, tuple] | None = None,
              family: FamilyLayout | None = None) -> KernelWriter:
        """A writer whose ``text`` is the kernel's source (``launch`` gives its launch);
        tiles of the ``causal`` tensors are computed from their positions, not loaded.
        ``family``: a shape family's ``FamilyLayout`` (its growing tensors and loops, the
        inputs read unpadded): the kernel's source is then the same at every padded size;
        loads of an unpadded input are masked past L (``seq_len``)."""
        try:
            writer = cls(k, specs, fn_name, causal=causal, family=family)
            writer.text = writer.source()
            block = writer.bumped()
            if block is not None:
                writer = cls(k, specs, fn_name, block, causal, family)
                writer.text = writer.source()
        except CodegenError as exc:  # which kernel the backend cannot lower
            exc.kernel = exc.kernel or k
            raise
        return writer

    # -- block inputs and outputs -----------------------------------------------------------
    def _pointers(self, section: list[str], tile: str, tensor: str, shape: Shape,
                  imap: Mapping[int, int], fmap: int | None, comment: str,
                  kind: str = "imap", full: Shape | None = None,
                  shift: Mapping[int, int] | None = None) -> str:
        """Emit the offsets and pointer block of a tile of ``tensor``; returns the pointers.

        ``shape`` is the tile's (or, for a part of a concat, the part's) shape, ``full``
        the whole tile's (a block's stride along a grid axis), ``shift`` a part's offset.
        """
        full, shift = full or shape, shift or {}
        maps = f"{kind}={fmt_map(imap)}" if imap or fmap is None else ""
        maps += (" " if maps and fmap is not None else "") + (f"fmap={fmap}" if fmap is not None
                                                             else "")
        section.append(f"# {comment} {maps}".rstrip())
        dims = squeezed(shape)
        terms, r, bounds = [], 0, []
        short = self.dynamic.get(tensor, ()) if tensor in self.short else ()
        for d, size in enumerate(shape):
            stride = self.stride[tensor][d]
            # a dim in both imap and fmap: each block's part is F tiles long
            step = self._step(full[d], d == fmap)
            base = ([f"{self.pid[imap[d]]} * {step}" if step != "1" else self.pid[imap[d]]]
                    if d in imap else []) + ([str(shift[d])] if shift.get(d) else [])
            walk = [f"f * {full[d]}"] if d == fmap and self.looped else []
            if size > 1:
                offs = self.names(f"offs_{tile}_{d}")
                start = "".join(f"{b} + " for b in base)
                self.emit(section, offs, f"{start}tl.arange(0, {self.bname(size)})")
                terms.append(f"{offs}{index(r, len(dims))} * {stride}")
                pos = [f"{offs}{index(r, len(dims))}"]
                r += 1
            else:
                pos = base or ["0"]
                if base:
                    start = " + ".join(base)
                    terms.append(f"({start}) * {stride}" if len(base) > 1 else
                                 f"{start} * {stride}")
            if d in short:  # read unpadded: positions at or past L read as 0
                bounds.append(f"({' + '.join(pos + walk)} < seq_len)")
        ptrs = self.names(f"{tile}_ptrs")
        if bounds:
            self.bounds[ptrs] = " & ".join(bounds)
        line = f"{ptrs} = " + " + ".join([self.ptr[tensor]] + terms)
        if len(line) > 96:  # one term per line, tutorial style
            pad = " " * (len(ptrs) + 4)
            line = f"{ptrs} = ({self.ptr[tensor]}\n" + "\n".join(
                f"{pad}+ {t}" for t in terms[:-1]) + f"\n{pad}+ {terms[-1]})"
        section.extend(line.split("\n"))
        if fmap is not None and self.looped:
            self.advance.append(f"{ptrs} += {full[fmap]} * {self.stride[tensor][fmap]}")
        return ptrs

    def shown(self, tensor: str) -> str:
        """``tensor``'s shape for a comment: a shape family's dynamic axes read ``Lp`` (the
        padded size), so the kernel's text is the same at every padded size."""
        axes = self.dynamic.get(tensor, ())
        return "[" + ", ".join("Lp" if a in axes else str(n)
                               for a, n in enumerate(self.specs[tensor].shape)) + "]"

    def _step(self, tile: int, looped_dim: bool) -> str:
        """A block's part along a dim: one tile, or F tiles for a dim the loop walks."""
        if not looped_dim or self.f_count == "1":
            return str(tile)
        if self.f_count.isdigit():
            return str(tile * int(self.f_count))
        return f"{tile} * {self.f_count}" if tile > 1 else self.f_count

    def tile(self, name: str, in_loop: bool) -> Val:
        """The tile of block input ``name``, loaded where it is first needed."""
        if name in self.tiles:
            return self.tiles[name]
        bi, node = self.k.inputs[name], self.k.loop.inputs[name]
        spec = self.specs[bi.tensor]
        self._check_numel(squeezed(node.shape), f"tile {name!r} {fmt_shape(node.shape)}")
        if bi.tensor in self.causal:
            return self._causal_tile(name, bi, node, spec)
        setup = self.pre if in_loop else self.post
        load = (self.loop if self.looped else self.pre) if bi.fmap is not None else setup
        ptrs = self._pointers(setup, name, bi.tensor, node.shape, bi.imap, bi.fmap,
                              f"in {name}: {short_dtype(node.dtype)}{list(node.shape)} <- "
                              f"{bi.tensor}{self.shown(bi.tensor)}")
        var = self.names(name)
        mask = self._load_mask(ptrs, squeezed(node.shape))
        other = "0" if node.dtype == "bool" else "0.0"
        expr = f"tl.load({ptrs}, mask={mask}, other={other})" if mask else f"tl.load({ptrs})"
        self.emit(load, var, expr)
        self.tiles[name] = Val(var, node.shape, node.dtype)
        return self.tiles[name]

    def _load_mask(self, ptrs: str, dims: tuple[int, ...]) -> str | None:
        """A load's mask: the block's padding lanes, and the positions past L of a shape
        family's input read unpadded."""
        parts = [m for m in (self.full_mask(dims), self.bounds.get(ptrs)) if m]
        return " & ".join(parts) or None

    def split_input(self, src: Node, axis: int, sizes: list[int]) -> Val | None:
        """Block input ``src`` loaded part by part, each at its offset along ``axis``."""
        if src.op is not Op.INPUT or src.arg not in self.k.inputs:
            return None
        parts, at = [], 0
        for n in sizes:
            part = Node(Op.SLICE, (src,), (axis, at, at + n),
                        src.shape[:axis] + (n,) + src.shape[axis + 1:], src.dtype)
            v = self.sliced_tile(part, self.in_loop, f"{src.arg} [{at}:{at + n}] of axis {axis}")
            if v is None:
                return None
            parts.append(v)
            at += n
        return split(parts, src.shape, axis, f"{src.arg} in parts")

    def sliced_tile(self, node: Node, in_loop: bool, label: str = "") -> Val | None:
        """A slice of a block input's tile, loaded at its offset (None: not such a slice)."""
        if node.op is not Op.SLICE:
            return None
        src = node.srcs[0]
        if src.op is not Op.INPUT or src.arg not in self.k.inputs:
            return None
        bi = self.k.inputs[src.arg]
        axis, start, stop = node.arg
        if bi.tensor in self.causal or axis in bi.imap or axis == bi.fmap:
            return None
        key = f"{src.arg}[{axis}:{start}:{stop}]"
        if key in self.tiles:
            return self.tiles[key]
        label = label or self.label(node)
        setup = self.pre if in_loop else self.post
        load = (self.loop if self.looped else self.pre) if bi.fmap is not None else setup
        ptrs = self._pointers(setup, f"{src.arg}_s{start}", bi.tensor, node.shape, bi.imap,
                              bi.fmap, f"{label}: {bi.tensor}{self.shown(bi.tensor)} at offset "
                              f"{start} of axis {axis}", full=src.shape, shift={axis: start})
        var = self.names(f"{src.arg}_s{start}")
        mask = self._load_mask(ptrs, squeezed(node.shape))
        expr = f"tl.load({ptrs}, mask={mask}, other=0.0)" if mask else f"tl.load({ptrs})"
        self.emit(load, var, expr)
        self.tiles[key] = Val(var, node.shape, node.dtype)
        return self.tiles[key]

    def _causal_tile(self, name: str, bi, node: Node, spec: TensorSpec) -> Val:
        """A tile of a causal mask from its rows' and columns' positions (no load):
        ``row + offset >= col``, each position ``pid * tile (+ f * tile in the loop) + i``."""
        rows, cols, off = self.causal[bi.tensor]
        dims, pos, r = squeezed(node.shape), [], 0
        for d, size in enumerate(node.shape):
            step = self._step(size, d == bi.fmap)
            terms = [f"{self.pid[bi.imap[d]]} * {step}"] if d in bi.imap else []
            if d == bi.fmap and self.looped:
                terms.append(f"f * {size}")
            if size > 1:
                terms.append(f"tl.arange(0, {self.bname(size)}){index(r, len(dims))}")
                r += 1
            pos.append("(" + " + ".join(terms) + ")" if terms else "0")
        load = (self.loop if self.looped else self.pre) if bi.fmap is not None else self.pre
        var = self.names(name)
        self.emit(load, var, f"{pos[0]} + {off} >= {pos[1]}",
                  f"in {name}: " + (f"causal mask {rows}x{cols}" if not isinstance(off, str)
                                    else "length mask (col < seq_len)")
                  + " from positions (not loaded)")
        self.tiles[name] = Val(var, node.shape, "bool")
        return self.tiles[name]

    def store(self, tensor: str, node: Node, v: Val, setup: list[str], where: list[str]) -> None:
        """Write tile ``v`` (of block output ``tensor``) by its omap and fmap."""
        bo, spec = self.k.outputs[tensor], self.specs[tensor]
        src = self.listed.get(id(node), node.arg)
        comment = f"out {tensor}{self.shown(tensor)} <- {bo.stage} {src} " \
                  f"{short_dtype(node.dtype)}{list(node.shape)}"
        offset, parts = 0, v.parts or (v,)
        for i, part in enumerate(parts):
            shape = part.shape if v.parts else node.shape
            ptrs = self._pointers(setup, f"{tensor}_p{i}" if v.parts else tensor, tensor, shape,
                                  bo.omap, bo.fmap, comment + (f" [part {i}]" if v.parts else ""),
                                  "omap", node.shape, {v.axis: offset} if v.parts else None)
            offset += shape[v.axis] if v.parts else 0
            value = self.materialize(part, shape)
            value_dtype = "float32" if part.const is not None else part.dtype
            if value_dtype != spec.dtype:
                value = f"{value}.to({TL_DTYPE[spec.dtype]})"
            mask = self.full_mask(squeezed(shape))
            where.append(f"tl.store({ptrs}, {value}" + (f", mask={mask})" if mask else ")"))

    def accumulate(self, name: str, shape: Shape, v: Val) -> Val:
        """The fp32 accumulator ``name`` of loop value ``v`` (one per part of a concat)."""
        if v.parts:
            accs = [self.accumulate(f"{name}_{i}", p.shape, p) for i, p in enumerate(v.parts)]
            return Val(f"<acc {name}>", shape, "float32", all(a.clean for a in accs),
                       parts=tuple(accs), axis=v.axis)
        var = self.names(f"acc_{name}")
        if self.looped:
            self.emit(self.pre, var, f"tl.zeros({self.blocks(squeezed(shape))}, dtype=tl.float32)")
            self.loop.append(f"{var} += {self.f32(v)}")
        else:
            dtype = "float32" if v.const is not None else v.dtype
            self.emit(self.pre, var, self.f32(Val(self.materialize(v, shape), shape, dtype)))
        return Val(var, shape, "float32", v.clean)

    # -- running maxima (online softmax) -----------------------------------------------------
    def _online_order(self, runs: Mapping[str, str]) -> tuple[list[Node], list[Node]]:
        """The loop nodes that read no running maximum, then those that do."""
        reads: set[int] = set()
        nodes = self.k.loop.nodes()
        for n in nodes:
            if (n.op is Op.INPUT and n.arg in runs) or any(id(s) in reads for s in n.srcs):
                reads.add(id(n))
        return [n for n in nodes if id(n) not in reads], [n for n in nodes if id(n) in reads]

    def _loop_node(self, node: Node, env: dict[int, Val], section: list[str]) -> None:
        if node.op is Op.INPUT:
            if node.arg not in self.k.inputs:  # a running maximum: set by _running_maxima
                return
            env[id(node)] = self.tile(node.arg, True)
            self.listed[id(node)] = node.arg
            return
        env[id(node)] = self.sliced_tile(node, True) or self.node(node, env, section)

    def _running_maxima(self, env: dict[int, Val], runs: Mapping[str, str]) -> dict[str, Val]:
        """``m_new = max(acc_m, this tile's max)`` and ``alpha_m = exp(acc_m - m_new)`` for
        each max accumulator (fp32, from -inf); returns alpha per maximum."""
        k, alphas = self.k, {}
        self._maxima: dict[str, tuple[str, str, str]] = {}  # max acc -> (acc, new, alpha)
        for a in k.maxima:
            node = k.loop.outputs[a]
            v, shape = env[id(node)], node.shape
            if not self.looped:  # one iteration: the tile's max is the maximum (-inf reads 0)
                use = self.names(f"{a}_use")
                self.emit(self.pre, use, f"tl.where({self.f32(v)} == -float('inf'), 0.0, "
                                         f"{self.f32(v)})")
                new = Val(use, shape, "float32", False)
            else:
                names = tuple(self.names(f"{p}{a}{q}") for p, q in (("acc_", ""), ("", "_new"),
                                                                      ("alpha_", "")))
                acc, new_var, alpha = self._maxima[a] = names
                self.emit(self.pre, acc, f"tl.full({self.blocks(squeezed(shape))}, "
                                         "-float('inf'), tl.float32)")
                self.emit(self.loop, new_var, f"tl.maximum({acc}, {self.f32(v)}, "
                                                 "propagate_nan=tl.PropagateNan.ALL)",
                          f"running max {a}")
                use = self.names(f"{a}_use")  # -inf (nothing kept yet in a row) reads as 0
                self.emit(self.loop, use, f"tl.where({new_var} == -float('inf'), 0.0, {new_var})")
                self.emit(self.loop, alpha, exp2(f"{acc} - {use}"), f"rescale for {a}")
                new = Val(use, shape, "float32", False)
                alphas[a] = Val(alpha, shape, "float32", False)
            run = f"{a}_run"
            if run in runs:
                env[id(k.loop.inputs[run])] = new
                self.listed[id(k.loop.inputs[run])] = run
        return alphas

    def _accumulator(self, a: str, env: dict[int, Val], alphas: Mapping[str, Val]) -> Val:
        k = self.k
        node = k.loop.outputs[a]
        if a in k.maxima:
            return Val(self._maxima[a][0] if self.looped else self.f32(env[id(node)]),
                       node.shape, "float32", False)
        m = k.rescaled().get(a)
        if m is None or not self.looped:
            return self.accumulate(a, node.shape, env[id(node)])
        v = env[id(node)]
        if v.parts:
            raise CodegenError(f"{self.who}: accumulator {a!r} is a concat of tiles rescaled "
                               "by a running maximum")
        var = self.names(f"acc_{a}")
        self.emit(self.pre, var, f"tl.zeros({self.blocks(squeezed(node.shape))}, "
                                 "dtype=tl.float32)")
        alpha = self.broadcast(alphas[m].expr, alphas[m], node.shape)
        self.loop.append(f"{var} = {var} * {alpha} + {self.f32(v)}")
        return Val(var, node.shape, "float32", v.clean)

    # -- the stages -------------------------------------------------------------------------
    def body(self) -> None:
        """Emit the loop stage, the accumulators, the post stage and the stores."""
        k = self.k
        lsec = self.loop if self.looped else self.pre
        env: dict[int, Val] = {}
        variant = k.per_iteration()  # depends on the loop iteration (an fmap tile)
        runs = k.running_inputs()
        first, rest = self._online_order(runs)
        for node in first:
            self._loop_node(node, env, lsec if id(node) in variant else self.pre)
        alphas = self._running_maxima(env, runs)
        for node in rest:
            self._loop_node(node, env, lsec if id(node) in variant else self.pre)
        accs = {a: self._accumulator(a, env, alphas) for a in k.accumulators}
        if self.looped:  # the running maxima move on after every rescale used the old ones
            self.loop += [f"{acc} = {new}" for acc, new, _ in self._maxima.values()]
        for t, bo in k.outputs.items():
            if bo.stage == "loop":
                node = k.loop.outputs[t]
                fixed = bo.fmap is None and id(node) not in variant
                self.store(t, node, env[id(node)], self.pre, self.pre if fixed else lsec)
        penv: dict[int, Val] = {}
        self.in_loop = False
        for node in k.post.nodes():
            if node.op is Op.INPUT:
                penv[id(node)] = accs[node.arg] if node.arg in accs else self.tile(node.arg, False)
                self.listed[id(node)] = node.arg
            else:
                penv[id(node)] = self.sliced_tile(node, False) or self.node(node, penv, self.post)
        for t, bo in k.outputs.items():
            if bo.stage == "post":
                node = k.post.outputs[t]
                self.store(t, node, penv[id(node)], self.post, self.post)

    def source(self) -> str:
        """The ``@triton.jit`` function."""
        k = self.k
        for a, g in enumerate(k.grid):
            if a and g > 65535:
                raise CodegenError(f"{self.who}: grid axis {axis_name(a)} has {g} blocks; "
                                   "Triton allows at most 65535 on axes y and z")
        self.body()
        tensors = self.reads + self.writes
        runtime = ["seq_len"] if self.runtime_length else []  # a length mask's L: not constexpr
        runtime += ["n_iter"] if self.f_count == "n_iter" else []
        runtime += [s for t in self.runtime_strides for s in self.stride[t]]
        args = [[self.ptr[t] for t in tensors] + runtime,
                [f"{s}: tl.constexpr" for t in tensors if t not in self.runtime_strides
                 for s in self.stride[t]],
                [f"{self.block_name[n]}: tl.constexpr" for n in sorted(self.block_name)]]
        out = ["@triton.jit", f"def {self.fn_name}("]
        for group in args:
            out += wrap(group, "    ", ",")
        out.append("):")
        grid = ", ".join(str(g) for g in k.grid)
        shape = f"grid ({grid}), forloop {k.forloop}" if not self.family else \
            "grid and loop count set at launch (a shape family)"
        writes = ", ".join(shown(t) for t in self.writes)
        out.append(f'    """Custom kernel {shown(k.name)}: {shape}; writes {writes}."""')
        text = "\n".join(self.pre + self.loop + self.post + self.advance)
        head = [f"{self.pid[a]} = tl.program_id({a})" for a in range(len(k.grid))
                if re.search(rf"\b{self.pid[a]}\b", text)]
        head += [f"{m} = tl.arange(0, {self.bname(n)}) < {n}"
                 for n, m in sorted(self.masks.items())]
        out += fit(head + self.pre, "    ")
        skip = causal_skip(k, self.causal, self.f_count == "n_iter") if self.looped else None
        if skip is not None:  # tiles past the last one the causal mask keeps change nothing
            bi, (_, _, off) = skip
            rows, cols = k.loop.inputs[bi.name].shape[:2]
            row0 = f"{self.pid[bi.imap[0]]} * {rows}" if 0 in bi.imap else "0"
            col0 = f" - {self.pid[bi.imap[1]]} * {self._step(cols, True)}" if 1 in bi.imap \
                else ""
            last = f"{rows - 1} + {off}" if isinstance(off, str) else rows - 1 + off
            out.append(f"    f_end = tl.minimum({self.f_count}, tl.maximum(0, ({row0} + "
                       f"{last}{col0}) // {cols} + 1))  # causal: skip masked tiles")
            out.append("    for f in range(0, f_end):")
        elif self.looped:
            out.append(f"    for f in range({self.f_count}):")
        if self.looped:
            out += fit(self.loop + self.advance, "        ")
        out += fit(self.post, "    ")
        return "\n".join(out) + "\n"

    def launch(self, var: Mapping[str, str], strides: Mapping[str, list[str]]) -> list[str]:
        """Host lines launching the kernel; ``var`` maps device tensors to Python variables,
        ``strides`` each tensor to its strides' expressions (the kernel's constexpr strides:
        literals, or variables of the launcher)."""
        tensors = self.reads + self.writes
        warps, stages = self.launched or (warps_for(self.k) or 16, stages_for(self.k))
        grid = ", ".join(str(g) for g in self.k.grid) + ("," if len(self.k.grid) == 1 else "")
        runtime = (["seq_len"] if self.runtime_length else []) + (
            [str(self.k.forloop)] if self.f_count == "n_iter" else []) + [
            strides[t][d] for t in self.runtime_strides for d in range(len(self.stride[t]))]
        args = [[var[t] for t in tensors] + runtime,
                [strides[t][d] for t in tensors if t not in self.runtime_strides
                 for d in range(len(self.stride[t]))],
                [f"{self.block_name[n]}={self.block[n]}" for n in sorted(self.block_name)]
                + [f"num_warps={warps}", f"num_stages={stages}"]]
        lines = [f"{self.fn_name}[({grid})]("]
        for group in args:
            lines += wrap(group, "    ", ",")
        return lines + [")"]


def fit(lines: list[str], indent: str, width: int = 100) -> list[str]:
    """Indent ``lines``; a trailing comment that makes a line too long goes on its own line."""
    out = []
    for line in lines:
        code, sep, comment = line.partition("  # ")
        if sep and len(indent) + len(line) > width:
            out += [f"{indent}# {comment}", indent + code]
        else:
            out.append(indent + line)
    return out


def wrap(items: list[str], indent: str, sep: str, width: int = 96) -> list[str]:
    """``items`` joined by ``sep`` into lines of at most ``width`` characters."""
    lines: list[str] = []
    line = ""
    for item in items:
        piece = item + sep
        if line and len(indent) + len(line) + 1 + len(piece) > width:
            lines.append(indent + line)
            line = piece
        else:
            line = f"{line} {piece}" if line else piece
    if line:
        lines.append(indent + line)
    return lines
