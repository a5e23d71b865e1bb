"""The transformers integration (the hf extra), with the real transformers: a folder written by save_pretrained loads
through AutoConfig / AutoModel* / AutoTokenizer / pipeline, every output equal to the package's own forward, and the
package's loader still reads the folder (config.json's model_type is not a field)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForImageClassification,
    AutoModelForMaskedLM,
    AutoTokenizer,
    pipeline,
)

import crate_transformer as ct
from crate_transformer.loading import transformers_hf as th
from crate_transformer.models.contract import LANGUAGE_MODEL

LM = dict(depth=2, dim=32, heads=2)


def _saved(tmp_path: Path, name: str, **kw: object) -> tuple[ct.Model, Path]:
    torch.manual_seed(0)
    model = ct.create_model(name, **kw).eval()
    if model.kind == LANGUAGE_MODEL:
        model.tokenizer = ct.Tokenizer.byte_level()
    folder = tmp_path / name
    model.save_pretrained(folder)
    return model, folder


@pytest.mark.parametrize("name", ["crate_gpt_mini", "gpt_mini", "tost_gpt_mini"])
def test_causal_lm_folder_loads_in_transformers_with_the_package_logits_and_greedy_tokens(tmp_path, name):
    model, folder = _saved(tmp_path, name, **LM)
    assert json.loads((folder / "config.json").read_text())["model_type"] == "crate_transformer_lm"
    assert isinstance(AutoConfig.from_pretrained(folder), th.CrateLMConfig)
    hf = AutoModelForCausalLM.from_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    assert isinstance(hf, th.CrateForCausalLM) and isinstance(tok, th.CrateTokenizerFast)
    inputs = tok("hello world", return_tensors="pt")
    ids = inputs["input_ids"]
    assert ids.tolist()[0] == model.tokenizer.encode("hello world")
    assert torch.equal(hf(**inputs).logits, model(ids))
    # transformers' generate (no cache, the whole context each step) gives the package's greedy tokens
    ours = model.generate(ids, 6, temperature=0)
    assert torch.equal(hf.generate(**inputs, max_new_tokens=6, do_sample=False), ours)
    text = pipeline("text-generation", model=hf, tokenizer=tok)("hello world", max_new_tokens=6, do_sample=False)
    assert text[0]["generated_text"] == model.tokenizer.decode(ours[0].tolist())
    # the loss with labels = input_ids is the package's forward(labels=) and an independent shifted cross-entropy
    loss = hf(**inputs, labels=ids).loss
    logits = model(ids)
    expected = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:])
    assert torch.allclose(loss, expected) and torch.equal(loss, model(ids, labels=ids).loss)
    base = AutoModel.from_pretrained(folder)
    assert isinstance(base, th.CrateModel)
    assert torch.equal(base(**inputs).last_hidden_state, model.forward_features(ids))
    assert type(ct.from_pretrained(folder)) is type(model)  # the package's loader reads the new config.json


def test_pipeline_by_folder_path_and_a_prompt_longer_than_the_context(tmp_path):
    model, folder = _saved(tmp_path, "crate_gpt_mini", block_size=8, **LM)
    gen = pipeline("text-generation", model=str(folder))
    out = gen("a prompt of many bytes", max_new_tokens=4, do_sample=False)[0]["generated_text"]
    ids = torch.tensor([model.tokenizer.encode("a prompt of many bytes")])
    assert out == model.tokenizer.decode(model.generate(ids, 4, temperature=0)[0].tolist())  # the window slides


def test_masked_lm_and_image_classifier_folders(tmp_path):
    bert, folder = _saved(tmp_path, "crate_bert_mini", **LM)
    hf = AutoModelForMaskedLM.from_pretrained(folder)
    ids = torch.randint(0, 256, (2, 9))
    assert torch.equal(hf(input_ids=ids).logits, bert(ids))
    labels = torch.full_like(ids, -100)
    labels[:, 3] = ids[:, 3]
    expected = torch.nn.functional.cross_entropy(bert(ids)[:, 3], ids[:, 3])
    assert torch.allclose(hf(input_ids=ids, labels=labels).loss, expected)
    image, folder = _saved(tmp_path, "crate_mnist", depth=2)
    assert json.loads((folder / "config.json").read_text())["model_type"] == "crate_transformer_image"
    hf = AutoModelForImageClassification.from_pretrained(folder)
    x, y = torch.randn(3, 1, 28, 28), torch.tensor([1, 2, 3])
    out = hf(pixel_values=x, labels=y)
    assert torch.equal(out.logits, image(x))
    assert torch.allclose(out.loss, torch.nn.functional.cross_entropy(image(x), y))
    base = AutoModel.from_pretrained(folder)(pixel_values=x)
    assert torch.equal(base.pooler_output, image.forward_head(image.forward_features(x), pre_logits=True))
    assert type(ct.from_pretrained(folder)) is type(image)


def test_wrappers_refuse_what_they_cannot_honour(tmp_path):
    model, folder = _saved(tmp_path, "crate_gpt_mini", **LM)
    hf = th.hf_model(model)
    ids = torch.randint(0, 256, (2, 5))
    with pytest.raises(ValueError, match="do not return"):
        hf(input_ids=ids, output_attentions=True)
    left = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    with pytest.raises(ValueError, match="pads on the left"):
        hf(input_ids=ids, attention_mask=left)
    right = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])  # a causal model's real tokens never see later padding
    assert torch.equal(hf(input_ids=ids, attention_mask=right).logits, model(ids))
    with pytest.raises(ValueError, match="takes the folder and dtype"):
        AutoModelForCausalLM.from_pretrained(folder, device_map="cpu")
    with pytest.raises(ValueError, match=r"\['id2label', 'label2id', 'num_labels'\] differ from its config.json"):
        AutoModelForCausalLM.from_pretrained(folder, num_labels=3)  # a config setting would not reach the weights
    with pytest.raises(ValueError, match=r"got \['dim'\]"):
        AutoModelForCausalLM.from_pretrained(folder, dim=64)
    with pytest.raises(ValueError, match="AutoModelForMaskedLM"):
        th.CrateForCausalLM.wrap(ct.create_model("crate_bert_mini", **LM))
    with pytest.raises(ValueError, match="wraps a language model, and this is a image classifier"):
        th.CrateForCausalLM.wrap(ct.create_model("crate_mnist", depth=1))
    # the wrapper's save is the package's: both loaders read it
    hf.save_pretrained(tmp_path / "again")
    assert torch.equal(ct.from_pretrained(tmp_path / "again")(ids), model(ids))


def test_an_old_folder_without_model_type_still_loads_in_the_package(tmp_path):
    """config.json written before model_type existed: the package reads it (and only transformers needs the key)."""
    model, folder = _saved(tmp_path, "crate_gpt_mini", **LM)
    data = json.loads((folder / "config.json").read_text())
    assert data.pop("model_type") == "crate_transformer_lm"
    # re-save without the key as the earlier release did: the weights' header holds the config's checksum
    from crate_transformer.io import CONFIG_NAME, json_sha256, load_safetensors, save_safetensors

    (folder / CONFIG_NAME).write_text(json.dumps(data, indent=2) + "\n")
    state, _ = load_safetensors(folder / "model.safetensors", verify=False)
    meta = {"config_sha256": json_sha256(data), "tokenizer_sha256": json_sha256(json.loads(model.tokenizer.to_str()))}
    save_safetensors(state, folder / "model.safetensors", metadata=meta)
    ids = torch.randint(0, 256, (1, 4))
    assert torch.equal(ct.from_pretrained(folder)(ids), model(ids))


def test_the_released_crate_bert_architecture_with_its_attention_mask_and_token_types(tmp_path):
    bert, folder = _saved(tmp_path, "crate_bert_base", depth=1, dim=32, heads=2, vocab_size=300, block_size=16)
    hf = AutoModelForMaskedLM.from_pretrained(folder)
    ids = torch.randint(3, 256, (2, 7))
    mask = torch.ones_like(ids)
    mask[0, 5:] = 0  # padding: masked out of the attention
    types = torch.zeros_like(ids)
    logits = bert(ids, key_mask=mask, token_type_ids=types)
    assert torch.equal(hf(input_ids=ids, attention_mask=mask, token_type_ids=types).logits, logits)
    assert not torch.equal(hf(input_ids=ids).logits[0], logits[0])  # the mask reached the model
    base = AutoModel.from_pretrained(folder)(input_ids=ids, attention_mask=mask).last_hidden_state
    assert torch.equal(base, bert.forward_features(ids, key_mask=mask.bool()))
