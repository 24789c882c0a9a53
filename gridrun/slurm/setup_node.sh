#!/usr/bin/env bash
# What a compute node needs before a gridrun job runs: sourced by every job script the SLURM
# launcher writes (after it exports SLURM_CONF, GRIDRUN_CACHE, GRIDRUN_DATA, GRIDRUN_LOG as
# set at submission, and GRIDRUN_CLUSTER, the cluster profile's name).
#
#   source gridrun/slurm/setup_node.sh        in a job (the launcher does it)
#   bash gridrun/slurm/setup_node.sh --check  by hand on a node: is everything a job needs there?
#
# It
# - sources sites/$GRIDRUN_CLUSTER.sh beside it when it exists (module loads, scratch paths:
#   whatever your site needs; copy sites/paper.sh),
# - keeps model downloads out of jobs (HF_HUB_OFFLINE=1: fetch models on a login node first)
#   and points the Hugging Face cache at shared storage (HF_HOME, default ~/.cache/huggingface),
# - keeps the toy-world cache shared (GRIDRUN_CACHE, default ~/.cache/gridrun),
# - with --check, verifies the venv's python imports gridrun and torch, GRIDRUN_DATA holds
#   prepared data, and the allocated GPUs are visible.
# Jobs run with the submitter's python (the venv's), so nothing is activated here. What the
# cell's own process needs (unbuffered output, thread pools sized to SLURM_CPUS_PER_TASK, its
# rank) is set by the job in Python (gridrun/grid/launchers/process.py), as for a local cell;
# this script stays shell because a site's module loads must run before that python starts.

# This script ships inside the package (gridrun/slurm/); the checkout is two folders up.
_gridrun_slurm=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
_gridrun_repo=$(cd "$_gridrun_slurm/../.." && pwd)

if [[ -n ${GRIDRUN_CLUSTER:-} && -f $_gridrun_slurm/sites/$GRIDRUN_CLUSTER.sh ]]; then
    # shellcheck source=/dev/null
    source "$_gridrun_slurm/sites/$GRIDRUN_CLUSTER.sh"
fi

export HF_HOME=${HF_HOME:-$HOME/.cache/huggingface}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
export TOKENIZERS_PARALLELISM=${TOKENIZERS_PARALLELISM:-false}
export GRIDRUN_CACHE=${GRIDRUN_CACHE:-$HOME/.cache/gridrun}

if [[ ${1:-} == --check ]]; then
    # The checkout's venv (make install); installed as a wheel, the python on PATH.
    python=${GRIDRUN_PYTHON:-$_gridrun_repo/.venv/bin/python}
    [[ -n ${GRIDRUN_PYTHON:-} || -x $python ]] || python=$(command -v python3 || echo python3)
    failed=0
    check() { # check <what> <command...>
        local what=$1
        shift
        if "$@" >/dev/null 2>&1; then
            echo "ok      $what"
        else
            echo "MISSING $what" >&2
            failed=1
        fi
    }
    check "python $python (make install)" test -x "$python"
    # From /, as jobs import it (their python runs with -P): the installed gridrun, not a
    # gridrun/ folder in the current directory.
    check "gridrun and torch import" bash -c "cd / && '$python' -c 'import gridrun.cli, torch'"
    check "HF cache $HF_HOME" test -d "$HF_HOME"
    check "toy/cache dir $GRIDRUN_CACHE writable" bash -c "mkdir -p '$GRIDRUN_CACHE' && test -w '$GRIDRUN_CACHE'"
    if [[ -n ${GRIDRUN_DATA:-} ]]; then
        check "prepared data in GRIDRUN_DATA=$GRIDRUN_DATA (gridrun data prepare math|code)" \
            bash -c "ls '$GRIDRUN_DATA'/*/meta.json"
    fi
    if [[ -n ${CUDA_VISIBLE_DEVICES:-} ]] && command -v nvidia-smi >/dev/null; then
        check "GPUs $CUDA_VISIBLE_DEVICES visible to torch" "$python" -c \
            "import torch, sys; sys.exit(torch.cuda.device_count() < len('$CUDA_VISIBLE_DEVICES'.split(',')))"
    fi
    unset -f check
    exit $failed
fi
unset _gridrun_repo
