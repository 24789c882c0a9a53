"""How an adapter's rows become mini-batches, kept pure: the released code's length-balanced
order (verl's balanced partitioning, largest differencing) and the scale of a short last
mini-batch. Left out: cutting micro-batches by the token budget (gridrun/train/update.py).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def partial_scale(rows: int, minibatch_size: int) -> float:
    """verl's weight of a mini-batch of `rows` rows: rows / mini-batch size (1 when full).

    verl scales each micro-batch's aggregated loss by its rows / the nominal mini-batch size,
    so a short last mini-batch (40 of 64 rows) counts 0.625x a full one."""
    return min(rows, minibatch_size) / minibatch_size


def workload(length: int) -> int:
    """verl's cost of one sequence of `length` tokens (prompt + response), used to balance:
    proportional to a dense transformer block's FLOPs, 6 * 4096 * L + L^2."""
    return 24576 * length + length * length


def _largest_differencing(costs: list[int], parts: int) -> list[list[int]]:
    """Karmarkar-Karp partition of item indices into `parts` sets of near-equal total cost
    (equal item counts when len(costs) is a multiple of parts). Each set's indices sorted."""
    ranked = sorted((cost, i) for i, cost in enumerate(costs))
    equal = len(costs) % parts == 0

    def state(items: list[tuple[int, int]]) -> list[tuple[int, list[tuple[int, int]]]]:
        sets = [(cost, [(i, cost)]) for cost, i in items] + [(0, []) for _ in range(parts - len(items))]
        return sorted(sets, key=_set_key, reverse=True)

    seeds = (
        [ranked[k : k + parts] for k in range(0, len(ranked), parts)] if equal else [[item] for item in ranked]
    )
    heap = [_State(state(items)) for items in seeds]
    heapq.heapify(heap)
    while len(heap) > 1:
        first, second = heapq.heappop(heap), heapq.heappop(heap)
        # The heaviest set of one state takes the lightest of the other, and so on.
        merged = [
            (a[0] + b[0], a[1] + b[1]) for a, b in zip(first.sets, reversed(second.sets))
        ]
        heapq.heappush(heap, _State(sorted(merged, key=_set_key, reverse=True)))
    return [sorted(i for i, _ in items) for _, items in heap[0].sets]


def _set_key(entry: tuple[int, list[tuple[int, int]]]) -> tuple:
    total, items = entry
    return (total, len(items), items)


class _State:
    """A partial partition; the heap pops the one with the largest spread first."""

    def __init__(self, sets: list[tuple[int, list[tuple[int, int]]]]) -> None:
        self.sets = sets
        self.spread = sets[0][0] - sets[-1][0]

    def __lt__(self, other: _State) -> bool:
        if self.spread != other.spread:
            return self.spread > other.spread
        return _set_key(self.sets[0]) > _set_key(other.sets[0])


def balanced_order(lengths: Sequence[int], world: int, minibatch_size: int) -> list[int]:
    """verl's `balance_batch` order of a step's rows, laid out so that consecutive slices of
    `minibatch_size` are the mini-batches verl's ranks train together.

    lengths: (rows,) prompt + response tokens. The rows are split into `world` partitions of
    near-equal workload (one per data-parallel rank); each partition is sorted by workload
    and laid out short-long-short (even positions ascending, then odd ones descending);
    rank r's k-th mini-batch is the k-th consecutive slice of partition r, so global
    mini-batch k = the k-th slice of every partition. Returns a permutation of range(rows).
    """
    costs = [workload(length) for length in lengths]
    if not costs:
        return []
    parts = [list(range(len(costs)))] if world <= 1 or len(costs) < world else _largest_differencing(costs, world)
    laid_out = []
    for part in parts:
        part = sorted(part, key=lambda i: (costs[i], i))
        laid_out.append(part[::2] + part[1::2][::-1])
    if len(laid_out) == 1:
        return laid_out[0]
    per_rank = max(1, minibatch_size // len(laid_out))
    longest = max(len(part) for part in laid_out)
    return [i for start in range(0, longest, per_rank) for part in laid_out for i in part[start : start + per_rank]]
