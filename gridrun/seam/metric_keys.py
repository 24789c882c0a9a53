"""The metrics vocabulary: how a per-role (or per-adapter) metric's key is spelled in
metrics.jsonl, cells.parquet and the tables, built and parsed here only.

    role/<role>/<metric>          a training step's per-role metric (loss, chi2, tokens, ...)
    adapter/<adapter>/<metric>    the same per adapter (Shared-Policy's one adapter)
    val/<key>                     a validation row's metric (val/role/<role>/acc, val/acc)

Both halves import it (the trainer writes the keys, collect reads them): standard library only.
Left out: which metrics exist (their writers: gridrun/train/update.py, diagnostics.py,
validate.py and the workflows' own metrics).
"""

from __future__ import annotations

import re

ROLE = "role"
ADAPTER = "adapter"
VAL = "val"
# Every validation metric of a role starts with it: `val/role/`.
VAL_ROLE = f"{VAL}/{ROLE}/"
_ROLE_KEY = re.compile(rf"^{ROLE}/([^/]+)/([^/]+)$")
_ADAPTER_KEY = re.compile(rf"^{ADAPTER}/([^/]+)/([^/]+)$")


def role_prefix(role: str) -> str:
    """`role/<role>/`: every metric of the role starts with it."""
    return f"{ROLE}/{role}/"


def role_key(role: str, metric: str) -> str:
    """`role/<role>/<metric>`."""
    return role_prefix(role) + metric


def adapter_prefix(adapter: str) -> str:
    """`adapter/<adapter>/`: every metric of the adapter starts with it."""
    return f"{ADAPTER}/{adapter}/"


def adapter_key(adapter: str, metric: str) -> str:
    """`adapter/<adapter>/<metric>`."""
    return adapter_prefix(adapter) + metric


def val_key(key: str) -> str:
    """A metric as a validation row names it: `val/<key>`."""
    return f"{VAL}/{key}"


def parse_role_key(key: str) -> tuple[str, str] | None:
    """(role, metric) of a `role/<role>/<metric>` key, None for any other key."""
    match = _ROLE_KEY.match(key)
    return (match.group(1), match.group(2)) if match else None


def parse_adapter_key(key: str) -> tuple[str, str] | None:
    """(adapter, metric) of an `adapter/<adapter>/<metric>` key, None for any other key."""
    match = _ADAPTER_KEY.match(key)
    return (match.group(1), match.group(2)) if match else None
