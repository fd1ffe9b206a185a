"""The PyTorch front end: ``from_torch(fn_or_module, *example_inputs) -> em.Graph``.

The function or ``nn.Module`` is traced with ``torch.fx`` (symbolic tracing,
recording the user's source line of every node), then the fx graph is
interpreted once with ``em.Tensor``s in place of torch tensors: placeholders
become ``Graph.input``s with the example inputs' shapes and dtypes, module
parameters and buffers become inputs named after their path ("proj.weight"
becomes the input ``proj_weight``), and every call goes through the support
table of ``torch_ops``. Shape arithmetic (``x.shape[-1] ** -0.5``) is folded in
Python. Ops computed from buffers alone are folded in torch at trace time: a comparison
of a mask buffer (nanoGPT's ``self.bias[:, :, :T, :T] == 0``) becomes the causal mask
built from positions, or a constant bool input, and the buffer is no input any more
(``torch_masks``). An op outside the table raises ``UnsupportedOpError`` naming the op and
the source line; a dtype other than float16, bfloat16, float32 (bool masks, and int64 or
int32 index tensors: token ids of an embedding lookup) raises ``DTypeError``.

``softmax`` becomes ``em.softmax``: ``exp(x - max) / sum(exp(x - max))``, max-subtracted
as torch computes it, so large logits do not overflow; of a float16 or bfloat16 tensor it
is computed in float32 and rounded once, as torch's kernels do (``torch_ops.torch_softmax``).

The ``Converter`` is shared with the ``torch.compile`` backend (``dynamo/backend.py``).
"""

from __future__ import annotations

import copy
import inspect
import keyword
import linecache
import os
import re
import sys
from typing import Any

import torch
from torch import fx

from ..ir.errors import DTypeError, GraphError, MirageError, UnsupportedOpError
from ..ir.node import DTYPES, Node, Op, canonical_dtype, located
from .graph import Graph, Tensor
from .inplace import functionalize
from .quantized import dequantized, is_wrapped
from .torch_masks import FOLD_LIMIT, Snapshot, constant_mask, source_value
from .torch_ops import METHODS, MODULES, SUPPORTED, function_handler

FACTORIES = (torch.zeros, torch.ones, torch.full)  # a 0-dim float constant (``factory``)
# a constant shaped or typed after a tensor (``like_factory``): masking_utils' 0-dim
# ``q_idx.new_ones((), dtype=torch.bool)`` that its and_masks start from
LIKE_FUNCTIONS = {torch.ones_like: torch.ones, torch.zeros_like: torch.zeros,
                  torch.full_like: torch.full}
LIKE_METHODS = {"new_ones": torch.ones, "new_zeros": torch.zeros, "new_full": torch.full}

__all__ = ["Converter", "from_torch", "graph_inputs", "op_name", "source_line", "trace",
           "unique_identifier"]

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # eqsat_mirage/
_FILE_LINE = re.compile(r'File "([^"]+)", line (\d+)')


def _user_frame() -> str:
    """``File "...", line N, in fn`` and the code of the innermost frame outside torch and us."""
    frame = sys._getframe(1)
    while frame is not None:
        fname = os.path.abspath(frame.f_code.co_filename)
        if not (fname.startswith((_TORCH_DIR, _PKG_DIR)) or frame.f_code.co_filename[:1] == "<"):
            code = linecache.getline(fname, frame.f_lineno).strip()
            return f'  File "{fname}", line {frame.f_lineno}, in {frame.f_code.co_name}\n    {code}'
        frame = frame.f_back
    return ""


class _Tracer(fx.Tracer):
    """``fx.Tracer`` that records the user's source line of every node (functions included).

    Buffers are proxied like parameters (``get_attr`` nodes named after their path), so
    ``self.bias[:, :, :T, :T]`` with ``T`` from ``x.size()`` traces, and the converter
    knows which constants a mask was computed from."""

    proxy_buffer_attributes = True

    def create_node(self, *args: Any, **kwargs: Any) -> fx.Node:
        node = super().create_node(*args, **kwargs)
        if node.op not in ("placeholder", "output") and not node.meta.get("stack_trace"):
            where = _user_frame()
            if where:
                node.meta["stack_trace"] = where
        return node


