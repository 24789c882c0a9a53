"""`gridrun`: the command line. Subcommands import their half lazily, so `gridrun status`
never loads torch and `gridrun run` never loads Hydra."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path


def _setup_logging() -> None:
    level = os.environ.get("GRIDRUN_LOG", "INFO").upper()
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    logging.getLogger("gridrun").setLevel(level)


def _cmd_run(args: argparse.Namespace) -> int:
    from gridrun.grid.errors import disk_error
    from gridrun.rundir import RunDir

    RunDir(args.run_dir).require()  # fail fast, before torch is imported
    from gridrun.cellrun import run_cell

    try:
        return run_cell(Path(args.run_dir))
    except OSError as err:
        # The run dir's disk is full or read-only before the run could record anything.
        message = disk_error(err)
        if message is None:
            raise
        raise UserError(message) from None


def _cmd_reward(args: argparse.Namespace) -> int:
    if args.task == "math":
        from gridrun.tasks.math_reward import score_math_json

        result = score_math_json(args.response, args.answer)
    else:
        from gridrun.tasks.code_reward import CodeInputError, score_program_json
        from gridrun.tasks.sandbox import SandboxConfig, SandboxUnavailable

        sandbox = SandboxConfig(isolation="none" if args.no_sandbox else "bwrap")
        try:
            result = score_program_json(args.file, args.tests, args.mode, sandbox)
        except CodeInputError as err:
            raise UserError(str(err)) from None
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
    from gridrun.tasks.data import DataError, prepare

    try:
        done = prepare(args.task, args.from_path, args.out, seed=args.seed, val_size=args.val_size)
    except DataError as err:
        raise UserError(str(err)) from None
    dropped = ", ".join(f"{n} {why}" for why, n in done.dropped.items()) or "none"
    print(f"prepared {args.task}: {done.n_train} train, {done.n_val} val (dropped: {dropped}) in {done.out}")
    print(f"task.data_path={done.out.resolve()}")
    return 0


def _cmd_toy(args: argparse.Namespace) -> int:
    from gridrun.runconfig import ToySpec
    from gridrun.toy.build import ensure_toy_world

    spec = ToySpec() if args.seed is None else ToySpec(seed=args.seed)
    path = ensure_toy_world(spec)
    info = json.loads((path / "build.json").read_text())
    print(f"toy world (seed {spec.seed}): {path}")
    print(f"warm start: {info['steps']} steps, greedy single accuracy {100 * info['accuracy']:.1f}% "
          f"on held-out problems, built in {info['seconds']:.0f} s")
    return 0


def _cmd_plot(args: argparse.Namespace) -> int:
    from gridrun.grid.analysis.figures import plot_cell
    from gridrun.grid.errors import GridError
    from gridrun.grid.show import find_cell
    from gridrun.grid.sweepdir import results_root

    conf = _conf_arg(args.conf, "plot")
    try:
        path = plot_cell(find_cell(args.cell, results_root(args.results_dir), conf))
    except GridError as err:
        raise UserError(str(err)) from None
    print(path)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from gridrun.export import ExportError, export
    from gridrun.grid.errors import GridError
    from gridrun.grid.show import find_cell
    from gridrun.grid.sweepdir import results_root

    conf = _conf_arg(args.conf, "export")
    try:
        run_dir = find_cell(args.cell, results_root(args.results_dir), conf)
        out = export(run_dir, args.step, Path(args.out) if args.out else None, merged=args.merged)
    except (GridError, ExportError) as err:
        raise UserError(str(err)) from None
    print(out)
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
    math = reward_sub.add_parser("math", help="last \\boxed{} against the answer, with math-verify")
    math.add_argument("--response", required=True)
    math.add_argument("--answer", required=True)
    code = reward_sub.add_parser("code", help="run a program against stdin/stdout or function-call tests")
    code.add_argument("--file", required=True, help="the program (PROG.py)")
    code.add_argument("--tests", required=True, help='JSON list of {"input": ..., "output": ...}')
    code.add_argument("--mode", choices=("pass_rate", "all_pass"), default="pass_rate")
    code.add_argument("--no-sandbox", action="store_true",
                      help="run the program WITHOUT isolation (trusted code only): it can read, write, "
                      "kill and connect to whatever you can; the result's flags say unsandboxed")
    reward.set_defaults(func=_cmd_reward)

    data = sub.add_parser("data", help="prepare a task's data set for training")
    data_sub = data.add_subparsers(dest="action", required=True, metavar="ACTION")
    data_prepare = data_sub.add_parser(
        "prepare", help="download (or read --from), validate and split; writes {train,val}.jsonl + meta.json")
    data_prepare.add_argument("task", choices=("math", "code"))
    data_prepare.add_argument("--from", dest="from_path", metavar="PATH",
                              help="a local .parquet/.jsonl file or folder instead of the hub")
    data_prepare.add_argument("--out", metavar="DIR", help="output folder (default: data/<task>)")
    data_prepare.add_argument("--seed", type=int, default=42, help="split seed (default: 42, the paper's)")
    data_prepare.add_argument("--val-size", type=_val_size, default=None,
                              help="held out: a fraction or a count (default: 0.1 math, 1000 code)")
    data.set_defaults(func=_cmd_data)

    toy = sub.add_parser("toy", help="the toy world (scale=toy): build it ahead of time, or find it in the cache")
    toy_sub = toy.add_subparsers(dest="action", required=True, metavar="ACTION")
    toy_build = toy_sub.add_parser("build", help="build (once, cached by recipe hash) and print where it is")
    toy_build.add_argument("--seed", type=int, help="the toy world's seed (model.toy.seed; default: the recipe's)")
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

    # The orchestration half: plan, sweep, status, resubmit, cancel, collect, show.
    from gridrun.grid.commands import add_commands

    add_commands(sub)
    return parser


class UserError(Exception):
    """An error the user can fix; printed as one line, no traceback."""


def main(argv: list[str] | None = None) -> int:
    _setup_logging()
    args = build_parser().parse_args(argv)
    from gridrun.runconfig import ConfigError
    from gridrun.rundir import DamagedFile, NotARunDir, RunLocked

    try:
        return int(args.func(args) or 0)
    except (UserError, ConfigError, NotARunDir, DamagedFile, RunLocked, FileNotFoundError) as err:
        print(f"gridrun: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
