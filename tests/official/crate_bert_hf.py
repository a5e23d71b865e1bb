"""The authors' CRATE-BERT, transcribed for parity tests (no ``transformers`` dependency).

Source: the Hugging Face ``transformers`` fork with the authors' port (indexed as huggingface/transformers),
``src/transformers/models/crate/modeling_crate.py`` at commit 00c81b57ea7fedb4689e1e340a463576cc1c670d, and the
defaults of ``configuration_crate.py`` beside it (``CrateConfig``).  Only what the forward passes of
``CrateForMaskedLM`` and ``CrateForSequenceClassification`` need is kept: the classes, names and arithmetic are the
source's; the ``PreTrainedModel`` machinery it inherits is replaced by the three pieces the forward uses
(``_init_weights`` + weight tying from ``post_init``, and ``get_extended_attention_mask`` of ``modeling_utils``),
and the unsupported branches (decoder, cross-attention, relative positions, head pruning, gradient checkpointing,
losses) are dropped.  Test code only; never imported by the package.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

# transformers.activations.gelu is GELUActivation(), i.e. nn.functional.gelu (the exact, erf form)
gelu = nn.functional.gelu


@dataclass
class CrateConfig:
    """``CrateConfig.__init__`` defaults (configuration_crate.py); ``num_labels`` and ``classifier_dropout`` are
    ``PretrainedConfig`` fields the classification head reads."""

    vocab_size: int = 50265
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 1
    bos_token_id: int = 0
    eos_token_id: int = 2
    position_embedding_type: str = "absolute"
    classifier_dropout: float | None = None
    num_labels: int = 2


def create_position_ids_from_input_ids(input_ids, padding_idx, past_key_values_length=0):
    """Replace non-padding symbols with their position numbers. Position numbers begin at padding_idx+1."""
    mask = input_ids.ne(padding_idx).int()
    incremental_indices = (torch.cumsum(mask, dim=1).type_as(mask) + past_key_values_length) * mask
    return incremental_indices.long() + padding_idx


class CrateEmbeddings(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.position_embedding_type = getattr(config, "position_embedding_type", "absolute")
        self.register_buffer(
            "position_ids", torch.arange(config.max_position_embeddings).expand((1, -1)), persistent=False
        )
        self.register_buffer(
            "token_type_ids", torch.zeros(self.position_ids.size(), dtype=torch.long), persistent=False
        )
        self.padding_idx = config.pad_token_id
        self.position_embeddings = nn.Embedding(
            config.max_position_embeddings, config.hidden_size, padding_idx=self.padding_idx
        )

    def forward(self, input_ids=None, token_type_ids=None, position_ids=None, past_key_values_length=0):
        if position_ids is None:
            position_ids = create_position_ids_from_input_ids(input_ids, self.padding_idx, past_key_values_length)
        input_shape = input_ids.size()
        seq_length = input_shape[1]
        if token_type_ids is None:
            buffered_token_type_ids = self.token_type_ids[:, :seq_length]
            token_type_ids = buffered_token_type_ids.expand(input_shape[0], seq_length)
        inputs_embeds = self.word_embeddings(input_ids)
        token_type_embeddings = self.token_type_embeddings(token_type_ids)
        embeddings = inputs_embeds + token_type_embeddings
        if self.position_embedding_type == "absolute":
            position_embeddings = self.position_embeddings(position_ids)
            embeddings += position_embeddings
        embeddings = self.LayerNorm(embeddings)
        embeddings = self.dropout(embeddings)
        return embeddings


class CrateSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.num_attention_heads = config.num_attention_heads
        self.attention_head_size = int(config.hidden_size / config.num_attention_heads)
        self.all_head_size = self.num_attention_heads * self.attention_head_size
        self.prenorm = nn.LayerNorm(config.hidden_size)
        # we use one matrix to do all three operations
        self.qkv = nn.Linear(config.hidden_size, self.all_head_size, bias=False)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

    def transpose_for_scores(self, x):
        new_x_shape = x.size()[:-1] + (self.num_attention_heads, self.attention_head_size)
        x = x.view(new_x_shape)
        return x.permute(0, 2, 1, 3)

    def forward(self, hidden_states, attention_mask=None, output_attentions=False):
        hidden_states = self.prenorm(hidden_states)
        qkv_layer = self.transpose_for_scores(self.qkv(hidden_states))
        attention_scores = torch.matmul(qkv_layer, qkv_layer.transpose(-1, -2))
        attention_scores = attention_scores / math.sqrt(self.attention_head_size)
        if attention_mask is not None:
            attention_scores = attention_scores + attention_mask
        attention_probs = nn.functional.softmax(attention_scores, dim=-1)
        attention_probs = self.dropout(attention_probs)
        context_layer = torch.matmul(attention_probs, qkv_layer)
        context_layer = context_layer.permute(0, 2, 1, 3).contiguous()
        new_context_layer_shape = context_layer.size()[:-2] + (self.all_head_size,)
        context_layer = context_layer.view(new_context_layer_shape)
        return (context_layer, attention_probs) if output_attentions else (context_layer,)


class CrateSelfOutput(nn.Module):
    """Aggregation layer of CRATE self-attention module."""

    def __init__(self, config):
        super().__init__()
        self.attention_head_size = int(config.hidden_size / config.num_attention_heads)
        self.all_head_size = config.num_attention_heads * self.attention_head_size
        self.dense = nn.Linear(self.all_head_size, config.hidden_size, bias=False)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states, input_tensor):
        hidden_states = self.dense(hidden_states)
        hidden_states = self.dropout(hidden_states)
        hidden_states = hidden_states + input_tensor
        return hidden_states


class CrateAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.self = CrateSelfAttention(config)
        self.output = CrateSelfOutput(config)

    def forward(self, hidden_states, attention_mask=None, output_attentions=False):
        self_outputs = self.self(hidden_states, attention_mask, output_attentions)
        attention_output = self.output(self_outputs[0], hidden_states)  # incl. residual addition
        return (attention_output,) + self_outputs[1:]


class CrateOutput(nn.Module):
    """ISTA Block"""

    def __init__(self, config):
        super().__init__()
        self.weight = nn.Parameter(torch.Tensor(config.hidden_size, config.hidden_size))
        with torch.no_grad():
            nn.init.kaiming_uniform_(self.weight)
        self.step_size = 0.1
        self.lambd = 0.1
        self.prenorm = nn.LayerNorm(config.hidden_size)

    def forward(self, hidden_states):
        hidden_states = self.prenorm(hidden_states)
        x1 = F.linear(hidden_states, self.weight, bias=None)
        grad_1 = F.linear(x1, self.weight.t(), bias=None)
        # compute D^T * x
        grad_2 = F.linear(hidden_states, self.weight.t(), bias=None)
        grad_update = self.step_size * (grad_2 - grad_1) - self.step_size * self.lambd
        hidden_states = F.relu(hidden_states + grad_update)
        return hidden_states


class CrateLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = CrateAttention(config)
        self.output = CrateOutput(config)

    def forward(self, hidden_states, attention_mask=None, output_attentions=False):
        self_attention_outputs = self.attention(hidden_states, attention_mask, output_attentions=output_attentions)
        attention_output = self_attention_outputs[0]
        outputs = self_attention_outputs[1:]
        layer_output = self.output(attention_output)  # feed_forward_chunk (apply_chunking_to_forward, chunk 0)
        return (layer_output,) + outputs


class CrateEncoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layer = nn.ModuleList([CrateLayer(config) for _ in range(config.num_hidden_layers)])

    def forward(self, hidden_states, attention_mask=None, output_hidden_states=False):
        all_hidden_states = ()
        for layer_module in self.layer:
            all_hidden_states = all_hidden_states + (hidden_states,)
            hidden_states = layer_module(hidden_states, attention_mask)[0]
        all_hidden_states = all_hidden_states + (hidden_states,)
        return (hidden_states, all_hidden_states) if output_hidden_states else (hidden_states,)


class CratePooler(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden_states):
        first_token_tensor = hidden_states[:, 0]
        pooled_output = self.dense(first_token_tensor)
        pooled_output = self.activation(pooled_output)
        return pooled_output


def _init_weights(module, config):
    """CratePreTrainedModel._init_weights (applied to every submodule by post_init)."""
    if isinstance(module, nn.Linear):
        module.weight.data.normal_(mean=0.0, std=config.initializer_range)
        if module.bias is not None:
            module.bias.data.zero_()
    elif isinstance(module, nn.Embedding):
        module.weight.data.normal_(mean=0.0, std=config.initializer_range)
        if module.padding_idx is not None:
            module.weight.data[module.padding_idx].zero_()
    elif isinstance(module, nn.LayerNorm):
        module.bias.data.zero_()
        module.weight.data.fill_(1.0)


def get_extended_attention_mask(attention_mask, dtype):
    """ModuleUtilsMixin.get_extended_attention_mask for a (batch, seq) encoder mask: 0 where attended, the
    dtype's most negative value where masked, broadcast over heads and queries."""
    extended_attention_mask = attention_mask[:, None, None, :]
    extended_attention_mask = extended_attention_mask.to(dtype=dtype)
    return (1.0 - extended_attention_mask) * torch.finfo(dtype).min


