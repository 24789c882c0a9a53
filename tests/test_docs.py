"""The user docs (README.md and docs/*.md) name only what exists: every `gridrun` subcommand
and flag (from the CLI's argparse parser), config group option (`preset=`, `engine=`, ...:
the option files under the config dir), sweep (`conf=<name>`, `sweeps/<name>.yaml`: the sweep
files), `make` target (the Makefile's rules), repository path and test function they name,
and every relative link (its file, and its heading). Only code (inline spans and fenced blocks) is read:
prose may say "make" or "task". Placeholders (`<sweep>`, `{cell}`, `XXXXXX`) are skipped.
bench/measured/ is history and is not checked."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gridrun.cli import build_parser
from gridrun.grid.compose import CONF_DIR
from gridrun.grid.search import SHIPPED_SWEEPS as SWEEPS_DIR

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# Top-level folders of the repository whose paths the docs may name.
PATH_ROOTS = ("gridrun", "conf", "sweeps", "tests", "bench", "slurm", "scripts", "docs", ".ci")
# Package data: `conf/x`, `sweeps/x` and `slurm/x` name gridrun's shipped files (gridrun/conf/...,
# found after a user's own: gridrun/grid/search.py); slurm/testcluster/ stays in the repository.
PACKAGE_DATA_ROOTS = ("conf", "sweeps", "slurm")
PLACEHOLDER = re.compile(r"[<>*]|\{(?![\w.-]+,)|XXXXXX|\.\.\.")


@dataclass
class Known:
    """What exists, read from the code: the CLI's parsers, the config groups, the sweeps, the
    Makefile's targets."""

    parser: argparse.ArgumentParser
    groups: dict[str, set[str]] = field(default_factory=dict)
    sweeps: set[str] = field(default_factory=set)
    targets: set[str] = field(default_factory=set)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def known() -> Known:
    groups = {d.name: {f.stem for f in d.glob("*.yaml")} for d in CONF_DIR.iterdir() if d.is_dir()}
    makefile = (REPO / "Makefile").read_text()
    return Known(
        parser=build_parser(),
        groups={g: opts for g, opts in groups.items() if opts},
        sweeps={f.stem for f in SWEEPS_DIR.glob("*.yaml")},
        targets=set(re.findall(r"^([a-z0-9][\w-]*):", makefile, re.MULTILINE)),
    )


FENCES = re.compile(r"^[ \t]*```[^\n]*\n(.*?)^[ \t]*```", re.MULTILINE | re.DOTALL)
SPANS = re.compile(r"`([^`]+)`")


def code_of(text: str) -> Iterator[str]:
    """The fenced blocks' lines, then the inline code spans (a span may wrap a line)."""
    for block in FENCES.findall(text):
        yield from block.splitlines()
    for span in SPANS.findall(FENCES.sub("", text)):
        yield span.replace("\n", " ")


def _expand(path: str) -> list[str]:
    """`a/{x,y}.json` -> a/x.json, a/y.json (one brace)."""
    match = re.search(r"\{([^{}]+,[^{}]+)\}", path)
    if not match:
        return [path]
    return [path[: match.start()] + alt + path[match.end() :] for alt in match.group(1).split(",")]


def check_commands(code: str, k: Known) -> Iterator[str]:
    for segment in re.split(r"&&|;|\n|#", code):
        match = re.search(r"(?<![\w./-])gridrun\s+([a-z][\w-]*)(.*)", segment)
        if not match or re.search(r"\b(from|import)\s+gridrun\s", segment):
            continue
        name, rest = match.group(1), match.group(2)
        commands = _subparsers(k.parser)
        if name not in commands:
            yield f"`gridrun {name}`: no such command (the CLI has {', '.join(sorted(commands))})"
            continue
        parser = commands[name]
        words = rest.split()
        nested = _subparsers(parser)
        if nested and words and not PLACEHOLDER.search(words[0]) and not words[0].startswith("-"):
            for word in words[0].split("|"):
                if word not in nested:
                    yield f"`gridrun {name} {word}`: no such command (it has {', '.join(sorted(nested))})"
            if words[0] in nested:
                parser = nested[words[0]]
        flags = {s for action in parser._actions for s in action.option_strings}
        for flag in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", rest):
            if flag not in flags:
                yield f"`gridrun {name} ... {flag}`: no such option (it has {', '.join(sorted(flags))})"


