"""Loading models: one pipeline from whatever a user points at to a built model in eval mode.

* :mod:`~crate_transformer.loading.pipeline` — ``resolve(path) → Source``, ``convert`` (an authors' file → this
  package's keys and config), ``materialize(source, name, overrides, mode)``; the public loaders ``load_model``,
  ``from_pretrained``, ``from_official`` (``ct.*``);
* :mod:`~crate_transformer.loading.folder` — :class:`~crate_transformer.loading.folder.Source`,
  :class:`~crate_transformer.loading.folder.Mode`, a ``save_pretrained`` folder read once, and the one build (what
  ``Model.from_pretrained`` uses too, without the registry);
* :mod:`~crate_transformer.loading.values` — sizes and types read from files, and sizes given to a loader, checked
  before anything is built;
* :mod:`~crate_transformer.loading.weights` — the strict weight load and its checks;
* the readers of other people's files and of this package's elsewhere: :mod:`~crate_transformer.loading.official`
  (the authors' key maps and formats), :mod:`~crate_transformer.loading.runfiles` (a training run's files),
  :mod:`~crate_transformer.loading.hub` (this package's format on the Hugging Face Hub) and
  :mod:`~crate_transformer.loading.pretrained` (the zoo's downloads).

This file imports nothing: the model contract (:mod:`crate_transformer.models.base`) uses the lower modules, and
the pipeline sits above the registry's tables.
"""