def trace(fn_or_module: Any) -> fx.GraphModule:
    """The ``fx.GraphModule`` of a function or module (symbolic tracing, source lines kept).

    Raises ``UnsupportedOpError`` when torch.fx cannot trace it (e.g. Python control
    flow that depends on tensor values).
    """
    if isinstance(fn_or_module, fx.GraphModule):
        return fn_or_module
    what = getattr(fn_or_module, "__name__", type(fn_or_module).__name__)
    if not callable(fn_or_module):
        raise UnsupportedOpError(f"from_torch: expected a function or an nn.Module, got "
                                 f"{type(fn_or_module).__name__}")
    try:
        tracer = _Tracer()
        graph = tracer.trace(fn_or_module)
    except Exception as exc:  # torch.fx raises TraceError, TypeError, RuntimeError, ...
        where = _traceback_line(exc)
        raise UnsupportedOpError(
            f"from_torch: torch.fx cannot trace {what!r}{where}: {type(exc).__name__}: {exc} "
            "(torch.fx traces symbolically: Python control flow on tensor values, and calls "
            "that need a concrete size, such as torch.ones(n, n) with n = x.shape[0], cannot "
            "be traced; pass such tensors as inputs, or use torch.compile(fn, backend="
            "em.backend), which sees concrete values)") from exc
    return fx.GraphModule(tracer.root, graph, what)  # with the tensor constants it made


def _traceback_line(exc: BaseException) -> str:
    """`` at file.py:LINE (`code`)`` of the innermost user frame of ``exc``'s traceback."""
    found = ""
    tb = exc.__traceback__
    while tb is not None:
        fname = os.path.abspath(tb.tb_frame.f_code.co_filename)
        if not fname.startswith((_TORCH_DIR, _PKG_DIR)) and not fname.startswith("<"):
            code = linecache.getline(fname, tb.tb_lineno).strip()
            found = f" at {os.path.basename(fname)}:{tb.tb_lineno}" + (f" (`{code}`)" if code
                                                                      else "")
        tb = tb.tb_next
    return found


def op_name(node: fx.Node, root: torch.nn.Module | None = None) -> str:
    """A readable name of the op of an fx node: ``torch.sort``, ``Tensor.exp``, ``nn.GELU``."""
    if node.op == "call_function":
        if isinstance(node.target, torch._ops.OpOverload):
            return str(node.target)  # aten.view.default
        try:
            name = fx.node._get_qualified_name(node.target)
        except Exception:  # noqa: BLE001 - any odd callable: fall back to its name
            name = getattr(node.target, "__name__", repr(node.target))
        if name.endswith("torch_movement.index_with_tensor"):  # the backend's own target
            return "operator.getitem"  # for x[idx] (dynamo.support.retarget_tensor_indexing)
        return name.replace("_operator.", "operator.").replace("torch._C._nn.", "torch.")
    if node.op == "call_method":
        return f"Tensor.{node.target}"
    if node.op == "call_module" and root is not None:
        try:
            mod = root.get_submodule(node.target)
        except AttributeError:
            return f"module {node.target!r}"
        cls = type(mod)
        prefix = "nn." if cls.__module__.startswith("torch.nn") else f"{cls.__module__}."
        return f"{prefix}{cls.__name__} (module {node.target!r})"
    return f"{node.op} {node.target}"


