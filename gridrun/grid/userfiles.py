"""YAML a user wrote (a sweep file, an option file in their conf/), read within bounds before
Hydra or the sweep reader constructs anything: at most MAX_BYTES, MAX_DEPTH deep, MAX_ALIASES
aliases (an alias bomb never expands), YAML's standard tags only (no `!!python/...` object),
readable at all (not a symlink loop or a folder), and an option file with the `# @package`
line its group's shipped options carry (without it Hydra puts its keys at the config's root).
Each refusal is one GridError naming the file and the line. gridrun's shipped files are trusted.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from gridrun.grid.errors import GridError

MAX_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_ALIASES = 64
STANDARD_TAG = "tag:yaml.org,2002:"
_PYTHON_TAG = STANDARD_TAG + "python/"


def read_checked(path: Path) -> str:
    """The text of a user's YAML file, after the checks above."""
    try:
        if not path.is_file():
            raise GridError(f"{path} is not a readable file (a folder, a broken link or a symlink loop?): fix or remove it")
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise GridError(f"{path} is {size:,} bytes, more than a config holds ({MAX_BYTES:,} at most): fix the file")
        text = path.read_bytes().decode("utf-8")
    except OSError as err:
        raise GridError(f"{path} cannot be read ({err.strerror}): fix or remove it") from None
    except UnicodeDecodeError:
        raise GridError(f"{path} is not UTF-8 text: fix the file") from None
    check_events(path, text)
    return text


def check_events(path: Path, text: str) -> None:
    """Walk the file's YAML events (nothing is constructed) and refuse what the bounds refuse."""
    depth = aliases = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            where = f"{path}:{event.start_mark.line + 1}" if event.start_mark else str(path)
            tag = getattr(event, "tag", None)
            if tag and (tag.startswith(_PYTHON_TAG) or (tag.startswith("!") and not tag.startswith("!!"))
                        or (tag.startswith("tag:") and not tag.startswith(STANDARD_TAG))):
                raise GridError(f"{where}: the tag {tag} makes an object, which a config never holds: remove it")
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    raise GridError(f"{where}: nested more than {MAX_DEPTH} deep: fix the file")
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
            elif isinstance(event, yaml.AliasEvent):
                aliases += 1
                if aliases > MAX_ALIASES:
                    raise GridError(f"{where}: more than {MAX_ALIASES} aliases (*name): write the values out")
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or err.__class__.__name__
        raise GridError(f"{path}{line} is not valid YAML ({problem}): fix the file") from None


def package_line(text: str) -> str | None:
    """The `# @package <where>` line Hydra reads from a file's header, None without one."""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped.startswith("#"):
            return None
        if stripped.lstrip("# ").startswith("@package"):
            return " ".join(stripped.lstrip("# ").split())
    return None


def check_option_files(user_conf: Path, shipped_conf: Path) -> None:
    """Every option file of the user's conf/ (in a group gridrun ships) read within bounds,
    with the package line its group's shipped options have."""
    for group in sorted(p for p in shipped_conf.iterdir() if p.is_dir()):
        own = user_conf / group.name
        if not own.is_dir():
            continue
        expected = {package_line(f.read_text()) for f in group.glob("*.yaml")}
        for path in sorted(own.glob("*.yaml")):
            text = read_checked(path)
            if len(expected) == 1 and (want := next(iter(expected))) and package_line(text) != want:
                raise GridError(f"{path} lacks the line `# {want}` that every {group.name} option starts with: add it "
                                "as its first line")
            shipped = group / path.name
            if shipped.is_file():
                _check_same_name(path, text, shipped)


def _check_same_name(path: Path, text: str, shipped: Path) -> None:
    """A user's file in place of a shipped option keeps that option's `name:`: cells are filed
    by the option chosen (`policy=shared` makes -sp- ids), so another name would file one
    policy's cells under another's."""
    def name_of(source: str) -> object:
        data = yaml.safe_load(source)
        return data.get("name") if isinstance(data, dict) else None

    ours, theirs = name_of(text), name_of(shipped.read_text())
    if theirs is not None and ours is not None and ours != theirs:
        raise GridError(f"{path} says name: {ours}, but {path.parent.name}={path.stem} is gridrun's '{theirs}': rename "
                        f"your file (e.g. {path.parent.name}/my_{path.stem}.yaml) or set name: {theirs}")
