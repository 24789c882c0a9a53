"""gridrun: multi-agent GRPO over the experiment grid of "When Does Multi-Agent RL Improve LLM
Workflows?" Two halves, `grid/` (never imports torch) and `train/` (never imports Hydra or
`grid/`), and the seam between them (`runconfig.py`, `rundir.py` and the other torch-free
modules both import); only run directories cross it. The package map is docs/design.md;
each package's `__init__.py` lists its own modules.
Package data (shipped in the wheel; a user's own files are found first, `grid/search.py`):
`conf/` and `sweeps/` (the Hydra groups and the sweeps), `slurm/` (the node setup script).
"""
