"""Hugging Face's and timm's conventions where their users type them: generate(input_ids=..., do_sample=...),
forward(labels=...) with a named loss and logits, features_only / num_classes; and what cannot apply refused in one
line (filters under greedy decoding, an end token outside the vocabulary, timm's words on families without them)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import crate_transformer as ct
from crate_transformer.models.lm import LMOutput

LM = dict(depth=2, dim=32, heads=2)


@pytest.fixture(scope="module")
def lm() -> ct.LanguageModel:
    torch.manual_seed(0)
    return ct.create_model("crate_gpt_mini", **LM).eval()


def test_hf_generate_call_is_the_package_call(lm):
    ids = torch.randint(0, 262, (2, 5))
    greedy = lm.generate(ids, 6, temperature=0)
    assert torch.equal(lm.generate(input_ids=ids, max_new_tokens=6, do_sample=False), greedy)
    mask = torch.ones_like(ids)  # what a tokenizer returns for prompts of one length
    assert torch.equal(lm.generate(input_ids=ids, max_new_tokens=6, attention_mask=mask, do_sample=False), greedy)
    g1, g2 = (torch.Generator().manual_seed(3) for _ in range(2))
    sampled = lm.generate(ids, 6, temperature=0.7, top_k=20, generator=g1)
    hf = lm.generate(input_ids=ids, max_new_tokens=6, do_sample=True, temperature=0.7, top_k=20, generator=g2)
    assert torch.equal(hf, sampled)
    # the nanoGPT-style default is unchanged: sampling at temperature 1
    g1, g2 = (torch.Generator().manual_seed(4) for _ in range(2))
    assert torch.equal(lm.generate(ids, 4, generator=g1), lm.generate(ids, 4, temperature=1.0, generator=g2))


def test_pad_token_id_fills_each_row_after_its_first_end_token(lm):
    ids = torch.randint(0, 262, (3, 4))
    plain = lm.generate(ids, 8, temperature=0)
    eos = int(plain[1, 6])  # a token row 1 makes at its third step
    out = lm.generate(input_ids=ids, max_new_tokens=8, do_sample=False, eos_token_id=eos, pad_token_id=0)
    assert out.shape[1] <= plain.shape[1]
    for row, want in zip(out, plain[:, : out.shape[1]]):
        new, ref = row[4:].tolist(), want[4:].tolist()
        cut = ref.index(eos) + 1 if eos in ref else len(ref)
        assert new[:cut] == ref[:cut] and all(t == 0 for t in new[cut:])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=0, top_k=1000, top_p=0.1), "top_k=1000 and top_p=0.1 filter the tokens sampled from"),
        (dict(do_sample=False, top_k=5), "top_k=5 filters the tokens sampled from, and do_sample=False"),
        (dict(do_sample=False, temperature=0.7), "temperature=0.7 applies to sampling"),
        (dict(do_sample=True, temperature=0), "do_sample=True samples at a temperature > 0"),
        (dict(eos_id=999), r"eos_id=999 is not a token of this model's vocabulary \[0, 262\)"),
        (dict(eos_token_id=[3, -1]), r"eos_id=-1 is not a token"),
        (dict(eos_id=3, eos_token_id=3), "eos_id and eos_token_id"),
        (dict(pad_token_id=0), "pad_token_id fills the rows that ended"),
        (dict(eos_id=3, pad_token_id=262), "pad_token_id=262 is not a token"),
        (dict(attention_mask=torch.tensor([[0, 1, 1]])), "attention_mask marks padding"),
        (dict(attention_mask=torch.ones(1, 2)), r"attention_mask must have the prompt's shape \(1, 3\)"),
    ],
)
def test_what_cannot_apply_to_generation_is_one_line(lm, kwargs, message):
    with pytest.raises(ValueError, match=message) as e:
        lm.generate(torch.tensor([[1, 2, 3]]), 2, **kwargs)
    assert "\n" not in str(e.value)


def test_prompt_given_twice_or_not_at_all(lm):
    ids = torch.tensor([[1, 2]])
    with pytest.raises(ValueError, match="idx and input_ids"):
        lm.generate(ids, 2, input_ids=ids)
    with pytest.raises(ValueError, match="needs the prompt and a length"):
        lm.generate(input_ids=ids)


def test_forward_with_labels_returns_the_loss_and_logits_by_name_and_by_index(lm):
    ids = torch.randint(0, 262, (2, 6))
    logits = lm(ids)
    assert isinstance(logits, torch.Tensor)  # without labels: the tensor, as every caller has it
    out = lm(input_ids=ids, labels=ids)
    assert isinstance(out, LMOutput) and torch.equal(out.logits, logits) and torch.equal(out["logits"], logits)
    expected = F.cross_entropy(logits[:, :-1].reshape(-1, 262), ids[:, 1:].reshape(-1))  # next token, eq. (89)
    assert torch.allclose(out.loss, expected) and out[0] is out.loss and out[1] is out.logits
    assert list(out) == ["loss", "logits"] and len(out.to_tuple()) == 2
    masked = ids.clone()
    masked[:, :3] = -100  # ignored positions
    assert torch.allclose(
        lm(ids, labels=masked).loss, F.cross_entropy(logits[:, 2:-1].reshape(-1, 262), ids[:, 3:].reshape(-1))
    )
    with pytest.raises(ValueError, match="labels must be token ids of the input's shape"):
        lm(ids, labels=ids[:, :3])
    with pytest.raises(ValueError, match="label 300 is outside the vocabulary"):
        lm(ids, labels=torch.full_like(ids, 300))
    with pytest.raises(ValueError, match="pass the token ids once"):
        lm(ids, input_ids=ids)


def test_bert_forward_takes_hf_names_and_masked_labels():
    torch.manual_seed(0)
    bert = ct.create_model("crate_bert_base", depth=1, dim=32, heads=2, vocab_size=50, block_size=16).eval()
    ids = torch.randint(3, 50, (2, 7))
    mask = torch.ones_like(ids)
    mask[0, 5:] = 0
    logits = bert(ids, key_mask=mask)
    assert torch.equal(bert(input_ids=ids, attention_mask=mask), logits)
    labels = torch.full_like(ids, -100)
    labels[:, 2] = ids[:, 2]
    out = bert(input_ids=ids, attention_mask=mask, labels=labels)
    assert torch.allclose(out.loss, F.cross_entropy(logits[:, 2], ids[:, 2])) and torch.equal(out.logits, logits)


def test_features_only_returns_timm_feature_maps_and_info():
    torch.manual_seed(0)
    feats = ct.create_model("crate_mnist", depth=4, features_only=True, out_indices=[0, -1])
    x = torch.randn(2, 1, 28, 28)
    maps = feats(x)
    ref = feats.model.forward_intermediates(x, indices=[0, 3], intermediates_only=True)
    assert len(maps) == 2 and all(torch.equal(a, b) for a, b in zip(maps, ref))
    assert maps[0].shape == (2, 128, 4, 4)
    info = feats.feature_info
    assert (
        info.channels() == [128, 128] and info.reduction() == [7, 7] and info.module_name() == ["layers.0", "layers.3"]
    )
    assert len(ct.create_model("crate_mnist", depth=4, features_only=True)(x)) == 3  # timm's ViT default: last 3
    with pytest.raises(ValueError, match="features_only builds feature maps of image models"):
        ct.create_model("crate_gpt_mini", features_only=True)
    with pytest.raises(ValueError, match="out_indices selects the layers of features_only=True"):
        ct.create_model("crate_mnist", out_indices=[1])


@pytest.mark.parametrize("name, n", [("crate_mnist", 10), ("tost_mnist", 10), ("crate_gpt_mini", 0)])
def test_num_classes_is_the_heads_count(name, n):
    model = ct.create_model(name)
    assert model.num_classes == n
    model.reset_classifier(5)
    assert model.num_classes == 5


def test_timm_words_on_families_without_the_field_name_both_words():
    with pytest.raises(ValueError, match=r"img_size \(timm's name for image_size\) does not apply to crate_gpt_mini"):
        ct.create_model("crate_gpt_mini", img_size=32)
    with pytest.raises(ValueError, match=r"global_pool \(timm's name for pool\) does not apply to tost_mnist"):
        ct.create_model("tost_mnist", global_pool="avg")
    assert ct.create_model("crate_mnist", global_pool="avg").config.pool == "avg"  # where it applies, it applies


@pytest.mark.parametrize("name", ["crate_mnist", "tost_mnist", "crate_gpt_mini"])
def test_reset_classifier_with_timms_no_pooling_is_refused(name):
    model = ct.create_model(name)
    with pytest.raises(ValueError, match="global_pool=''"):
        model.reset_classifier(5, "")


def test_fractional_or_scalar_float_indices_are_refused():
    model = ct.create_model("crate_mnist", depth=2)
    x = torch.randn(1, 1, 28, 28)
    for indices in ([0.5], 0.5):
        with pytest.raises(ValueError, match="layer indices are whole numbers|indices must be a layer count"):
            model.forward_intermediates(x, indices=indices)
    assert len(model.forward_intermediates(x, indices=[torch.tensor(1).item()], intermediates_only=True)) == 1


def test_resolve_data_config_refuses_what_cannot_feed_the_model():
    model = ct.create_model("crate_mnist")
    with pytest.raises(ValueError, match="mean has 3 values and the model takes 1-channel images"):
        ct.resolve_data_config(model, mean=(0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match=r"input_size must be \(channels, height, width\) of positive whole numbers"):
        ct.resolve_data_config(model, input_size=(1, -5, 28))
    with pytest.raises(ValueError, match="input_size has 3 channels and the model takes 1"):
        ct.resolve_data_config(model, input_size=(3, 28, 28))
    with pytest.raises(ValueError, match="img_size must be a positive whole number"):
        ct.resolve_data_config(model, img_size=0)
    cfg = ct.resolve_data_config(model, input_size=(1, 32, 32), mean=[0.5], std=0.25)
    assert cfg["input_size"] == (1, 32, 32) and cfg["mean"] == (0.5,) and cfg["std"] == (0.25,)


def test_a_native_state_dict_given_to_from_official_names_its_loader():
    for name in ("tost_mnist", "crate_mnist"):
        state = ct.create_model(name).state_dict()
        with pytest.raises(ct.CheckpointError, match=rf"this package's own state dict of {name}.*load_state_dict"):
            ct.from_official(state, name)
