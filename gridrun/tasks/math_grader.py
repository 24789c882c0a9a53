"""The released code's math grader (`task.grader=released`), rewritten from its rules.

The paper's released code scores math with rLLM's grader (the DeepScaleR / PRM800K lineage).
Its verdicts differ from math-verify's in ways that move rewards (an unreduced fraction is
wrong, "0.333333" is not 1/3, a response without a box scores 0.0, not a penalty), so this
module implements its rules rather than approximating them with math-verify:

  * The answer is the content of the last `\\boxed{...}` as `answers.released_box` reads it:
    the last "\\boxed" of the response, its braces matched by plain counting, and only the
    exact form `\\boxed{`. None (no box, a bare `\\boxed 5`, unbalanced braces, `\\fbox`)
    scores `format_penalty` (0.0 in the released code), flag "no_box".
  * Correct when either check passes against the reference:
    1. mathd: both sides normalised Hendrycks-MATH style (`_mathd`: a leading `\\text{}`
       unwrapped, `\\!`, `\\left`, `\\right`, degrees, `\\$`, `\\%`, spaces and a right-hand
       `\\text{ unit}` removed, `dfrac`/`tfrac` -> `frac`, `\\frac12` -> `\\frac{1}{2}`,
       `\\sqrt3` -> `\\sqrt{3}`, `k = ` dropped when its left side has at most 2 characters,
       "0.5" -> `\\frac{1}{2}`, `a/b` of two integers -> `\\frac{a}{b}`) and compared as strings.
    2. sympy: both sides normalised PRM800K style (`_prm`: `$`, `%`, units and thousands
       separators removed, "or"/"and" read as commas, LaTeX converted to plain text,
       lower-cased, integers canonical) and compared as strings; otherwise split into tuple or
       interval elements (the brackets must match), and each pair of elements must be equal:
       two fractions `a/b` only as written (unreduced is wrong), an integer against a
       non-integer never, anything else when sympy simplifies their difference to 0 (refused
       for expressions with more than 2 distinct letters or with `^{`, `^(`, or exponents of
       2+ digits, as sympy could hang).
  * Bounded, as the released guards meant to be ("refuse what could hang"), where they were
    not: `**` is guarded exactly as `^` (sympy reads `^` as `**`, so `9**9**8` and
    `(x+1)**999` slipped past and ran for minutes), a given element longer than
    `answers.MAX_BOX_CHARS` (or twice the reference's) or nested deeper than
    `_MAX_NESTING` brackets is refused, and sympy runs in a worker process with a hard limit
    of `TIME_LIMIT_S` per response: past it the worker is killed, the answer scores 0.0 with
    the flag "timeout" (counted as `reward/grader_timeouts`) and a warning is logged. A
    process, not an alarm: `signal.alarm` only works on the main thread, and a watchdog
    thread cannot interrupt big-int arithmetic, which holds the GIL.

Left out, or approximate:
  * LaTeX to plain text: the released grader uses pylatexenc's `latex2text`, which gridrun does
    not depend on; `_latex_text` converts the constructs final answers use as pylatexenc's
    default macro table does (`\\frac{a}{b}` and `\\frac12` -> `a/b`, no parentheses, so
    `\\frac{a+1}{2}` reads a+1/2 there too; `\\sqrt{x}` -> `sqrt(x)`; `\\pi`, `\\infty`,
    `\\cdot`, `\\times`, `\\cup` to the grader's words; `\\text{}`, spacing macros; any other
    macro dropped) and may differ from pylatexenc on anything rarer.
  * The bounds above are gridrun's, not the released code's (which ran sympy without a time
    limit in 0.2.1); they change no verdict of an answer sympy settles within the limit,
    except answers written with `**` that the released code would have sent to sympy.
  * Speed: the same verdicts, faster where that is provable: two integer literals are
    compared by value, not through sympy (0.06 ms instead of 2 ms per wrong integer answer).
  * rLLM's handling of `<think>` delimiters and of several reference answers: gridrun's
    references are one string and its prompts run with thinking disabled.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import select
import subprocess
import sys
import threading
import time

import sympy
from sympy.parsing import sympy_parser

from gridrun.tasks.answers import MAX_BOX_CHARS, released_box
from gridrun.tasks.math_reward import MathScore

__all__ = ["TIME_LIMIT_S", "grade", "score_released"]

log = logging.getLogger(__name__)

# Seconds of sympy per response (all of its tuple elements together). Normal answers take
# milliseconds; the worker's start (importing sympy) is not counted.
TIME_LIMIT_S = 3.0
_WORKER_START_S = 120.0
_WORKER_MEMORY = 4 << 30  # RLIMIT_AS of the worker: `9<<10**10` is a MemoryError, not a full node
# Brackets nested deeper than this are no final answer (and Python's parser gives up at 200).
_MAX_NESTING = 32

# A unit word with its plural and power ("meters^2"), removed from PRM-normalised answers.
_UNITS = ("degree", "cm", "centimeter", "meter", "mile", "second", "minute", "hour", "day", "week",
          "month", "year", "foot", "feet", "inch", "yard")
_UNIT = re.compile(rf"({'|'.join(_UNITS)})(es)?(s)? *(\^[0-9]+)?")
_LEADING_TEXT = re.compile(r"^\\text\{(?P<text>.+?)\}")
_THOUSANDS = re.compile(r"(\d)(,)(\d\d\d)($|\D)")
_MIXED = re.compile(r"([0-9]) +([0-9])")
_FRACTION = re.compile(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$")
_INTEGER = re.compile(r"-?[0-9]+")
# Where sympy may hang: the released grader refuses these (its "should allow eval").
_SYMPY_REFUSED = ("^{", "^(")
_SYMPY_REFUSED_RE = (re.compile(r"\^[0-9]+\^"), re.compile(r"\^[0-9][0-9]+"))
_TUPLE_BRACKETS = "()[]"
# LaTeX symbols and the plain text they become (pylatexenc's unicode, then the grader's words).
_SYMBOLS = {"\\pi": "pi", "\\infty": "inf", "\\cup": "U", "\\cdot": "*", "\\times": "*"}
_SPACING = ("\\,", "\\;", "\\:", "\\!", "\\ ", "\\quad", "\\qquad")


# ------------------------------------------------------------------------------- mathd check
def _braced_fracs(s: str) -> str:
    """`\\frac12` -> `\\frac{1}{2}`, `\\frac1{72}` -> `\\frac{1}{72}`; a form it cannot read is left whole."""
    head, *rest = s.split("\\frac")
    out = head
    for part in rest:
        out += "\\frac"
        if part.startswith("{"):
            out += part
        elif len(part) < 2:
            return s
        elif part[1] == "{":
            out += "{" + part[0] + "}" + part[1:]
        else:
            out += "{" + part[0] + "}{" + part[1] + "}" + part[2:]
    return out


def _braced_sqrts(s: str) -> str:
    head, *rest = s.split("\\sqrt")
    return head + "".join("\\sqrt" + (p if p.startswith("{") else "{" + p[:1] + "}" + p[1:]) for p in rest)


def _int_slash_int(s: str) -> str:
    parts = s.split("/")
    if len(parts) == 2 and re.fullmatch(r"-?\d+", parts[0]) and re.fullmatch(r"-?\d+", parts[1]):
        a, b = int(parts[0]), int(parts[1])
        if s == f"{a}/{b}":
            return f"\\frac{{{a}}}{{{b}}}"
    return s


def _mathd(answer: str) -> str:
    """Hendrycks-MATH normalisation, in the released grader's order (see the module docstring)."""
    s = answer.strip()
    m = _LEADING_TEXT.search(s)
    if m is not None:
        s = m.group("text").strip()
    # Where a released rule fails (it raises there), the released grader keeps this form.
    unwrapped = s
    s = s.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac").replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\$", "")
    units = s.split("\\text{ ")
    if len(units) > 2:
        return unwrapped  # two unit texts
    s = units[0]
    s = s.replace("\\%", "").replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        s = sides[1]
    if "\\sqrt" in s:
        if any(not p for p in s.split("\\sqrt")[1:]):
            return unwrapped  # a \sqrt with nothing after it
        s = _braced_sqrts(s)
    s = s.replace(" ", "")
    s = _braced_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _int_slash_int(s)


