"""Every seed a run derives, by named stream: `derive(seed, Stream.SHUFFLE, step)`.

A cell has one seed (`cell.seed`); each random stream of its run is a named function of it
(and of the stream's position: an epoch, a step, a rank), so that a resumed run, every rank
of a job and a rerun on another machine draw the same values. Each stream keeps the formula
it had before it moved here, bit for bit (fingerprints, the documented measurements and the
exact-resume tests depend on them; tests/test_seeds.py pins each):

    CELL        seed                                   torch's and Python's global RNGs at the start, vLLM's engine
    SAMPLER     seed * 100_003 + epoch                 the problem order of an epoch (sampler.py)
    SHUFFLE     seed * 1_000_003 + step                the shuffled-reward control's permutation of a step
    UPDATE      seed + 1                               the update's Python RNG (mini-batch order)
    VALIDATION  1234, whatever the seed                torch's RNG while validating (forked, then restored)
    TEST        4321, whatever the seed                torch's RNG during the test evaluation (forked, restored)
    RANK        first 8 bytes (little-endian) of       torch's RNG of rank > 0 after step `step` (rank 0 keeps
                sha256(f"{seed}:{rank}:{step}")        the single-process stream)
    INIT        0, whatever the seed                   the weights of a randomly initialised base model

Left out: the dataset splits' seed (gridrun/tasks/data.py: 42, the paper's, fixed per task so
every cell sees one validation split) and the toy world's recipe seed (part of its recipe).
Per-request sampling seeds (`engine=vllm`) are `request_seed(rollout, episode, call)`: one
draw from torch's global RNG per rollout (which CELL seeds), then a function of the episode's
index in the rollout and the call's index in its episode, so that a request's seed does not
depend on when the engine serves it (the continuous rollout's episodes equal the staged ones).
"""

from __future__ import annotations

import hashlib
from enum import StrEnum

VALIDATION_SEED = 1234
TEST_SEED = 4321
INIT_SEED = 0


class Stream(StrEnum):
    CELL = "cell"
    SAMPLER = "sampler"
    SHUFFLE = "shuffle"
    UPDATE = "update"
    VALIDATION = "validation"
    TEST = "test"
    RANK = "rank"
    INIT = "init"


# The positions each stream is indexed by, in the order `derive` takes them.
POSITIONS: dict[Stream, tuple[str, ...]] = {
    Stream.CELL: (),
    Stream.SAMPLER: ("epoch",),
    Stream.SHUFFLE: ("step",),
    Stream.UPDATE: (),
    Stream.VALIDATION: (),
    Stream.TEST: (),
    Stream.RANK: ("rank", "step"),
    Stream.INIT: (),
}


def derive(seed: int, stream: Stream, *position: int) -> int:
    """The seed of `stream` at `position` (see the table above) for a cell seeded `seed`."""
    names = POSITIONS[stream]
    if len(position) != len(names):
        raise TypeError(f"stream {stream.value} takes {len(names)} position(s) ({', '.join(names) or 'none'}), "
                        f"got {len(position)}")
    if stream is Stream.CELL:
        return seed
    if stream is Stream.SAMPLER:
        return seed * 100_003 + position[0]
    if stream is Stream.SHUFFLE:
        return seed * 1_000_003 + position[0]
    if stream is Stream.UPDATE:
        return seed + 1
    if stream is Stream.VALIDATION:
        return VALIDATION_SEED
    if stream is Stream.TEST:
        return TEST_SEED
    if stream is Stream.RANK:
        rank, step = position
        return int.from_bytes(hashlib.sha256(f"{seed}:{rank}:{step}".encode()).digest()[:8], "little")
    return INIT_SEED


def request_seed(rollout: int, episode: int, call: int) -> int:
    """The sampling seed (31 bits) of an episode's `call`-th LLM call in a rollout seeded
    `rollout`: the same whatever the order or batch the engine serves it in."""
    digest = hashlib.sha256(f"{rollout}:{episode}:{call}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFF_FFFF
