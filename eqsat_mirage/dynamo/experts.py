"""Mixture-of-experts layers of transformers models: every expert's MLP through the backend.

transformers' default ("eager") experts implementation loops over the experts a batch hit,
with ``nonzero`` and ``torch.where`` in the loop; Dynamo cannot capture that frame and runs
it, the experts' matmuls included, without any backend. ``use_experts(model, backend)``
installs an implementation, ``"eqsat_mirage"``, that keeps the router's bookkeeping and
the loop eager (outside Dynamo, ``torch.compiler.disable``) and runs each expert's MLP,

    out = down(act(x @ gate.T) * (x @ up.T)) * routing weight

through one function compiled with ``backend``. The experts' weights are that function's
inputs, not its constants, so every expert of every layer is the same graph: searched once
as a static program at the first token count and, when a count differs (Dynamo's automatic
dynamic shapes), once more as a shape family over the token count, which then serves every
expert and every count of 2 or more; Dynamo specializes a count of 1 (every expert in a
decode step), so that is one more static graph, searched once. The result equals the eager
implementation's up to the kernels' rounding (the scatter back, ``index_add_``, is the
same, in the dtype the class sums in).

Supported: experts classes decorated with transformers' ``use_experts_implementation``
(Mixtral, Qwen2-MoE, OLMoE, DeepSeek's and the like) with the default gate (``gate, up =
chunk(2)`` then ``act(gate) * up``) or no gate, weights stored either way round, with or
without biases; a custom gate or a norm after each expert is refused with its reason.
"""

from __future__ import annotations

import functools
import inspect
import types
import warnings
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from ..ir.errors import MirageError

NAME = "eqsat_mirage"  # the experts implementation's name in transformers' registry


@dataclass(frozen=True)
class Variant:
    """The form of one experts class: gated (``gate_up_proj``) or not (``up_proj``), its
    weights stored (experts, in, out) (``transposed``) or (experts, out, in), with biases."""

    gated: bool
    transposed: bool
    bias: bool


_BOUND: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # experts module -> MLP fn


def use_experts(model: Any, backend: Any) -> int:
    """Run every experts module of ``model`` (a transformers model or block) with the
    ``"eqsat_mirage"`` implementation: the loop over the experts hit stays eager and each
    expert's MLP runs through ``backend`` (``em.backend(...)``), one compiled graph for all
    the experts. Compile the model with the same backend as usual
    (``torch.compile(model, backend=backend)``) for the rest. Returns how many experts
    modules were bound; raises ``MirageError`` naming the module for a form it does not
    support, or when ``model`` has no experts module."""
    from .backend import Backend

    if not isinstance(backend, Backend):
        raise MirageError(f"em.use_experts takes an eqsat-mirage backend (em.backend(...)), "
                          f"got {type(backend).__name__}")
    try:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    except ImportError as exc:
        raise MirageError(f"em.use_experts needs transformers with experts implementations "
                          f"(5.x): {exc}") from None
    found = [(name, m) for name, m in model.named_modules() if _is_experts(m)]
    if not found:
        raise MirageError(f"em.use_experts: {type(model).__name__} has no experts module (a "
                          "transformers class decorated with use_experts_implementation)")
    variants = [(name or type(m).__name__, m, variant(name or type(m).__name__, m))
                for name, m in found]  # every module checked before any is changed
    ALL_EXPERTS_FUNCTIONS.register(NAME, experts_forward)
    for _name, module, form in variants:
        _BOUND[module] = _compiled(backend, form, module.act_fn)
        module.config._experts_implementation = NAME
    return len(variants)


def _is_experts(module: Any) -> bool:
    """Whether ``module`` is a transformers experts module (``use_experts_implementation``
    gives it these attributes)."""
    return all(hasattr(module, a) for a in ("num_experts", "is_transposed", "has_gate",
                                            "has_bias", "down_proj", "config"))


def variant(name: str, module: Any) -> Variant:
    """The ``Variant`` of experts module ``module`` (called ``name``), or a ``MirageError``
    saying why its form is not supported."""
    why = None
    if getattr(module, "has_post_expert_norm", False):
        why = "a norm after each expert (has_post_expert_norm)"
    elif module.has_gate and not getattr(module, "is_concatenated", True):
        why = "gate and up weights interleaved (is_concatenated=False)"
    elif module.has_gate and getattr(type(module)._apply_gate, "__name__", "") != \
            "_default_apply_gate":
        why = f"a custom gate ({type(module).__name__}._apply_gate)"
    elif not callable(getattr(module, "act_fn", None)):
        why = "no activation module (act_fn)"
    elif any(True for _ in module.act_fn.parameters()) or \
            any(True for _ in module.act_fn.buffers()):
        why = (f"an activation with weights of its own ({type(module.act_fn).__name__}: each "
               "layer's would need its own compiled function)")
    if why:
        raise MirageError(f"em.use_experts: experts module {name!r} ({type(module).__name__})"
                          f" has {why}; supported: the default gate act(gate) * up or none, "
                          "with a stateless activation")
    return Variant(bool(module.has_gate), bool(module.is_transposed), bool(module.has_bias))


