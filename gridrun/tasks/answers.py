"""Parsers for the shapes roles are asked to produce.

`\\boxed{...}` is the answer channel of every role: generators and workers box the answer,
the evaluator boxes its verdict, the aggregator boxes a candidate number. Code comes in
fenced python blocks: the code reward runs the last one, the evaluator's code-fence rate
counts them. Parsing is deliberately strict (the last box, balanced braces; complete
fences) so drift away from a shape is measurable; where the released code read a shape
more leniently (the first box, a lone digit, unnumbered strategies), that reading is a rule
here too, picked by the cell's `protocol` block. Each shape has exactly one parser here,
so a reward, a role's parsed answer and a diagnostic reading the same text read it the
same way. (Exceptions: the math reward widens the box-length cap for a reference longer
than MAX_BOX_CHARS / 2, which no MATH answer is; and the released code's grader reads its
own last box, `released_box`, which a boxed-answer task under that grader also parses with.)
"""

from __future__ import annotations

import re

# A box command followed by its argument: `{`, or a bare number (`\\boxed 5`, `\\boxed -3.5`).
# `\\boxed` mentioned in prose ("put it in \\boxed form") is not a box.
_LAST_BOX = re.compile(r".*\\(?:boxed|fbox)(?![A-Za-z])\s*(?=\{|-?\d)", re.DOTALL)
_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])\s*(?=\{|-?\d)")
_BARE_NUMBER = re.compile(r"-?\d+(?:[.,]\d+)*")
_BRACE_TOKEN = re.compile(r"\\.|[{}]", re.DOTALL)  # a backslash eats the next char: `\{` is not a brace
# A box longer than this is a derivation, not an answer (MATH answers are < 200 chars); capping it
# also bounds the brace scan and the parse.
MAX_BOX_CHARS = 500
_PYTHON_TAGS = {"", "python", "py", "python3"}
_RELEASED_BOX = "\\boxed{"
_NUMBERED = re.compile(r"^\s*(\d+)[.)]\s*(.+?)\s*$")
# The released aggregator's fallback: a digit 1-9 standing alone (not part of "12" or "x2").
_LONE_DIGIT = re.compile(r"\b([1-9])\b")
# The released orchestrator's fallback keeps lines longer than this many characters.
_STRATEGY_LINE_CHARS = 10


def _closing_brace(text: str, open_at: int, limit: int) -> int | None:
    """Index of the `}` matching the `{` at `open_at`, looking at most `limit` chars ahead."""
    depth = 0
    for m in _BRACE_TOKEN.finditer(text, open_at, min(len(text), open_at + limit + 2)):
        token = m.group()
        if token == "{":
            depth += 1
        elif token == "}":
            depth -= 1
            if depth == 0:
                return m.start()
    return None


def last_box(text: str, limit: int = MAX_BOX_CHARS) -> tuple[bool, str | None]:
    """(found, stripped content) of the LAST box only; found=True with content None: that box is
    unclosed or longer than `limit` chars (an earlier, well-formed box does not stand in for it).

    A box is `\\boxed{...}` or `\\fbox{...}` with balanced braces (`\\{`, `\\}` are escapes,
    not braces), or the bare form `\\boxed 5` / `\\boxed -3.5` for numbers."""
    # The greedy `.*` makes the regex engine back off from the end of the text, so this finds the
    # last box in one C-speed pass however long the response is.
    m = _LAST_BOX.match(text)
    if m is None:
        return False, None
    return True, _box_content(text, m.end(), limit)


def boxes(text: str, limit: int = MAX_BOX_CHARS) -> list[str | None]:
    """Every box's stripped content, in order of the box commands (a box inside another's
    content comes after it); None for one that is unclosed or longer than `limit` chars."""
    return [_box_content(text, m.end(), limit) for m in _BOX.finditer(text)]


def _box_content(text: str, arg: int, limit: int) -> str | None:
    """The stripped content of the box whose argument starts at `arg` (a `{` or a number)."""
    if text[arg] == "{":
        close = _closing_brace(text, arg, limit)
        return None if close is None else text[arg + 1 : close].strip()
    bare = _BARE_NUMBER.match(text, arg)  # matches: the lookahead saw a digit
    number = bare.group() if bare is not None else ""
    return number if len(number) <= limit else None


def last_boxed(text: str) -> str | None:
    """The last box's stripped contents; None when there is no box or it is empty, unclosed or
    too long (`last_box`). The math reward scores exactly this text."""
    return last_box(text)[1] or None


def released_box(text: str) -> str | None:
    """The last box as the released code's math grader reads it (task.grader=released): from
    the last "\\boxed", braces matched by plain counting (escapes count too, no length cap),
    and only the exact form `\\boxed{...}` (not `\\boxed 5`, not `\\fbox`); the content,
    stripped, else None."""
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                whole = text[start : i + 1]
                return whole[len(_RELEASED_BOX) : -1].strip() if whole.startswith(_RELEASED_BOX) else None
    return None


def _verdict(box: str | None) -> bool | None:
    if not box:
        return None
    word = box.replace("\\text{", "").replace("}", "").strip().lower()
    return {"correct": True, "incorrect": False}.get(word)


def parse_verdict(text: str, box: str) -> bool | None:
    """Evaluator verdict: True for \\boxed{Correct}, False for \\boxed{Incorrect}, else None.

    box="last": the last box, whatever it holds (a last box holding anything else is no
    verdict). box="first": the first box holding a verdict, boxes holding anything else
    skipped, as the released code searched its text (protocol.verdict_box)."""
    if box == "last":
        return _verdict(last_boxed(text))
    if box == "first":
        return next((v for v in map(_verdict, boxes(text)) if v is not None), None)
    raise ValueError(f"unknown verdict box '{box}': use first or last")


def parse_selection(text: str, n_candidates: int, rule: str) -> int | None:
    """Aggregator choice as a 0-based index (protocol.aggregator_parse).

    rule="last_box": the last box's number; None when it is no number or names no candidate.
    rule="released": the first box holding a number; if there is none or it names no
    candidate, the first lone digit 1-9 of the text; if that names none either, candidate 1.
    Never None: the released workflow always commits to a candidate."""
    if rule == "last_box":
        return _candidate(last_boxed(text), n_candidates)
    if rule != "released":
        raise ValueError(f"unknown aggregator parse '{rule}': use released or last_box")
    boxed = next((b for b in boxes(text) if b is not None and b.isdecimal()), None)
    digit = _LONE_DIGIT.search(text)
    for choice in (boxed, digit.group(1) if digit else None):
        index = _candidate(choice, n_candidates)
        if index is not None:
            return index
    return 0


def _candidate(number: str | None, n_candidates: int) -> int | None:
    """The 0-based index a 1-based candidate number names; None when it names none."""
    if number is None or not number.isdecimal():
        return None
    index = int(number) - 1
    return index if 0 <= index < n_candidates else None


def parse_strategies(text: str, n: int) -> list[str]:
    """The orchestrator's numbered strategies `1. ...`, at most n, in order of their numbers."""
    by_number: dict[int, str] = {}
    for line in text.splitlines():
        match = _NUMBERED.match(line)
        if match and 1 <= int(match.group(1)) <= n:
            by_number.setdefault(int(match.group(1)), match.group(2))
    return [by_number[k] for k in sorted(by_number)]


def unnumbered_strategies(text: str, n: int) -> list[str]:
    """The released orchestrator's strategies when no numbered line parses: its lines longer
    than 10 characters (stripped), at most n, else its whole stripped text as one strategy."""
    lines = [line.strip() for line in text.split("\n") if len(line.strip()) > _STRATEGY_LINE_CHARS]
    return lines[:n] or [text.strip()]


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
