"""Every family through ``torch.export`` and to ONNX, as docs/export.md shows: the exported program and the ONNX
graph (run by onnxruntime) give the PyTorch model's outputs at a batch size other than the one traced (and, for a
language model, another sequence length): batch and length are dynamic.  The program is called as the docs call it,
with gradients on (a traced in-place ``out=`` product once failed there: TSSA), and without.  CRATE-GPT's token
check does not block the export: inside it the check is the device's assertion, not a host read, and the exported
program keeps it; an image model's program casts floating images of any dtype as the model does and refuses
integer ones in one line."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import crate_transformer as ct

# one small model of every family: (registered name, overrides, what is exported)
FAMILIES = {
    "crate_mnist": dict(depth=2),
    "vit_mnist": dict(depth=2),
    "crate_alpha_base16": dict(image_size=32, patch_size=8, dim=32, depth=2, heads=2, num_classes=5),
    "tost_mnist": dict(depth=2),
    "crate_mae_mnist": dict(depth=2),  # its encoder (forward_features): MAE's forward draws a random mask
    "crate_gpt_mini": dict(depth=1, dim=32, heads=2),
    "crate_bert_mini": dict(depth=1, dim=32, heads=2),
    "crate_bert_medium": dict(depth=1, dim=32, heads=2, vocab_size=300, block_size=32),
    "gpt_mini": dict(depth=1, dim=32, heads=2),
    "tost_gpt_mini": dict(depth=1),
}
# the other forms of a family's layers that an export goes through differently: (registered name, overrides)
VARIANTS = {"crate_mnist[attention=tssa]": ("crate_mnist", dict(depth=2, attention="tssa"))}
CASES = {**{name: (name, kw) for name, kw in FAMILIES.items()}, **VARIANTS}
IMAGE_CASES = [c for c, (name, _) in CASES.items() if ct.model_config(name).kind != "language model"]


class Encoder(nn.Module):
    """A model's ``forward_features`` as a module's forward (what one exports of a masked autoencoder)."""

    def __init__(self, model: ct.Model) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.forward_features(x)


def exported(case: str) -> tuple[nn.Module, torch.Tensor]:
    name, overrides = CASES[case]
    model = ct.create_model(name, **overrides).eval()
    if model.kind == "language model":
        return model, torch.randint(0, model.config.vocab_size, (2, 8))
    c = model.config
    x = torch.randn(2, c.in_chans, c.image_size, c.image_size)
    return (Encoder(model).eval() if model.kind == "masked autoencoder" else model), x


def dynamic(module: nn.Module, x: torch.Tensor) -> tuple[dict, torch.Tensor]:
    """The dynamic dimensions (batch; a language model's length too) and an input that changes them."""
    batch = torch.export.Dim("batch", min=1, max=64)
    if x.dtype != torch.long:
        return {0: batch}, torch.cat([x, x[:1]])
    tokens = torch.export.Dim("tokens", min=2, max=32)
    return {0: batch, 1: tokens}, torch.randint(0, int(x.max()) + 1, (3, 13))


def _out(y: object) -> torch.Tensor:
    return y[0] if isinstance(y, tuple) else y


def test_every_registered_family_is_covered() -> None:
    archs = {ct.model_config(n).arch for n in ct.list_models()}
    assert archs == {ct.model_config(n).arch for n in FAMILIES}


@functools.cache
def program(case: str) -> tuple[nn.Module, torch.Tensor, torch.Tensor, torch.export.ExportedProgram]:
    """The case's module, its traced input, another input, and its program (exported once per session)."""
    module, x = exported(case)
    dims, other = dynamic(module, x)
    return module, x, other, torch.export.export(module, (x,), dynamic_shapes=(dims,))


@pytest.mark.parametrize("case", CASES)
def test_torch_export_gives_the_models_outputs(case: str) -> None:
    module, x, other, exported_program = program(case)
    run = exported_program.module()
    for grad in (True, False):  # as docs/export.md calls it (gradients on), and under no_grad
        for inputs in (x, other):  # the traced shape, and another
            with torch.no_grad():
                want = _out(module(inputs))
            with torch.set_grad_enabled(grad):
                got = _out(run(inputs))
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", IMAGE_CASES)
def test_an_exported_image_model_takes_the_images_the_model_takes(case: str) -> None:
    """float64 (or half) images: the program casts them to the parameters' dtype as the eager model does, and
    gives its outputs; integer images: the eager model's one-line refusal, raised by the program's assertion."""
    module, _, other, exported_program = program(case)
    run = exported_program.module()
    with torch.no_grad():
        for dtype in (torch.float64, torch.bfloat16):
            images = other.to(dtype)
            want = _out(module(images))
            assert want.dtype == torch.float32
            torch.testing.assert_close(_out(run(images)), want, rtol=1e-5, atol=1e-5)
        pixels = (other * 255).clamp(0, 255).to(torch.uint8)
        with pytest.raises(ValueError, match=r"^expected floating-point images, got dtype torch.uint8"):
            module(pixels)
        with pytest.raises(RuntimeError, match=r"^expected floating-point images, got integer ones; convert with"):
            run(pixels)


def _onnx_matches(name: str, tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime", reason="the dev extra installs onnx, onnxscript and onnxruntime")
    pytest.importorskip("onnxscript", reason="the dev extra installs onnx, onnxscript and onnxruntime")
    module, x = exported(name)
    path = tmp_path / f"{name}.onnx"
    dims, other = dynamic(module, x)
    torch.onnx.export(module, (x,), path, dynamic_shapes=(dims,), dynamo=True).save(path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for inputs in (x, other):
        (got, *_) = session.run(None, {session.get_inputs()[0].name: inputs.numpy()})
        with torch.no_grad():
            want = _out(module(inputs)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", [n for n in FAMILIES if ct.model_config(n).kind == "language model"])
def test_the_documented_language_model_recipe_takes_lengths_up_to_the_context(name: str) -> None:
    """docs/export.md's recipe, ``Dim("tokens", min=2, max=block_size)``, exports every language-model family (a
    slice of ToST's per-position offsets once guarded the length against the context: "Constraints violated"),
    and the program runs a whole context."""
    model, x = exported(name)
    c = model.config
    batch, tokens = torch.export.Dim("batch", min=1, max=256), torch.export.Dim("tokens", min=2, max=c.block_size)
    program = torch.export.export(model, (x,), dynamic_shapes=({0: batch, 1: tokens},))
    full = torch.randint(0, c.vocab_size, (1, c.block_size))
    with torch.no_grad():
        torch.testing.assert_close(_out(program.module()(full)), _out(model(full)), rtol=1e-5, atol=1e-5)


def test_the_exported_language_model_keeps_its_token_check() -> None:
    model, x = exported("crate_gpt_mini")
    dims, _ = dynamic(model, x)
    program = torch.export.export(model, (x,), dynamic_shapes=(dims,))
    assert any("assert_async" in str(node.target) for node in program.graph.nodes)  # on the device, no host read
    with pytest.raises(RuntimeError, match="outside the vocabulary"):
        program.module()(torch.tensor([[1, 999]]))
    with pytest.raises(ValueError, match="token id 999"):  # the eager model checks on the host
        model(torch.tensor([[1, 999]]))


# crate_mnist and crate_gpt_mini go through ONNX in the fast suite: tests/test_docs.py runs docs/export.md
@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in CASES if n not in ("crate_mnist", "crate_gpt_mini")])
def test_every_family_runs_in_onnxruntime(name: str, tmp_path: Path) -> None:
    _onnx_matches(name, tmp_path)
