"""Parsers for the shapes roles are asked to produce.

`\\boxed{...}` is the answer channel of every role: generators and workers box the answer,
the evaluator boxes its verdict, the aggregator boxes a candidate number. Code comes in fenced python blocks: the code
reward runs the last one, the evaluator's code-fence rate counts them. Parsing is
deliberately strict (the last box, balanced braces; complete fences) so drift away from a
shape is measurable. Each shape has exactly one parser here, so a reward and a diagnostic
reading the same text read it the same way.
"""

from __future__ import annotations

import re

_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_PYTHON_TAGS = {"", "python", "py", "python3"}
_NUMBERED = re.compile(r"^\s*(\d+)[.)]\s*(.+?)\s*$")


def boxed_contents(text: str) -> list[str]:
    """Contents of every `\\boxed{...}` with balanced braces, in order; unclosed boxes skipped."""
    found = []
    for match in _BOX.finditer(text):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    found.append(text[start:i])
                    break
    return found


def last_boxed(text: str) -> str | None:
    """The last box's stripped contents; None when there is none or it is empty."""
    boxes = boxed_contents(text)
    if not boxes or not boxes[-1].strip():
        return None
    return boxes[-1].strip()


def parse_verdict(text: str) -> bool | None:
    """Evaluator verdict: True for \\boxed{Correct}, False for \\boxed{Incorrect}, else None."""
    box = last_boxed(text)
    if box is None:
        return None
    word = box.replace("\\text{", "").replace("}", "").strip().lower()
    return {"correct": True, "incorrect": False}.get(word)


def parse_selection(text: str, n_candidates: int) -> int | None:
    """Aggregator choice as a 0-based index, None when unparsable or out of range."""
    box = last_boxed(text)
    if box is None or not box.strip().isdigit():
        return None
    index = int(box.strip()) - 1
    return index if 0 <= index < n_candidates else None


def parse_strategies(text: str, n: int) -> list[str]:
    """The orchestrator's numbered strategies `1. ...`, at most n, in order of their numbers."""
    by_number: dict[int, str] = {}
    for line in text.splitlines():
        match = _NUMBERED.match(line)
        if match and 1 <= int(match.group(1)) <= n:
            by_number.setdefault(int(match.group(1)), match.group(2))
    return [by_number[k] for k in sorted(by_number)]


def python_blocks(text: str) -> list[str]:
    """Bodies of the complete fenced blocks tagged python / py / python3 or untagged, in order.

    A fence opens on a line starting with three backticks (the rest of the line is the tag)
    and closes on a line of exactly three backticks; an unclosed block (a truncated
    response) is not code. Each body keeps its lines and ends with a newline."""
    blocks: list[str] = []
    body: list[str] | None = None
    tag = ""
    for line in text.splitlines():
        stripped = line.strip()
        if body is None:
            if stripped.startswith("```"):
                tag = stripped[3:].strip().lower()
                body = []
        elif stripped == "```":
            if tag in _PYTHON_TAGS:
                blocks.append("\n".join(body) + "\n")
            body = None
        else:
            body.append(line)
    return blocks


def last_python_block(text: str) -> str | None:
    """The last complete python (or untagged) fenced block's body; None when there is none."""
    blocks = python_blocks(text)
    return blocks[-1] if blocks else None
