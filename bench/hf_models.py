"""Hugging Face models through torch.compile (issue 15): real LLaMA and GPT-2 layers.

    python bench/hf_models.py [--write bench/RESULTS.md]
    python bench/hf_models.py --case 4 --rows rows.jsonl     # one row of CASES, kept
    python bench/hf_models.py --rows rows.jsonl --table-only --write bench/RESULTS.md

Each case builds a real ``transformers`` module from a tiny random-init config
(nothing is downloaded): hidden size 256, 4 heads (2 key/value heads for LLaMA),
sequence 64 (decoder layers of LLaMA, Qwen2/3, Mistral, Phi/Phi-3, Gemma, GPT-NeoX, Falcon,
OPT, GPT-J and GPT-2; encoder layers of BERT, ViT, CLIP and T5; Mixtral's sparse MoE
block); or a nanoGPT block (its causal attention written ``masked_fill(bias == 0,
-inf)``, as nanoGPT and minGPT write it); or a 2-layer LlamaForCausalLM's forward and its
``generate()`` (8 greedy tokens, ``forward`` compiled). It runs through ``torch.compile(...,
backend=em.backend(...))`` and is compared with eager torch; the table gives the ops
that ran in optimized partitions, the predicted time of those partitions one kernel
per op and as chosen (h100 cost model), the largest error against eager and the
wall-clock compile time (search included, fresh cache). With TRITON_INTERPRET=1 the
optimized partitions run as Triton kernels (interpreted on the CPU), otherwise as
torch code of the chosen program.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import eqsat_mirage as em  # noqa: E402
from eqsat_mirage.dynamo.experts import NAME  # noqa: E402 - em.use_experts's implementation

SECTION = "## Hugging Face models"
MORE_SECTION = "## More Hugging Face families"  # rows 27-46, 57-58 (issue 52): a table
LLAMA_SECTION = "## LlamaForCausalLM: forward and generate()"  # rows 47-49, the same
QUANT_SECTION = "## LlamaForCausalLM with quantized weights"  # rows 50-56, the same
HIDDEN, HEADS, KV_HEADS, SEQ, VOCAB = 256, 4, 2, 64, 128
TOLERANCE = {"float32": 2e-3, "float16": 2e-2}  # max |compiled - eager| / max |eager|


def llama_config(impl: str = "sdpa", layers: int = 2, hidden: int = HIDDEN, seq: int = SEQ):
    """A tiny LLaMA config: GQA (4 query heads, 2 key/value heads at hidden 256; heads of
    64 at other sizes, half as many key/value heads), random init."""
    from transformers import LlamaConfig

    heads = HEADS if hidden == HIDDEN else max(hidden // 64, 2)
    return LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden,
                       num_attention_heads=heads, num_key_value_heads=heads // 2,
                       num_hidden_layers=layers, vocab_size=VOCAB,
                       max_position_embeddings=2 * seq, attn_implementation=impl)


# Decoder layers built the same way (rotary position embeddings passed in, causal SDPA
# when attention_mask is None): family -> (module, class prefix, config class, extra config)
DECODERS = {
    "llama": ("llama", "Llama", "LlamaConfig", {}),
    "qwen2": ("qwen2", "Qwen2", "Qwen2Config", {}),
    "mistral": ("mistral", "Mistral", "MistralConfig", {"sliding_window": None}),
    "phi3": ("phi3", "Phi3", "Phi3Config", {"pad_token_id": 0}),
    "gemma": ("gemma", "Gemma", "GemmaConfig", {"head_dim": 64}),
    "neox": ("gpt_neox", "GPTNeoX", "GPTNeoXConfig", {"rotary_pct": 0.25,
                                                     "use_parallel_residual": True}),
    # phi-2 style: LayerNorm, attention and GELU MLP in parallel, rotary on half of each head
    "phi": ("phi", "Phi", "PhiConfig", {}),
    # RMSNorm on each query and key head (qk-norm) before the rotary embedding
    "qwen3": ("qwen3", "Qwen3", "Qwen3Config", {"head_dim": 64}),
}


def decoder_layer(family: str, dtype: str = "float32", impl: str = "sdpa", seq: int = SEQ,
                  hidden: int = HIDDEN, seed: int = 0):
    """(function, example inputs) of one decoder layer of ``family`` (a key of
    ``DECODERS``) at hidden size ``hidden`` (head dim 64, half as many key/value heads where
    the family has them), sequence ``seq``, batch 1, random init."""
    import importlib

    import torch
    import transformers

    mod_name, prefix, cfg_name, extra = DECODERS[family]
    mm = importlib.import_module(f"transformers.models.{mod_name}.modeling_{mod_name}")
    heads = hidden // 64
    kw = {"hidden_size": hidden, "intermediate_size": 2 * hidden, "num_attention_heads": heads,
          "num_hidden_layers": 1, "vocab_size": VOCAB, "max_position_embeddings": 2 * seq,
          "attn_implementation": impl, "bos_token_id": 0, "eos_token_id": 0, **extra}
    if family != "neox":
        kw["num_key_value_heads"] = max(1, heads // 2)
    cfg = getattr(transformers, cfg_name)(**kw)
    torch.manual_seed(seed)
    dt = getattr(torch, dtype)
    x = torch.randn(1, seq, hidden, dtype=dt)
    pos = torch.arange(seq)[None]
    cos, sin = getattr(mm, f"{prefix}RotaryEmbedding")(cfg)(x, pos)
    layer_cls = getattr(mm, f"{prefix}Layer" if family == "neox" else f"{prefix}DecoderLayer")
    mod = layer_cls(cfg, 0).eval().to(dt)
    return (lambda h: mod(h, attention_mask=None, position_embeddings=(cos, sin),
                          position_ids=pos)), (x,)


def bert_model(dtype: str = "float32", impl: str = "sdpa", seq: int = SEQ,
               hidden: int = HIDDEN, seed: int = 0):
    """(function, example inputs) of a 1-layer BertModel over two sequences, the second
    padded (its attention_mask zero over the last quarter)."""
    import torch
    from transformers import BertConfig, BertModel

    cfg = BertConfig(hidden_size=hidden, intermediate_size=2 * hidden,
                     num_attention_heads=hidden // 64, num_hidden_layers=1, vocab_size=VOCAB,
                     max_position_embeddings=2 * seq, attn_implementation=impl)
    torch.manual_seed(seed)
    mod = BertModel(cfg, add_pooling_layer=False).eval().to(getattr(torch, dtype))
    ids = torch.randint(0, VOCAB, (2, seq))
    mask = torch.ones(2, seq, dtype=torch.long)
    mask[1, 3 * seq // 4:] = 0
    return (lambda i, m: mod(input_ids=i, attention_mask=m).last_hidden_state), (ids, mask)


def nanogpt_block(dtype: str = "float32", impl: str = "masked_fill", seq: int = SEQ,
                  hidden: int = HIDDEN, seed: int = 0):
    """(module, example inputs) of a nanoGPT block (tests/torch_models.py: LayerNorm, causal
    self-attention written ``att.masked_fill(self.bias[:, :, :T, :T] == 0, fill)`` on a
    tril buffer of block size 2 * seq, GELU MLP) at hidden size ``hidden`` (head dim 64),
    batch 1, random init; ``impl`` "masked_fill" fills with -inf, "masked_fill_finite" with
    -1e4."""
    import torch

    tests = str(ROOT / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from torch_models import NanoGPTBlock

    torch.manual_seed(seed)
    dt = getattr(torch, dtype)
    fill = -1e4 if impl == "masked_fill_finite" else float("-inf")
    mod = NanoGPTBlock(hidden, hidden // 64, 2 * seq, fill).eval().to(dt)
    return mod, (torch.randn(1, seq, hidden, dtype=dt),)


def attention_block(family: str, dtype: str = "float32", impl: str = "sdpa", seq: int = SEQ,
                    hidden: int = HIDDEN, seed: int = 0):
    """(function, example inputs) of one attention module, random init, batch 1, head dim 64:
    "falcon" is Falcon's multi-query attention (``new_decoder_architecture=False,
    multi_query=True``: one key/value head, ``fused_qkv[..., [-2], :]``, SDPA with the key
    head broadcast), "gptj" GPT-J's (rotary on the first 32 dims of each head:
    ``x[..., ::2]``, ``torch.stack``, ``repeat_interleave``)."""
    import torch

    torch.manual_seed(seed)
    dt = getattr(torch, dtype)
    x = torch.randn(1, seq, hidden, dtype=dt)
    pos = torch.arange(seq)[None]
    if family == "falcon":
        from transformers import FalconConfig
        from transformers.models.falcon import modeling_falcon as mf

        cfg = FalconConfig(hidden_size=hidden, num_attention_heads=hidden // 64,
                           num_hidden_layers=1, vocab_size=VOCAB, new_decoder_architecture=False,
                           multi_query=True, alibi=False, bias=False, attn_implementation=impl,
                           max_position_embeddings=2 * seq)
        cos, sin = mf.FalconRotaryEmbedding(cfg)(x, pos)
        mod = mf.FalconAttention(cfg, 0).eval().to(dt)
        return (lambda h: mod(h, alibi=None, attention_mask=None, position_ids=pos,
                              position_embeddings=(cos, sin))[0]), (x,)
    from transformers import GPTJConfig
    from transformers.models.gptj import modeling_gptj as mg

    cfg = GPTJConfig(n_embd=hidden, n_head=hidden // 64, n_layer=1, vocab_size=VOCAB,
                     n_positions=2 * seq, rotary_dim=32, attn_implementation=impl,
                     bos_token_id=0, eos_token_id=0)
    sin, cos = mg.GPTJRotaryEmbedding(cfg)(x, pos)
    mod = mg.GPTJAttention(cfg, 0).eval().to(dt)
    return (lambda h: mod(h, position_embeddings=(sin, cos), attention_mask=None)[0]), (x,)


def decoder_block(family: str, dtype: str = "float32", impl: str = "sdpa", seq: int = SEQ,
                  hidden: int = HIDDEN, seed: int = 0):
    """(function, example inputs) of one causal decoder layer whose forward differs from
    ``DECODERS``'s, random init, batch 1, head dim 64, MLP width 2 * ``hidden``: "falcon"
    is FalconDecoderLayer at its default attention choices (``new_decoder_architecture=
    False, multi_query=True, parallel_attn=True``: one key/value head, attention and MLP
    both fed by the one LayerNorm), "opt" OPTDecoderLayer (pre-LayerNorm, the query scaled
    before SDPA, ReLU MLP on a ``reshape(-1, hidden)``), "gptj" GPTJBlock (attention and
    MLP in parallel, rotary on the first 32 dims of each head, ``x[..., ::2]``)."""
    import torch

    torch.manual_seed(seed)
    dt = getattr(torch, dtype)
    x = torch.randn(1, seq, hidden, dtype=dt)
    pos = torch.arange(seq)[None]
    heads = hidden // 64
    if family == "falcon":
        from transformers import FalconConfig
        from transformers.models.falcon import modeling_falcon as mf

        cfg = FalconConfig(hidden_size=hidden, num_attention_heads=heads, num_hidden_layers=1,
                           vocab_size=VOCAB, ffn_hidden_size=2 * hidden,
                           max_position_embeddings=2 * seq, attn_implementation=impl)
        cos, sin = mf.FalconRotaryEmbedding(cfg)(x, pos)
        mod = mf.FalconDecoderLayer(cfg, 0).eval().to(dt)
        return (lambda h: mod(h, alibi=None, attention_mask=None, position_ids=pos,
                              position_embeddings=(cos, sin))[0]), (x,)
    if family == "opt":
        from transformers import OPTConfig
        from transformers.models.opt import modeling_opt as mo

        cfg = OPTConfig(hidden_size=hidden, ffn_dim=2 * hidden, num_attention_heads=heads,
                        num_hidden_layers=1, vocab_size=VOCAB, max_position_embeddings=2 * seq,
                        attn_implementation=impl)
        mod = mo.OPTDecoderLayer(cfg, 0).eval().to(dt)
        return (lambda h: mod(h, attention_mask=None, position_ids=pos)), (x,)
    if family != "gptj":
        raise ValueError(f"unknown decoder block {family!r}")
    from transformers import GPTJConfig
    from transformers.models.gptj import modeling_gptj as mg

    cfg = GPTJConfig(n_embd=hidden, n_head=heads, n_layer=1, n_inner=2 * hidden,
                     vocab_size=VOCAB, n_positions=2 * seq, rotary_dim=32,
                     attn_implementation=impl, bos_token_id=0, eos_token_id=0)
    sin, cos = mg.GPTJRotaryEmbedding(cfg)(x, pos)
    mod = mg.GPTJBlock(cfg, 0).eval().to(dt)
    return (lambda h: mod(h, attention_mask=None, position_ids=pos,
                          position_embeddings=(sin, cos))), (x,)


def encoder_block(family: str, dtype: str = "float32", impl: str = "sdpa", seq: int = SEQ,
                  hidden: int = HIDDEN, seed: int = 0):
    """(function, example inputs) of one bidirectional encoder layer on [1, ``seq``,
    ``hidden``] hidden states, no attention mask, random init, head dim 64, MLP width
    2 * ``hidden``: "vit" ViTLayer (LayerNorm, GELU), "clip" CLIPEncoderLayer of the vision
    tower (quick GELU, ``attention_mask=None``), "t5" an encoder's first T5Block (RMS-style
    T5LayerNorm, no query scaling, ReLU MLP, the relative position bias computed inside:
    bucketed ``arange`` differences, an embedding lookup, added to the scores)."""
    import torch

    torch.manual_seed(seed)
    dt = getattr(torch, dtype)
    x = torch.randn(1, seq, hidden, dtype=dt)
    heads = hidden // 64
    if family == "vit":
        from transformers import ViTConfig
        from transformers.models.vit.modeling_vit import ViTLayer

        cfg = ViTConfig(hidden_size=hidden, num_attention_heads=heads, num_hidden_layers=1,
                        intermediate_size=2 * hidden, attn_implementation=impl)
        mod = ViTLayer(cfg).eval().to(dt)
        return (lambda h: mod(h)), (x,)
    if family == "clip":
        from transformers import CLIPVisionConfig
        from transformers.models.clip.modeling_clip import CLIPEncoderLayer

        cfg = CLIPVisionConfig(hidden_size=hidden, num_attention_heads=heads,
                               num_hidden_layers=1, intermediate_size=2 * hidden,
                               attn_implementation=impl)
        mod = CLIPEncoderLayer(cfg).eval().to(dt)
        return (lambda h: mod(h, attention_mask=None)), (x,)
    if family != "t5":
        raise ValueError(f"unknown encoder block {family!r}")
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Block

    cfg = T5Config(d_model=hidden, d_kv=64, d_ff=2 * hidden, num_heads=heads, num_layers=1,
                   vocab_size=VOCAB, is_decoder=False, use_cache=False,
                   attn_implementation=impl)
    mod = T5Block(cfg, has_relative_attention_bias=True, layer_idx=0).eval().to(dt)
    return (lambda h: mod(h, attention_mask=None)[0]), (x,)


def moe_block(dtype: str = "float32", impl: str = "eager", seq: int = SEQ,
              hidden: int = HIDDEN, seed: int = 0, experts: int = 4, top_k: int = 2):
    """(module, example inputs) of a MixtralSparseMoeBlock on [1, ``seq``, ``hidden``]: a
    router (linear, softmax, ``topk``, renormalised), ``experts`` SiLU-gated experts of
    width 2 * ``hidden``, ``top_k`` per token; ``impl`` is the experts implementation
    ("eager": the loop over the experts hit, ``one_hot``, ``nonzero``, ``torch.where``,
    ``index_add_``: Dynamo captures the router and the bookkeeping, and runs the loop's
    frame itself uncaptured; ``NAME``, "eqsat_mirage": that loop, with each expert's MLP
    through the backend once ``em.use_experts`` binds it; or transformers' "batched_mm": one
    graph, the experts' weights gathered by ``w[expert_ids]``; or "grouped_mm": one graph
    with an in-place ``inv_perm[perm] = ...``). The block's weights are ``torch.empty``
    until a PreTrainedModel initialises them, so here they are drawn normal with standard
    deviation fan_in ** -0.5 (after ``seed``)."""
    import torch
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    heads = hidden // 64
    cfg = MixtralConfig(hidden_size=hidden, intermediate_size=2 * hidden,
                        num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                        num_hidden_layers=1, vocab_size=VOCAB, num_local_experts=experts,
                        num_experts_per_tok=top_k, max_position_embeddings=2 * seq,
                        experts_implementation="eager" if impl == NAME else impl)
    torch.manual_seed(seed)
    dt = getattr(torch, dtype)
    x = torch.randn(1, seq, hidden, dtype=dt)
    mod = MixtralSparseMoeBlock(cfg).eval()
    with torch.no_grad():
        for p in mod.parameters():
            p.normal_(0.0, p.shape[-1] ** -0.5)
    return mod.to(dt), (x,)


def case(name: str, dtype: str = "float32", impl: str = "sdpa", seed: int = 0,
         seq: int = SEQ, hidden: int = HIDDEN):
    """(function, example inputs) of one case: "llama_layer", "llama_mlp",
    "llama_attention", "gpt2_block", "llama_model" (2 layers, logits), "bert",
    "nanogpt_block", "falcon_attention", "gptj_attention" (``attention_block``),
    "falcon_layer", "opt_layer", "gptj_block" (``decoder_block``), "vit_layer",
    "clip_layer", "t5_block" (``encoder_block``), "mixtral_moe" (``moe_block``; ``impl``
    the experts implementation), or "<family>_layer" for a family of ``DECODERS``."""
    import torch

    family = name.removesuffix("_layer")
    if family in DECODERS:
        return decoder_layer(family, dtype, impl, seq, hidden, seed)
    family = family.removesuffix("_block")
    if family in ("falcon", "opt", "gptj"):
        return decoder_block(family, dtype, impl, seq, hidden, seed)
    if family in ("vit", "clip", "t5"):
        return encoder_block(family, dtype, impl, seq, hidden, seed)
    if name == "mixtral_moe":
        return moe_block(dtype, impl, seq, hidden, seed)
    if name == "bert":
        return bert_model(dtype, impl, seq, hidden, seed)
    if name == "nanogpt_block":
        return nanogpt_block(dtype, impl, seq, hidden, seed)
    if name in ("falcon_attention", "gptj_attention"):
        return attention_block(name.removesuffix("_attention"), dtype, impl, seq, hidden, seed)
    torch.manual_seed(seed)
    dt = getattr(torch, dtype)
    x = torch.randn(1, SEQ, HIDDEN, dtype=dt)
    if name.startswith("llama") and not name.startswith("llama_model"):
        from transformers.models.llama import modeling_llama as ml

        cfg = llama_config(impl)
        pos = torch.arange(SEQ)[None]
        cos, sin = ml.LlamaRotaryEmbedding(cfg)(x, pos)
        if name == "llama_mlp":
            mod = ml.LlamaMLP(cfg).eval().to(dt)
            return mod, (x,)
        if name == "llama_attention":
            mod = ml.LlamaAttention(cfg, 0).eval().to(dt)
            return (lambda h: mod(h, position_embeddings=(cos, sin), attention_mask=None)[0]), \
                (x,)
        mod = ml.LlamaDecoderLayer(cfg, 0).eval().to(dt)
        return (lambda h: mod(h, attention_mask=None, position_embeddings=(cos, sin),
                              position_ids=pos)), (x,)
    if name == "gpt2_block":
        from transformers import GPT2Config
        from transformers.models.gpt2.modeling_gpt2 import GPT2Block

        cfg = GPT2Config(n_embd=HIDDEN, n_head=HEADS, n_layer=2, vocab_size=VOCAB,
                         n_positions=2 * SEQ, attn_implementation=impl,
                         bos_token_id=0, eos_token_id=0)
        mod = GPT2Block(cfg, 0).eval().to(dt)
        return (lambda h: mod(h)), (x,)
    if name.startswith("llama_model"):
        from transformers import LlamaForCausalLM

        mod = LlamaForCausalLM(llama_config(impl, hidden=hidden, seq=seq)).eval().to(dt)
        if name != "llama_model":
            mod = quantized(mod, name.removeprefix("llama_model_"), dt)
        ids = torch.randint(0, VOCAB, (1, seq))
        return (lambda i: mod(i).logits), (ids,)
    raise ValueError(f"unknown case {name!r}")


# llama_model_<kind>: its weights (``quantized``)
QUANTIZED = ("int8", "int4g128", "int8_hf", "w8hand", "w4g128hand", "fp8")


def quantized(mod, kind: str, dtype):
    """``mod`` with its linear weights quantized by torchao, weight-only: "int8" (per row,
    ``Int8WeightOnlyConfig``), "int4g128" (int4 in groups of 128, ``IntxWeightOnlyConfig``),
    "fp8" (float8 e4m3 per row, ``Float8WeightOnlyConfig``) with ``quantize_``, or
    "int8_hf" through transformers (``save_pretrained``, then
    ``from_pretrained(quantization_config=TorchAoConfig(...))``); "w8hand" and "w4g128hand":
    the forms people write by hand (tests/torch_models.py ``Int8Linear``, ``Int4Linear``:
    GPTQ's packed layout, groups of 128)."""
    import torch

    if kind.endswith("hand"):
        tests = str(ROOT / "tests")
        if tests not in sys.path:
            sys.path.insert(0, tests)
        from torch_models import Int4Linear, Int8Linear, swap_linears

        return swap_linears(mod, Int8Linear if kind == "w8hand" else Int4Linear)
    from torchao.quantization import (
        Float8WeightOnlyConfig,
        Int8WeightOnlyConfig,
        IntxWeightOnlyConfig,
        quantize_,
    )
    from torchao.quantization.granularity import PerGroup

    config = IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(128)) \
        if kind == "int4g128" else Float8WeightOnlyConfig() if kind == "fp8" else \
        Int8WeightOnlyConfig()
    if kind == "int8_hf":
        from transformers import TorchAoConfig

        with tempfile.TemporaryDirectory() as tmp:
            mod.save_pretrained(tmp)
            return type(mod).from_pretrained(tmp, dtype=dtype,
                                             quantization_config=TorchAoConfig(config)).eval()
    quantize_(mod, config)
    return mod


