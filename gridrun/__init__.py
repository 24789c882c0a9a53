"""gridrun: multi-agent GRPO over the experiment grid of "When Does Multi-Agent RL Improve LLM
Workflows?" Two halves and the seam between them; only run directories cross it.

The seam (torch-free, standard library only; both halves import it):
    runconfig.py     the run schema: what a cell's config.yaml may hold
    rundir.py        RunDir: every path of a run directory, its file IO and state.json's one writer
    cellstate.py     a cell's states and named transitions
    accuracy.py      what an accuracy and a run's peak are, from metric rows
    mechanisms.py    every alert, replayable from metric rows with any Thresholds
    registry.py      the registries of workflows, tasks and engines (and plugins)
Options declared for both halves (torch-free, importing neither half):
    workflows/       one module per workflow: params, async program, metrics, registry entry
    engine_params.py the built-in engines' params and registry entries (code: train/engines/)
    tasks/           problems, prompts, rewards, the sandbox, data preparation
The halves and what sits above them:
    grid/            the sweep half (never imports torch): compose, plan, launch, status, collect
    train/           the cell half (never imports hydra or grid): the trainer and its parts
    toy/             the embedded toy world (uses train/; train/ never imports it)
    cellrun.py       `gridrun run`'s entry: the base model resolved to files, then the trainer
    cli.py           the `gridrun` command line
    adapters.py      where a trained adapter is; export.py: `gridrun export`
    memory.py arch/  the dry run's GPU-memory model; Qwen3 architectures
    results.py       a collected sweep as pandas DataFrames
Package data (shipped in the wheel; a user's own are found first, grid/search.py):
    conf/ sweeps/    the Hydra config groups and the sweeps
    slurm/           the SLURM node setup script and its site scripts
"""
