"""The one base class of the errors a user can fix.

A `UserError` says in one line what is wrong and the command or setting that fixes it;
gridrun prints it as `gridrun: error: <line>` with no traceback and exits 2, and a cell's run
records the line in state.json. Every such error in both halves derives from it (a bad
config key, a damaged or locked run dir, a sweep file's typo, a missing sandbox, data or
GPU), so each catch site names this class alone. A bug is never one: its traceback is kept.
"""

from __future__ import annotations


class UserError(Exception):
    """An error the user can fix; printed as one line, no traceback."""
