"""Seed derivation (gridrun/train/seeds.py): every named stream gives, bit for bit, what the
formula it replaced gave (a running study, the documented measurements, exact resume and the
fingerprints depend on it), and the modules that draw from a stream draw those values."""

from __future__ import annotations

import random

import pytest
import torch

from gridrun.tasks.base import Problem, Score
from gridrun.train.advantages import shuffle_rewards
from gridrun.train.distributed import Dist
from gridrun.train.episode import Episode
from gridrun.train.sampler import ProblemSampler
from gridrun.train.seeds import INIT_SEED, TEST_SEED, VALIDATION_SEED, Stream, derive


def test_each_stream_keeps_its_old_formula_worked_out_by_hand() -> None:
    # CELL: the seed itself (trainer: random.seed(seed), torch.manual_seed(seed); vLLM's seed).
    assert derive(7, Stream.CELL) == 7
    # SAMPLER: seed * 100_003 + epoch (sampler.py): 2 * 100_003 + 1 = 200_007.
    assert derive(2, Stream.SAMPLER, 1) == 200_007
    assert derive(0, Stream.SAMPLER, 5) == 5
    # SHUFFLE: seed * 1_000_003 + step (the trainer's reward control): 3 * 1_000_003 + 10.
    assert derive(3, Stream.SHUFFLE, 10) == 3_000_019
    assert derive(0, Stream.SHUFFLE, 3) == 3
    # UPDATE: seed + 1 (the trainer's update RNG).
    assert derive(4, Stream.UPDATE) == 5
    # VALIDATION: the trainer's old VAL_SEED = 1234, whatever the seed; INIT: random_init's 0.
    assert derive(0, Stream.VALIDATION) == derive(9, Stream.VALIDATION) == VALIDATION_SEED == 1234
    assert derive(9, Stream.INIT) == INIT_SEED == 0
    # TEST: its own fixed stream, so the test evaluation's draws are not validation's.
    assert derive(0, Stream.TEST) == derive(9, Stream.TEST) == TEST_SEED == 4321
    # RANK: the first 8 bytes, little-endian, of sha256("seed:rank:step") (distributed.py);
    # a digest is not worked out by hand, so these two are pinned from the old code's output.
    assert derive(0, Stream.RANK, 1, 0) == 8657338722054433821
    assert derive(3, Stream.RANK, 2, 10) == 16935551837332939839


def test_a_stream_refuses_the_wrong_number_of_positions() -> None:
    with pytest.raises(TypeError, match="stream rank takes 2 position"):
        derive(0, Stream.RANK, 1)
    with pytest.raises(TypeError, match="stream update takes 0 position"):
        derive(0, Stream.UPDATE, 3)


def test_the_sampler_draws_epoch_orders_from_the_sampler_stream() -> None:
    # Seed 2, six problems: epoch 0 is Random(200_006)'s shuffle, epoch 1 Random(200_007)'s.
    problems = [Problem(id=str(i), question="q", answer="a") for i in range(6)]
    sampler = ProblemSampler(problems, seed=2)
    drawn = [p.id for p in sampler.take(12)]
    expected = []
    for seed in (200_006, 200_007):
        order = list(range(6))
        random.Random(seed).shuffle(order)
        expected += [str(i) for i in order]
    assert drawn == expected


def test_rank_decorrelation_seeds_torch_from_the_rank_stream_and_leaves_rank_0_alone() -> None:
    with torch.random.fork_rng():
        torch.manual_seed(5)
        Dist(rank=0, world=2).decorrelate_rng(0, 0)
        rank0 = torch.rand(3)
        torch.manual_seed(5)
        assert torch.equal(rank0, torch.rand(3))  # rank 0 keeps the single-process stream
        Dist(rank=1, world=2).decorrelate_rng(0, 0)
        rank1 = torch.rand(3)
        torch.manual_seed(8657338722054433821)
        assert torch.equal(rank1, torch.rand(3))


def test_the_reward_control_permutes_with_the_shuffle_stream() -> None:
    # Seed 0, step 3: SHUFFLE = 3, and torch.randperm(8) under manual_seed(3) is
    # [2, 4, 3, 5, 1, 0, 6, 7] (the old seed * 1_000_003 + step gave the same 3): episode i
    # trains on episode order[i]'s reward; rewards i / 10 make the permutation readable.
    episodes = []
    for i in range(8):
        episode = Episode(Problem(id="p", question="q", answer="a"), i, [])
        episode.score = Score(i / 10, None, "wrong")
        episodes.append(episode)
    shuffle_rewards(episodes, seed=0, step=3)
    assert [e.reward for e in episodes] == [0.2, 0.4, 0.3, 0.5, 0.1, 0.0, 0.6, 0.7]


def test_request_seeds_depend_on_the_rollout_episode_and_call_only() -> None:
    # The first 4 bytes (little-endian, 31 bits kept) of sha256("rollout:episode:call"): what
    # makes the continuous rollout's requests draw what the staged rollout's do. Pinned.
    from gridrun.train.seeds import request_seed

    assert request_seed(0, 0, 1) == 1447803995
    assert request_seed(5, 3, 2) == 1879212172
    seeds = {request_seed(r, e, c) for r in range(3) for e in range(8) for c in range(1, 7)}
    assert len(seeds) == 3 * 8 * 6 and all(0 <= s < 2**31 for s in seeds)
