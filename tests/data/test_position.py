"""``Position``: the one argument that says which samples a source's ``batches`` yields.

Each in-memory source is checked against the epoch order computed here from its definition (a ``randperm`` of
a generator seeded ``seed * 1_000_003 + epoch``, cut into global batches, then ``tensor_split`` by rank), not
through :func:`global_batches`; the streamed sources are checked against the in-memory ones in
``test_streaming.py``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from crate_transformer.data import ImageDataset, Position
from crate_transformer.data.text import LabelledTexts, TokenBlocks
from crate_transformer.train.runtime import Runtime

N, B = 23, 6  # 3 full global batches and a partial one of 5


def _expected(seed: int, epoch: int, start: int, rank: int, world: int, shuffle: bool = True) -> list[list[int]]:
    """This process's sample indices of each batch, from the definition of the order."""
    order = torch.randperm(N, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch)) if shuffle else None
    order = order.tolist() if shuffle else list(range(N))
    count = N // B if shuffle else -(-N // B)
    out = []
    for b in range(start, count):
        glob = order[b * B : (b + 1) * B]
        share = np.array_split(np.array(glob), world)[rank].tolist()  # sizes as tensor_split: the first ones larger
        if share:
            out.append(share)
    return out


def _dataset() -> ImageDataset:
    images = torch.arange(N, dtype=torch.uint8).view(N, 1, 1, 1).expand(N, 1, 2, 2).contiguous()
    return ImageDataset(images, torch.arange(N) * 10, ["c"], [0.5], [0.5])


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("start", [0, 2])
def test_memory_batches_at_a_position_are_the_defined_share_of_the_defined_order(world: int, start: int) -> None:
    ds = _dataset()
    for rank in range(world):
        at = Position(seed=7, epoch=3, start=start, rank=rank, world=world)
        got = [y.div(10).tolist() for _, y in ds.batches(B, at=at)]
        assert got == _expected(7, 3, start, rank, world)
        assert all(torch.equal(x[:, 0, 0, 0].long() * 10, y) for x, y in ds.batches(B, at=Position(seed=7)))
    evaluation = [y.div(10).tolist() for _, y in ds.batches(B, shuffle=False, at=Position(rank=world - 1, world=world))]
    assert evaluation == _expected(0, 0, 0, world - 1, world, shuffle=False)  # every sample, in order


def test_every_world_sees_the_same_global_batch_and_a_resume_continues_it() -> None:
    ds = _dataset()
    whole = [y for _, y in ds.batches(B, at=Position(seed=1, epoch=2))]
    for world in (2, 3):
        places = [Position(seed=1, epoch=2, rank=r, world=world) for r in range(world)]
        shares = [[y for _, y in ds.batches(B, at=at)] for at in places]
        assert all(len(s) == len(whole) for s in shares)
        assert all(torch.equal(torch.cat(parts), w) for parts, w in zip(zip(*shares), whole))
    resumed = [y for _, y in ds.batches(B, at=Position(seed=1, epoch=2, start=1))]
    assert len(resumed) == len(whole) - 1 and all(torch.equal(r, w) for r, w in zip(resumed, whole[1:]))
    other = [y for _, y in ds.batches(B, at=Position(seed=1, epoch=3))]
    assert not all(torch.equal(o, w) for o, w in zip(other, whole))  # the epoch changes the order


def test_text_sources_read_the_same_position() -> None:
    texts = LabelledTexts([[i] * (1 + i % 3) for i in range(N)], torch.arange(N), 0, "t", "train")
    got = [y.tolist() for _, _, y in texts.batches(B, at=Position(seed=4, epoch=1, start=1, rank=1, world=2))]
    assert got == _expected(4, 1, 1, 1, 2)
    tokens = np.arange(8 * N + 9, dtype=np.int64)  # windows of 9 tokens: window i starts at token 8i (+ the offset)
    blocks = TokenBlocks(tokens, 8, 0, len(tokens), "c", "train")
    assert blocks.train_windows == N
    offset = blocks.offset(4, 1)
    firsts = [(rows[:, 0] - offset).div(8).tolist() for rows in blocks.batches(B, at=Position(4, 1, 1, 1, 2))]
    assert firsts == _expected(4, 1, 1, 1, 2)


def test_runtime_position_is_this_process_share() -> None:
    at = Runtime(rank=2, world=3).position(seed=5, epoch=1, start=4)
    assert at == Position(seed=5, epoch=1, start=4, rank=2, world=3)
    assert Runtime().position() == Position()
    with pytest.raises(dataclasses.FrozenInstanceError):
        at.start = 0  # shared by every batches() call as a default: it must not change


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(rank=2, world=2), "Position(rank=2) is not one of 2 processes; pass rank < world"),
        (dict(world=0), "Position(world=0) has no process; pass world >= 1"),
        (dict(start=-1), "Position(start=-1) is negative; pass start >= 0"),
        (dict(epoch=-2), "Position(epoch=-2) is negative; pass epoch >= 0"),
    ],
)
def test_an_impossible_position_is_a_one_line_error(kw: dict, words: str) -> None:
    with pytest.raises(ValueError) as e:
        Position(**kw)
    assert str(e.value) == words
