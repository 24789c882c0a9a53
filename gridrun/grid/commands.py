"""The grid's `gridrun` subcommands: plan, sweep, fetch, status, resubmit, cancel, canary, preflight, show.

Registered into gridrun/cli.py's parser by `add_commands`. Each handler imports what it
needs when it runs, so `gridrun status` loads neither Hydra nor pandas (nor torch), and
`gridrun run` loads none of this. A `GridError`, or a disk that refuses a write (full,
read-only), is printed as one line and exits 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gridrun.grid.console import console as make_console
from gridrun.grid.errors import GridError, closest, disk_error
from gridrun.seam.errors import UserError

Handler = Callable[[argparse.Namespace], int]


def guarded(handler: Handler) -> Handler:
    def run(args: argparse.Namespace) -> int:
        try:
            if getattr(args, "config_dir", None):
                from gridrun.grid.search import set_user_root

                set_user_root(args.config_dir)
            return handler(args)
        except UserError as err:  # GridError and every other error that names its fix
            print(f"gridrun: error: {err}", file=sys.stderr)
            return 2
        except OSError as err:
            message = disk_error(err, runs_cells=args.command in ("plan", "sweep", "resubmit"))
            if message is None:
                raise
            print(f"gridrun: error: {message}", file=sys.stderr)
            return 2

    return run


def conf_only(args: list[str], command: str) -> str | None:
    """The sweep named by `conf=<name or sweep file>` of commands that take no other override."""
    from gridrun.grid.sweepdir import sweep_name

    conf = None
    for arg in args:
        if arg.startswith("conf="):
            conf = sweep_name(arg.split("=", 1)[1])
        else:
            raise GridError(
                f"gridrun {command} takes conf=<sweep> and options, not '{arg}': settings are frozen in the "
                "plan; change them with `gridrun plan conf=<sweep> ... --replace`"
            )
    return conf


def _require_conf(conf: str | None, command: str, results: Path) -> str:
    if conf:
        return conf
    from gridrun.grid.sweepdir import planned_sweeps

    planned = planned_sweeps(results)
    raise GridError(
        f"gridrun {command} needs conf=<sweep>"
        + (f" (planned under {results}: {', '.join(planned)})" if planned else f" (none is planned under {results})")
    )


# --- plan / sweep ------------------------------------------------------------------------------
def _plan(args: argparse.Namespace) -> int:
    from gridrun.grid.canary import CANARY_SWEEP
    from gridrun.grid.compose import Composer
    from gridrun.grid.cost import read_measured_step
    from gridrun.grid.plan import check, freeze, make_plan, plan_table
    from gridrun.grid.spec import command_line, load_spec, split_conf
    from gridrun.grid.sweepdir import SweepDir, results_root

    dispatching = args.command == "sweep"
    conf, overrides = split_conf(args.overrides)
    results = results_root(args.results_dir)
    composer = Composer()
    spec = load_spec(conf, overrides, composer)
    # The last canary's step replaces the cost model's for its cell shape.
    plan = make_plan(spec, composer, read_measured_step(SweepDir(results, CANARY_SWEEP).measured_step_json))
    if getattr(args, "max_parallel", None):
        plan.launcher["max_parallel"] = args.max_parallel
    sweep = SweepDir(results, spec.name)
    console = make_console()
    from gridrun.grid.fetch import check_fetched, model_dirs_of
    from gridrun.grid.templates import check_fetched_templates

    fetch_line = command_line("fetch", conf, overrides, config_dir=args.config_dir)
    # A fetched model's own chat template renders every conversation of its cells.
    check_fetched_templates(plan.cells, model_dirs_of(plan))
    if args.dry_run:
        console.print(plan_table(plan, check(plan, sweep, args.replace), sweep))
        try:
            check_fetched(plan, fetch_line)
        except GridError as err:
            console.print(f"[yellow]not fetched yet: {err}[/]", soft_wrap=True)
        return 0
    # Jobs never download: a cell whose model or data is not here would fail after its queue wait.
    check_fetched(plan, fetch_line)

    from gridrun.grid.launchers.base import make_launcher
    from gridrun.grid.launchers.dispatch import queue, runnable
    from gridrun.seam.cellstate import UNREADABLE_STATES

    launcher = make_launcher(plan.launcher) if dispatching else None
    with sweep.lock():
        done = freeze(plan, sweep, args.replace)
    submitted: list[str] = []
    if launcher is not None:
        to_run = set(runnable(sweep, [pc.id for pc in plan.cells]))
        if launcher.name == "slurm" and not args.no_preflight and to_run:
            # Planned, nothing queued yet: a failing preflight leaves the cells planned.
            _require_preflight(plan, [pc for pc in plan.cells if pc.id in to_run], results, args.preflight_timeout_min)
        with sweep.lock():
            submitted = queue(sweep, runnable(sweep, [pc.id for pc in plan.cells]), launcher)
    console.print(
        f"planned {len(plan.cells)} cells of '{sweep.name}' in {sweep.root}: {len(done.new)} new, "
        f"{len(done.unchanged)} unchanged, {len(done.replaced)} replaced"
        + (f", {len(done.repaired)} repaired (cell.json or config.yaml written again)" if done.repaired else "")
        + ("; its damaged sweep.json was moved aside" if done.sweep_damaged else "")
    )
    if launcher is None:
        run = command_line("sweep", conf, overrides, results_dir=args.results_dir, config_dir=args.config_dir)
        console.print(f"run them with: {run}", highlight=False, soft_wrap=True)
        return 0
    damaged = [pc.id for pc in plan.cells if sweep.cell(pc.id).read_state().state in UNREADABLE_STATES]
    skipped = len(plan.cells) - len(submitted) - len(damaged)
    console.print(
        f"dispatching {len(submitted)} cells with launcher={launcher.name}"
        + (f" (skipping {skipped} done, queued or running)" if skipped else "")
    )
    if damaged:
        console.print(
            f"[red]not dispatching {len(damaged)} damaged cell(s) ({', '.join(damaged[:3])}): "
            f"`gridrun status conf={spec.name}` names each damaged file and its fix[/]"
        )
    console.print(f"watch from another terminal: gridrun status conf={spec.name}" + _results_flag(args))
    return launcher.wait(sweep, submitted)


def _composed_plan(args: argparse.Namespace) -> Any:
    """The plan of `conf=<sweep>` and its overrides on the command line, written nowhere."""
    from gridrun.grid.compose import Composer
    from gridrun.grid.plan import make_plan
    from gridrun.grid.spec import load_spec, split_conf

    conf, overrides = split_conf(args.overrides)
    composer = Composer()
    return make_plan(load_spec(conf, overrides, composer), composer)


def _fetch(args: argparse.Namespace) -> int:
    from gridrun.grid.fetch import fetch, model_dirs_of
    from gridrun.grid.templates import check_fetched_templates

    data_from = {}
    for line in args.data_from or []:
        task, eq, path = line.partition("=")
        if not eq or not task or not path:
            raise GridError(f"--data-from takes TASK=PATH (e.g. math=/shared/dapo-math-17k), not '{line}'")
        data_from[task] = path
    plan = _composed_plan(args)
    console = make_console()
    done = fetch(plan, data_from, console)
    check_fetched_templates(plan.cells, model_dirs_of(plan))
    if not done.fetched:
        console.print(f"nothing to fetch: the {len(plan.cells)} cells of '{plan.spec.name}' load "
                      + (", ".join(done.present) + ", all present" if done.present else "nothing from disk"))
    else:
        console.print(f"fetched {len(done.fetched)}" + (f", {len(done.present)} already present" if done.present else "")
                      + f": the {len(plan.cells)} cells of '{plan.spec.name}' have everything they load")
    return 0


def _require_preflight(plan: Any, cells: list[Any], results: Path, timeout_min: float, cpu_ok: bool = False) -> None:
    """The preflight of these cells of a plan, failing closed: each failure on stderr, then a refusal."""
    from gridrun.grid.preflight import preflight

    print(f"preflight: checking {len(cells)} cell(s) where they will run (launcher={plan.launcher['name']})",
          flush=True)
    failures = preflight(cells, plan.cluster, plan.launcher["name"], results, timeout_min, cpu_ok=cpu_ok)
    for line in failures:
        print(f"preflight: {line}", file=sys.stderr)
    if failures:
        raise GridError(f"the preflight found {len(failures)} problem(s), listed above: nothing was queued; fix them "
                        "(`gridrun preflight conf=<sweep>` checks again), or pass --no-preflight to queue anyway")


def _preflight(args: argparse.Namespace) -> int:
    from gridrun.grid.preflight import preflight
    from gridrun.grid.sweepdir import results_root

    plan = _composed_plan(args)
    results = results_root(args.results_dir)
    failures = preflight(plan.cells, plan.cluster, plan.launcher["name"], results, args.timeout_min,
                         min_free_gb=args.min_free_gb)
    for line in failures:
        print(f"preflight: {line}")
    where = "a job on the cells' partition" if plan.launcher["name"] == "slurm" else "this machine"
    print(f"preflight {'FAILED' if failures else 'ok'}: {len(plan.cells)} cell(s) of '{plan.spec.name}', checked on "
          f"{where}" + (f"; {len(failures)} problem(s)" if failures else ""))
    return 1 if failures else 0


def _canary(args: argparse.Namespace) -> int:
    from gridrun.grid.canary import run_canary
    from gridrun.grid.sweepdir import results_root

    named = {line.split("=", 1)[0]: line.split("=", 1)[1] for line in args.overrides if line.split("=", 1)[0] in ("cluster", "conf")}
    rest = [line for line in args.overrides if line.split("=", 1)[0] not in ("cluster", "conf")]
    check = None if args.no_preflight else _require_preflight
    return run_canary(results_root(args.results_dir), named.get("cluster", "local"), named.get("conf", "full_matrix"),
                      rest, args.cpu, args.timeout_min, check)


def _results_flag(args: argparse.Namespace) -> str:
    return f" --results-dir {args.results_dir}" if args.results_dir else ""


# --- status ----------------------------------------------------------------------------------
def _status(args: argparse.Namespace) -> int:
    from gridrun.grid import status
    from gridrun.grid.sweepdir import SweepDir, planned_sweeps, results_root

    results = results_root(args.results_dir)
    conf = conf_only(args.conf, "status")
    if conf:
        SweepDir(results, conf).read()  # a missing sweep fails here with the fix
    skipped: list[str] = []
    if args.json:
        print(status.to_json(status.sorted_rows(status.all_rows(results, conf, skipped), args.sort)))
        warn_skipped(skipped)
        return 0
    console = make_console()
    if not conf and not planned_sweeps(results):
        console.print(f"no sweep is planned under {results}: start with `gridrun sweep conf=smoke`")
        return 0

    def render() -> Any:
        from rich.console import Group

        skipped.clear()
        rows = status.sorted_rows(status.all_rows(results, conf, skipped), args.sort)
        return Group(*(status.failures(rows) if args.failed else status.tables(rows)))

    if not args.watch:
        console.print(render())
        warn_skipped(skipped)
        return 0
    from rich.live import Live

    try:
        with Live(render(), console=console, refresh_per_second=1, screen=False) as live:
            while True:
                time.sleep(args.interval)
                live.update(render())
    except KeyboardInterrupt:
        return 0


def warn_skipped(skipped: list[str]) -> None:
    """Sweeps left out because their sweep.json is damaged: one line each, on stderr."""
    for message in skipped:
        print(f"gridrun: warning: skipped a sweep: {message}", file=sys.stderr)


# --- resubmit / cancel -----------------------------------------------------------------------
def _selected(rows: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    known = [row["cell"] for row in rows]
    for cell_id in args.cells or []:
        if cell_id not in known:
            raise GridError(f"no cell '{cell_id}' in this sweep{closest(cell_id, known)}")
    wanted = set(args.cells or [])
    if getattr(args, "failed", False):
        wanted |= {row["cell"] for row in rows if row["state"] == "failed"}
    if getattr(args, "preempted", False):
        wanted |= {row["cell"] for row in rows if row["state"] == "preempted"}
    return [cell_id for cell_id in known if cell_id in wanted]


def _resubmit(args: argparse.Namespace) -> int:
    from gridrun.grid.launchers.base import make_launcher
    from gridrun.grid.launchers.dispatch import queue
    from gridrun.grid.status import sweep_rows
    from gridrun.grid.sweepdir import SweepDir, results_root
    from gridrun.seam.cellstate import ACTIVE_STATES, FINISHED_STATES, UNREADABLE_STATES

    results = results_root(args.results_dir)
    sweep = SweepDir(results, _require_conf(conf_only(args.conf, "resubmit"), "resubmit", results))
    data = sweep.read()
    if not (args.failed or args.preempted or args.cells):
        raise GridError("say which cells to resubmit: --failed, --preempted and/or --cells ID ...")
    rows = {row["cell"]: row for row in sweep_rows(sweep)}
    ids = _selected(list(rows.values()), args)
    console = make_console()
    kept = (*FINISHED_STATES, *ACTIVE_STATES, *UNREADABLE_STATES)
    for cell_id in ids:
        state = rows[cell_id]["state"]
        if state in kept:
            why = " (to run it again, re-plan it with --replace)" if state in FINISHED_STATES else ""
            if state in UNREADABLE_STATES:
                why = f": {rows[cell_id]['error']}"
            console.print(f"skip {cell_id}: {state}" + why, highlight=False)
    ids = [cell_id for cell_id in ids if rows[cell_id]["state"] not in kept]
    # Cells stopped by a user (Ctrl-C, SIGTERM, `gridrun cancel`) are not failed: say how to take them.
    cancelled = [cell_id for cell_id, row in rows.items() if row["state"] == "cancelled" and cell_id not in ids]
    if cancelled and (args.failed or args.preempted):
        console.print(f"not resubmitting {len(cancelled)} cancelled cell(s); to resume them too: gridrun resubmit "
                      f"conf={sweep.name} --cells {' '.join(cancelled)}" + _results_flag(args), highlight=False)
    if not ids:
        console.print("nothing to resubmit")
        return 0
    settings = dict(data.launcher)
    if args.max_parallel:
        settings["max_parallel"] = args.max_parallel
    launcher = make_launcher(settings)
    with sweep.lock():
        submitted = queue(sweep, ids, launcher)
    console.print(f"resubmitted {len(submitted)} cells of '{sweep.name}' with launcher={launcher.name}; "
                  "each resumes from its newest complete checkpoint")
    return launcher.wait(sweep, submitted)


def _cancel(args: argparse.Namespace) -> int:
    from gridrun.grid.launchers.base import launcher_class
    from gridrun.grid.status import sweep_rows
    from gridrun.grid.sweepdir import SweepDir, results_root
    from gridrun.seam.cellstate import CellState

    results = results_root(args.results_dir)
    sweep = SweepDir(results, _require_conf(conf_only(args.conf, "cancel"), "cancel", results))
    planned = sweep.read().launcher
    rows = sweep_rows(sweep)
    ids = _selected(rows, args) if args.cells else [row["cell"] for row in rows]
    states = {row["cell"]: row["state"] for row in rows}
    # A blocked cell's job may still wait in the scheduler's queue for a need that failed.
    held = {cell_id for cell_id in ids if states[cell_id] == "blocked"
            and sweep.cell(cell_id).read_state().state == CellState.QUEUED}
    active = [cell_id for cell_id in ids if states[cell_id] in ("queued", "running") or cell_id in held]
    console = make_console()
    for cell_id in args.cells or []:
        if cell_id not in active:
            console.print(f"skip {cell_id}: {states[cell_id]}, not queued or running")
    by_launcher: dict[str, list[str]] = {}
    for cell_id in active:
        by_launcher.setdefault(sweep.cell(cell_id).read_state().launcher or "local", []).append(cell_id)
    with sweep.lock():
        for name, cells in by_launcher.items():
            settings = planned if planned.get("name") == name else {"name": name}
            for line in launcher_class(name)(settings).cancel(sweep, cells):
                console.print(line)
    if not active:
        console.print(f"nothing to cancel in '{sweep.name}'")
    return 0


# --- show ------------------------------------------------------------------------------------
def _show(args: argparse.Namespace) -> int:
    from gridrun.grid.show import find_cell, show
    from gridrun.grid.sweepdir import results_root

    results = results_root(args.results_dir)
    conf = conf_only(args.conf, "show")
    show(find_cell(args.cell, results, conf), make_console())
    return 0


def results_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results-dir", metavar="DIR", help="results root (default: $GRIDRUN_RESULTS or ./results)")


# --- registration ------------------------------------------------------------------------------
def add_commands(sub: Any) -> None:
    """Add the grid's subcommands to gridrun's subparsers."""

    def config_option(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--config-dir", metavar="DIR",
            help="your own sweeps/<name>.yaml and conf/<group>/<option>.yaml, searched before gridrun's shipped ones "
            "(default: $GRIDRUN_CONFIG_DIR or the working directory)",
        )

    def preflight_timeout_option(parser: argparse.ArgumentParser, flag: str) -> None:
        parser.add_argument(flag, type=float, default=30.0, metavar="MIN",
                            help="give up on the preflight job after MIN minutes, queue wait included (default 30)")

    overrides_help = "conf=<sweep> then Hydra overrides: axes (seed=0,1,2, 'seed=range(0,16)') or settings"
    for name, helptext in (
        ("plan", "expand, validate and freeze a sweep's cells; dispatch nothing"),
        ("sweep", "plan a sweep, then dispatch its cells that are not done, queued or running"),
    ):
        parser = sub.add_parser(name, help=helptext, description=helptext)
        parser.add_argument("overrides", nargs="*", metavar="OVERRIDE", help=overrides_help)
        parser.add_argument("--dry-run", action="store_true", help="print the plan and its cost; write nothing")
        parser.add_argument("--replace", action="store_true", help="re-plan cells whose config changed")
        if name == "sweep":
            parser.add_argument("--max-parallel", type=int, metavar="N", help="cells running at once (local)")
            parser.add_argument("--no-preflight", action="store_true",
                                help="queue without the preflight job a SLURM sweep runs first")
            preflight_timeout_option(parser, "--preflight-timeout-min")
        results_option(parser)
        config_option(parser)
        parser.set_defaults(func=guarded(_plan))

    fetch = sub.add_parser(
        "fetch", help="put every model and data set a sweep's cells load where its jobs read them (on a login node)",
        description="download each cell's model by hub id into the hub cache ($HF_HOME) and prepare each task's "
                    "data at its task.data_path; what is present is left alone")
    fetch.add_argument("overrides", nargs="*", metavar="OVERRIDE", help=overrides_help)
    fetch.add_argument("--data-from", action="append", metavar="TASK=PATH",
                       help="prepare TASK's data from a local copy (as `gridrun data prepare TASK --from PATH`)")
    config_option(fetch)
    fetch.set_defaults(func=guarded(_fetch))

    status = sub.add_parser("status", help="a table of every cell's state (fast; works while a sweep runs)")
    status.add_argument("conf", nargs="*", metavar="conf=SWEEP", help="one sweep (default: every sweep)")
    status.add_argument("--watch", action="store_true", help="redraw until Ctrl-C")
    status.add_argument("--interval", type=float, default=2.0, help="seconds between redraws (--watch)")
    status.add_argument("--failed", action="store_true", help="only failed cells, with their error tails")
    status.add_argument("--json", action="store_true", help="a JSON list of cells instead of the table")
    status.add_argument("--sort", choices=("plan", "delta"), default="plan",
                        help="the plan's order (default), or by Δ vs base: peak minus the base control, largest first")
    results_option(status)
    status.set_defaults(func=guarded(_status))

    resubmit = sub.add_parser("resubmit", help="dispatch cells again; they resume from their newest checkpoint")
    resubmit.add_argument("conf", nargs="*", metavar="conf=SWEEP")
    resubmit.add_argument("--failed", action="store_true", help="every failed cell (including lost ones)")
    resubmit.add_argument("--preempted", action="store_true", help="every preempted cell")
    resubmit.add_argument("--cells", nargs="+", metavar="ID", help="these cells")
    resubmit.add_argument("--max-parallel", type=int, metavar="N", help="cells running at once (local)")
    results_option(resubmit)
    resubmit.set_defaults(func=guarded(_resubmit))

    cancel = sub.add_parser("cancel", help="stop queued and running cells (all of the sweep's, or --cells)")
    cancel.add_argument("conf", nargs="*", metavar="conf=SWEEP")
    cancel.add_argument("--cells", nargs="+", metavar="ID", help="only these cells")
    results_option(cancel)
    cancel.set_defaults(func=guarded(_cancel))

    canary = sub.add_parser(
        "canary", help="first job on a new cluster: one short cell of the paper's shape, per-rank devices and rates, "
                       "a go/no-go line with the sweep's projected node-days")
    canary.add_argument("overrides", nargs="*", metavar="OVERRIDE",
                        help="cluster=<profile> (default local), conf=<sweep to project> (default full_matrix), "
                             "then Hydra overrides of the canary cell")
    cpu = canary.add_mutually_exclusive_group()
    cpu.add_argument("--cpu", dest="cpu", action="store_true", default=None,
                     help="run the cell on a random-init model cut to CPU size (default with cluster=local and no "
                          "NVIDIA GPU)")
    cpu.add_argument("--gpu", dest="cpu", action="store_false", help="run the real shape even where no GPU is seen")
    canary.add_argument("--timeout-min", type=float, default=60.0, metavar="MIN",
                        help="cancel a scheduler's canary not finished after MIN minutes (default 60)")
    canary.add_argument("--no-preflight", action="store_true", help="submit without the preflight check first")
    results_option(canary)
    canary.set_defaults(func=guarded(_canary))

    check = sub.add_parser(
        "preflight", help="check where a sweep's cells will run (a tiny job on their SLURM partition): venv, torch/CUDA, "
                          "vLLM, one GPU per task, the sandbox, models and data, disk; one line per problem")
    check.add_argument("overrides", nargs="*", metavar="OVERRIDE", help="conf=<sweep> and Hydra overrides, as for plan")
    preflight_timeout_option(check, "--timeout-min")
    check.add_argument("--min-free-gb", type=float, default=0.0, metavar="GB",
                       help="free disk the results root must have at least (default: the checkpoints' estimate)")
    results_option(check)
    config_option(check)
    check.set_defaults(func=guarded(_preflight))

    show = sub.add_parser("show", help="a cell's resolved config and state")
    show.add_argument("cell", help="a cell id (voting-ip-1.7b-math-s0) or a cell directory")
    show.add_argument("conf", nargs="*", metavar="conf=SWEEP", help="the sweep, when the id is in several")
    results_option(show)
    config_option(show)
    show.set_defaults(func=guarded(_show))
