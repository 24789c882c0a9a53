#!/usr/bin/env bash
# Run a command as on a machine that never had SLURM: every PATH folder holding one of
# SLURM's commands is replaced by a folder of links to its other programs (a machine where
# the test cluster ran has them in /usr/bin, beside everything else). CI runs `make test`
# this way, so no fast test leans on a binary a newcomer's machine lacks.
#
#   scripts/without_slurm.sh make test
set -euo pipefail
[[ $# -gt 0 ]] || { echo "usage: scripts/without_slurm.sh COMMAND [ARGS...]" >&2; exit 2; }
slurm=" sbatch srun salloc sacct sacctmgr squeue scancel scontrol sinfo sprio sshare sstat sattach sbcast sdiag sreport strigger sview "
shadows=$(mktemp -d "${TMPDIR:-/tmp}/without-slurm.XXXXXX")
trap 'rm -rf "$shadows"' EXIT
path=
IFS=: read -ra dirs <<<"$PATH"
for dir in "${dirs[@]}"; do
    use=$dir
    for command in $slurm; do
        if [[ -e $dir/$command ]]; then
            use=$shadows/${dir//\//_}
            mkdir -p "$use"
            for program in "$dir"/*; do
                [[ $slurm == *" ${program##*/} "* ]] || ln -s "$program" "$use/"
            done
            break
        fi
    done
    path=${path:+$path:}$use
done
for command in $slurm; do
    if PATH=$path command -v "$command" >/dev/null; then
        echo "without_slurm: $command is still on PATH" >&2
        exit 1
    fi
done
PATH=$path "$@"
