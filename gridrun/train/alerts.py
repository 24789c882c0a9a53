"""Drift alerts: per-role signatures that moved far from their step-0 values.

Each rule fires on one of the paper's failure surfaces, read from validation rows (the
trajectory side), so they work under Shared- and Isolated-Policy alike:
- the aggregator's terse-selection slot captured by long-form text (terse rate halves);
- the evaluator emitting code (code-fence rate above 20%);
- a role losing its `\\boxed{}` answer channel (box rate halves);
- a role's length distribution hitting the response cap (p95 at the cap, truncation > 20%);
- same-role slots collapsing onto one output (3-gram Jaccard above 0.9 from below 0.7).
One more comes from the training side: optimizer steps skipped because the loss or the
gradient was not finite (the guard in update.py); any such step is worth a look.
"""

from __future__ import annotations

import re

_KEY = re.compile(r"^val/role/([^/]+)/(.+)$")


def drift_alerts(first: dict[str, float], now: dict[str, float], response_cap: int) -> list[str]:
    alerts: list[str] = []
    for key, value in now.items():
        match = _KEY.match(key)
        if not match:
            continue
        role, metric = match.groups()
        before = first.get(key)
        if metric in ("terse_rate", "box_rate") and before is not None and before >= 0.5 and value < before / 2:
            alerts.append(f"{role} {metric.replace('_', ' ')} {before:.0%}->{value:.0%}")
        elif metric == "code_fence_rate" and value > 0.2 and (before or 0.0) <= 0.2:
            alerts.append(f"{role} writes code {value:.0%}")
        elif metric == "trunc_rate" and value > 0.2 and (before or 0.0) <= 0.2:
            alerts.append(f"{role} truncated {value:.0%}")
        elif metric == "len_p95" and value >= response_cap and (before or 0.0) < response_cap:
            alerts.append(f"{role} p95 length at cap")
        elif metric == "slot_jaccard3" and value > 0.9 and (before or 0.0) < 0.7:
            alerts.append(f"{role} slots collapsed (jaccard {value:.2f})")
    return sorted(alerts)


def nonfinite_alerts(skipped: int) -> list[str]:
    """The alert for `skipped` optimizer steps skipped on a non-finite loss or gradient."""
    return [f"non-finite update: {skipped} optimizer step{'s' if skipped != 1 else ''} skipped"] if skipped else []
