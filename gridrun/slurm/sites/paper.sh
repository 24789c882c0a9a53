# Site file of the `paper` cluster profile (conf/cluster/paper.yaml), sourced by
# gridrun/slurm/setup_node.sh on the node before every job. Put what your site needs here (and name
# the file after your profile): modules, shared-storage paths, NCCL settings.
#
# module load cuda/12.4
# export HF_HOME=/shared/$USER/hf
# export GRIDRUN_DATA=/shared/gridrun-data
# export GRIDRUN_CACHE=/shared/$USER/gridrun-cache
# NCCL between the node's two GPUs only (one node per cell).
export NCCL_P2P_LEVEL=${NCCL_P2P_LEVEL:-NVL}
