"""Benchmark the sandboxed code reward: batch scheduler vs one sandbox start per test.

Both sides score the same 64 programs (80% wrong: 43 wrong answers, 8 runtime
errors; all fail test 0) on one stdin/stdout problem with 10 tests, in the same
run. "sequential" starts one sandboxed subprocess per test and runs them one after
another, never skipping (``score_code_batch`` on one-test items with one worker, the
rewards then assembled per program); "scheduler" is ``score_code_batch`` as training
calls it (pool sized to the CPU count, one sandbox start per program, dropping a
program at its first failure where that cannot change the reward). Rewards of both
sides must be identical, else the script exits with status 1.

    .venv/bin/python bench/code_reward.py --json            # mode all_pass
    .venv/bin/python bench/code_reward.py --json --mode pass_rate

Prints one JSON object: programs, wrong_fraction, scheduler_s, sequential_s,
speedup (plus mode, tests_per_program, workers, isolated). Without a working sandbox
it measures nothing: the reason on stderr, exit status 2.
Left out: timeouts and syntax errors among the wrong programs (they would inflate
the speedup: the scheduler skips them, the baseline pays every test).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from gridrun.tasks.code_reward import CodeLimits, score_code_batch
from gridrun.tasks.sandbox import isolation_status

CORRECT = [
    "n = int(input())\na = list(map(int, input().split()))\nprint(sum(a), max(a))\n",
    (
        "import sys\ndata = sys.stdin.read().split()\nn = int(data[0])\nxs = [int(x) for x in data[1:n + 1]]\n"
        "print(sum(xs), max(xs))\n"
    ),
    (
        "def main():\n    n = int(input())\n    best, total = None, 0\n    for x in map(int, input().split()):\n"
        "        total += x\n        best = x if best is None or x > best else best\n    print(total, best)\n\n"
        "if __name__ == '__main__':\n    main()\n"
    ),
]
WRONG_ANSWER = [
    "n = int(input())\na = list(map(int, input().split()))\nprint(sum(a) + 1, max(a))\n",
    "n = int(input())\na = list(map(int, input().split()))\nprint(sum(a), min(a))\n",
    "n = int(input())\na = list(map(int, input().split()))\nprint(sum(a[1:]), max(a))\n",
    "n = int(input())\na = list(map(int, input().split()))\nprint(max(a), sum(a))\n",
]
RUNTIME_ERROR = [
    "n = int(input())\na = list(map(int, input().split()))\nprint(sum(a), max(a), a[n])\n",
    "n = int(input())\na = list(map(int, input().split()))\nprint(sum(a) // 0)\n",
]


def _tests(n_tests: int, rng: random.Random) -> list[dict[str, str]]:
    tests = []
    for _ in range(n_tests):
        xs = [rng.randint(-10**6, 10**6) for _ in range(rng.randint(1, 2000))]
        tests.append({"input": f"{len(xs)}\n{' '.join(map(str, xs))}\n", "output": f"{sum(xs)} {max(xs)}\n"})
    return tests


def _programs(n: int, wrong_fraction: float) -> list[str]:
    n_wrong = round(n * wrong_fraction)
    n_runtime = n_wrong // 6
    progs = [CORRECT[i % len(CORRECT)] for i in range(n - n_wrong)]
    progs += [RUNTIME_ERROR[i % len(RUNTIME_ERROR)] for i in range(n_runtime)]
    progs += [WRONG_ANSWER[i % len(WRONG_ANSWER)] for i in range(n_wrong - n_runtime)]
    random.Random(1).shuffle(progs)
    return [f"Here is my solution.\n```python\n{p}```\n" for p in progs]


def one_sandbox_per_test(items: list[tuple[str, list[dict[str, str]]]], mode: str,
                         limits: CodeLimits) -> list[float]:
    """Each program's reward with every one of its tests run alone, in turn, never skipped."""
    alone = score_code_batch([(r, [t]) for r, tests in items for t in tests], "pass_rate", limits=limits, workers=1)
    rewards, at = [], 0
    for _, tests in items:
        passed, at = sum(s.passed for s in alone[at : at + len(tests)]), at + len(tests)
        rewards.append(passed / len(tests) if mode == "pass_rate" else float(passed == len(tests)))
    return rewards


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print only the JSON result")
    ap.add_argument("--programs", type=int, default=64)
    ap.add_argument("--wrong-fraction", type=float, default=0.8)
    ap.add_argument("--tests", type=int, default=10)
    ap.add_argument("--mode", choices=("all_pass", "pass_rate"), default="all_pass")
    args = ap.parse_args()
    isolated, why = isolation_status()
    if not isolated:  # the code reward fails closed: nothing to measure
        print(f"bench/code_reward.py: {why}", file=sys.stderr)
        return 2

    tests = _tests(args.tests, random.Random(0))
    items = [(r, tests) for r in _programs(args.programs, args.wrong_fraction)]
    limits = CodeLimits(timeout_s=2.0)
    score_code_batch(items[:1], args.mode, limits=limits)  # probe + warm caches outside the timings

    t0 = time.perf_counter()
    fast = score_code_batch(items, args.mode, limits=limits)
    scheduler_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    slow = one_sandbox_per_test(items, args.mode, limits)
    sequential_s = time.perf_counter() - t0

    same = [a.reward for a in fast] == slow
    result = {
        "programs": args.programs,
        "wrong_fraction": args.wrong_fraction,
        "scheduler_s": round(scheduler_s, 3),
        "sequential_s": round(sequential_s, 3),
        "speedup": round(sequential_s / scheduler_s, 2),
        "mode": args.mode,
        "tests_per_program": args.tests,
        "workers": len(os.sched_getaffinity(0)),
        "isolated": isolated,
    }
    if not args.json:
        print(f"rewards identical: {same}; mean reward {sum(s.reward for s in fast) / len(fast):.3f}",
              file=sys.stderr)
    print(json.dumps(result))
    if not same:
        print("ERROR: scheduler and per-test rewards differ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
