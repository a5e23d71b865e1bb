"""The official CRATE-MAE formulation, transcribed: the forward computation of the official
``model/crate_ae/{crate_ae,crate_encoder,crate_decoder,pos_embed}.py`` (Ma-Lab-Berkeley/CRATE, PR #21;
commit 674408f) with its module names, so its ``state_dict`` has the official keys.  Conv patch
embedding, gather/scatter masking, explicit attention matrices, three-matmul ISTA.

Not the implementation to use — ``crate_transformer.models.mae`` is.  This exists so the tests can check
that ``ct.from_official(..., "crate_mae_*")`` reproduces the official loss and predictions, and so the
benchmark can time the official formulation beside ours in the same run.
"""

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .crate import Attention, PreNorm


def _sincos_1d(dim, pos):
    omega = np.arange(dim // 2, dtype=np.float32) / (dim / 2.0)
    omega = 1.0 / 10000**omega
    out = np.einsum("m,d->md", pos.reshape(-1), omega)
    return np.concatenate([np.sin(out), np.cos(out)], axis=1)


def sincos_2d(dim, grid, cls_token=True):
    gw, gh = np.meshgrid(np.arange(grid, dtype=np.float32), np.arange(grid, dtype=np.float32))  # w first
    emb = np.concatenate([_sincos_1d(dim // 2, gw), _sincos_1d(dim // 2, gh)], axis=1)
    if cls_token:
        emb = np.concatenate([np.zeros([1, dim]), emb], axis=0)
    return emb


class EncoderISTA(nn.Module):  # crate_encoder.FeedForward (λ = 0.5)
    def __init__(self, dim, step_size=0.1, lambd=0.5):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim, dim))
        nn.init.kaiming_uniform_(self.weight)
        self.step_size, self.lambd = step_size, lambd

    def forward(self, x):
        grad_1 = F.linear(F.linear(x, self.weight), self.weight.t())
        grad_2 = F.linear(x, self.weight.t())
        return F.relu(x + self.step_size * (grad_2 - grad_1) - self.step_size * self.lambd)


class DecoderDictionary(nn.Module):  # crate_decoder.FeedForward: the plain linear map E
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim, dim))
        nn.init.kaiming_uniform_(self.weight)

    def forward(self, x):
        return F.linear(x, self.weight)


class EncoderBlock(nn.Module):  # crate_encoder.Block_CRATE
    def __init__(self, dim, heads, dim_head, lambd=0.5):
        super().__init__()
        self.layers = nn.ModuleList(
            [
                nn.ModuleList(
                    [PreNorm(dim, Attention(dim, heads, dim_head)), PreNorm(dim, EncoderISTA(dim, lambd=lambd))]
                )
            ]
        )

    def forward(self, x):
        for attn, ff in self.layers:
            x = ff(attn(x) + x)
        return x


class DecoderBlock(nn.Module):  # crate_decoder.Block_CRATE
    def __init__(self, dim, heads, dim_head):
        super().__init__()
        self.layers = nn.ModuleList(
            [nn.ModuleList([PreNorm(dim, DecoderDictionary(dim)), PreNorm(dim, Attention(dim, heads, dim_head))])]
        )

    def forward(self, x):
        for ff, attn in self.layers:
            grad_x = ff(x)
            x = grad_x - attn(grad_x)
        return x


class PatchEmbed(nn.Module):  # timm PatchEmbed: a strided conv, flatten, no norm
    def __init__(self, patch_size, in_chans, dim):
        super().__init__()
        self.proj = nn.Conv2d(in_chans, dim, patch_size, patch_size)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


