"""The crate-lm language models, transcribed for the parity tests (not part of the package).

Source: https://github.com/crate-lm/crate-lm at commit 3d5027b7471b7586c76c24063d19bbc5c545b74a
(Bai & Ma, "Improving Neuron-level Interpretability with White-box Language Models", CPAL 2025):

* ``crate.py`` — CRATE-GPT with CRATE's ISTA (complete d × d dictionary, one step from the input), no final
  LayerNorm, the explicit-mask attention (``flash = False``, so the causal mask is a ``bias`` buffer);
* ``crate_overcomplete.py`` — the file ``train.py`` imports, which trained the released
  ``JackBAI/CRATE-GPT-12L-Pile-600000steps`` (``ckpt-crate-12l-overparam-600000.pt``): the ISTA block has a
  ``4d × d`` weight that codes and decodes, two steps from zero, no residual; a final LayerNorm ``ln_f``;
  ``scaled_dot_product_attention`` (``flash = True``, no buffer).

Module and attribute names are the originals (so ``state_dict`` keys match the checkpoints).  The two files
share ``LayerNorm``, the attention (up to its ``flash`` flag) and the model class; here crate_overcomplete.py's
differences are the subclasses with an ``Overcomplete`` suffix, and the model class picks its block and
``ln_f`` by two class attributes.  Left out: the ``enhanced_feature_id`` feature
interventions (inactive unless passed), debug ``print`` calls, ``from_pretrained``, ``crop_block_size``,
``configure_optimizers``, ``estimate_mfu`` and ``generate``.  ``forward(idx, targets)`` returns the logits of
every position (as the original does when given targets).  Formatted with ruff; the computation is unchanged.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.init as init
from torch.nn import functional as F


class LayerNorm(nn.Module):
    """LayerNorm but with an optional bias. PyTorch doesn't support simply bias=False"""

    def __init__(self, ndim, bias=True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


@dataclass
class CRATEConfig:
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True


# --------------------------------------------------------------------------- crate.py
class CausalSelfAttention(nn.Module):
    """Masked MSSA Attention"""

    def __init__(self, config, flash=False):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=True)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        self.flash = flash  # crate.py: False; crate_overcomplete.py: True
        if not self.flash:
            self.register_buffer(
                "bias",
                torch.tril(torch.ones(config.block_size, config.block_size)).view(
                    1, 1, config.block_size, config.block_size
                ),
            )

    def forward(self, x):
        B, T, C = x.size()
        qkv = self.c_attn(x)
        qkv = qkv.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        if self.flash:
            y = torch.nn.functional.scaled_dot_product_attention(
                qkv, qkv, qkv, attn_mask=None, dropout_p=self.dropout if self.training else 0, is_causal=True
            )
        else:
            att = (qkv @ qkv.transpose(-2, -1)) * (1.0 / math.sqrt(qkv.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            att = self.attn_dropout(att)
            y = att @ qkv
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        y = self.resid_dropout(self.c_proj(y))
        return y


class MLP(nn.Module):
    """ISTA Block"""

    def __init__(self, config):
        super().__init__()
        self.weight = nn.Parameter(torch.Tensor(config.n_embd, config.n_embd))
        with torch.no_grad():
            init.kaiming_uniform_(self.weight)
        self.step_size = 0.1
        self.relu = nn.ReLU()
        self.lambd = 0.1

    def forward(self, x):
        # compute D^T * D * x
        x1 = F.linear(x, self.weight, bias=None)
        grad_1 = F.linear(x1, self.weight.t(), bias=None)
        # compute D^T * x
        grad_2 = F.linear(x, self.weight.t(), bias=None)
        # compute negative gradient update: step_size * (D^T * x - D^T * D * x)
        grad_update = self.step_size * (grad_2 - grad_1) - self.step_size * self.lambd
        output = self.relu(x + grad_update)
        return output


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.prenorm_1 = LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.prenorm_2 = LayerNorm(config.n_embd)
        self.ista = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.prenorm_1(x))
        x = self.ista(self.prenorm_2(x))
        return x


class CRATE(nn.Module):
    block_cls = Block
    final_norm = False  # crate.py has no ln_f

    def __init__(self, config):
        super().__init__()
        assert config.vocab_size is not None
        assert config.block_size is not None
        self.config = config
        modules = dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([self.block_cls(config) for _ in range(config.n_layer)]),
        )
        if self.final_norm:
            modules["ln_f"] = LayerNorm(config.n_embd, bias=True)
        self.transformer = nn.ModuleDict(modules)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # https://paperswithcode.com/method/weight-tying
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
        assert t <= self.config.block_size, f"Cannot forward sequence of length {t}"
        pos = torch.arange(0, t, dtype=torch.long, device=device).unsqueeze(0)  # shape (1, t)
        tok_emb = self.transformer.wte(idx)
        pos_emb = self.transformer.wpe(pos)
        x = self.transformer.drop(tok_emb + pos_emb)
        for block in self.transformer.h:
            x = block(x)
        if self.final_norm:
            x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        else:
            logits = self.lm_head(x[:, [-1], :])
            loss = None
        return logits, loss


# --------------------------------------------------------------------------- crate_overcomplete.py
class CausalSelfAttentionOvercomplete(CausalSelfAttention):
    """Masked MSSA Attention (crate_overcomplete.py: ``flash = True``; its ``y_hook`` is an identity)"""

    def __init__(self, config):
        super().__init__(config, flash=True)
        self.y_hook = nn.Identity()


class MLPOvercomplete(nn.Module):
    """ISTA Block"""

    def __init__(self, config):
        super().__init__()
        self.weight = nn.Parameter(torch.Tensor(4 * config.n_embd, config.n_embd))
        with torch.no_grad():
            init.kaiming_uniform_(self.weight)
        self.relu = nn.ReLU()
        self.step_size = 0.1
        self.lambd = 0.1

    def forward(self, x):
        z_init = F.relu(self.step_size * F.linear(x, self.weight, bias=None) - self.step_size * self.lambd)
        # compute D^T * D * z_init
        x1 = F.linear(z_init, self.weight.t(), bias=None)
        grad_1 = F.linear(x1, self.weight, bias=None)
        # compute D^T * x
        grad_2 = F.linear(x, self.weight, bias=None)
        # compute negative gradient update: step_size * (D^T * x - D^T * D * x)
        grad_update = self.step_size * (grad_2 - grad_1) - self.step_size * self.lambd
        output_sparse_code = self.relu(z_init + grad_update)
        output = F.linear(output_sparse_code, self.weight.t(), bias=None)
        return output


class BlockOvercomplete(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.prenorm_1 = LayerNorm(config.n_embd)
        self.attn = CausalSelfAttentionOvercomplete(config)
        self.prenorm_2 = LayerNorm(config.n_embd)
        self.ista = MLPOvercomplete(config)

    def forward(self, x):
        x = x + self.attn(self.prenorm_1(x))
        x = self.ista(self.prenorm_2(x))
        return x


class CRATEOvercomplete(CRATE):
    """crate_overcomplete.py's CRATE: the overcomplete blocks and ``transformer.ln_f`` before the head."""

    block_cls = BlockOvercomplete
    final_norm = True
