"""Launchers: how queued cells become running `gridrun run <run_dir>` processes.

    dispatch.py   the Launcher interface, queueing (attempts, needs), what a cell's state
                  really is when its job died silently, and starting one cell's process
    local.py      cells as subprocesses of `gridrun sweep`, with a progress display
    slurm.py      cells as submitit job arrays (slurm_job.py runs inside each job)
"""
