"""The seam between the halves: what both `gridrun.grid` and `gridrun.train` read and write.
Torch-free and standard library only (tests/test_seam.py checks every module of this package).

    runconfig.py    the run schema: what a cell's config.yaml may hold, its defaults, its loader
    rundir.py       a run directory's paths and files, and state.json's one writer
    cellstate.py    a cell's states and their named transitions
    accuracy.py     what an accuracy and a run's peak are
    mechanisms.py   the alerts both halves compute from metric rows
    metric_keys.py  the metric keys' vocabulary (role/<r>/<m>, adapter/<a>/<m>, val/<key>)
    registry.py     the registries of workflows, tasks and engines (built-ins and plugins), and
                    `named`: the one resolver of a `<module>:<name>` plugin function
    routing.py      which adapter serves each role; per-role loss weights, LR factors, steps
    records.py      per-problem validation records (which problems an evaluation got right)
    significance.py the tests: a paired fall and the cliff rule, a comparison, a detectable difference
    errors.py       UserError: the base of every error a user can fix (one line, no traceback)
"""
