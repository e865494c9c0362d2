"""export_nanogpt.py: nanoGPT-style PyTorch language models for the export round trip
(tests/cli/export_nanogpt.sh), written as nanoGPT writes them: token and position embeddings
(wte + wpe(arange)), pre-norm blocks with a hand-written CausalSelfAttention (c_attn, c_proj,
split into heads, a tril mask buffer), an MLP with GELU, a final LayerNorm and an lm_head whose
weight IS the token embedding's (weight tying). A second variant uses nn.MultiheadAttention with
a causal mask. Small: vocabulary 256, context 16, width 32, 2 blocks."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size, bias=True):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.attn_dropout = nn.Dropout(0.0)
        self.resid_dropout = nn.Dropout(0.0)
        self.n_head, self.n_embd = n_head, n_embd
        self.register_buffer('bias', torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf'))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MhaAttention(nn.Module):
    """The same through nn.MultiheadAttention (batch_first) and a boolean causal mask."""

    def __init__(self, n_embd, n_head, block_size, bias=True):
        super().__init__()
        self.mha = nn.MultiheadAttention(n_embd, n_head, batch_first=True)
        self.register_buffer('mask', torch.ones(block_size, block_size, dtype=torch.bool).triu(1))

    def forward(self, x):
        return self.mha(x, x, x, attn_mask=self.mask, need_weights=False)[0]


class MLP(nn.Module):
    def __init__(self, n_embd, approximate):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU(approximate=approximate)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)
        self.dropout = nn.Dropout(0.0)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size, approximate, attn):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = attn(n_embd, n_head, block_size)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd, approximate)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, vocab_size=256, block_size=16, n_embd=32, n_head=4, attn=CausalSelfAttention):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd),
            wpe=nn.Embedding(block_size, n_embd),
            drop=nn.Dropout(0.0),
            # both GELUs: the exact one in block 0, the tanh approximation in block 1
            h=nn.ModuleList([Block(n_embd, n_head, block_size, a, attn) for a in ('none', 'tanh')]),
            ln_f=nn.LayerNorm(n_embd),
        ))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight   # weight tying
        for p in self.parameters():   # small weights, so the loss is a few nats and differences show
            nn.init.normal_(p, 0.0, 0.1)

    def forward(self, idx):
        t = idx.size(1)   # (nanoGPT: b, t = idx.size(); torch.fx of torch 1.13 cannot unpack a size on this Python)
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def gpt():
    return GPT()


def gpt_mha():
    return GPT(attn=MhaAttention)
