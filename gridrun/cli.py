"""`gridrun`: the command line. Subcommands import their half lazily, so `gridrun status`
never loads torch and `gridrun run` never loads Hydra."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Literal

from gridrun.seam.errors import UserError

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _setup_logging() -> None:
    level = os.environ.get("GRIDRUN_LOG", "INFO").upper()
    if level not in LOG_LEVELS:
        print(f"gridrun: note: GRIDRUN_LOG={os.environ['GRIDRUN_LOG']} is not a level ({', '.join(LOG_LEVELS)}): "
              "logging at INFO", file=sys.stderr)
        level = "INFO"
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    logging.getLogger("gridrun").setLevel(level)


def _cmd_run(args: argparse.Namespace) -> int:
    from gridrun.seam.rundir import RUN_DISK_FIXES, RunDir, disk_error

    RunDir(args.run_dir).require_runnable()  # fail fast, before torch is imported
    from gridrun.cellrun import run_cell

    try:
        return run_cell(Path(args.run_dir))
    except OSError as err:
        # The run dir's disk is full or read-only before the run could record anything.
        message = disk_error(err, RUN_DISK_FIXES)
        if message is None:
            raise
        raise UserError(message) from None


def _cell_task(cell: str, kind: str, flags: list[str]) -> Any:
    """The task params of the cell at `cell` (for `gridrun reward ... --cell`), checked to be
    scored by `gridrun reward <kind>` and not set twice by `flags` (those given by hand)."""
    from gridrun.seam.runconfig import load_config
    from gridrun.seam.rundir import RunDir

    if flags:
        raise UserError(f"--cell scores with the cell's own reward settings: drop {' and '.join(flags)}")
    task = load_config(RunDir(Path(cell)).require().config_yaml).task
    other = {"math": "code", "code": "math"}[kind]
    if (kind == "math") != hasattr(task, "grader"):
        raise UserError(f"the cell at {cell} trains task '{task.name}': score it with `gridrun reward {other} --cell`")
    return task


def _cmd_reward(args: argparse.Namespace) -> int:
    if args.task == "math":
        from gridrun.tasks.math import MathParams, score_boxed

        given = [f for f, v in (("--grader", args.grader), ("--format-penalty", args.format_penalty)) if v is not None]
        task = _cell_task(args.cell, "math", given) if args.cell else None
        grader = task.grader if task else args.grader or MathParams.grader
        penalty = task.format_penalty if task else (
            MathParams.format_penalty if args.format_penalty is None else args.format_penalty)
        score = score_boxed(args.response, args.answer, grader, penalty)
        result: dict[str, Any] = {"reward": score.reward, "parsed": score.parsed}
    else:
        from gridrun.tasks.code import CodeParams, limits_of
        from gridrun.tasks.code_reward import score_program_json
        from gridrun.tasks.sandbox import SandboxConfig, SandboxUnavailable

        task = _cell_task(args.cell, "code", ["--mode"] if args.mode else []) if args.cell else None
        mode = task.code_reward_mode if task else args.mode or CodeParams.code_reward_mode
        isolation: Literal["bwrap", "none"] = "none" if args.no_sandbox or (task and task.sandbox == "none") else "bwrap"
        try:
            result = score_program_json(args.file, args.tests, mode, SandboxConfig(isolation=isolation),
                                        limits_of(task))
        except SandboxUnavailable as err:
            raise UserError(f"{err}; or pass --no-sandbox to run the program unisolated") from None
    print(json.dumps(result))
    return 0


def _val_size(text: str) -> float | int:
    """--val-size: a fraction of the rows ("0.1") or a count of problems ("1000")."""
    try:
        return float(text) if any(c in text for c in ".eE") else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a fraction (0.1) nor a count (1000)") from None


def _cmd_data(args: argparse.Namespace) -> int:
    from gridrun.tasks.data import prepare

    done = prepare(args.task, args.from_path, args.out, seed=args.seed, val_size=args.val_size,
                   test_size=args.test_size)
    dropped = ", ".join(f"{n} {why}" for why, n in done.dropped.items()) or "none"
    print(f"prepared {args.task}: {done.n_train} train, {done.n_val} val, {done.n_test} test (held out from "
          f"training; dropped: {dropped}) in {done.out}")
    print(f"task.data_path={done.out.resolve()}")
    return 0


def _cmd_toy(args: argparse.Namespace) -> int:
    from gridrun.seam.runconfig import ToySpec
    from gridrun.toy.build import SHIPPED, ensure_toy_world, file_hashes, rebuild, shipped_world

    spec = ToySpec() if args.seed is None else ToySpec(seed=args.seed)
    path = rebuild(spec) if args.rebuild else ensure_toy_world(spec)
    shipped = shipped_world(spec)
    info = json.loads((path / "build.json").read_text())
    where = "shipped with gridrun" if path == SHIPPED else "rebuilt" if args.rebuild else "cached"
    print(f"toy world (seed {spec.seed}, {where}): {path}")
    print(f"warm start: {info['steps']} steps, greedy single accuracy {100 * info['accuracy']:.1f}% "
          f"on held-out problems, built in {info['seconds']:.0f} s")
    if args.rebuild and shipped is not None:
        same = file_hashes(path) == file_hashes(shipped)
        print("the rebuild is byte-identical to the shipped world" if same else
              "the rebuild differs from the shipped world in its bytes (another CPU's float32 kernels sum in "
              "another order); cells keep using the shipped world")
    return 0


def _cmd_plot(args: argparse.Namespace) -> int:
    from gridrun.analysis.paper_figures import plot_cell
    from gridrun.grid.show import find_cell
    from gridrun.grid.sweepdir import results_root

    conf = _conf_arg(args.conf, "plot")
    print(plot_cell(find_cell(args.cell, results_root(args.results_dir), conf).require()))
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from gridrun.export import MergeWriter, export
    from gridrun.grid.show import find_cell
    from gridrun.grid.sweepdir import results_root

    conf = _conf_arg(args.conf, "export")
    merge: MergeWriter | None = None
    if args.merged:
        from gridrun.cellrun import write_merged as merge
    run_dir = find_cell(args.cell, results_root(args.results_dir), conf).require()  # its config as planned
    print(export(run_dir, args.step, Path(args.out) if args.out else None, merge=merge))
    return 0


def _conf_arg(args: list[str], command: str) -> str | None:
    """The sweep of `conf=SWEEP`, the only extra argument a one-cell command takes."""
    conf = None
    for arg in args:
        if not arg.startswith("conf="):
            raise UserError(f"gridrun {command} takes a cell and conf=<sweep>, not '{arg}'")
        conf = arg.split("=", 1)[1]
    return conf


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gridrun", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run one cell (what every job executes)")
    run.add_argument("run_dir", help="a cell directory, results/<sweep>/cells/<cell_id>")
    run.set_defaults(func=_cmd_run)

    reward = sub.add_parser("reward", help="score one response")
    reward_sub = reward.add_subparsers(dest="task", required=True, metavar="TASK")
    cell_help = ("score with this cell's own reward settings (its run dir, results/<sweep>/cells/<id>); "
                 "without it, the run schema's defaults (the released code's)")
    math = reward_sub.add_parser("math", help="last \\boxed{} against the answer")
    math.add_argument("--response", required=True)
    math.add_argument("--answer", required=True)
    math.add_argument("--cell", help=cell_help)
    math.add_argument("--grader", choices=("released", "math_verify"), help="default: released")
    math.add_argument("--format-penalty", type=float, help="the reward without a box; default: 0.0")
    code = reward_sub.add_parser("code", help="run a program against stdin/stdout or function-call tests")
    code.add_argument("--file", required=True, help="the program (PROG.py)")
    code.add_argument("--tests", required=True, help='JSON list of {"input": ..., "output": ...}')
    code.add_argument("--cell", help=cell_help)
    code.add_argument("--mode", choices=("pass_rate", "all_pass"), help="default: all_pass")
    code.add_argument("--no-sandbox", action="store_true",
                      help="run the program WITHOUT isolation (trusted code only): it can read, write, "
                      "kill and connect to whatever you can; the result's flags say unsandboxed")
    reward.set_defaults(func=_cmd_reward)

    data = sub.add_parser("data", help="prepare a task's data set for training")
    data_sub = data.add_subparsers(dest="action", required=True, metavar="ACTION")
    data_prepare = data_sub.add_parser(
        "prepare", help="download (or read --from), validate and split; writes {train,val,test}.jsonl + meta.json")
    data_prepare.add_argument("task", choices=("math", "code"))
    data_prepare.add_argument("--from", dest="from_path", metavar="PATH",
                              help="a local .parquet/.jsonl file or folder instead of the hub")
    data_prepare.add_argument("--out", metavar="DIR", help="output folder (default: data/<task>)")
    data_prepare.add_argument("--seed", type=int, default=42, help="split seed (default: 42, the paper's)")
    data_prepare.add_argument("--val-size", type=_val_size, default=None,
                              help="held out: a fraction or a count (default: 0.1 math, 1000 code)")
    data_prepare.add_argument("--test-size", type=int, default=None,
                              help="test problems held out from training (default: as many as val holds)")
    data.set_defaults(func=_cmd_data)

    toy = sub.add_parser("toy", help="the toy world (scale=toy): build it ahead of time, or find it in the cache")
    toy_sub = toy.add_subparsers(dest="action", required=True, metavar="ACTION")
    toy_build = toy_sub.add_parser(
        "build", help="find the toy world (the default one ships with gridrun; others are built once and cached)"
    )
    toy_build.add_argument("--seed", type=int, help="the toy world's seed (model.toy.seed; default: the recipe's)")
    toy_build.add_argument("--rebuild", action="store_true",
                           help="build it afresh from its recipe into the cache and compare it with the shipped world")
    toy.set_defaults(func=_cmd_toy)

    plot = sub.add_parser(
        "plot", help="Fig. 6 for one cell: per-role diagnostics over its first values, validation vs its twin")
    plot.add_argument("cell", help="a cell id (voting-ip-1.7b-math-s0) or a cell directory")
    plot.add_argument("conf", nargs="*", metavar="conf=SWEEP", help="the sweep, when the id is in several")
    plot.add_argument("--results-dir", metavar="DIR", help="results root (default: $GRIDRUN_RESULTS or ./results)")
    plot.set_defaults(func=_cmd_plot)

    export = sub.add_parser(
        "export", help="a cell's adapters at a step as standard peft folders, a model card and the role map")
    export.add_argument("cell", help="a cell id (voting-ip-1.7b-math-s0) or a cell directory")
    export.add_argument("conf", nargs="*", metavar="conf=SWEEP", help="the sweep, when the id is in several")
    export.add_argument("--step", default="peak", metavar="peak|last|N",
                        help="the peak validation's checkpoint (default), the newest one, or step N")
    export.add_argument("--out", metavar="DIR", help="where to write (default: <cell dir>/exports/step_XXXXXX)")
    export.add_argument("--merged", action="store_true",
                        help="also write the base model with the adapter merged in (cells with one adapter)")
    export.add_argument("--results-dir", metavar="DIR", help="results root (default: $GRIDRUN_RESULTS or ./results)")
    export.set_defaults(func=_cmd_export)

    # The orchestration half (plan, sweep, fetch, status, resubmit, cancel, canary, preflight,
    # show), then the analysis (collect).
    from gridrun.analysis.commands import add_commands as add_analysis_commands
    from gridrun.grid.commands import add_commands as add_grid_commands

    add_grid_commands(sub)
    add_analysis_commands(sub)
    return parser


# The `train` extra (pyproject.toml): what the trainer imports and a plain `pip install .`
# (the grid half, for a login node) leaves out.
TRAIN_STACK = ("torch", "transformers", "peft", "tokenizers", "safetensors", "wandb", "datasets")


def missing_train_stack(err: ModuleNotFoundError, command: str) -> str | None:
    """The one line for a command that reached the trainer without its packages installed;
    None when the missing module is not one of them."""
    module = (err.name or "").split(".")[0]
    if module not in TRAIN_STACK:
        return None
    # gridrun is installed from its checkout (it is not on PyPI).
    return (f"gridrun {command} needs the training stack ({module} is not installed): in gridrun's checkout, "
            "pip install -e '.[train]' (or make install; make install-cluster on a GPU cluster)")


def main(argv: list[str] | None = None) -> int:
    _setup_logging()
    args = build_parser().parse_args(argv)
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # here, where a reader gone early is caught, not at the interpreter's exit
        return code
    except BrokenPipeError:
        # A reader that stopped early (`gridrun status --json | head`): not an error of ours.
        # stdout goes to /dev/null so that Python's flush at exit does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # the shell's code for SIGPIPE
    except (UserError, FileNotFoundError) as err:
        print(f"gridrun: error: {err}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:
        message = missing_train_stack(err, " ".join(filter(None, (args.command, getattr(args, "action", None)))))
        if message is None:
            raise
        print(f"gridrun: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
