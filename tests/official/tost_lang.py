"""The authors' ToST language model, transcribed for the parity tests (never imported by the library).

Source: https://github.com/RobinWu218/ToST, file ``tost_lang/model_TSSA.py``, commit
071ea98ffc84b4e4eb4f0c1167eae90b2bd11dd9 (Wu et al., "Token Statistics Transformer: Linear-Time Attention via
Variational Rate Reduction", ICLR 2025), a nanoGPT ``model.py`` whose attention is ``CausalSelfAttention_TSSA``
when ``GPTConfig.TSSA`` is set (``tost_lang/config/train_tost_*_ls.py`` set it).  ``tost_lang/train.py`` saves
``{'model': state_dict, 'optimizer', 'model_args': {n_layer, n_head, n_embd, block_size, bias, vocab_size,
dropout, TSSA}, 'iter_num', 'best_val_loss', 'config'}`` as ``ckpt.pt``.

Changes from the source, none of which alters the computation or the parameter names: the standard-attention
class (``CausalSelfAttention``, used when ``TSSA`` is off), ``from_pretrained``, ``crop_block_size``,
``configure_optimizers``, ``estimate_mfu``, ``generate``, the parameter-count print and the unused imports
(``einops``, ``torch.profiler``) are left out; formatted to this repository's style (ruff).  ``forward(idx,
targets)`` returns every position's logits when given targets, the last position's otherwise, as the original.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F


class LayerNorm(nn.Module):
    """LayerNorm but with an optional bias. PyTorch doesn't support simply bias=False"""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention_TSSA(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0

        self.c_attn = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        # output projection
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        # regularization
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        self.temp = nn.Parameter(torch.ones(config.n_head, 1))
        self.denom_bias = nn.Parameter(torch.zeros(config.n_head, config.block_size, 1))

    def forward(self, x):
        B, T, C = x.size()  # batch size, sequence length, embedding dimensionality (n_embd)

        w = self.c_attn(x)
        w = w.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        w_sq = w**2
        denom = (torch.cumsum(w_sq, dim=-2)).clamp_min(1e-12)
        w_normed = (w_sq / denom) + self.denom_bias[:, :T, :]
        tmp = torch.sum(w_normed, dim=-1) * self.temp

        Pi = F.softmax(tmp, dim=1)  # B, nh, T
        dots = torch.cumsum(w_sq * Pi.unsqueeze(-1), dim=-2) / (Pi.cumsum(dim=-1) + 1e-8).unsqueeze(-1)
        attn = 1.0 / (1 + dots)
        attn = self.attn_dropout(attn)
        y = -torch.mul(w.mul(Pi.unsqueeze(-1)), attn)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble all head outputs side by side
        y = self.resid_dropout(self.c_proj(y))
        return y


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        x = self.c_fc(x)
        x = self.gelu(x)
        x = self.c_proj(x)
        x = self.dropout(x)
        return x


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        assert config.TSSA, "this transcription keeps the TSSA attention only"
        self.attn = CausalSelfAttention_TSSA(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)
        eta = 1e-5
        self.gamma1 = nn.Parameter(eta * torch.ones(config.n_embd), requires_grad=True)
        self.gamma2 = nn.Parameter(eta * torch.ones(config.n_embd), requires_grad=True)

    def forward(self, x):
        x = x + self.gamma1 * self.attn(self.ln_1(x))
        x = x + self.gamma2 * self.mlp(self.ln_2(x))
        return x


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True
    TSSA: bool = False


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.vocab_size is not None
        assert config.block_size is not None
        self.config = config

        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight

        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def get_num_params(self, non_embedding=True):
        n_params = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n_params -= self.transformer.wpe.weight.numel()
        return n_params

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        device = idx.device
        b, t = idx.size()
        assert t <= self.config.block_size, (
            f"Cannot forward sequence of length {t}, block size is only {self.config.block_size}"
        )
        pos = torch.arange(0, t, dtype=torch.long, device=device)  # shape (t)

        tok_emb = self.transformer.wte(idx)  # token embeddings of shape (b, t, n_embd)
        pos_emb = self.transformer.wpe(pos)  # position embeddings of shape (t, n_embd)
        x = self.transformer.drop(tok_emb + pos_emb)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)

        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        else:
            logits = self.lm_head(x[:, [-1], :])  # note: using list [-1] to preserve the time dim
            loss = None

        return logits, loss
