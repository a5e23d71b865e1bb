"""SimDINO pre-training (Wu et al. 2025, "Simplifying DINO via Coding Rate Regularization"; RobinWu218/SimDINO):
the ``simdino`` task.

DINO's prototype layer, centring, sharpening and cross-entropy give way to two terms on the ℓ2-normalised head
features: the views pulled together (cosine similarity) and the coding rate of the global views' features
(JMLR eq. (8)) pushed up (:class:`~crate_transformer.models.dino.SimDINOLoss`).  Everything else is the ``dino``
task's (:class:`~crate_transformer.train.dino.DINOTask`): the multi-crop views, the EMA teacher and its momentum
schedule, the weight-decay schedule, the k-NN / linear-probe evaluations and the run folder.  The task is the
``dino`` task with ``objective="simdino"`` by default; DINO's own options (prototypes, temperatures, centre,
frozen last layer) are refused here, SimDINO's (``eps``, ``coeff``, ``expa_type``, ``patch_coding_rate``) in
``dino``, through their ``applies`` declarations.

Unlike the authors' code, the coding rate is always that of the whole global batch (each process's d×d Gram
all-reduced with its gradient), computed in float64 outside autocast, so the loss and its gradients do not depend
on the number of processes (RobinWu218/SimDINO#48, #43) and the log-det does not turn NaN (#19, #20).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config_utils import override
from .dino import DINOOptions, DINOTask

__all__ = ["SimDINOOptions", "SimDINOTask"]


@dataclass
class SimDINOOptions(DINOOptions):
    """The ``simdino`` task's options: :class:`~crate_transformer.train.dino.DINOOptions` with the SimDINO objective
    and its preset forms (:func:`~crate_transformer.train.dino.preset`; no BatchNorm in the head, as the authors)."""

    objective: str = override(DINOOptions, "objective", "simdino")
    use_bn_in_head: bool = override(DINOOptions, "use_bn_in_head", False)


class SimDINOTask(DINOTask):
    """Self-supervised SimDINO pre-training of a registry backbone (coding-rate regularised DINO, Wu et al. 2025)."""

    name = "simdino"
    Options = SimDINOOptions