def check_names(code: str, k: Known) -> Iterator[str]:
    for group, value in re.findall(r"(?<![\w.+/-])([A-Za-z_]+)=([\w.,/-]+)", code):
        if group == "conf" and ("/" in value or value.endswith((".yaml", ".yml"))):
            continue  # conf=<path to a sweep file>: a file of the user's
        if group in k.groups:
            for option in value.split(","):
                if option and option not in k.groups[group]:
                    yield f"`{group}={option}`: no option {option} in conf/{group}/ ({', '.join(sorted(k.groups[group]))})"
        elif group in ("conf", "SWEEP"):
            for sweep in value.split(","):
                if sweep not in k.sweeps:
                    yield f"`{group}={sweep}`: no sweeps/{sweep}.yaml ({', '.join(sorted(k.sweeps))})"
    for sweep in re.findall(r"(?<![\w/])sweeps/([\w-]+)\.yaml", code):
        if sweep not in k.sweeps:
            yield f"`sweeps/{sweep}.yaml` does not exist"
    for target in re.findall(r"(?<![\w/.-])make\s+([a-z0-9][\w-]*)", code):
        if target not in k.targets:
            yield f"`make {target}`: the Makefile has no such target"


def check_paths(code: str, repo: Path) -> Iterator[str]:
    roots = "|".join(re.escape(r) for r in PATH_ROOTS)
    for path in re.findall(rf"(?<![\w./~-])((?:{roots})/[\w./{{}},<>*-]*)", code):
        path = path.rstrip(".,")
        if PLACEHOLDER.search(path):
            continue
        for one in _expand(path):
            shipped = one.split("/")[0] in PACKAGE_DATA_ROOTS and (repo / "gridrun" / one).exists()
            if not (repo / one).exists() and not shipped:
                yield f"`{one}` does not exist"


def check_tests(text: str, repo: Path) -> Iterator[str]:
    """`tests/x.py::test_a`, and `::test_b` after it on the same line (the parity ledger's
    cells), name test functions of that file."""
    for line in text.splitlines():
        current: Path | None = None
        for path, name in re.findall(r"`(tests/[\w/]+\.py)?::(\w+)`", line):
            current = repo / path if path else current
            if current is None or not current.is_file():
                continue
            if not re.search(rf"^\s*(async )?def {name}\(", current.read_text(), re.MULTILINE):
                yield f"`{current.relative_to(repo)}::{name}`: no such test"


def _anchors(markdown: str) -> set[str]:
    """Each heading's anchor as GitHub and as MkDocs (Python-Markdown's toc) spell it."""
    anchors = set()
    for heading in re.findall(r"^#+\s+(.+?)\s*$", markdown, re.MULTILINE):
        text = heading.lower()
        anchors.add(re.sub(r" ", "-", re.sub(r"[^\w\s-]", "", text)))
        anchors.add(re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip()))
    return anchors


def check_links(text: str, source: Path) -> Iterator[str]:
    """Relative links reach a file and, with `#anchor`, a heading of that file."""
    prose = SPANS.sub("", FENCES.sub("", text))
    for target in re.findall(r"\]\(([^)\s]+)\)", prose):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        path = (source.parent / file).resolve() if file else source
        if not path.exists():
            yield f"link ({target}) does not exist"
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path.read_text()):
            yield f"link ({target}): {file or source.name} has no heading #{anchor}"


# A page whose example makes files of the user's own declares their names, which then count as
# existing on that page only: <!-- docs-check own: cluster=mycluster conf=mine -->
OWN = re.compile(r"<!-- docs-check own: ([^>]*?) -->")