def first(value):
    """The first tensor of a module's output (a tensor, or a tuple of them)."""
    return value[0] if isinstance(value, (tuple, list)) else value


def run(name: str, dtype: str = "float32", impl: str = "sdpa", time_limit_s: float = 30.0,
        cache=None, seq: int = SEQ, hidden: int = HIDDEN) -> dict:
    """Compile one case with em.backend, compare with eager; the figures of one row
    ("llama_generate": ``generate``)."""
    import torch

    if name.startswith("llama_generate"):
        return generate(dtype, time_limit_s, cache, seq, hidden,
                        quant=name.removeprefix("llama_generate").lstrip("_") or None)

    fn, args = case(name, dtype, impl, seq=seq, hidden=hidden)
    torch._dynamo.reset()  # one call: searched when Dynamo compiles it (warmup=0)
    said: list[str] = []  # the search's progress lines: the verifier's refusals among them
    load = os.getloadavg()[0]
    be = em.backend(time_limit_s=time_limit_s, warn=False, warmup=0, progress=said.append,
                    **({"cache": cache} if cache is not None else {}))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = first(fn(*args)).float()
        if impl == NAME:  # each expert's MLP through the backend, the loop eager
            em.use_experts(fn, be)
        t = time.perf_counter()
        got = first(torch.compile(fn, backend=be)(*args)).float()
        seconds = time.perf_counter() - t
    s = be.summary()
    err = float((got - want).abs().max() / want.abs().max())
    timed_out = time_limited_ops(be.report)
    return {"name": name, "dtype": dtype, "impl": impl, "seq": seq, "hidden": hidden,
            "ops": s["ops"],
            "compute_ops": s["compute_ops"],
            "optimized_ops": s["optimized_ops"], "optimized_compute_ops":
            s["optimized_compute_ops"], "partitions": s["optimized_partitions"],
            "time_limited_ops": timed_out,
            "before": (s["predicted_us"] or (None, None))[0],  # None: nothing optimized
            "after": (s["predicted_us"] or (None, None))[1], "error": err,
            "finite": bool(torch.isfinite(got).all()), "seconds": seconds,
            "eager": s["eager"], "backend": be,
            "rejected": [line for line in said if "rejected by the verifier" in line],
            "load": (load, os.getloadavg()[0])}


