"""Launchers: how queued cells become running `gridrun run <run_dir>` processes.

    base.py       the Launcher interface (admit, submit, wait, reconcile, cancel) and the
                  registry of launchers by name
    dispatch.py   queueing: a cell's next attempt, its needs first, which cells a sweep
                  dispatches (judged by their observed state, gridrun/grid/launchers/observe.py)
    observe.py    a cell's observed state: lost jobs, the scheduler's word, waiting, blocked
    cluster.py    the cluster profile (conf/cluster/<name>.yaml), checked
    process.py    one cell's process, as every launcher starts it
    local.py      cells as subprocesses of `gridrun sweep`, with a progress display
    slurm.py      cells as submitit job arrays (slurm_job.py runs inside each job)
"""
