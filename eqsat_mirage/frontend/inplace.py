"""In-place tensor updates of an fx graph rewritten as their functional forms.

``x += y`` (``operator.iadd``; also ``-=``, ``*=``, ``/=``), ``x.add_(y)``, ``sub_``, ``mul_``,
``div_``, ``masked_fill_`` and ``x.copy_(src)`` are rewritten when ``x`` is a tensor the graph
itself created (Falcon's ``mlp_output += attention_output``, Mixtral's router's
``routing_weights /= ...``): the node computes the functional form (``x + y``, ``src`` cast
to ``x``'s dtype and broadcast to its shape; a result torch would promote is cast back to
``x``'s dtype, as the in-place op keeps it), and every later use of ``x`` (and of any node
holding the same tensor) reads the node instead.

A write is refused, and nothing is rewritten, when it would change what the caller sees or
what an alias reads: a write into a graph input, a parameter or a buffer (a placeholder or
``get_attr`` node) or a view of one; a write whose tensor has a view taken before the write
and read after it (the view would see the new values). Aliasing is read from the tensors'
storages: Dynamo's recorded fake values, else a run of the graph on fake tensors.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx

__all__ = ["INPLACE_FUNCTIONS", "INPLACE_METHODS", "functionalize"]

INPLACE_FUNCTIONS = {operator.iadd: operator.add, operator.isub: operator.sub,
                     operator.imul: operator.mul, operator.itruediv: operator.truediv}
INPLACE_METHODS = {"add_": "add", "sub_": "sub", "mul_": "mul", "div_": "div",
                   "masked_fill_": "masked_fill", "copy_": "to", "index_add_": "index_add"}
_KEYS = ("example_value", "val")  # where Dynamo (or FakeTensorProp) records a node's value


def _rewritable(node: fx.Node) -> bool:
    if node.op == "call_function":
        return node.target in INPLACE_FUNCTIONS and len(node.args) == 2 and not node.kwargs
    return node.op == "call_method" and node.target in INPLACE_METHODS and bool(node.args)


def _recorded(gm: fx.GraphModule) -> dict[fx.Node, Any] | None:
    """Each node's recorded value (Dynamo's ``example_value``), or None if some node lacks one."""
    out = {}
    for n in gm.graph.nodes:
        if n.op == "output":
            continue
        key = next((k for k in _KEYS if k in n.meta), None)
        if key is None:
            return None
        out[n] = n.meta[key]
    return out


class _FakeRun(fx.Interpreter):
    """Runs a graph on fake tensors (inputs, parameters and buffers made fake, aliasing kept)."""

    def __init__(self, gm: fx.GraphModule) -> None:
        from torch._subclasses.fake_tensor import FakeTensorMode

        super().__init__(gm)
        self.mode = FakeTensorMode(allow_non_fake_inputs=True)
        self.values: dict[fx.Node, Any] = {}

    def _fake(self, value: Any) -> Any:
        return self.mode.from_tensor(value) if isinstance(value, torch.Tensor) else value

    def placeholder(self, target: Any, args: Any, kwargs: Any) -> Any:
        """A placeholder's value, fake."""
        return self._fake(super().placeholder(target, args, kwargs))

    def get_attr(self, target: Any, args: Any, kwargs: Any) -> Any:
        """A parameter's or buffer's value, fake."""
        return self._fake(super().get_attr(target, args, kwargs))

    def run_node(self, n: fx.Node) -> Any:
        """Run one node under the fake mode, keeping its value."""
        with self.mode:
            value = super().run_node(n)
        self.values[n] = value
        return value


def _storage(value: Any) -> int | None:
    if not isinstance(value, torch.Tensor):
        return None
    try:
        return value.untyped_storage()._cdata
    except Exception:  # noqa: BLE001 - a tensor without storage (a sparse or nested one)
        return None


def _refusal(node: fx.Node, pos: dict, vals: dict, where: Any) -> str | None:
    """Why the write ``node`` cannot be rewritten, or None."""
    target = node.args[0]
    if not isinstance(target, fx.Node):
        return None
    value = vals.get(target)
    if not isinstance(value, torch.Tensor):
        return None if target in vals else "the value it writes into was not recorded"
    store = _storage(value)
    if store is None:
        return "the tensor it writes into has no storage"
    for n, v in vals.items():
        if n.op in ("placeholder", "get_attr") and _storage(v) == store:
            what = "graph input" if n.op == "placeholder" else "parameter or buffer"
            view = "" if v is value else "a view of "
            return f"it writes into {view}the {what} {str(n.target)!r}"
    for n, v in vals.items():
        if v is value or _storage(v) != store or pos[n] > pos[node]:
            continue
        late = [u for u in n.users if pos[u] > pos[node]]
        if late:
            return (f"{where(n)} is a view of the tensor it writes into, read after the "
                    f"write (by {where(late[0])})")
    return None


def functionalize(gm: fx.GraphModule, example_inputs: list | None,
                  where: Any) -> tuple[fx.Node, str] | None:
    """Rewrite ``gm``'s in-place updates of tensors the graph created as their functional
    forms (see the module docstring), in place; returns None when every one was rewritten (or
    there was none), else ``(node, why)`` for the first write refused, with ``gm`` unchanged.
    ``example_inputs`` (its placeholders' values, in order) serve a graph without recorded
    values; ``where(node)`` names a node in a reason (``op at file:line``)."""
    writes = [n for n in gm.graph.nodes if _rewritable(n)]
    if not writes:
        return None
    vals = _recorded(gm)
    recorded = vals is not None
    if vals is None:
        try:
            run = _FakeRun(gm)
            run.run(*(example_inputs or []))
        except Exception as exc:  # noqa: BLE001 - fake tensors refused an op: cannot tell
            return writes[0], f"its aliasing is unknown (a fake-tensor run failed: {exc})"
        vals = run.values
    pos = {n: i for i, n in enumerate(gm.graph.nodes)}
    for node in writes:
        why = _refusal(node, pos, vals, where)
        if why is not None:
            return node, why
    for node in writes:
        _rewrite(gm, node, pos, vals, recorded)
    gm.graph.lint()
    gm.recompile()
    return None


def _rewrite(gm: fx.GraphModule, node: fx.Node, pos: dict, vals: dict, recorded: bool) -> None:
    """Make ``node`` its functional form and point the later uses of its target at it
    (``vals``, ``pos``: each node's value and place, extended with the nodes made here;
    ``recorded``: the graph records values, which the new and changed nodes get too)."""
    target = node.args[0]
    value = vals.get(target) if isinstance(target, fx.Node) else None
    if node.op == "call_function":
        node.target = INPLACE_FUNCTIONS[node.target]
    elif node.target == "copy_":  # src, cast to the target's dtype, broadcast to its shape
        node.target, node.args, node.kwargs = "to", (node.args[1], value.dtype), {}
    else:
        node.target = INPLACE_METHODS[node.target]
    for key in _KEYS:
        node.meta.pop(key, None)
    got = _fake_value(node, vals)
    vals[node] = got
    if recorded and got is not None:
        node.meta["example_value"] = got
    if not isinstance(value, torch.Tensor):
        return
    result = _match(gm, node, got, value, target)
    for i, made in enumerate(result[1:], 1):
        pos[made] = pos[node] + i / len(result)
        vals[made] = _fake_value(made, vals)
        made.meta["stack_trace"] = node.meta.get("stack_trace", "")
        if recorded and vals[made] is not None:
            made.meta["example_value"] = vals[made]
    last = result[-1]
    vals[last] = value  # the written tensor's new value: later writes find it by identity
    if last is not node:  # the node's own users read the cast and broadcast value
        node.replace_all_uses_with(last, delete_user_cb=lambda user: user not in result)
    for n in [n for n, v in vals.items() if v is value and pos[n] < pos[node]]:
        for user in list(n.users):  # every node holding the tensor: later uses read the new one
            if user not in result and (user.op == "output" or pos.get(user, -1) > pos[node]):
                user.replace_input_with(n, last)


def _match(gm: fx.GraphModule, node: fx.Node, got: Any, value: torch.Tensor,
           target: fx.Node) -> list[fx.Node]:
    """``[node]``, then a cast and a broadcast after it where ``got`` (its value) lacks the
    written tensor's dtype or shape (``value``)."""
    out = [node]
    if got is None or got.dtype != value.dtype:
        with gm.graph.inserting_after(out[-1]):
            out.append(gm.graph.call_method("to", (out[-1], value.dtype)))
    if got is None or tuple(got.shape) != tuple(value.shape):
        sizes = tuple(value.shape)
        with gm.graph.inserting_after(out[-1]):
            out.append(gm.graph.call_method("expand", (out[-1], *sizes))
                       if all(isinstance(d, int) for d in sizes) else
                       gm.graph.call_method("expand_as", (out[-1], target)))
    return out


def _fake_value(node: fx.Node, vals: dict) -> Any:
    """``node``'s value computed from its operands' values (fake tensors), or None."""
    args = fx.node.map_arg(node.args, lambda n: vals.get(n))
    kwargs = fx.node.map_arg(node.kwargs, lambda n: vals.get(n))
    fakes = [a for a in (*args, *kwargs.values()) if getattr(a, "fake_mode", None) is not None]
    if not fakes:
        return None
    try:
        with fakes[0].fake_mode:
            if node.op == "call_method":
                return getattr(args[0], node.target)(*args[1:], **kwargs)
            return node.target(*args, **kwargs)
    except Exception:  # noqa: BLE001 - no value: shape propagation reads the node again
        return None
