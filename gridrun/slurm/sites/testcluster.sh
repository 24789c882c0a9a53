# Site file of the `testcluster` profile: the single-node cluster of slurm/testcluster/.
# Its GPUs are fake (character devices), so torch sees none and the ranks use gloo on CPU.
# Nothing to load; jobs inherit GRIDRUN_CACHE from the test session.
:
