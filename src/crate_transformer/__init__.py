"""crate_transformer — white-box transformers via sparse rate reduction (CRATE; Yu et al., JMLR 2024).

Public API::

    import crate_transformer as ct
    model = ct.create_model("crate_small", num_classes=10)
    ct.list_models("crate_*")
    model.save_pretrained("out/"); model = ct.from_pretrained("out/")
    model = ct.create_model("crate_alpha_base16", pretrained=True)   # released weights (ct.list_pretrained())
    model.push_to_hub("me/my-crate"); model = ct.from_pretrained("hf-hub:me/my-crate")
    model = ct.from_official("checkpoint.pth.tar", "crate_small")
    model = ct.load_model("runs/my-run")   # anything a command accepts: a folder, a run, a training state
    lm = ct.create_model("crate_gpt_mini"); lm.generate(ids, 100)   # CRATE-GPT / CRATE-BERT (JMLR §4.1.4)
    mae = ct.create_model("crate_mae_small"); loss, pred, mask = mae(images)   # CRATE-MAE
    ct.coding_rate(Z), ct.subspace_coding_rate(Z, U), ...
    with ct.frozen_weights(model): ...   # inference with the weights held: ISTA's step matrix computed once
"""

from ._version import __version__
from .config import Config
from .io import CheckpointError
from .layers import frozen_weights
from .loading.pipeline import from_official, from_pretrained, load_model
from .loading.pretrained import list_pretrained
from .models.alpha import AlphaConfig, CRATEAlpha
from .models.base import Model, Trace
from .models.bert import CRATEBert
from .models.classifier import CRATE, ImageClassifier, ModelConfig, ViT
from .models.lm import GPT, CRATELanguageModel, LanguageModel, LMConfig
from .models.mae import CRATEMAE, MAEConfig
from .models.registry import create_model, list_models, model_config
from .models.spec import resolve_data_config
from .models.tokenizer import Tokenizer
from .models.tost import ToST, ToSTConfig, ToSTLanguageModel, ToSTLMConfig
from .objectives import (
    coding_rate,
    coding_rate_grad,
    l1_per_entry,
    membership_coding_rate,
    rate_reduction,
    sparse_rate_reduction,
    sparsity,
    subspace_coding_rate,
    subspace_coding_rate_grad,
    subspaces_from_qkv,
    variational_coding_rate,
)

# the lab's packages and two modules users reach as ``ct.probe`` / ``ct.dino`` → where each lives
_SUBMODULES = {
    "analysis": ".analysis",
    "theory": ".theory",
    "data": ".data",
    "train": ".train",
    "probe": ".analysis.probe",
    "dino": ".models.dino",
}


def __getattr__(name: str) -> object:
    """``ct.analysis``, ``ct.theory``, ``ct.data``, ``ct.train``, ``ct.probe`` and ``ct.dino`` on first use (they
    import matplotlib etc.)."""
    import importlib

    if name in _SUBMODULES:
        return importlib.import_module(_SUBMODULES[name], __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "__version__",
    "Model",
    "Config",
    "CRATE",
    "ViT",
    "ImageClassifier",
    "ModelConfig",
    "CRATEMAE",
    "MAEConfig",
    "Trace",
    "frozen_weights",
    "LanguageModel",
    "CRATELanguageModel",
    "GPT",
    "LMConfig",
    "CRATEBert",
    "CRATEAlpha",
    "AlphaConfig",
    "ToST",
    "ToSTConfig",
    "ToSTLanguageModel",
    "ToSTLMConfig",
    "Tokenizer",
    "CheckpointError",
    "create_model",
    "list_models",
    "list_pretrained",
    "model_config",
    "from_pretrained",
    "resolve_data_config",
    "from_official",
    "load_model",
    "coding_rate",
    "coding_rate_grad",
    "membership_coding_rate",
    "subspace_coding_rate",
    "subspace_coding_rate_grad",
    "rate_reduction",
    "sparse_rate_reduction",
    "sparsity",
    "l1_per_entry",
    "subspaces_from_qkv",
    "variational_coding_rate",
]
