"""The model families and their contract: what a reader of the white box opens beside ``layers/``.

* :mod:`~crate_transformer.models.base` — :class:`~crate_transformer.models.base.Model`, the contract every family
  keeps (``forward_features``, ``forward_trace``, pooling, ``save_pretrained`` / ``from_pretrained``), and
  :mod:`~crate_transformer.models.contract`, its config half (``FamilyConfig``, the base of every family's config:
  ``kind``, ``white_box``, ``sparse_output``, ``layer_blocks``, ``pipeline_tag``, ``BLOCK_COUNTS``);
* the families, each registering itself at the bottom of its module: :mod:`~crate_transformer.models.classifier`
  (CRATE and ViT image classifiers; their named models and released weights in
  :mod:`~crate_transformer.models.classifier_zoo`), :mod:`~crate_transformer.models.mae` (CRATE-MAE),
  :mod:`~crate_transformer.models.lm` (CRATE-GPT, GPT; with :mod:`~crate_transformer.models.generation` and
  :mod:`~crate_transformer.models.token_prior`), :mod:`~crate_transformer.models.bert` (CRATE-BERT),
  :mod:`~crate_transformer.models.alpha` (CRATE-α), :mod:`~crate_transformer.models.tost` (ToST), and
  :mod:`~crate_transformer.models.dino` (DINO's heads around a backbone);
* :mod:`~crate_transformer.models.tokenizer` and :mod:`~crate_transformer.models.spec` (the data description saved
  with a model);
* :mod:`~crate_transformer.models._registry` (the tables) and :mod:`~crate_transformer.models.registry` (the
  factory, ``create_model``).

This file imports nothing, so that a family module's import does not pull in the others.
"""
