"""The built-in workflows, one module each: its params, its async program over
`await llm.chat(role, messages)`, its own validation metrics and its registry entry
(gridrun/seam/registry.py). Torch-free and importing neither half, so the grid checks a workflow's
config at plan time from the same declaration the trainer runs.

A workflow module takes duck-typed objects: the episode (gridrun/train/episode.py), the
rollout's per-episode LLM (gridrun/train/rollout.py) and the task (gridrun/tasks/base.py).
Left out: batching the calls, routing roles to adapters and scoring, which those do.

    single.py  eval_opt.py  voting.py  orch_workers.py
"""
