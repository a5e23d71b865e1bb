"""DINO's keep-a-fraction-of-the-mass thresholding of class-token attention, transcribed for the tests.

Source: https://github.com/facebookresearch/dino, commit 7c446df5b9f45747937fb0d72314eb9f7b66930a,
``visualize_attention.py`` (the ``if args.threshold is not None:`` block, the attentions already
``attentions[0, :, 0, 1:].reshape(nh, -1)``), wrapped in a function; the emergence demo code
(LeslieTrue/crate-emergence-notebooks, commit d62ec794a1935cdb0aef7377822675a68439d9e8, ``crate.py``
``CRATEFeat.forward_attn``) returns the same attention tensor ``get_last_selfattention`` gives DINO's script.
"""

import torch
from torch import nn


def threshold(attentions, threshold, w_featmap, h_featmap, patch_size):
    nh = attentions.shape[0]
    # we keep only a certain percentage of the mass
    val, idx = torch.sort(attentions)
    val /= torch.sum(val, dim=1, keepdim=True)
    cumval = torch.cumsum(val, dim=1)
    th_attn = cumval > (1 - threshold)
    idx2 = torch.argsort(idx)
    for head in range(nh):
        th_attn[head] = th_attn[head][idx2[head]]
    th_attn = th_attn.reshape(nh, w_featmap, h_featmap).float()
    # interpolate
    th_attn = nn.functional.interpolate(th_attn.unsqueeze(0), scale_factor=patch_size, mode="nearest")[0].cpu().numpy()
    return th_attn