def _compiled(backend: Any, form: Variant, act: Any):
    """The expert MLP of ``form`` with activation ``act``, compiled with ``backend``: one
    per backend (kept in ``backend.experts``), form and activation (its class and every
    setting: ``ClippedGELUActivation(min, max)`` prints none), which the experts modules
    of a model share. Each has a code object of its own: Dynamo keeps its compiled graphs
    and its recompile limit per code object, so backends and forms never share them."""
    key = (form, type(act), tuple(sorted((k, repr(v)) for k, v in vars(act).items()
                                         if not k.startswith("_"))))
    if key not in backend.experts:
        fn = _mlp(form, act)
        code = fn.__code__.replace(co_name=f"expert_mlp_{len(backend.experts)}")
        own = types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__,
                                 fn.__closure__)
        backend.experts[key] = torch.compile(own, backend=backend)
    return backend.experts[key]


def _mlp(form: Variant, act: Any):
    """The expert MLP of ``form``: (tokens, first weight, down weight, routing weight column,
    first bias, down bias) -> the tokens' outputs, as transformers' eager loop computes them."""
    def linear(x, w, b):
        y = x @ w if form.transposed else torch.nn.functional.linear(x, w)
        return y + b if b is not None else y

    def expert_mlp(x, w1, w2, scale, b1, b2):
        h = linear(x, w1, b1)
        if form.gated:
            gate, up = h.chunk(2, dim=-1)
            h = act(gate) * up
        else:
            h = act(h)
        return linear(h, w2, b2) * scale

    return expert_mlp


@torch.compiler.disable
def experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """transformers' experts forward (registered as ``"eqsat_mirage"``): the eager loop over
    the experts hit, each expert's MLP through the compiled function ``use_experts`` bound
    to this module. A module it did not bind (another model built from a config that
    ``use_experts`` switched) runs its class's own forward, with a warning once.

    The whole of it is opaque to Dynamo (``torch.compiler.disable``), the lookup of the
    bound function included: with only the loop opaque, a compiled model with two MoE
    layers computed its second layer wrongly (max error 3.44 against eager, with Dynamo's
    own "eager" backend), and ``generate()`` gave other tokens."""
    mlp = _BOUND.get(self)
    if mlp is None:
        warnings.warn(f"eqsat-mirage: a {type(self).__name__} that em.use_experts did not bind "
                      f"(its config says {NAME!r}) runs its own eager forward", stacklevel=2)
        return type(self).forward.__wrapped__(self, hidden_states, top_k_index, top_k_weights)
    return _loop(self, mlp, hidden_states, top_k_index, top_k_weights)


@functools.lru_cache(maxsize=256)
def _accumulates_in_weights_dtype(cls: type) -> bool:
    """Whether ``cls``'s own eager forward sums the experts' outputs in the routing weights'
    dtype (NemotronH: ``zeros_like(hidden_states, dtype=top_k_weights.dtype)``, cast back at
    the end) rather than in the hidden states' (Mixtral and most): read from its source."""
    try:
        text = inspect.getsource(cls.forward.__wrapped__)
    except (AttributeError, OSError, TypeError):
        return False
    return "dtype=top_k_weights.dtype" in text.replace(" ", "")


def _loop(module, mlp, hidden_states, top_k_index, top_k_weights):
    """The loop of transformers' eager experts forward, with ``mlp`` for each expert hit,
    summed in the dtype the class's own forward sums in."""
    wide = _accumulates_in_weights_dtype(type(module))
    final = torch.zeros_like(hidden_states, dtype=top_k_weights.dtype if wide else None)
    with torch.no_grad():
        mask = torch.nn.functional.one_hot(top_k_index, num_classes=module.num_experts + 1)
        mask = mask.permute(2, 1, 0)
        hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()[:, 0].tolist()
    first = module.gate_up_proj if module.has_gate else module.up_proj
    first_bias = (module.gate_up_proj_bias if module.has_gate else module.up_proj_bias) \
        if module.has_bias else None
    for e in hit:
        if e == module.num_experts:  # the padding class of expert-parallel sentinels
            continue
        pos, tokens = torch.where(mask[e])
        out = mlp(hidden_states[tokens], first[e], module.down_proj[e],
                  top_k_weights[tokens, pos, None],
                  first_bias[e] if first_bias is not None else None,
                  module.down_proj_bias[e] if module.has_bias else None)
        final.index_add_(0, tokens, out.to(final.dtype))
    return final.to(hidden_states.dtype) if wide else final
