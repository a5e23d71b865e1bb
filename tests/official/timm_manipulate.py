"""timm's parameter grouping by name (what its layer-wise lr decay reads from ``model.group_matcher()``),
transcribed for the tests.

Source: https://github.com/huggingface/pytorch-image-models, commit aa4b5850c1543fa488abf260f18390eda46cf85d,
``timm/models/_manipulate.py``: ``MATCH_PREV_GROUP``, ``group_with_matcher`` and ``group_parameters``, verbatim
(Apache-2.0).  timm itself cannot be installed here (it needs torchvision).
"""
# ruff: noqa: UP006, UP007, UP035, B007  (verbatim: timm's typing style)

import collections.abc
import re
from collections import defaultdict
from itertools import chain
from typing import Any, Callable, Dict, Iterator, Tuple, Union

from torch import nn

MATCH_PREV_GROUP = (99999,)


def group_with_matcher(
    named_objects: Iterator[Tuple[str, Any]],
    group_matcher: Union[Dict, Callable],
    return_values: bool = False,
    reverse: bool = False,
):
    if isinstance(group_matcher, dict):
        # dictionary matcher contains a dict of raw-string regex expr that must be compiled
        compiled = []
        for group_ordinal, (group_name, mspec) in enumerate(group_matcher.items()):
            if mspec is None:
                continue
            # map all matching specifications into 3-tuple (compiled re, prefix, suffix)
            if isinstance(mspec, (tuple, list)):
                # multi-entry match specifications require each sub-spec to be a 2-tuple (re, suffix)
                for sspec in mspec:
                    compiled += [(re.compile(sspec[0]), (group_ordinal,), sspec[1])]
            else:
                compiled += [(re.compile(mspec), (group_ordinal,), None)]
        group_matcher = compiled

    def _get_grouping(name):
        if isinstance(group_matcher, (list, tuple)):
            for match_fn, prefix, suffix in group_matcher:
                r = match_fn.match(name)
                if r:
                    parts = (prefix, r.groups(), suffix)
                    # map all tuple elem to int for numeric sort, filter out None entries
                    return tuple(map(float, chain.from_iterable(filter(None, parts))))
            return (float("inf"),)  # un-matched layers (neck, head) mapped to largest ordinal
        else:
            ord = group_matcher(name)
            if not isinstance(ord, collections.abc.Iterable):
                return (ord,)
            return tuple(ord)

    # map layers into groups via ordinals (ints or tuples of ints) from matcher
    grouping = defaultdict(list)
    for k, v in named_objects:
        grouping[_get_grouping(k)].append(v if return_values else k)

    # remap to integers
    layer_id_to_param = defaultdict(list)
    lid = -1
    for k in sorted(filter(lambda x: x is not None, grouping.keys())):
        if lid < 0 or k[-1] != MATCH_PREV_GROUP[0]:
            lid += 1
        layer_id_to_param[lid].extend(grouping[k])

    if reverse:
        assert not return_values, "reverse mapping only sensible for name output"
        # output reverse mapping
        param_to_layer_id = {}
        for lid, lm in layer_id_to_param.items():
            for n in lm:
                param_to_layer_id[n] = lid
        return param_to_layer_id

    return layer_id_to_param


def group_parameters(
    module: nn.Module,
    group_matcher,
    return_values: bool = False,
    reverse: bool = False,
):
    return group_with_matcher(module.named_parameters(), group_matcher, return_values=return_values, reverse=reverse)