def decode(steps: int = 4, dynamic=None, time_limit_s: float = 30.0, cache=None,
           hidden: int = HIDDEN, seq: int = SEQ) -> dict:
    """A 2-layer LlamaForCausalLM (``llama_config`` at ``hidden``) decoding ``steps``
    tokens through torch.compile after an eager ``seq``-token prefill: its DynamicCache
    grows by one per step (torch.cat, a size formula Dynamo computes as s + 1). Each
    step's logits against eager's on a copy of the cache; the figures of one row."""
    import copy

    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    mod = LlamaForCausalLM(llama_config("sdpa", hidden=hidden, seq=seq)).eval()
    torch._dynamo.reset()
    be = em.backend(time_limit_s=time_limit_s, warn=False,
                    **({"cache": cache} if cache is not None else {}))
    step = torch.compile(lambda i, c: mod(i, past_key_values=c).logits, backend=be,
                         dynamic=dynamic)
    errors, seconds = [], []
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = mod(torch.randint(0, VOCAB, (1, seq)), use_cache=True)
        mine, theirs = copy.deepcopy(out.past_key_values), out.past_key_values
        token = out.logits[:, -1:].argmax(-1)
        for _ in range(steps):
            t = time.perf_counter()
            got = step(token, mine)
            seconds.append(time.perf_counter() - t)
            want = mod(token, past_key_values=theirs).logits
            errors.append(float((got - want).abs().max() / want.abs().max()))
            token = want[:, -1:].argmax(-1)
    fams = [e for e in be.report if e.graph is not None and e.graph.is_family]
    return {"errors": errors, "seconds": seconds, "summary": be.summary(), "families": fams,
            "report": be.report, "time_limited_ops": time_limited_ops(be.report)}