def source_line(node: fx.Node, fallback: Any = None) -> str:
    """``file.py:LINE (`code`)`` of the user's source of ``node``, or ``""`` if unknown.

    Reads the node's recorded stack trace (``node.meta["stack_trace"]``, set by our
    tracer and by Dynamo): its innermost frame outside torch (its last frame when every
    one is torch's); without one, searches the source of ``fallback`` (the
    traced function or module) for the op's name.
    """
    trace_text = node.meta.get("stack_trace") or ""
    hits = list(_FILE_LINE.finditer(trace_text))
    if hits:  # the innermost frame outside torch (an inlined nn.Module's forward is torch's)
        mine = [h for h in hits if not os.path.abspath(h.group(1)).startswith(_TORCH_DIR)]
        fname, line = (mine or hits)[-1].group(1), int((mine or hits)[-1].group(2))
        code = linecache.getline(fname, line).strip()
        return f"{os.path.basename(fname)}:{line}" + (f" (`{code}`)" if code else "")
    fn = getattr(fallback, "forward", fallback)
    try:
        lines, start = inspect.getsourcelines(fn)
        fname = os.path.basename(inspect.getsourcefile(fn) or "?")
    except (TypeError, OSError):
        return ""
    needle = str(node.target).split(".")[-1] if node.op != "call_function" else \
        op_name(node).split(".")[-1]
    for i, text in enumerate(lines):
        if needle and needle in text and i > 0:
            return f"{fname}:{start + i} (`{text.strip()}`)"
    return f"{fname}:{start} (in {getattr(fn, '__name__', '?')})"


def unique_identifier(name: str, used: set[str]) -> str:
    """``name`` made a Python identifier not in ``used`` (which it is added to)."""
    base = re.sub(r"\W", "_", str(name)) or "x"
    if not base.isidentifier() or keyword.iskeyword(base):
        base = f"t_{base}"
    out, i = base, 1
    while out in used:
        out, i = f"{base}_{i}", i + 1
    used.add(out)
    return out


def dtype_of(value: Any, what: str) -> str:
    """The canonical dtype of a torch tensor, or a ``DTypeError`` naming ``what``."""
    try:
        return canonical_dtype(value.dtype)
    except DTypeError:
        raise DTypeError(f"{what}: dtype {value.dtype} is not supported (eqsat-mirage "
                         f"supports {', '.join(DTYPES)}, bool masks, int64/int32 "
                         "indices and int8/uint8 and float8_e4m3fn/float8_e5m2 weights)"
                         ) from None


def call_in_torch(node: fx.Node, value_of: Any) -> Any:
    """Run the call_function or call_method ``node`` in torch (no grad) on its operands'
    values (``value_of``: fx node -> value); raises what torch raises."""
    args = fx.node.map_arg(node.args, value_of)
    kwargs = fx.node.map_arg(node.kwargs, value_of)
    with torch.no_grad():
        if node.op == "call_method":
            return getattr(args[0], node.target)(*args[1:], **kwargs)
        return node.target(*args, **kwargs)