# ------------------------------------------------------------------------------- sympy check
def _fraction_text(m: re.Match[str]) -> str:
    numerator = m[1] if m[1] is not None else m[2]
    denominator = m[3] if m[3] is not None else m[4]
    return f"{numerator}/{denominator}"


def _latex_text(expr: str) -> str:
    """LaTeX to plain text for sympy (an approximation of pylatexenc's latex2text: see the
    module docstring): `\\frac{a}{b}` -> `a/b`, `\\sqrt{x}` -> `sqrt(x)`, symbols to words."""
    s = expr.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac").replace("\\frac", " \\frac")
    for macro in _SPACING:
        s = s.replace(macro, " ")
    s = s.replace("\\left", "").replace("\\right", "")
    for macro, text in _SYMBOLS.items():
        s = re.sub(re.escape(macro) + r"(?![A-Za-z])", f" {text} " if text == "U" else text, s)
    group = r"\{([^{}]*)\}"
    arg = r"(?:\{([^{}]*)\}|([^{}\s\\]))"  # a braced group or one character, as LaTeX reads \frac12
    for _ in range(8):  # innermost groups first, until nothing changes
        before = s
        s = re.sub(r"\\frac\s*" + arg + r"\s*" + arg, _fraction_text, s)
        s = re.sub(r"\\sqrt\s*" + group, r"sqrt(\1)", s)
        s = re.sub(r"\\(?:text|mathrm|mathbf|textbf|operatorname)\s*" + group, r"\1", s)
        if s == before:
            break
    s = re.sub(r"\\[A-Za-z]+", "", s)  # any other macro: dropped
    return s.replace("{", "").replace("}", "").strip()


