"""GRPO maths against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from gridrun.train import advantages, lr_schedule, minibatches, ppo


def test_equal_rewards_give_zero_advantage_and_are_counted() -> None:
    adv, stats = advantages.group_advantages(torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0]), ["a", "a", "a", "b", "c"])
    # Group a has zero variance; b and c are singletons: all zero, never raw rewards.
    assert adv.tolist() == [0.0] * 5
    assert (stats.groups, stats.singleton, stats.zero_variance) == (3, 2, 1)


def test_a_singleton_group_gets_its_raw_reward_under_released() -> None:
    # verl's GRPO takes mean 0 and std 1 for a group of one row: advantage r / (1 + eps).
    # Group a has zero variance (0 under both), b, c and d are singletons; all are counted.
    rewards, keys = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, -0.1]), ["a", "a", "a", "b", "c", "d"]
    raw, stats = advantages.group_advantages(rewards, keys, eps=0.0, singleton="raw")
    assert raw.tolist() == pytest.approx([0.0, 0.0, 0.0, 0.0, 1.0, -0.1])
    assert (stats.groups, stats.singleton, stats.zero_variance) == (4, 3, 1)
    # With the default eps 1e-6: 1 / (1 + 1e-6); without the std, the reward itself.
    assert advantages.group_advantages(rewards, keys, singleton="raw")[0][4].item() == pytest.approx(1 / (1 + 1e-6), rel=1e-7)
    assert advantages.group_advantages(rewards, keys, norm_by_std=False, singleton="raw")[0][5].item() == pytest.approx(-0.1)
    zero, zero_stats = advantages.group_advantages(rewards, keys, eps=0.0, singleton="zero")
    assert zero.tolist() == [0.0] * 6 and zero_stats == stats


def test_chi2_and_ppl_per_micro_batch_against_pooled() -> None:
    # Micro-batch 1: one row of 2 tokens, each at prob 0.5 under pi_theta and 0.25 under the
    # rollout: rho = 2, rho^2 - 1 = 3, (rho - 1)^2 = 1, ppl = exp(log 2) = 2.
    # Micro-batch 2: a 1-token row at prob 1 and a 3-token row at prob 0.25, both on-policy:
    # rho = 1 (chi2 0, centred 0), ppls 1 and 4 (mean 2.5). The 2-wide row is left-padded
    # with a junk log-prob the mask must drop.
    half, quarter = math.log(0.5), math.log(0.25)
    mb1 = ppo.ratio_sums(torch.tensor([[half, half]]), torch.tensor([[quarter, quarter]]), torch.ones(1, 2))
    logp2 = torch.tensor([[5.0, 5.0, 0.0], [quarter] * 3])
    mask2 = torch.tensor([[0.0, 0.0, 1.0], [1.0, 1.0, 1.0]])
    mb2 = ppo.ratio_sums(logp2, logp2, mask2)
    assert (mb1.tokens, mb1.rows, mb2.tokens, mb2.rows) == (2, 1, 4, 2)
    # verl: each micro-batch's masked means, then their mean: chi2 (3 + 0) / 2, centred
    # (1 + 0) / 2, ppl (2 + 2.5) / 2.
    assert ppo.ratio_diagnostics([mb1, mb2], "micro_batch") == pytest.approx(
        {"chi2": 1.5, "chi2_centered": 0.5, "ppl": 2.25})
    # Pooled over the step: rho^2 sums to 2 * 4 + 4 * 1 = 12 over 6 tokens, (rho - 1)^2 to 2,
    # and the three rows' ppls 2, 1, 4 average 7 / 3.
    assert ppo.ratio_diagnostics([mb1, mb2], "pooled") == pytest.approx(
        {"chi2": 1.0, "chi2_centered": 1 / 3, "ppl": 7 / 3})


def test_known_four_sample_group() -> None:
    # rewards [1, 0, 0, 0]: mean 0.25; unbiased std = sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5
    # -> advantages (r - 0.25) / 0.5 = [1.5, -0.5, -0.5, -0.5].
    adv, _ = advantages.group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), ["g"] * 4, eps=0.0)
    assert adv.tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5])
    centred, _ = advantages.group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), ["g"] * 4, norm_by_std=False)
    assert centred.tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_groups_are_normalised_separately() -> None:
    adv, _ = advantages.group_advantages(torch.tensor([1.0, 0.0, 3.0, 1.0]), ["x", "x", "y", "y"], eps=0.0)
    # Each pair: mean-centred +-0.5 (x) / +-1 (y), unbiased std of a pair = |diff| / sqrt(2).
    s = math.sqrt(2) / 2
    assert adv.tolist() == pytest.approx([s, -s, s, -s])


def test_clipping_at_both_bounds() -> None:
    # ratios 1.5 (above 1 + 0.28) and 0.5 (below 1 - 0.2), with positive and negative advantages.
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.5, 0.5, 1.1]]))
    old = torch.zeros_like(logp)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, 1.0]])
    loss, clipped = ppo.clipped_policy_loss(logp, old, adv, clip_low=0.2, clip_high=0.28)
    # A > 0, ratio 1.5: min(1.5, 1.28) * A -> loss -1.28 (clipped).
    # A > 0, ratio 0.5: min(0.5, 0.8) -> -0.5 (unclipped: pessimistic bound keeps the ratio).
    # A < 0, ratio 1.5: max(-1.5, -1.28) is taken as loss 1.5 (unclipped).
    # A < 0, ratio 0.5: loss = max(0.5, 0.8) = 0.8 (clipped at 1 - 0.2).
    # A > 0, ratio 1.1 inside the band: -1.1.
    assert loss.tolist()[0] == pytest.approx([-1.28, -0.5, 1.5, 0.8, -1.1])
    assert clipped.tolist()[0] == [True, False, False, True, False]


def whole_minibatch_loss(loss: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """A (batch, tokens) loss aggregated over one whole mini-batch by its token weights."""
    return (loss * ppo.token_weights(mask, mode, int(mask.sum()), mask.shape[0])).sum()


def test_seq_mean_token_mean_vs_token_mean_on_ragged_lengths() -> None:
    # Sequence 1 has 1 token with loss 4; sequence 2 has 3 tokens with loss 1 each.
    loss = torch.tensor([[4.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    # token-mean: (4 + 3) / 4 tokens = 1.75. seq-mean-token-mean: (4/1 + 3/3) / 2 = 2.5.
    assert whole_minibatch_loss(loss, mask, "token-mean").item() == pytest.approx(1.75)
    assert whole_minibatch_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx(2.5)


def test_micro_batch_weights_sum_to_the_mini_batch_aggregate() -> None:
    loss = torch.tensor([[4.0, 0.0, 0.0], [1.0, 1.0, 1.0], [2.0, 2.0, 0.0]])
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    for mode in ("token-mean", "seq-mean-token-mean"):
        whole = whole_minibatch_loss(loss, mask, mode)
        split = sum(
            (ppo.token_weights(mask[rows], mode, int(mask.sum()), 3) * loss[rows]).sum() for rows in ([0], [1, 2])
        )
        assert split.item() == pytest.approx(whole.item())


def test_unknown_aggregation_names_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="seq-mean-token-mean or token-mean"):
        ppo.token_weights(torch.ones(1, 1), "sum", 1, 1)


def test_k3_kl_is_zero_at_equality_and_positive_elsewhere() -> None:
    logp = torch.log(torch.tensor([0.5, 0.2]))
    assert ppo.k3_kl(logp, logp).tolist() == [0.0, 0.0]
    # ref 0.25 vs pi 0.5: exp(log .5) - log .5 - 1 = 0.5 + 0.693 - 1 = 0.193.
    assert ppo.k3_kl(torch.log(torch.tensor([0.5])), torch.log(torch.tensor([0.25]))).item() == pytest.approx(
        0.5 + math.log(2) - 1, rel=1e-5
    )


def test_lr_schedule_warmup_from_zero_then_cosine() -> None:
    # verl's LambdaLR schedules: after 0 advances the LR is 0; warmup 2 gives 0, 1/2, then
    # cosine over the 4 advances left to total 6: progress 0, 1/4, 2/4, 3/4, then the floor.
    lr = [lr_schedule.lr_at(a, 1.0, warmup=2, total=6, schedule="cosine") for a in range(7)]
    assert lr == pytest.approx(
        [0.0, 0.5, 1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5, 0.5 * (1 + math.cos(3 * math.pi / 4)), 0.0]
    )


def test_equal_non_integer_rewards_are_zero_variance() -> None:
    # Eight equal rewards of -0.1 (the format penalty), 0.3 or 0.7 (pass rates): float32's std
    # of them is not exactly 0 (about 8e-9 for -0.1), so a `std == 0` test would hand each
    # row (r - mean) / (std + 1e-6) ~ 0.007. max == min catches them: zero, and counted.
    for value in (-0.1, 0.3, 0.7):
        assert torch.tensor([value] * 8).std().item() != 0.0
    rewards = torch.tensor([-0.1] * 8 + [0.3] * 8 + [0.7] * 8)
    adv, stats = advantages.group_advantages(rewards, ["a"] * 8 + ["b"] * 8 + ["c"] * 8)
    assert adv.tolist() == [0.0] * 24
    assert (stats.groups, stats.singleton, stats.zero_variance) == (3, 0, 3)


def test_dual_clip_caps_negative_advantage_losses_at_c_times_a() -> None:
    # clip 0.2 / 0.28, c = 3. Per token: (ratio, A) -> PPO loss max(-A r, -A clip(r)), then
    # where A < 0: min(that, -3 A).
    ratio = torch.tensor([[5.0, 2.0, 5.0, 4.0, 0.5]])
    adv = torch.tensor([[-1.0, -1.0, 1.0, -2.0, -1.0]])
    logp, old = torch.log(ratio), torch.zeros_like(ratio)
    loss, clipped = ppo.clipped_policy_loss(logp, old, adv, 0.2, 0.28, clip_ratio_c=3.0)
    # r 5, A -1: PPO max(5, 1.28) = 5 -> capped at 3.   r 2, A -1: 2 < 3 stays.
    # r 5, A +1: -1.28 (A > 0: no cap).                  r 4, A -2: max(8, 2.56) = 8 -> 6.
    # r 0.5, A -1: max(0.5, 0.8) = 0.8 (clip below), under the cap.
    assert loss.tolist()[0] == pytest.approx([3.0, 2.0, -1.28, 6.0, 0.8])
    # Without dual-clip the first and fourth tokens keep the PPO loss (the as_written preset).
    plain, _ = ppo.clipped_policy_loss(logp, old, adv, 0.2, 0.28)
    assert plain.tolist()[0] == pytest.approx([5.0, 2.0, -1.28, 8.0, 0.8])
    # `clipped` reports the PPO clip only: tokens 3 (upper) and 5 (lower).
    assert clipped.tolist()[0] == [False, False, True, False, True]


def test_capped_tokens_carry_no_gradient_and_the_log_ratio_is_clamped_at_20() -> None:
    logp = torch.tensor([[math.log(5.0), 30.0]], requires_grad=True)
    old = torch.zeros(1, 2)
    adv = torch.tensor([[-1.0, -1.0]])
    loss, _ = ppo.clipped_policy_loss(logp, old, adv, 0.2, 0.28, clip_ratio_c=3.0, log_ratio_clamp=20.0)
    loss.sum().backward()
    # Both tokens sit on the cap 3 * |A| = 3: constant in logp, so their gradient is 0.
    assert loss.tolist()[0] == pytest.approx([3.0, 3.0])
    assert logp.grad is not None and logp.grad.tolist()[0] == [0.0, 0.0]
    # A positive advantage at log-ratio 30 is clipped at 1.28 either way; with A = -1 and no
    # dual-clip the clamp bounds the loss at e^20 instead of e^30.
    clamped, _ = ppo.clipped_policy_loss(logp.detach(), old, adv, 0.2, 0.28, log_ratio_clamp=20.0)
    assert clamped[0, 1].item() == pytest.approx(math.exp(20.0), rel=1e-5)


def test_k3_kl_clamps_as_verl() -> None:
    # ref - logp = +25: clamped to 20, e^20 - 21 is far above 10 -> 10.
    # ref - logp = -30: clamped to -20, e^-20 + 19 = 19.000... -> 10; unclamped: e^-30 + 29 = 29.
    logp = torch.tensor([0.0, 30.0])
    ref = torch.tensor([25.0, 0.0])
    assert ppo.k3_kl(logp, ref, log_ratio_clamp=20.0, kl_clamp=10.0).tolist() == pytest.approx([10.0, 10.0])
    assert ppo.k3_kl(logp[1:], ref[1:]).item() == pytest.approx(29.0, rel=1e-6)
    # Inside the bounds the clamps change nothing: the 0.193 of the test above.
    small = ppo.k3_kl(torch.log(torch.tensor([0.5])), torch.log(torch.tensor([0.25])), 20.0, 10.0)
    assert small.item() == pytest.approx(0.5 + math.log(2) - 1, rel=1e-5)


def test_partial_mini_batch_scale() -> None:
    # verl: a micro-batch's loss times its rows / the mini-batch size; 40 of 64 rows -> 0.625.
    assert minibatches.partial_scale(40, 64) == 0.625
    assert minibatches.partial_scale(64, 64) == 1.0


def test_balanced_order_on_one_rank_is_short_long_short() -> None:
    # Lengths 5 1 4 2 3 (indices 0..4). Sorted by workload (monotone in length): 1 2 3 4 5 =
    # indices 1 3 4 2 0; even positions ascending (1 4 0) then odd ones descending (2 3).
    order = minibatches.balanced_order([5, 1, 4, 2, 3], world=1, minibatch_size=2)
    assert order == [1, 4, 0, 2, 3]
    # Consecutive cuts of 2: lengths (1, 3), (5, 4), (2) -- the mini-batches verl trains.
    lengths = [5, 1, 4, 2, 3]
    assert [[lengths[i] for i in order[k : k + 2]] for k in range(0, 5, 2)] == [[1, 3], [5, 4], [2]]


def test_balanced_order_on_two_ranks_pairs_longest_with_shortest() -> None:
    # Lengths 1 2 3 4 on 2 ranks, equal sizes. Workload w(L) = 24576 L + L^2. Karmarkar-Karp
    # seeds {L2 | L1} (spread w(2) - w(1) = 24579) and {L4 | L3} (24583); the larger spread
    # merges first, heaviest with lightest: {4, 1} (5 * 24576 + 17) and {3, 2} (5 * 24576 + 13).
    # Each rank's part ascending; global mini-batch k = slice k of every rank (2 rows each).
    assert minibatches.balanced_order([1, 2, 3, 4], world=2, minibatch_size=4) == [0, 3, 1, 2]
    assert minibatches.workload(2) - minibatches.workload(1) == 24579


def test_released_lr_per_adapter_for_the_first_20_steps_under_sp_and_ip() -> None:
    # preset=released: verl's constant schedule with a 15-advance warmup from 0, advanced once
    # per update_actor call, which the released trainer makes once per adapter. lr 1 so the
    # values are fractions of the peak, worked out by hand:
    #   SP (one adapter): step t runs after t - 1 advances: 0, 1/15, ..., 14/15 (step 15), then 1.
    #   IP Voting (generator, aggregator): step t's generator after 2(t - 1) advances, its
    #   aggregator after 2(t - 1) + 1: step 1 0 and 1/15, step 2 2/15 and 3/15, ..., step 8
    #   14/15 and 1 (15 advances), 1 from step 9 on.
    #   IP Orch-Workers (3 adapters): 3(t - 1) + i: step 5 is 12/15, 13/15, 14/15; step 6 on, 1.
    def lr(step: int, index: int, adapters: int) -> float:
        advances = lr_schedule.schedule_advances(step, index, adapters, "per_update")
        return lr_schedule.lr_at(advances, 1.0, warmup=15, total=500, schedule="constant")

    steps = range(1, 21)
    sp = [min(t - 1, 15) / 15 for t in steps]
    assert [lr(t, 0, 1) for t in steps] == pytest.approx(sp)
    assert sp[:3] == [0.0, 1 / 15, 2 / 15] and sp[14:17] == [14 / 15, 1.0, 1.0]
    generator = [0, 2, 4, 6, 8, 10, 12, 14] + [15] * 12
    aggregator = [1, 3, 5, 7, 9, 11, 13, 15] + [15] * 12
    assert [lr(t, 0, 2) for t in steps] == pytest.approx([g / 15 for g in generator])
    assert [lr(t, 1, 2) for t in steps] == pytest.approx([a / 15 for a in aggregator])
    orch = [[min(3 * (t - 1) + i, 15) / 15 for t in steps] for i in range(3)]
    for i in range(3):
        assert [lr(t, i, 3) for t in steps] == pytest.approx(orch[i])
    assert [orch[i][4] for i in range(3)] == pytest.approx([12 / 15, 13 / 15, 14 / 15])
    assert [orch[i][5] for i in range(3)] == [1.0, 1.0, 1.0]


def test_as_written_lr_is_one_cosine_per_step_for_every_adapter() -> None:
    # preset=as_written: cosine with 15 warmup advances, once per training step, the same for
    # every adapter under SP and IP. Steps 1-16: (t - 1)/15; from step 17 (16 advances) the
    # cosine over the 485 advances left to step 500: 0.5 (1 + cos(pi (t - 16) / 485)).
    def lr(step: int, index: int, adapters: int) -> float:
        advances = lr_schedule.schedule_advances(step, index, adapters, "per_step")
        return lr_schedule.lr_at(advances, 1.0, warmup=15, total=500, schedule="cosine")

    expected = [(t - 1) / 15 if t <= 16 else 0.5 * (1 + math.cos(math.pi * (t - 16) / 485)) for t in range(1, 21)]
    for adapters in (1, 2, 3):
        for index in range(adapters):
            assert [lr(t, index, adapters) for t in range(1, 21)] == pytest.approx(expected)
    assert expected[15] == 1.0 and expected[16] < 1.0


def test_schedule_advances_per_step_and_per_update() -> None:
    # Step 3 of a run with 2 adapters: per_step, 2 advances before it for both; per_update
    # advances once per adapter update, so step 3's updates come after 4 and 5.
    assert [lr_schedule.schedule_advances(3, i, 2, "per_step") for i in range(2)] == [2, 2]
    assert [lr_schedule.schedule_advances(3, i, 2, "per_update") for i in range(2)] == [4, 5]
    assert lr_schedule.schedule_advances(1, 0, 1, "per_update") == 0
    with pytest.raises(ValueError, match="per_step or per_update"):
        lr_schedule.schedule_advances(1, 0, 1, "per_epoch")
