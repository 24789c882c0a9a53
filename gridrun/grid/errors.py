"""The grid's one exception type (a mistake the user can fix, printed as one line), the
closest-match hint its messages carry, and the one-line message for a disk that refuses a
write (full, read-only, not ours)."""

from __future__ import annotations

import difflib
import errno
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from gridrun.seam.errors import UserError
from gridrun.seam.runconfig import ConfigError, from_dict
from gridrun.seam.rundir import disk_error as write_error

T = TypeVar("T")

_FULL = (
    "free space there (or pass --results-dir on another disk), then re-run the same command: "
    "every cell resumes from its newest checkpoint"
)
_FULL_OUTPUTS = "free space there (or pass --results-dir on another disk), then re-run the same command"
_NOT_OURS = "pass --results-dir <a directory you can write>, or fix its permissions"
# errno -> the fix, for the errors of a results root that cannot take a write.
_DISK_FIXES = {
    errno.ENOSPC: _FULL,
    errno.EDQUOT: _FULL,
    errno.EROFS: "pass --results-dir <a writable directory>",
    errno.EACCES: _NOT_OURS,
    errno.EPERM: _NOT_OURS,
    errno.ENOTDIR: "a part of that path is a file, not a directory: pass --results-dir <a directory>",
}


class GridError(UserError):
    """Bad input or a refused action; the message says what to do instead."""


def closest(word: str, options: Sequence[str]) -> str:
    """' (did you mean 'x'?)' when a close match exists, else ' (valid: a, b, c)' for a
    short list, else nothing."""
    match = difflib.get_close_matches(word, list(options), n=1, cutoff=0.5)
    if match:
        return f" (did you mean '{match[0]}'?)"
    return f" (valid: {', '.join(options)})" if len(options) <= 12 else ""


def checked(cls: type[T], data: dict[str, Any], prefix: str, where: str) -> T:
    """Dataclass `cls` built from a user-written node by the run schema's rules; a bad key or
    value is a GridError naming it and `where` to fix it."""
    try:
        return from_dict(cls, data, prefix)
    except ConfigError as err:
        raise GridError(f"{err}: fix {where}") from None


def option_file(group: str, node: Mapping[str, Any]) -> str:
    """The option file a node came from, as its own `name:` says (without the composition at
    hand, as in sweep.json)."""
    return f"the conf/{group}/ file of {group} '{node.get('name')}'"


def disk_error(err: OSError, runs_cells: bool = True) -> str | None:
    """One line naming the path, the reason and the fix, for an error of the disk; None for
    other errors (a bug, shown with its traceback). `runs_cells`: the command plans or runs
    cells (a full disk's fix then says they resume); collect's outputs are rebuilt whole."""
    fixes = _DISK_FIXES if runs_cells else {**_DISK_FIXES, errno.ENOSPC: _FULL_OUTPUTS, errno.EDQUOT: _FULL_OUTPUTS}
    return write_error(err, fixes)