def generate(dtype: str = "float32", time_limit_s: float = 30.0, cache=None,
             seq: int = SEQ, hidden: int = HIDDEN, new_tokens: int = 8,
             warmup: int | None = 0, quant: str | None = None, padded: bool = False,
             layers: int = 2) -> dict:
    """A ``layers``-layer (2) LlamaForCausalLM's ``generate()`` (greedy, ``new_tokens`` tokens
    after a ``seq``-token prompt, transformers' DynamicCache) with its ``forward`` compiled
    by ``em.backend``, as users compile a model for generation; the same call eagerly is the
    reference. The figures of one row: ops over every graph Dynamo made (the prompt's, the
    first decode step's, the growing-cache family), the largest error of any step's logits,
    and whether the tokens equal eager's. ``warmup``: the backend's (0: every graph searched
    at its first call; None: its default, where the prompt's graph and the first decode
    step's run eagerly and only the growing-cache family is searched); ``quant``: the
    model's weights quantized as ``quantized`` does (None: as they are); ``padded``: a batch
    of two prompts, the second left-padded by two tokens (its ``attention_mask`` zero
    there), so each step builds the padding mask over the cache's length."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    dt = getattr(torch, dtype)
    mod = LlamaForCausalLM(llama_config("sdpa", layers, hidden, seq + new_tokens)).eval()
    mod = mod.to(dt)
    if quant:
        mod = quantized(mod, quant, dt)
    mod.generation_config.pad_token_id = 0
    ids = torch.randint(0, VOCAB, (2 if padded else 1, seq))
    kw = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False,
          "output_logits": True, "return_dict_in_generate": True}
    if padded:
        mask = torch.ones_like(ids)
        mask[1, :2] = 0
        kw["attention_mask"] = mask
    torch._dynamo.reset()
    said: list[str] = []
    load = os.getloadavg()[0]
    be = em.backend(time_limit_s=time_limit_s, warn=False, warmup=warmup,
                    progress=said.append, **({"cache": cache} if cache is not None else {}))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = mod.generate(ids, **kw)
        eager_forward = mod.forward
        mod.forward = torch.compile(eager_forward, backend=be)
        t = time.perf_counter()
        got = mod.generate(ids, **kw)
        seconds = time.perf_counter() - t
        mod.forward = eager_forward
    err = max(float((g.float() - w.float()).abs().max() / w.float().abs().max())
              for g, w in zip(got.logits, want.logits))
    s = be.summary()
    return {"name": "llama_generate" + (f"_{quant}" if quant else ""), "dtype": dtype,
            "impl": "sdpa", "seq": seq,
            "hidden": hidden, "ops": s["ops"], "compute_ops": s["compute_ops"],
            "optimized_ops": s["optimized_ops"],
            "optimized_compute_ops": s["optimized_compute_ops"],
            "partitions": s["optimized_partitions"],
            "time_limited_ops": time_limited_ops(be.report),
            "before": (s["predicted_us"] or (None, None))[0],
            "after": (s["predicted_us"] or (None, None))[1], "error": err,
            "tokens_equal": bool(torch.equal(got.sequences, want.sequences)),
            "families": [e for e in be.report if e.graph is not None and e.graph.is_family],
            "summary": s,
            "graphs": len(s.get("graphs", [])),
            "finite": all(bool(torch.isfinite(g).all()) for g in got.logits),
            "seconds": seconds, "eager": s["eager"], "backend": be,
            "rejected": [line for line in said if "rejected by the verifier" in line],
            "load": (load, os.getloadavg()[0])}


def time_limited_ops(report) -> int:
    """Compute ops left as they were only because their search ran out of time (the
    machine's speed, said so in the reason), as the backend counts them in each partition's
    own ops (``PartitionReport.time_limited_compute_ops``): those of a partition left
    unchanged by the time limit, and those a piece so left computes inside an optimized
    one. (Counting the pieces' program ops instead, as before, overstated it: row 55
    reported 364 of 441 compute ops.)"""
    return sum(e.time_limited_compute_ops for e in report)


# (name, dtype, attention, sequence, hidden): issue 31's table of transformers layers
CASES = [(f, dt, "sdpa", SEQ, HIDDEN) for f in ("llama", "qwen2", "mistral", "phi3", "gemma",
                                                 "neox") for dt in ("float32", "float16")]
CASES = [(f"{f}_layer", dt, impl, seq, h) for f, dt, impl, seq, h in CASES]
CASES += [("llama_layer", dt, "sdpa", seq, h) for dt in ("float32", "float16")
          for seq, h in ((16, HIDDEN), (128, HIDDEN), (64, 512))]
CASES += [("llama_layer", "float32", "eager", SEQ, HIDDEN),
          ("bert", "float32", "sdpa", SEQ, HIDDEN), ("bert", "float32", "eager", SEQ, HIDDEN),
          ("bert", "float16", "sdpa", SEQ, HIDDEN),
          ("gpt2_block", "float32", "sdpa", SEQ, HIDDEN),
          ("gpt2_block", "float16", "eager", SEQ, HIDDEN),
          ("llama_model", "float32", "sdpa", SEQ, HIDDEN),
          ("nanogpt_block", "float32", "masked_fill", SEQ, HIDDEN),
          ("nanogpt_block", "float16", "masked_fill", SEQ, HIDDEN)]
# issue 52: more families (appended, so the rows above keep their indices)
CASES += [(name, dt, impl, SEQ, HIDDEN)
          for name, impl in (("falcon_layer", "sdpa"), ("opt_layer", "sdpa"),
                             ("gptj_block", "sdpa"), ("phi_layer", "sdpa"),
                             ("qwen3_layer", "sdpa"), ("vit_layer", "sdpa"),
                             ("clip_layer", "sdpa"), ("t5_block", "sdpa"),
                             ("mixtral_moe", "eager"), ("mixtral_moe", "batched_mm"))
          for dt in ("float32", "float16")]  # Mixtral: its experts' eager loop (which Dynamo
#   runs uncaptured) and transformers' batched_mm (one graph: the experts' MLP searched once)
# LlamaForCausalLM: forward in fp16 (fp32 is row 23), and generate() with forward compiled
CASES += [("llama_model", "float16", "sdpa", SEQ, HIDDEN)]
CASES += [("llama_generate", dt, "sdpa", SEQ, HIDDEN) for dt in ("float32", "float16")]
# issue 53: LlamaForCausalLM forward with torchao weight-only quantized weights
CASES += [("llama_model_int8", "float16", "sdpa", SEQ, HIDDEN),
          ("llama_model_int4g128", "float16", "sdpa", SEQ, HIDDEN),
          ("llama_model_int8_hf", "float32", "sdpa", SEQ, HIDDEN),
          ("llama_model_w8hand", "float16", "sdpa", SEQ, HIDDEN),
          ("llama_model_w4g128hand", "float16", "sdpa", SEQ, HIDDEN),
          ("llama_generate_int8", "float16", "sdpa", SEQ, HIDDEN),
          ("llama_model_fp8", "float16", "sdpa", SEQ, HIDDEN)]
# issue 52: Mixtral with em.use_experts (rows 57-58, in the More families table): the
# experts' loop eager, each expert's MLP through the backend, one search for them all
CASES += [("mixtral_moe", dt, NAME, SEQ, HIDDEN) for dt in ("float32", "float16")]


def table(rows: list[dict]) -> str:
    """The rows as a markdown table."""
    lines = ["| model | dtype | attention | seq | hidden | compute ops optimized / compute ops "
             "/ all ops "
             "| ops left by the time limit | partitions | predicted us (one kernel per op -> "
             "chosen) | speedup | max rel. error vs eager | compile s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        speed = r["before"] / r["after"] if r["after"] else float("nan")
        share = 100 * r["optimized_compute_ops"] / max(r["compute_ops"], 1)
        tokens = {None: "", True: ", tokens equal", False: ", TOKENS DIFFER"}[
            r.get("tokens_equal")]
        lines.append(f"| {r['name']} | {r['dtype']} | {r['impl']} | {r['seq']} | "
                     f"{r['hidden']} | {r['optimized_compute_ops']} / {r['compute_ops']} / "
                     f"{r['ops']} "
                     f"({share:.0f}% of compute) | {r['time_limited_ops']} | "
                     f"{r['partitions']} | "
                     + (f"{r['before']:.2f} -> {r['after']:.2f}" if r["after"] else "not priced")
                     + " | "
                     f"{speed:.2f}x | {r['error']:.1e}{tokens} | {r['seconds']:.1f} |")
    return "\n".join(lines)


def commit() -> str:
    """The repository's commit (short), "+" if the work tree differs from it."""
    def git(*a):
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout
    return git("rev-parse", "--short", "HEAD").strip() + ("+" if git("status", "--porcelain",
                                                                     "eqsat_mirage") else "")


def stored(path: Path) -> list[dict]:
    """The rows kept in ``path`` (JSON lines), the latest of each case, in ``CASES`` order."""
    latest = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        row = json.loads(line)
        latest[row["case"]] = row
    return [latest[i] for i in sorted(latest)]


def main(argv=None) -> int:
    """Run the cases (all, ``--only`` names, ``--case`` indices), print the table, optionally
    keep the rows (``--rows``) and write the table into RESULTS.md (``--table-only``: the
    kept rows, nothing run)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=120.0)
    ap.add_argument("--write", metavar="RESULTS.md")
    ap.add_argument("--only", action="append", help="run the cases whose name starts so")
    ap.add_argument("--case", action="append", type=int, help="run CASES[i]")
    ap.add_argument("--rows", metavar="FILE.jsonl", help="append each row's figures here")
    ap.add_argument("--section", default=SECTION,
                    help=f"the RESULTS.md heading written (default {SECTION!r}; the families "
                    f"of rows 27-46 and 57-58: {MORE_SECTION!r}; rows 47-49: {LLAMA_SECTION!r}; "
                    f"rows 50-56: {QUANT_SECTION!r})")
    ap.add_argument("--table-only", action="store_true",
                    help="run nothing: the table of the rows kept in --rows")
    args = ap.parse_args(argv)
    if args.table_only and not args.rows:
        ap.error("--table-only needs --rows")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, dtype, impl, seq, hidden) in enumerate(CASES):
            if args.table_only or args.only and not any(name.startswith(o) for o in args.only) \
                    or args.case and i not in args.case:
                continue
            row = run(name, dtype, impl, args.time_limit, Path(tmp) / f"c{i}.sqlite", seq, hidden)
            print(table([row]).splitlines()[-1], flush=True)
            for e in row["eager"]:
                print(f"    eager: {e}", flush=True)
            for g in row["backend"].summary().get("graphs", []):  # refused whole: no op named
                if g.get("outcome") == "eager" and not g.get("eager"):
                    print(f"    graph {g['graph']} eager: {g['reason']}", flush=True)
            for e in row["backend"].report:  # pieces left as they were, and why
                pieces = getattr(e.result, "stats", {}).get("pieces") or []
                for p in pieces:
                    if p["status"] != "optimized":
                        print(f"    unchanged: {e.name} piece {p['index']} "
                              f"({len(p['ops'])} ops): {p['reason']}", flush=True)
            for line in row["rejected"]:
                print(f"    {line}", flush=True)
            summary = row.get("summary") or row["backend"].summary()
            for line in summary.get("eager_calls") or []:  # served eagerly at a call
                print(f"    eager calls: {line}", flush=True)
            row = {k: v for k, v in row.items() if k not in ("backend", "families")}
            rows.append({**row, "case": i, "time_limit": args.time_limit, "commit": commit(),
                         "triton": os.environ.get("TRITON_INTERPRET") == "1"})
            if args.rows:
                with open(args.rows, "a") as f:
                    f.write(json.dumps(rows[-1]) + "\n")
    if args.table_only:
        rows = stored(Path(args.rows))
    text = table(rows)
    ran = {r.get("triton", os.environ.get("TRITON_INTERPRET") == "1") for r in rows}
    mode = " and ".join(("Triton kernels (TRITON_INTERPRET=1)" if t else
                         "torch code of the chosen programs") for t in sorted(ran, reverse=True))
    if args.write and rows:
        from bench.results_md import replace_section

        loads = [x for r in rows for x in r.get("load", ())]
        commits = sorted({r.get("commit", "?") for r in rows})
        limits = sorted({r.get("time_limit", args.time_limit) for r in rows})
        section = f" --section '{args.section}'" if args.section != SECTION else ""
        body = (f"{args.section}\n\nCommand: `TRITON_INTERPRET=1 python bench/hf_models.py "
                f"--write bench/RESULTS.md{section}` (one row: `--case I --rows FILE`, then "
                f"`--rows FILE --table-only --write bench/RESULTS.md{section}`). Machine: "
                f"{platform.machine()} CPU, "
                f"{os.cpu_count()} cores, shared (load average {min(loads, default=0):.1f} to "
                f"{max(loads, default=0):.1f} at the rows' start and end), Python "
                f"{platform.python_version()}; commit {', '.join(commits)}; transformers "
                "modules from tiny random-init configs (head dim 64, half as many key/value "
                "heads where the family has them, batch 1; BERT: batch 2, the second padded), "
                f"nothing downloaded; `torch.compile(fn, backend=em.backend(time_limit_s="
                f"{'/'.join(f'{t:.0f}' for t in limits)}, warmup=0))`, one call, a fresh "
                f"results cache per row; optimized partitions ran as {mode}. Predicted times are "
                "the h100 cost model's, summed over the optimized partitions; compile seconds "
                "are the first call's wall clock here (search included).\n\n" + text + "\n")
        replace_section(Path(args.write), args.section, body)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