def with_own(text: str, k: Known) -> tuple[Known, set[str]]:
    """k plus the names the page declares as the user's own, and those names (for paths)."""
    own = [pair.split("=", 1) for line in OWN.findall(text) for pair in line.split()]
    groups = {g: set(opts) for g, opts in k.groups.items()}
    sweeps = set(k.sweeps)
    for group, name in own:
        (sweeps if group == "conf" else groups.setdefault(group, set())).add(name)
    return Known(k.parser, groups, sweeps, k.targets), {name for _, name in own}


def problems(text: str, source: Path, k: Known, repo: Path = REPO) -> list[str]:
    found: list[str] = []
    k, own = with_own(text, k)
    for code in code_of(text):
        found += check_commands(code, k)
        found += check_names(code, k)
        found += [p for p in check_paths(code, repo) if not any(f"/{name}.yaml`" in p for name in own)]
    found += check_tests(text, repo)
    found += check_links(text, source)
    return found


@pytest.fixture(scope="module")
def valid() -> Known:
    k = known()
    # Each set is read from the code: an empty one would let every name through.
    assert _subparsers(k.parser) and k.groups and k.sweeps and k.targets
    assert {"workflow", "task", "scale", "policy", "engine", "preset"} <= set(k.groups)
    return k


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_the_docs_name_only_what_exists(doc: Path, valid: Known) -> None:
    found = problems(doc.read_text(), doc, valid)
    assert not found, f"{doc.relative_to(REPO)} names what does not exist:\n  " + "\n  ".join(found)


def test_the_readme_keeps_the_ci_test_command() -> None:
    # .ci/run calls `make test` as "the README's test command".
    assert "make test" in (REPO / "README.md").read_text()
    assert "make test" in (REPO / ".ci" / "run").read_text()


def test_planted_wrong_names_are_caught(valid: Known) -> None:
    planted = """
Run `gridrun sweeep conf=smoke` or `gridrun status --wacth`, then `gridrun toy bild`.

```bash
gridrun sweep conf=smokee preset=as_writen engine=hf,vllmm   # three wrong names
make demoo && make test
```

Options: `gpu=h200`, `scale=1.7b`, `sweeps/nope.yaml`, `conf/cluster/nope.yaml`,
`tests/test_grpo.py::test_k3_kl_clamps_as_verl`, `::test_no_such_thing`, `make table1 SWEEP=fulll_matrix`.
See [the design](docs/nope.md) and [its map](docs/design.md#no-such-heading), [analysis](#analysis).
"""
    found = problems(planted, REPO / "README.md", valid)
    for wrong in ("gridrun sweeep", "--wacth", "gridrun toy bild", "conf=smokee", "preset=as_writen",
                  "engine=vllmm", "make demoo", "gpu=h200", "sweeps/nope.yaml", "conf/cluster/nope.yaml",
                  "test_no_such_thing", "SWEEP=fulll_matrix", "docs/nope.md", "#no-such-heading"):
        assert any(wrong in line for line in found), f"{wrong} was not caught: {found}"
    assert not any(name in line for line in found for name in ("scale=1.7b", "make test", "engine=hf`", "as_verl"))


# Docs state what is; how it came to be belongs to the commits and bench/measured/.
CHANGE_NOTES = re.compile(r"\b(no longer|before this change|used to|previously|since the last|is now|are now)\b", re.IGNORECASE)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_the_docs_say_what_is_not_how_it_came_to_be(doc: Path) -> None:
    notes = [f"{doc.name}:{i}: {line.strip()}" for i, line in enumerate(doc.read_text().splitlines(), 1)
             if CHANGE_NOTES.search(line)]
    assert notes == []


def test_the_real_scale_guide_stays_a_guide() -> None:
    assert len((REPO / "docs" / "real-scale.md").read_text().splitlines()) <= 450
