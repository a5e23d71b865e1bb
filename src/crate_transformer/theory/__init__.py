"""The theory lab: the paper's mathematical claims, checked numerically on its own data model.

CRATE is derived from sparse rate reduction; every claim of JMLR §2-3 can be tested on tokens drawn from
the model it assumes, a mixture of low-dimensional Gaussians on (incoherent) subspaces (eqs. (10), (11),
(231)).  Each experiment returns a report (``config``, ``results``, ``checks``: which claims hold, with the
numbers) and, given an output directory, writes ``<name>.png`` and ``<name>.json``::

    from crate_transformer import theory
    report = theory.run_experiment("denoising", "out/")
    theory.run_all("out/", quick=True)

or ``crate theory all --out out/`` on the command line.  Experiments:

``approximation``  Approximation 9 (MSSA ≈ gradient step on R^c) across β   — :func:`run_approximation`
``unrolled``       a training-free CRATE with ground-truth U and orthogonal D — :func:`run_unrolled`
``denoising``      Theorem 16 / Remark 17 at d=768, n=196, K=12, p=64       — :func:`run_denoising`
``tweedie``        exact mixture score (215) and the attention form (47)    — :func:`run_tweedie`
``ista``           ISTA on the non-negative LASSO (42) vs scikit-learn     — :func:`run_ista`
``diffusion``      structured denoising (55) then diffusion (61) ODEs       — :func:`run_diffusion`
"""

from .approximation import approximation_errors, rc_change, run_approximation
from .denoising import denoising_measurements, remark17_eps, run_denoising, theorem16_nominal
from .diffusion import diffusion_grid, log_time_flow, run_diffusion, structured_denoise, structured_diffuse
from .ista import ista_solve, run_ista, sklearn_nonneg_lasso
from .runner import EXPERIMENTS, QUICK, run_all, run_experiment
from .steps import (
    beta_from_eps,
    compression_step,
    eps_from_beta,
    exact_compression_step,
    ista_step,
    mssa_compression_step,
    mssa_gradient,
    neumann_gradient,
    nonneg_lasso_objective,
)
from .synthetic import (
    SubspaceSample,
    normalize_tokens,
    off_subspace_energy,
    random_subspaces,
    relative_distance_to_subspaces,
    sample_subspace_mixture,
    subspace_coherence,
)
from .tweedie import (
    attention_denoiser,
    gmm_log_density,
    gmm_posterior_mean,
    gmm_score,
    nearest_subspace_projection,
    run_tweedie,
    tweedie_denoiser,
)
from .unrolled import orthogonal_dictionary, run_unrolled, unrolled_crate

__all__ = [
    # command line and registry
    "EXPERIMENTS",
    "QUICK",
    "run_experiment",
    "run_all",
    # experiments
    "run_approximation",
    "run_unrolled",
    "run_denoising",
    "run_tweedie",
    "run_ista",
    "run_diffusion",
    # data model
    "SubspaceSample",
    "random_subspaces",
    "sample_subspace_mixture",
    "subspace_coherence",
    "normalize_tokens",
    "off_subspace_energy",
    "relative_distance_to_subspaces",
    # steps
    "beta_from_eps",
    "eps_from_beta",
    "exact_compression_step",
    "neumann_gradient",
    "mssa_gradient",
    "mssa_compression_step",
    "compression_step",
    "nonneg_lasso_objective",
    "ista_step",
    # per-experiment building blocks
    "approximation_errors",
    "rc_change",
    "orthogonal_dictionary",
    "unrolled_crate",
    "remark17_eps",
    "theorem16_nominal",
    "denoising_measurements",
    "gmm_log_density",
    "gmm_score",
    "gmm_posterior_mean",
    "tweedie_denoiser",
    "attention_denoiser",
    "nearest_subspace_projection",
    "sklearn_nonneg_lasso",
    "ista_solve",
    "diffusion_grid",
    "structured_denoise",
    "structured_diffuse",
    "log_time_flow",
]