def _is_float(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def _strip_thousands(s: str) -> str:
    while True:
        stripped = _THOUSANDS.sub(r"\1\3\4", s)
        if stripped == s:
            return s
        s = stripped


def _is_int_text(s: str) -> bool:
    try:
        x = float(_strip_thousands(s))
    except ValueError:
        return False
    return math.isfinite(x) and abs(x - round(x)) <= 1e-7


def _prm(expr: str) -> str:
    """PRM800K normalisation, in the released grader's order (see the module docstring)."""
    m = _LEADING_TEXT.search(expr)
    if m is not None:
        expr = m.group("text")
    expr = expr.replace("\\%", "%").replace("\\$", "$").replace("$", "").replace("%", "")
    expr = expr.replace(" or ", " , ").replace(" and ", " , ")
    expr = expr.replace("million", "*10^6").replace("billion", "*10^9").replace("trillion", "*10^12")
    expr = _UNIT.sub("", expr)
    expr = re.sub(r"\^ *\\circ", "", expr)
    if len(expr) > 0 and expr[0] == "{" and expr[-1] == "}":
        expr = expr[1:-1]
    expr = re.sub(r",\\! *", "", expr)
    if _is_float(expr) and math.isfinite(float(expr)) and abs(float(expr) - round(float(expr))) <= 1e-7:
        expr = str(round(float(expr)))
    if "\\" in expr:
        expr = _latex_text(expr)
    expr = re.sub("- *", "-", expr)
    expr = _MIXED.sub(r"\1+\2", expr)
    expr = expr.replace(" ", "").replace("{", "").replace("}", "").lower()
    if _is_int_text(expr):
        expr = str(int(float(expr.replace(",", ""))))
    return expr


def _tuple_elements(expr: str) -> list[str]:
    expr = _strip_thousands(expr)
    if not expr:
        return []
    inner = expr[1:-1]
    if len(expr) > 2 and expr[0] in _TUPLE_BRACKETS and expr[-1] in _TUPLE_BRACKETS and not any(
        c in inner for c in _TUPLE_BRACKETS
    ):
        return [e.strip() for e in inner.split(",")]
    return [expr]


class _Timeout(Exception):
    """The sympy part of one response ran past TIME_LIMIT_S."""


def _nesting(expr: str) -> int:
    depth = deepest = 0
    for c in expr:
        if c in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in ")]}":
            depth -= 1
    return deepest


def _sympy_equal(reference: str, given: str, deadline: float | None = None) -> bool:
    """sympy's verdict on (reference) - (given) == 0, or False where the guards refuse it.

    ``deadline`` (time.monotonic()) bounds sympy's time, raising _Timeout past it; None runs
    it in this process without a bound (the worker's own call).
    """
    if _INTEGER.fullmatch(reference) and _INTEGER.fullmatch(given):
        # Two integer literals: sympy's difference is 0 exactly when their values are equal,
        # so compare the values (2 ms of sympy per wrong integer answer, most of the toy
        # world's and DAPO-Math's verdicts).
        return int(reference) == int(given)
    expr = f"({reference})-({given})"
    guarded = expr.replace("**", "^")  # the same power to sympy, so the same guards
    letters = {c for c in expr.replace("sqrt", "").replace("frac", "") if c.isalpha()}
    if len(letters) > 2 or any(b in guarded for b in _SYMPY_REFUSED) or any(r.search(guarded) for r in _SYMPY_REFUSED_RE):
        return False
    if len(given) > max(MAX_BOX_CHARS, 2 * len(reference)) or _nesting(expr) > _MAX_NESTING:
        return False
    if deadline is not None:
        return _WORKERS.equal(reference, given, deadline)
    transformations = sympy_parser.standard_transformations + (sympy_parser.implicit_multiplication_application,)
    try:
        diff = sympy_parser.parse_expr(expr.replace("^", "**"), transformations=transformations)
        return bool(sympy.simplify(diff) == 0)
    except Exception:  # noqa: BLE001 - the released grader counts any parse or sympy failure as not equal
        return False


class _Worker:
    """One `python -m gridrun.tasks.math_grader` process answering sympy checks, a JSON line each."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gridrun.tasks.math_grader"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, start_new_session=True)
        if self._read(time.monotonic() + _WORKER_START_S) != "ready":
            self.close()
            raise RuntimeError(f"the math grader's sympy worker ({sys.executable} -m gridrun.tasks.math_grader) "
                               f"did not start within {_WORKER_START_S:.0f} s: check that gridrun imports in "
                               "that interpreter")

    def _read(self, deadline: float) -> str | None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return None
            line = self.proc.stdout.readline()
            return line.decode().strip() if line else None

    def equal(self, reference: str, given: str, deadline: float) -> bool | None:
        """The verdict, or None when it did not come before ``deadline``."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps([reference, given]).encode() + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return None
        answer = self._read(deadline)
        return None if answer is None else answer == "1"

    def close(self) -> None:
        """Kill and reap (a killed worker must leave no zombie)."""
        try:
            os.killpg(self.proc.pid, 9)
        except ProcessLookupError:
            pass
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


class _Workers:
    """Idle workers, one per concurrent caller; a worker that ran past its deadline is replaced."""

    def __init__(self) -> None:
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()

    def equal(self, reference: str, given: str, deadline: float) -> bool:
        with self._lock:
            worker = self._idle.pop() if self._idle else None
        if worker is None:
            worker = _Worker()  # before the clock matters: the deadline counts sympy's time only
            deadline = max(deadline, time.monotonic() + TIME_LIMIT_S)
        verdict = worker.equal(reference, given, deadline)
        if verdict is None:
            worker.close()
            raise _Timeout
        with self._lock:
            self._idle.append(worker)
        return verdict


_WORKERS = _Workers()


def _serve() -> None:
    """The worker's loop: a JSON [reference, given] per line in, "1" or "0" per line out."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (_WORKER_MEMORY, _WORKER_MEMORY))
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:  # EOF: the grader's process is gone
        reference, given = json.loads(line)
        try:
            ok = _sympy_equal(reference, given)
        except MemoryError:
            ok = False
        out.write("1\n" if ok else "0\n")
        out.flush()


def _sympy_check(given: str, reference: str, deadline: float | None = None) -> bool:
    ref, ans = _prm(reference), _prm(given)
    if ref == ans:
        return True
    if not ans:
        return False
    ref_elems, ans_elems = _tuple_elements(ref), _tuple_elements(ans)
    if len(ref_elems) > 1 and (ref[0] != ans[0] or ref[-1] != ans[-1]):
        return False  # an interval's or tuple's brackets must match
    if len(ref_elems) != len(ans_elems):
        return False
    for r, a in zip(ref_elems, ans_elems):
        if _FRACTION.search(r) and _FRACTION.search(a):
            ok = r == a  # unreduced fractions are wrong: no simplification
        elif _is_int_text(r) != _is_int_text(a):
            ok = False
        else:
            ok = _sympy_equal(r, a, deadline)
        if not ok:
            return False
    return True


def _grade(given: str, reference: str) -> bool:
    deadline = time.monotonic() + TIME_LIMIT_S
    return _mathd(given) == _mathd(reference) or _sympy_check(given, reference, deadline)


def grade(given: str, reference: str) -> bool:
    """The released grader's verdict on a boxed answer: the mathd check, else the sympy check
    (False when sympy runs past TIME_LIMIT_S)."""
    try:
        return _grade(given, reference)
    except _Timeout:
        return False


def score_released(response: str, answer: str, format_penalty: float = 0.0) -> MathScore:
    """1.0 / 0.0 by `grade` on the last box; `format_penalty` (the released 0.0) without one;
    0.0 flagged "timeout" when sympy ran past TIME_LIMIT_S."""
    given = released_box(response)
    if given is None:
        return MathScore(format_penalty, None, "no_box")
    try:
        ok = _grade(given, answer)
    except _Timeout:
        log.warning("math grader: sympy ran past %.1f s on the answer %.80r (reference %.80r); scored wrong",
                    TIME_LIMIT_S, given, answer)
        return MathScore(0.0, given, "timeout")
    return MathScore(1.0 if ok else 0.0, given, "correct" if ok else "wrong")


if __name__ == "__main__":
    _serve()