class Converter:
    """Interprets an fx graph node by node, building an ``em.Graph`` with ``em.Tensor``s.

    ``env`` maps fx nodes to their values; ``sources`` maps each graph input name to
    ``("arg", i)`` (the i-th positional input), ``("param", path)`` (a parameter
    or buffer of ``root``) or ``("const", tensor)`` (a folded bool mask); ``fallback`` (the
    traced function or module) serves ``source_line`` when a node has no recorded stack trace.

    ``known`` maps fx nodes to the torch values of constants (module buffers, set by the
    caller) and of every op computed from constants alone, which ``run`` folds in torch;
    a folded bool result becomes a ``BoolMask`` (``torch_masks.constant_mask``), and the
    constants it read are guarded (``snapshots``: {source: ``Snapshot``}).
    """

    def __init__(self, graph: Graph, root: torch.nn.Module, fallback: Any = None) -> None:
        self.graph, self.root, self.fallback = graph, root, fallback
        self.env: dict[fx.Node, Any] = {}
        self.sources: dict[str, tuple[str, Any]] = {}
        self.used: set[str] = set()
        self._params: dict[str, Tensor] = {}
        self.known: dict[fx.Node, torch.Tensor] = {}
        self.known_sources: dict[fx.Node, tuple] = {}  # a constant node -> its input's source
        self._roots: dict[fx.Node, frozenset[fx.Node]] = {}  # the constants a fold read
        self.snapshots: dict[tuple, Snapshot] = {}
        graph.torch_sources = self.sources

    def input(self, name: str, shape: tuple[int, ...], dtype: str, source: tuple) -> Tensor:
        """A new graph input (the name made a unique identifier) fed from ``source``."""
        ident = unique_identifier(name, self.used)
        t = self.graph.input(ident, shape, dtype)
        self.sources[ident] = source
        return t

    def tensor_input(self, name: str, value: Any, source: tuple) -> Tensor:
        """A graph input with the shape and dtype of the torch tensor (or fake) ``value``; a
        quantized weight (a wrapper tensor) is its dequantization from inputs for its parts
        (``quantized.dequantized``)."""
        if is_wrapped(value):
            return dequantized(self.input, name, value, source)
        return self.input(name, tuple(int(d) for d in value.shape),
                          dtype_of(value, f"input {name!r}"), source)

    def param(self, path: str) -> Tensor:
        """The graph input holding parameter or buffer ``path`` of the root module."""
        if path not in self._params:
            try:
                value = self.root.get_parameter(path)
            except AttributeError:
                try:
                    value = self.root.get_buffer(path)
                except AttributeError:
                    obj = self.root
                    for part in path.split("."):
                        obj = getattr(obj, part)
                    value = obj
            if not isinstance(value, torch.Tensor):
                raise UnsupportedOpError(f"attribute {path!r} is a {type(value).__name__}, "
                                         "not a tensor")
            self._params[path] = self.tensor_input(path, value, ("param", path))
        return self._params[path]

    def where(self, node: fx.Node) -> str:
        """``op at file:line (`code`)`` for error messages."""
        loc = source_line(node, self.fallback)
        return op_name(node, self.root) + (f" at {loc}" if loc else "")

    def lookup(self, node: fx.Node) -> tuple[Any, tuple]:
        """The support-table handler of a call node and its leading arguments.

        Raises ``UnsupportedOpError`` naming the op and its source line when the
        table has none.
        """
        if node.op == "call_function" and any(node.target is f for f in FACTORIES):
            return (lambda *_, **__: self.factory(node)), ()
        if node.op == "call_function" and node.target in LIKE_FUNCTIONS or \
                node.op == "call_method" and node.target in LIKE_METHODS:
            return (lambda *args, **kwargs: self.like_factory(node, *args, **kwargs)), ()
        if node.op == "call_function":
            handler, extra = function_handler(node.target), ()
        elif node.op == "call_method":
            handler, extra = METHODS.get(node.target), ()
        elif node.op == "call_module":
            mod = self.root.get_submodule(node.target)
            handler, extra = MODULES.get(type(mod)), (self, mod, node.target)
        else:
            raise UnsupportedOpError(f"fx node {node.name!r} of kind {node.op!r}")
        if handler is None:
            raise UnsupportedOpError(f"unsupported op {self.where(node)}; eqsat-mirage "
                                     f"supports {SUPPORTED}")
        return handler, extra

    def constant(self, node: fx.Node, value: torch.Tensor, source: tuple) -> None:
        """Mark ``node`` (an input fed from ``source``) as the constant ``value``: ops computed
        from constants alone are folded (a mask buffer)."""
        if value.numel() <= FOLD_LIMIT:
            self.known[node], self.known_sources[node] = value, source
            self._roots[node] = frozenset({node})

    def fold(self, node: fx.Node) -> torch.Tensor | None:
        """The torch value of a call node whose tensor operands are all constants, or None."""
        if node.op not in ("call_function", "call_method"):
            return None
        srcs = node.all_input_nodes
        if not srcs or any(s not in self.known and (isinstance(self.env.get(s), torch.Tensor)
                                                    or hasattr(self.env.get(s), "shape"))
                           for s in srcs) or not any(s in self.known for s in srcs):
            return None
        try:
            value = call_in_torch(node, lambda n: self.known.get(n, self.env.get(n)))
        except Exception:  # noqa: BLE001 - not foldable: converted as any other op
            return None
        if not isinstance(value, torch.Tensor) or value.numel() > FOLD_LIMIT:
            return None
        self._roots[node] = frozenset().union(*(self._roots.get(s, frozenset()) for s in srcs))
        return value

    def factory(self, node: fx.Node) -> Tensor:
        """A constant made by a factory (``torch.zeros((), dtype=dtype)``: transformers' additive
        mask is ``torch.where(mask, torch.zeros((), dtype=dtype), min)``): one value, 0-dim."""
        if node.all_input_nodes:  # a size or value computed in the graph
            raise UnsupportedOpError(f"{self.where(node)}: a constant whose size or value is "
                                     "computed (a 0-dim float one of constant value is "
                                     "supported)")
        kwargs = {k: v for k, v in node.kwargs.items() if k != "device"}
        return self._float_constant(node, self._made(node, node.target, *node.args, **kwargs),
                                    "a 0-dim float one is supported")

    def _made(self, node: fx.Node, make: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        """``make(*args, **kwargs)``, torch's refusal an ``UnsupportedOpError`` naming ``node``."""
        try:
            with torch.no_grad():
                return make(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - arguments torch refuses: not converted
            raise UnsupportedOpError(f"unsupported arguments to {self.where(node)}: "
                                     f"{exc}") from None

    def _float_constant(self, node: fx.Node, value: torch.Tensor, supported: str) -> Tensor:
        """The graph constant of the 0-dim float ``value`` made by ``node``, or an
        ``UnsupportedOpError`` saying ``supported``."""
        dtype = str(value.dtype).removeprefix("torch.")
        if value.dim() != 0 or dtype not in ("float16", "bfloat16", "float32"):
            raise UnsupportedOpError(f"{self.where(node)}: a constant of shape "
                                     f"{list(value.shape)} and dtype {dtype} ({supported})")
        const = Tensor(Node(Op.CONST, (), float(value), (), "float32"), self.graph)
        return const if dtype == "float32" else const.astype(dtype)

    def like_factory(self, node: fx.Node, like: Any, *args: Any, **kwargs: Any) -> Any:
        """A constant made after a tensor ``like`` (``x.new_ones(size)``, ``ones_like(x)``,
        their zeros and full): a 0-dim bool one is a Python bool (folded where it is
        combined), a bool one of a fixed shape a constant mask
        (``torch_masks.constant_mask``), a float one a 0-dim constant; ``like`` gives only its
        shape (``*_like``) and dtype."""
        if not hasattr(like, "shape") or not hasattr(like, "dtype"):
            raise UnsupportedOpError(f"{self.where(node)}: expected a tensor, got "
                                     f"{type(like).__name__}")
        kwargs = {k: v for k, v in kwargs.items()
                  if k not in ("device", "layout", "pin_memory", "requires_grad",
                               "memory_format")}
        if node.op == "call_function":
            make, size = LIKE_FUNCTIONS[node.target], tuple(like.shape)
            args = (size, *args) if make is torch.full else (size,)
        else:
            make = LIKE_METHODS[node.target]
        if kwargs.get("dtype") is None:  # torch's new_* and *_like: the tensor's dtype
            kwargs["dtype"] = getattr(torch, str(like.dtype), None)
        value = self._made(node, make, *args, **kwargs)  # a computed size: refused there
        if value.dtype == torch.bool and value.dim() == 0:  # folded where it is combined
            return bool(value)  # (``torch_masks.combine``: True & m is m)
        if value.dtype == torch.bool and 0 not in value.shape:
            return constant_mask(self.graph, value, node.name, self.input)
        return self._float_constant(node, value, "a bool one, or a 0-dim float one, is "
                                                 "supported")

    def run(self, node: fx.Node) -> Any:
        """Convert one call/get_attr node (its operands already in ``env``); returns its value."""
        if node.op == "get_attr":
            held = self.root
            for part in str(node.target).split("."):
                held = getattr(held, part, None)
            if isinstance(held, torch.Tensor) and not (held.is_floating_point() or held.dtype
                                                       in (torch.bool, torch.int8, torch.uint8)):
                self.env[node] = held  # an integer constant: indices (torch_movement.take)
                return held
            value = self.param(node.target)
            self.env[node] = value
            if isinstance(held, torch.Tensor) and not isinstance(held, torch.nn.Parameter) \
                    and not is_wrapped(held):  # a quantized buffer: read as its parts
                self.constant(node, held, self.sources[value.node.arg])  # a buffer
            return value
        folded = self.fold(node)
        if folded is not None:
            self.known[node] = folded
            if folded.dtype == torch.bool:  # a constant mask: from positions, or an input
                for root in self._roots[node]:
                    source = self.known_sources[root]
                    self.snapshots.setdefault(source, Snapshot(self.known[root]))
                value = constant_mask(self.graph, folded, node.name, self.input)
                self.env[node] = value
                return value
        handler, extra = self.lookup(node)
        args = fx.node.map_arg(node.args, self.env.__getitem__)
        kwargs = fx.node.map_arg(node.kwargs, self.env.__getitem__)
        try:
            with located(source_line(node, self.fallback).split(" (")[0]):  # nodes, errors
                value = handler(*extra, *args, **kwargs)
        except UnsupportedOpError as exc:
            raise UnsupportedOpError(f"unsupported use of {self.where(node)}: {exc}") from None
        except MirageError as exc:
            raise type(exc)(f"{exc} (converting {self.where(node)})") from None
        except (TypeError, KeyError) as exc:
            raise UnsupportedOpError(f"unsupported arguments to {self.where(node)}: "
                                     f"{exc}") from None
        self.env[node] = value
        return value

    def outputs(self, value: Any, prefix: str = "out", top: bool = True) -> list[tuple[str, Any]]:
        """The leaves of an fx ``output`` value (a tensor, or nested tuples/lists/dicts), named.

        A single value is ``out``; a tuple ``out0``, ``out1``; a dict keeps its keys;
        deeper levels append ``_i`` or ``_key``.
        """
        if isinstance(value, (tuple, list)):
            sep = "" if top else "_"
            return [o for i, v in enumerate(value)
                    for o in self.outputs(v, f"{prefix}{sep}{i}", False)]
        if isinstance(value, dict):
            return [o for k, v in value.items()
                    for o in self.outputs(v, str(k) if top else f"{prefix}_{k}", False)]
        return [(prefix, value)]

    def finish(self, keep: frozenset = frozenset()) -> None:
        """End the conversion: remove the inputs of constants that only fed folds (no
        output reads them; ``keep``: inputs handed back as outputs, kept)."""
        reached = {id(n) for n in self.graph.nodes()}
        for source in self.known_sources.values():
            for name, src in list(self.sources.items()):
                if src is source and name not in keep and \
                        id(self.graph.inputs[name]) not in reached:
                    del self.graph.inputs[name], self.sources[name]
                    self.graph.dynamic.pop(name, None)


def from_torch(fn_or_module: Any, *example_inputs: Any, name: str | None = None,
               **example_kwargs: Any) -> Graph:
    """The ``em.Graph`` of a torch function or ``nn.Module`` called on ``example_inputs``
    (positional) and ``example_kwargs`` (by argument name; ``name`` names the graph).

    Placeholders become inputs named after the function's arguments, with the
    example inputs' shapes and dtypes (float16, bfloat16 or float32; int64 or int32
    index tensors, used only as a gather's indices; Python numbers
    are baked in as constants); parameters and buffers become inputs named after
    their path, made identifiers ("proj.weight" -> ``proj_weight``). Outputs: a
    single tensor is ``out``, a tuple/list ``out0``, ``out1``, ..., a dict keeps its
    keys. ``graph.torch_sources`` maps each input name to ``("arg", i)``, ``("kwarg",
    name)`` or ``("param", path)``; ``graph_inputs`` builds the input dict from it.

    Supported: see ``torch_ops.SUPPORTED``. ``softmax`` becomes ``em.softmax``
    (max-subtracted and, in float16/bfloat16, in float32, as torch computes it). Raises
    ``UnsupportedOpError`` (naming the op and the source line) for anything else,
    ``DTypeError`` for other dtypes.
    """
    gm = trace(fn_or_module)
    if gm is fn_or_module:  # a GraphModule: its in-place updates are rewritten in a copy
        gm = copy.deepcopy(gm)
    default = getattr(fn_or_module, "__name__", None) or type(fn_or_module).__name__
    graph = Graph(name or default)
    cv = Converter(graph, gm, fallback=fn_or_module)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    names = [str(n.target).lstrip("*") for n in placeholders]
    unknown = sorted(set(example_kwargs) - set(names[len(example_inputs):]))
    if len(example_inputs) > len(placeholders) or unknown or any(
            i >= len(example_inputs) and names[i] not in example_kwargs and not n.args
            for i, n in enumerate(placeholders)):
        raise GraphError(f"from_torch({default}): {len(example_inputs)} positional and "
                         f"{len(example_kwargs)} keyword example input(s)"
                         + (f" (unknown or repeated: {', '.join(unknown)})" if unknown else "")
                         + f" for {len(placeholders)} argument(s) ({', '.join(names)})")
    _functional(gm, fn_or_module, default, [
        example_inputs[i] if i < len(example_inputs) else example_kwargs.get(
            names[i], n.args[0] if n.args else None) for i, n in enumerate(placeholders)])
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            i = placeholders.index(node)
            if i < len(example_inputs):
                value, source = example_inputs[i], ("arg", i)
            elif names[i] in example_kwargs:
                value, source = example_kwargs[names[i]], ("kwarg", names[i])
            else:
                value, source = node.args[0], None
            if isinstance(value, torch.Tensor):
                cv.env[node] = cv.tensor_input(names[i], value, source)
            else:
                cv.env[node] = value  # a Python value: folded as a constant
        elif node.op == "output":
            for out_name, value in cv.outputs(fx.node.map_arg(node.args[0], cv.env.__getitem__)):
                if not isinstance(value, Tensor):
                    raise GraphError(f"from_torch({default}): output {out_name!r} is of "
                                     f"type {type(value).__name__}, not a tensor")
                ident = unique_identifier(out_name, cv.used)
                graph.output(value, ident)
        else:
            cv.run(node)
    cv.finish()
    graph.torch_sources = dict(cv.sources)
    graph.torch_snapshots = dict(cv.snapshots)
    return graph


def _functional(gm: fx.GraphModule, fn_or_module: Any, what: str, values: list) -> None:
    """Rewrite ``gm``'s in-place updates of tensors it created as their functional forms
    (``inplace.functionalize``, ``values``: its placeholders'); ``UnsupportedOpError`` naming
    the write and its line for one it cannot rewrite (into an input, a parameter, a buffer)."""
    def where(node: fx.Node) -> str:
        loc = source_line(node, fn_or_module)
        return op_name(node, gm) + (f" at {loc}" if loc else "")

    refused = functionalize(gm, values, where)
    if refused is not None:
        node, why = refused
        raise UnsupportedOpError(f"from_torch({what}): {where(node)} mutates a tensor in place "
                                 f"and {why}; eqsat-mirage rewrites in-place updates only of "
                                 "tensors the function itself computed")


def graph_inputs(graph: Graph, fn_or_module: Any, *example_inputs: Any,
                 **example_kwargs: Any) -> dict[str, Any]:
    """The ``{input name: torch tensor}`` dict that feeds ``graph`` (from ``from_torch``).

    Takes the same module (for its parameters) and positional and keyword inputs as
    ``from_torch``; the result goes to ``em.evaluate`` (as NumPy arrays) or to the
    compiled program.
    """
    sources = getattr(graph, "torch_sources", None)
    if sources is None:
        raise GraphError(f"graph {graph.name!r} was not built by from_torch")

    def fetch(kind: str, ref: Any) -> Any:
        if kind == "arg":
            return example_inputs[ref]
        if kind == "kwarg":
            return example_kwargs[ref]
        obj = fn_or_module
        for part in ref.split("."):
            obj = getattr(obj, part)
        return obj

    for source, snap in getattr(graph, "torch_snapshots", {}).items():
        if not snap.holds(fetch(*source)):
            raise GraphError(f"graph {graph.name!r}: {source[0]} {source[1]!r} no longer holds "
                             "the value from_torch folded into a mask: trace it again")
    return {name: source_value(src, fetch) for name, src in sources.items()}

