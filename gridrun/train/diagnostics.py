"""Trajectory-side drift signatures, computed on validation episodes (pure functions).

These are the paper's per-role signatures of `gradient_amplification` and
`sp_role_capture` that any workflow's roles have: length percentiles and truncation per
role, `\\boxed{}` retention, hedging-phrase rate, inter-slot 3-gram Jaccard of parallel
slots. A workflow's own signatures (the aggregator's terse rate, the evaluator's code-fence
rate, the orchestrator's unique openers) live in its module (gridrun/workflows/).
"""

from __future__ import annotations

import itertools
import math
import re
from collections import defaultdict

from gridrun.seam.metric_keys import role_key, role_prefix
from gridrun.tasks.answers import last_boxed
from gridrun.train.episode import Episode, Turn

HEDGES = (
    "wait",
    "alternatively",
    "actually",
    "hmm",
    "let me reconsider",
    "on second thought",
    "not correct",
    "this is wrong",
)
_HEDGE = re.compile(r"\b(" + "|".join(re.escape(h) for h in HEDGES) + r")\b", re.IGNORECASE)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile: the ceil(q/100 * n)-th smallest value, q in [0, 100]; 0 for no
    values. (The product is rounded to 9 digits first: 0.95 * 20 must rank 19, not 20.)"""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(round(q / 100 * len(ordered), 9))))
    return float(ordered[rank - 1])


def trigrams(text: str) -> set[tuple[str, ...]]:
    words = text.split()
    return {tuple(words[i : i + 3]) for i in range(len(words) - 2)}


def jaccard(a: set, b: set) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def has_box(turn: Turn) -> bool:
    return last_boxed(turn.text) is not None


def role_signatures(episodes: list[Episode], parallel_role: str | None) -> dict[str, float]:
    """Flat `role/<role>/<signature>` metrics over a set of episodes."""
    turns: dict[str, list[Turn]] = defaultdict(list)
    for episode in episodes:
        for turn in episode.turns:
            turns[turn.role].append(turn)
    out: dict[str, float] = {}
    for role, group in turns.items():
        lengths = [float(len(t.completion_ids)) for t in group]
        prefix = role_prefix(role)
        out[prefix + "len_p50"] = percentile(lengths, 50)
        out[prefix + "len_p95"] = percentile(lengths, 95)
        out[prefix + "len_mean"] = sum(lengths) / len(lengths)
        out[prefix + "trunc_rate"] = sum(t.finish_reason == "length" for t in group) / len(group)
        out[prefix + "box_rate"] = sum(has_box(t) for t in group) / len(group)
        out[prefix + "hedge_rate"] = sum(bool(_HEDGE.search(t.text)) for t in group) / len(group)
    if parallel_role and parallel_role in turns:
        scores = []
        for episode in episodes:
            slots = [trigrams(t.text) for t in episode.role_turns(parallel_role)]
            pairs = [jaccard(a, b) for a, b in itertools.combinations(slots, 2)]
            if pairs:
                scores.append(sum(pairs) / len(pairs))
        if scores:
            out[role_key(parallel_role, "slot_jaccard3")] = sum(scores) / len(scores)
    return out
