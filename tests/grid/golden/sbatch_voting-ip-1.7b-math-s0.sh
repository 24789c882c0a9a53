#!/bin/bash

# Parameters
#SBATCH --cpus-per-task=8
#SBATCH --error=<RESULTS>/full_matrix/jobs/%j/%j_0_log.err
#SBATCH --gpus-per-task=h100:1
#SBATCH --job-name=gridrun-full_matrix
#SBATCH --mem=128G
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --open-mode=append
#SBATCH --output=<RESULTS>/full_matrix/jobs/%j/%j_0_log.out
#SBATCH --partition=h100
#SBATCH --signal=USR2@2164
#SBATCH --time=2880
#SBATCH --wckey=submitit

# setup
export SLURM_CONF=/etc/slurm/slurm.conf
export GRIDRUN_CLUSTER=paper
source <REPO>/gridrun/slurm/setup_node.sh

# command
export SUBMITIT_EXECUTOR=slurm
srun --unbuffered --output <RESULTS>/full_matrix/jobs/%j/%j_%t_log.out --error <RESULTS>/full_matrix/jobs/%j/%j_%t_log.err --kill-on-bad-exit=1 /venv/bin/python -P -u -m submitit.core._submit <RESULTS>/full_matrix/jobs/%j
