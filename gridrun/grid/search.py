"""Where sweeps and config groups come from: the user's folder first, then gridrun's own.

gridrun ships its Hydra groups (gridrun/conf/) and sweeps (gridrun/sweeps/) inside the package.
A user adds their own beside their work, laid out the same way, as a Hydra app's search path:

    ./sweeps/<name>.yaml                  conf=<name> plans it
    ./conf/<group>/<option>.yaml          <group>=<option> composes it (a cluster profile, ...)

The user's folder is the working directory, or the one named by `--config-dir DIR` (any grid
command) or $GRIDRUN_CONFIG_DIR. A file there of the same name as a shipped one wins, and a
one-line notice on stderr says so (once per file and process).

Left out: composing (compose.py builds Hydra's search path from `conf_dirs`); reading a sweep
file (spec.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from gridrun.grid import PACKAGE_DIR
from gridrun.grid.errors import GridError

ENV = "GRIDRUN_CONFIG_DIR"
SHIPPED_CONF = PACKAGE_DIR / "conf"
SHIPPED_SWEEPS = PACKAGE_DIR / "sweeps"
_announced: set[Path] = set()


def user_root() -> Path:
    """The user's folder: $GRIDRUN_CONFIG_DIR (set by --config-dir too), else the working directory."""
    named = os.environ.get(ENV)
    if not named:
        return Path.cwd()
    root = Path(named).expanduser()
    if not root.is_dir():
        raise GridError(f"{ENV}={named} (or --config-dir) is not a folder: name one holding conf/ or sweeps/")
    return root


def set_user_root(path: str) -> None:
    """--config-dir: the user's folder for this process and the cells it starts."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise GridError(f"--config-dir {path} is not a folder: name one holding conf/<group>/ or sweeps/")
    os.environ[ENV] = str(root.resolve())


def _with_user(sub: str, shipped: Path) -> list[Path]:
    """[the user's <sub>/ when it exists and is not the shipped one, the shipped folder]."""
    own = user_root() / sub
    if own.is_dir() and own.resolve() != shipped.resolve():
        return [own, shipped]
    return [shipped]


def conf_dirs(shipped: Path = SHIPPED_CONF) -> list[Path]:
    """Config-group folders, first wins."""
    return _with_user("conf", shipped)


def sweep_dirs(shipped: Path = SHIPPED_SWEEPS) -> list[Path]:
    """Sweep folders, first wins."""
    return _with_user("sweeps", shipped)


def find(dirs: list[Path], relative: str) -> Path | None:
    """The first `dir/relative` that is a file; announces it when it hides a later one."""
    found = [d / relative for d in dirs if (d / relative).is_file()]
    if not found:
        return None
    if len(found) > 1:
        announce(found[0], found[-1])
    return found[0]


def announce(own: Path, shipped: Path) -> None:
    """The one-line notice that the user's file is used instead of gridrun's."""
    if own in _announced:
        return
    _announced.add(own)
    try:
        theirs = str(shipped.relative_to(PACKAGE_DIR))
    except ValueError:
        theirs = str(shipped)
    print(f"gridrun: note: using your {display(own)} instead of gridrun's shipped {theirs}", file=sys.stderr)


def display(path: Path) -> str:
    """A path as the user would type it: relative to the working directory when below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, RuntimeError, OSError):  # elsewhere, or a symlink loop that resolves to nothing
        return str(path)
