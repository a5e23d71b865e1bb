"""The official formulation, transcribed: the forward computation of the official
``model/crate.py`` (Ma-Lab-Berkeley/CRATE @ 674408f; JMLR Algs. 2-4, 6) with its module names, so
its ``state_dict`` has the official keys.  Explicit attention matrix, three-matmul ISTA.

Not the implementation to use — ``crate_transformer.models.classifier`` is.  This exists so the tests can
check that ``ct.from_official`` reproduces the official logits and the benchmarks can time the
official formulation beside ours in the same run.
"""

import torch
import torch.nn.functional as F
from torch import nn


class PreNorm(nn.Module):
    def __init__(self, dim, fn):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fn = fn

    def forward(self, x):
        return self.fn(self.norm(x))


class FeedForward(nn.Module):  # the official name of the ISTA block
    def __init__(self, dim, step_size=0.1):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim, dim))
        nn.init.kaiming_uniform_(self.weight)
        self.step_size = step_size
        self.lambd = 0.1

    def forward(self, x):
        x1 = F.linear(x, self.weight, bias=None)
        grad_1 = F.linear(x1, self.weight.t(), bias=None)
        grad_2 = F.linear(x, self.weight.t(), bias=None)
        grad_update = self.step_size * (grad_2 - grad_1) - self.step_size * self.lambd
        return F.relu(x + grad_update)


class Attention(nn.Module):
    def __init__(self, dim, heads, dim_head):
        super().__init__()
        self.heads = heads
        self.scale = dim_head**-0.5
        self.qkv = nn.Linear(dim, heads * dim_head, bias=False)
        self.to_out = nn.Sequential(nn.Linear(heads * dim_head, dim), nn.Dropout(0.0))

    def forward(self, x):
        b, n, _ = x.shape
        w = self.qkv(x).reshape(b, n, self.heads, -1).transpose(1, 2)
        dots = torch.matmul(w, w.transpose(-1, -2)) * self.scale
        attn = dots.softmax(dim=-1)
        out = torch.matmul(attn, w).transpose(1, 2).reshape(b, n, -1)
        return self.to_out(out)


class Transformer(nn.Module):
    def __init__(self, dim, depth, heads, dim_head, ista=0.1):
        super().__init__()
        self.layers = nn.ModuleList(
            nn.ModuleList([PreNorm(dim, Attention(dim, heads, dim_head)), PreNorm(dim, FeedForward(dim, ista))])
            for _ in range(depth)
        )

    def forward(self, x):
        for attn, ff in self.layers:
            grad_x = attn(x) + x
            x = ff(grad_x)
        return x


class OfficialCRATE(nn.Module):
    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, pool="cls", channels=3):
        super().__init__()
        self.p = patch_size
        patch_dim = channels * patch_size * patch_size
        num_patches = (image_size // patch_size) ** 2
        # index 0 stands for the parameter-free Rearrange of the official code
        self.to_patch_embedding = nn.Sequential(
            nn.Identity(), nn.LayerNorm(patch_dim), nn.Linear(patch_dim, dim), nn.LayerNorm(dim)
        )
        self.pos_embedding = nn.Parameter(torch.randn(1, num_patches + 1, dim))
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim))
        self.transformer = Transformer(dim, depth, heads, dim // heads)
        self.pool = pool
        self.mlp_head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, num_classes))

    def rearrange(self, img):  # einops 'b c (h p1) (w p2) -> b (h w) (p1 p2 c)'
        b, c, H, W = img.shape
        p = self.p
        x = img.reshape(b, c, H // p, p, W // p, p).permute(0, 2, 4, 3, 5, 1)
        return x.reshape(b, (H // p) * (W // p), p * p * c)

    def forward(self, img):
        x = self.to_patch_embedding(self.rearrange(img))
        b, n, _ = x.shape
        x = torch.cat((self.cls_token.expand(b, -1, -1), x), dim=1)
        x = x + self.pos_embedding[:, : n + 1]
        x = self.transformer(x)
        x = x.mean(dim=1) if self.pool == "mean" else x[:, 0]
        return self.mlp_head(x)
