"""Small torch modules shared by the from_torch and backend tests (an attention
block, a gated MLP block and a LoRA linear)."""

import torch
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
