"""Small torch modules shared by the from_torch and backend tests (an attention
block, a gated MLP block, a LoRA linear, and a nanoGPT block whose causal attention is
``masked_fill(bias == 0, -inf)`` on a tril buffer; bench/hf_models.py runs it too)."""

import math

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn


class Attention(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.o = nn.Linear(d, d, bias=False)

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        a = torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5, dim=-1)
        return self.o(a @ v)


class GatedMLP(nn.Module):
    def __init__(self, d=8, h=16):
        super().__init__()
        self.w1, self.w2 = nn.Linear(d, h, bias=False), nn.Linear(d, h, bias=False)
        self.w3, self.act = nn.Linear(h, d, bias=False), nn.SiLU()

    def forward(self, x):
        return self.w3(self.act(self.w1(x)) * self.w2(x))


class LoRALinear(nn.Module):
    def __init__(self, d=8, out=12, r=2, scale=0.5):
        super().__init__()
        self.base = nn.Linear(d, out)
        self.lora_a, self.lora_b = nn.Linear(d, r, bias=False), nn.Linear(r, out, bias=False)
        self.scale = scale

    def forward(self, x):
        return self.base(x) + self.lora_b(self.lora_a(x)) * self.scale


# -- a nanoGPT block (Karpathy's model.py, tiny sizes): causal attention written with a
# tril buffer and masked_fill(bias == 0, -inf), as nanoGPT and minGPT write it
class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd=32, n_head=2, block_size=16, fill=float("-inf"), diagonal=0):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head, self.n_embd, self.fill = n_head, n_embd, fill
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size), diagonal)
                             .view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()  # noqa: N806 - nanoGPT's names
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, self.fill)
        att = F.softmax(att, dim=-1)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class NanoMLP(nn.Module):
    def __init__(self, n_embd=32):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class NanoGPTBlock(nn.Module):
    def __init__(self, n_embd=32, n_head=2, block_size=16, fill=float("-inf")):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size, fill)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = NanoMLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Int8Linear(nn.Module):
    """``linear`` with int8 weights, written by hand: per-row absmax quantization of its
    weight (N, K), ``F.linear(x, w_q.to(x.dtype) * s[:, None], bias)``."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        w = linear.weight.detach().float()
        s = w.abs().amax(dim=1).clamp(min=1e-8) / 127
        self.register_buffer("w_q", torch.round(w / s[:, None]).clamp(-128, 127)
                             .to(torch.int8))
        self.register_buffer("s", s.to(linear.weight.dtype))
        self.bias = linear.bias

    def forward(self, x):
        return F.linear(x, self.w_q.to(x.dtype) * self.s[:, None], self.bias)


class Int4Linear(nn.Module):
    """``linear`` with packed int4 weights, written by hand in GPTQ's layout: W^T (K, N) in
    groups of ``group`` rows, 4-bit values with zero point 8, two to a uint8 (row 2i in the
    low nibble), a scale per group and column; ``x @ ((q - 8) * s)``."""

    def __init__(self, linear: nn.Linear, group: int = 128) -> None:
        super().__init__()
        w = linear.weight.detach().float().t()
        k, n = w.shape
        s = w.reshape(k // group, group, n).abs().amax(dim=1).clamp(min=1e-8) / 7
        q = (torch.round(w.reshape(k // group, group, n) / s[:, None, :]) + 8).clamp(0, 15)
        q = q.to(torch.uint8).reshape(k, n)
        self.register_buffer("w_p", q[0::2] | (q[1::2] << 4))
        self.register_buffer("s", s.to(linear.weight.dtype))
        self.bias, self.k, self.n, self.group = linear.bias, k, n, group

    def forward(self, x):
        k, n, g = self.k, self.n, self.group
        q = torch.stack([self.w_p & 0xF, self.w_p >> 4], dim=1).reshape(k, n)
        w = (q.reshape(k // g, g, n).to(x.dtype) - 8) * self.s[:, None, :]
        y = x @ w.reshape(k, n)
        return y if self.bias is None else y + self.bias


def swap_linears(module: nn.Module, make) -> nn.Module:
    """``module`` with every ``nn.Linear`` inside it replaced by ``make(linear)``."""
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            setattr(module, name, make(child))
        else:
            swap_linears(child, make)
    return module


def assert_close_to_eager(got: torch.Tensor, want: torch.Tensor, dtype) -> None:
    """``got`` within the quantized tests' tolerance of eager ``want`` (fp16: 2e-2, bf16:
    5e-2, else 1e-4, of ``want``'s largest magnitude), compared in float64; ``dtype`` the
    activations' (a torch dtype or its name)."""
    name = str(dtype).removeprefix("torch.")
    tol = {"float16": 2e-2, "bfloat16": 5e-2}.get(name, 1e-4)
    err = float((got.double() - want.double()).abs().max())
    assert err <= tol * float(want.double().abs().max()), err


def quantized_linear_result(m: nn.Module, x: torch.Tensor):
    """Run the weight-quantized linear ``m`` on ``x`` through ``torch.compile`` with the
    eqsat-mirage backend; check it equals eager (fp16 within 2e-2, fp32 within 1e-4 of the
    output's largest value), has every compute op in one optimized Triton partition, and
    return that partition's ``OptimizeResult`` (the int8 and int4 linear tests read its
    source and program)."""
    import warnings

    import eqsat_mirage as em

    be = em.backend(warmup=0, cache=False, warn=False)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = m(x)
        got = torch.compile(m, backend=be)(x)
    assert got.dtype == want.dtype
    assert_close_to_eager(got, want, x.dtype)
    s = be.summary()
    assert s["optimized_compute_ops"] == s["compute_ops"] > 0, s
    (entry,) = [e for e in be.report if e.result is not None]
    assert entry.status == "optimized" and entry.mode == "triton", entry
    return entry.result


def run_compiled(res, g, inputs: dict) -> dict:
    """``res.compile()`` (the generated code, its first launch checked; Triton's interpreter
    on CPU) run on the NumPy ``inputs`` of ``g``, each as a torch tensor of its input's
    dtype: the outputs by name."""
    args = {n: torch.tensor(v).to(getattr(torch, g.inputs[n].dtype)) for n, v in inputs.items()}
    return res.compile()(**args)
