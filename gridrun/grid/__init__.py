"""The orchestration half: plan, launch, watch. Hydra composition, cells, launching, status;
the analysis of a finished sweep is gridrun/analysis/.

    search.py      where sweeps and config groups are found: the user's folder, then the shipped ones
    spec.py        a sweep file + command-line overrides -> axes and settings
    userfiles.py   YAML from the user's folder (sweeps, option files) read within bounds
    compose.py     Hydra composition of one cell's config (conf/)
    gridconfig.py  the grid root's schema (gpu, cluster, launcher, ...), checked at plan time
    presets.py     the whole-run presets seen from the grid
    cells.py       cell kinds, coordinates and readable ids
    plan.py        expand, validate and freeze cells into results/<sweep>/cells/<id>/
    sweepdir.py    SweepDir: the one owner of results/<sweep>/ paths, sweep.json and its lock
    launchers/     the Launcher interface (base.py), queueing (dispatch.py), a cell's observed
                   state (observe.py), the cluster profile (cluster.py), the local launcher
                   (subprocesses with a progress display), the SLURM one (submitit job arrays)
    status.py      reading every cell's state fast (stdlib only) and drawing the table
    show.py        one cell's resolved config and state
    fetch.py       models and data a sweep needs, into shared storage (on a login node)
    templates.py   a cell's conversations against its model: context window, the family's
                   turn rules, the fetched chat template rendered once
    preflight.py   a tiny job where the cells will run: venv, CUDA, vLLM, GPUs, sandbox, data, disk
    canary.py      the first job on a new cluster: one short real-shaped cell, go or no-go
    cost.py        the dry run's cost model: a step's seconds, node-days, measured rates
    disk.py        the dry run's disk model: a cell's checkpoints at their worst moment
    console.py     the rich Console the commands draw on
    errors.py      GridError, the one-line error that names the fix
    commands.py    the `gridrun` subcommands of this half

Imports Hydra, rich, pandas and filelock, never torch: everything here runs on a login node.
The trainer is reached only through a run directory and `gridrun run <run_dir>`.
"""

from pathlib import Path

# The package's own folder: its shipped conf/ (Hydra groups), sweeps/ and slurm/ (the node
# setup script and site scripts) are package data, found here in a wheel and in a checkout.
PACKAGE_DIR = Path(__file__).resolve().parents[1]
# The folder holding the package: the repository checkout in an editable install.
REPO_ROOT = PACKAGE_DIR.parent


def checkout() -> Path | None:
    """The repository checkout gridrun runs from (an editable install); None when installed as
    a wheel (REPO_ROOT is then site-packages)."""
    return REPO_ROOT if (REPO_ROOT / "pyproject.toml").is_file() else None