class CrateModel(nn.Module):
    def __init__(self, config, add_pooling_layer=True):
        super().__init__()
        self.config = config
        self.embeddings = CrateEmbeddings(config)
        self.encoder = CrateEncoder(config)
        self.pooler = CratePooler(config) if add_pooling_layer else None

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, output_hidden_states=False):
        batch_size, seq_length = input_ids.size()
        if attention_mask is None:
            attention_mask = torch.ones((batch_size, seq_length), device=input_ids.device)
        if token_type_ids is None:
            buffered_token_type_ids = self.embeddings.token_type_ids[:, :seq_length]
            token_type_ids = buffered_token_type_ids.expand(batch_size, seq_length)
        dtype = self.embeddings.word_embeddings.weight.dtype
        extended_attention_mask = get_extended_attention_mask(attention_mask, dtype)
        embedding_output = self.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)
        encoder_outputs = self.encoder(
            embedding_output, attention_mask=extended_attention_mask, output_hidden_states=output_hidden_states
        )
        sequence_output = encoder_outputs[0]
        pooled_output = self.pooler(sequence_output) if self.pooler is not None else None
        return (sequence_output, pooled_output) + encoder_outputs[1:]


class CrateLMHead(nn.Module):
    """Crate Head for masked language modeling."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.decoder.bias = self.bias

    def forward(self, features):
        x = self.dense(features)
        x = gelu(x)
        x = self.layer_norm(x)
        # project back to size of vocabulary with bias
        x = self.decoder(x)
        return x


class CrateForMaskedLM(nn.Module):
    _tied_weights_keys = ["lm_head.decoder.weight", "lm_head.decoder.bias"]

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.crate = CrateModel(config, add_pooling_layer=False)
        self.lm_head = CrateLMHead(config)
        self.apply(lambda m: _init_weights(m, config))  # post_init: init, then tie the output embeddings
        self.lm_head.decoder.weight = self.crate.embeddings.word_embeddings.weight

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        outputs = self.crate(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        sequence_output = outputs[0]
        prediction_scores = self.lm_head(sequence_output)
        return prediction_scores


class CrateClassificationHead(nn.Module):
    """Head for sentence-level classification tasks."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        classifier_dropout = (
            config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        )
        self.dropout = nn.Dropout(classifier_dropout)
        self.out_proj = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, features):
        x = features[:, 0, :]  # take <s> token (equiv. to [CLS])
        x = self.dropout(x)
        x = self.dense(x)
        x = torch.tanh(x)
        x = self.dropout(x)
        x = self.out_proj(x)
        return x


class CrateForSequenceClassification(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.num_labels = config.num_labels
        self.config = config
        self.crate = CrateModel(config, add_pooling_layer=False)
        self.classifier = CrateClassificationHead(config)
        self.apply(lambda m: _init_weights(m, config))

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        outputs = self.crate(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        sequence_output = outputs[0]
        logits = self.classifier(sequence_output)
        return logits