class OfficialCRATEMAE(nn.Module):
    """``MaskedAutoencoderViT(CRATEEncoderBlock, CRATEDecoderBlock, ...)`` with d_dec = d, L_dec = L, K_dec = K."""

    def __init__(self, *, img_size=224, patch_size=16, in_chans=3, embed_dim=768, depth=12, num_heads=12,
                 norm_pix_loss=False, lambd=0.5):  # fmt: skip
        super().__init__()
        self.p, self.in_chans, self.norm_pix_loss = patch_size, in_chans, norm_pix_loss
        num_patches = (img_size // patch_size) ** 2
        d, dh = embed_dim, embed_dim // num_heads
        self.patch_embed = PatchEmbed(patch_size, in_chans, d)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + 1, d), requires_grad=False)
        self.blocks = nn.ModuleList(EncoderBlock(d, num_heads, dh, lambd) for _ in range(depth))
        self.norm = nn.LayerNorm(d, eps=1e-6)
        self.decoder_embed = nn.Linear(d, d)  # defined, never used
        self.mask_token = nn.Parameter(torch.zeros(1, 1, d))
        self.decoder_pos_embed = nn.Parameter(torch.zeros(1, num_patches + 1, d), requires_grad=False)
        self.decoder_blocks = nn.ModuleList(DecoderBlock(d, num_heads, dh) for _ in range(depth))
        self.decoder_norm = nn.LayerNorm(d, eps=1e-6)
        self.decoder_pred = nn.Linear(d, patch_size**2 * in_chans)
        grid = int(num_patches**0.5)
        self.pos_embed.data.copy_(torch.from_numpy(sincos_2d(d, grid)).float().unsqueeze(0))
        self.decoder_pos_embed.data.copy_(torch.from_numpy(sincos_2d(d, grid)).float().unsqueeze(0))
        w = self.patch_embed.proj.weight.data
        nn.init.xavier_uniform_(w.view([w.shape[0], -1]))
        nn.init.normal_(self.cls_token, std=0.02)
        nn.init.normal_(self.mask_token, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.constant_(m.bias, 0)
            elif isinstance(m, nn.LayerNorm):
                nn.init.constant_(m.bias, 0)
                nn.init.constant_(m.weight, 1.0)

    def patchify(self, imgs):  # 'nchpwq->nhwpqc'
        p, c = self.p, imgs.shape[1]
        h = w = imgs.shape[2] // p
        x = imgs.reshape(imgs.shape[0], c, h, p, w, p)
        x = torch.einsum("nchpwq->nhwpqc", x)
        return x.reshape(imgs.shape[0], h * w, p * p * c)

    def random_masking(self, x, mask_ratio, noise=None):
        N, L, D = x.shape
        len_keep = int(L * (1 - mask_ratio))
        if noise is None:
            noise = torch.rand(N, L, device=x.device)
        ids_shuffle = torch.argsort(noise, dim=1)
        ids_restore = torch.argsort(ids_shuffle, dim=1)
        ids_keep = ids_shuffle[:, :len_keep]
        x_masked = torch.gather(x, dim=1, index=ids_keep.unsqueeze(-1).repeat(1, 1, D))
        mask = torch.ones([N, L], device=x.device)
        mask[:, :len_keep] = 0
        mask = torch.gather(mask, dim=1, index=ids_restore)
        return x_masked, mask, ids_restore

    def forward_encoder(self, x, mask_ratio, noise=None):
        x = self.patch_embed(x)
        x, mask, ids_restore = self.random_masking(x, mask_ratio, noise)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        mask_tokens = self.mask_token.repeat(x.shape[0], ids_restore.shape[1] + 1 - x.shape[1], 1)
        x_ = torch.cat([x[:, 1:, :], mask_tokens], dim=1)
        x_ = torch.gather(x_, dim=1, index=ids_restore.unsqueeze(-1).repeat(1, 1, x.shape[2]))
        x = torch.cat([x[:, :1, :], x_], dim=1)
        x = x + self.decoder_pos_embed  # the official forward adds decoder_pos_embed (pos_embed is unused)
        for blk in self.blocks:
            x = blk(x)
        return self.norm(x), mask, ids_restore

    def forward_decoder(self, x, ids_restore):
        for blk in self.decoder_blocks:
            x = blk(x)
        return self.decoder_pred(self.decoder_norm(x))[:, 1:, :]

    def forward_loss(self, imgs, pred, mask):
        target = self.patchify(imgs)
        if self.norm_pix_loss:
            mean = target.mean(dim=-1, keepdim=True)
            var = target.var(dim=-1, keepdim=True)
            target = (target - mean) / (var + 1.0e-6) ** 0.5
        loss = ((pred - target) ** 2).mean(dim=-1)
        return (loss * mask).sum() / mask.sum()

    def forward(self, imgs, mask_ratio=0.75, noise=None):
        latent, mask, ids_restore = self.forward_encoder(imgs, mask_ratio, noise)
        pred = self.forward_decoder(latent, ids_restore)
        return self.forward_loss(imgs, pred, mask), pred, mask
