"""Math reward: the LAST `\\boxed{...}` of a response, checked against a reference with math-verify.

`score_math(response, answer)` gives 1.0 when the last box is mathematically equivalent to the
reference (math-verify: "0.5" == "\\frac12", "2x+2" == "2(x+1)", "{1,2}" == "2,1", ...), 0.0 when it
is not, and `format_penalty` (default -0.1) when there is no usable box: none at all ("no_box"), or
one that is empty, unclosed, too long, or that math-verify cannot parse ("unparseable").

What it does:
  * Box extraction is ours (`gridrun.tasks.answers.last_box`, the one box parser every role's
    answer goes through), not math-verify's: math-verify's own `parse(response)` joins several
    nearby boxes into a set ("\\boxed{1} and \\boxed{2}" -> {1, 2}) and may fall back to any number
    in the text; here only the last box counts. Braces must balance (`\\{`, `\\}` are escapes);
    `\\fbox{...}` counts as a box; the bare form `\\boxed 5` is accepted for numbers only.
  * Thread-safe: math-verify's timeouts use `signal.alarm`, which raises in any thread but the main
    one, so they are switched off (`parsing_timeout=None`, `timeout_seconds=None`). The only cache
    is a `functools.lru_cache` of parsed references (internally locked; holds immutable sympy values).
  * Because nothing can interrupt sympy any more, answers that would make it run for minutes or
    forever are refused before verification and score 0.0 ("wrong"): exact numbers beyond
    `_MAX_DIGITS` digits (`10^{10^{10}}`, `(10^{10})!`, `\\binom{10^6}{5000}`), power towers beyond
    `_MAX_TOWER_DIGITS` (`2^{10^4}` hangs simplify although `2^{10000}` is instant), non-numeric
    bases raised past `_MAX_SYMBOLIC_EXP` (`(x+1)^{100}`: simplify expands it), and unevaluated
    sums, products, integrals, limits and derivatives (not final answers; sympy may spend seconds
    evaluating them). Sizes are estimated from the expression tree, never by evaluating it.
    Boxes longer than `answers.MAX_BOX_CHARS` (or twice the reference's length) are "unparseable".
  * Percent answers: "\\boxed{10\\%}" is parsed as the percentage (latex2sympy cannot parse "\\%" itself);
    math-verify then accepts both 10 and 0.1 for it.

What it leaves out:
  * No hard wall-clock limit. The guards above cover the known runaways, but sympy's `simplify`
    on an adversarial short expression can still take seconds; a caller that needs a hard bound
    must run this in a process it can kill (a watchdog thread cannot: big-int arithmetic holds the GIL).
  * No reasoning about the text outside the box, no answer-type checks (a set where a number was
    asked is just "wrong"), no multiple-choice letter normalisation beyond what math-verify does.
  * The reference is trusted: it is not length-capped or guarded. One that math-verify cannot
    parse (e.g. a name) is matched verbatim only (whitespace-insensitive).

math-verify behaviour callers see through this: floats are compared rounded to 6 places
("0.333333" == 1/3, "3.14" != pi); `verify` is asymmetric (reference "1<x<2" accepts "(1,2)", not
the reverse; reference "x=5" accepts "5" and vice versa); text is lower-cased ("\text{(B)}" == "B");
a one-time "Timeout is disabled" warning is logged by math_verify.parser / math_verify.grader.

Speed (warm, one CPU core, math-verify 0.9.0, sympy 1.14, distinct answers so no cache hits):
~0.05 ms when the box equals the reference verbatim (sympy is skipped), ~0.5 ms integers, ~2 ms
fractions, ~7 ms surds, ~14 ms polynomials (math-verify's simplify). The first call for a new LaTeX
construct costs 20-80 ms while the ANTLR parser warms up. Finding the box in a 2 MB response takes
~1 ms (a regex backing off from the end; braces are only scanned within the length cap).
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Literal, TypeAlias

import sympy
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from sympy.matrices import MatrixBase
from sympy.matrices.expressions import MatPow

from gridrun.tasks.answers import MAX_BOX_CHARS, last_box

__all__ = ["Flag", "MathScore", "score_math", "score_math_json"]

# "timeout": the released grader's sympy ran past its time limit (scored 0.0, counted).
Flag = Literal["correct", "wrong", "no_box", "unparseable", "timeout"]
Parsed: TypeAlias = sympy.Basic | MatrixBase | str  # what math-verify's parse() returns items of


@dataclass(frozen=True)
class MathScore:
    reward: float
    parsed: str | None  # the last box's stripped text; None when no box parsed
    flag: Flag


# Exact numbers of this size are cheap for sympy: 2^{100000} (30k digits) or 25000! verify in < 0.2 s.
_MAX_DIGITS = 100_000
# ...but a power tower like 2^{10^4} sends simplify into factoring its value: 2^{2^9} (155 digits)
# takes 0.2 s, 2^{2^{11}} (617 digits) 12 s, 2^{10^4} hangs. 2^{10000} and 2^{2\cdot 5000} are fine.
_MAX_TOWER_DIGITS = 100
# (x+1)^n is expanded by simplify; n=20 takes ~0.2 s, n=500 several seconds.
_MAX_SYMBOLIC_EXP = 16

# Boxes are read with math-verify's LaTeX extractor only: its plain-expression extractor would pull
# any digit out of a malformed box ("\\frac{1}{}" -> 1) and score garbage.
_LATEX = [LatexExtractionConfig(boxed_match_priority=0)]
# The reference may be plain text ("1 234", "2*x"); there the expression extractor is a fallback.
_EXPR = [ExprExtractionConfig()]

_PERCENT = re.compile(r"\s*\\?%\s*$")
# A plain integer literal, short enough for int(): two of them compare by value without sympy
# (a wrong integer answer is most of the toy world's and DAPO-Math's scoring, 2 ms each in
# math-verify); tests/test_math_reward.py checks the verdicts agree with math-verify's.
_INTEGER = re.compile(r"\s*[+-]?\d{1,50}\s*")
_UNEVALUATED = (sympy.Sum, sympy.Product, sympy.Integral, sympy.Limit, sympy.Derivative)
_BIG_FUNCS = (
    sympy.factorial,
    sympy.factorial2,
    sympy.subfactorial,
    sympy.gamma,
    sympy.RisingFactorial,
    sympy.FallingFactorial,
)


def _parse_latex(content: str) -> list[Parsed]:
    # Wrapping the content in a box lets math-verify's box normalisation handle `$...$`, `\text{}`
    # and units inside. "10\%" is not parseable by latex2sympy; the display-math form with a
    # trailing "\%" is math-verify's percentage path.
    pct = _PERCENT.search(content)
    if pct is not None and pct.start() > 0 and "$" not in content:
        source = f"$${content[: pct.start()]}$$\\%"
    else:
        source = f"\\boxed{{{content}}}"
    return parse(
        source,
        extraction_config=_LATEX,
        fallback_mode="no_fallback",  # a string fallback would be compared verbatim, we do that ourselves
        parsing_timeout=None,  # type: ignore[arg-type]  # None disables signal.alarm (thread-safe)
    )


@functools.lru_cache(maxsize=4096)
def _parse_reference(answer: str) -> tuple[Parsed, ...]:
    # GRPO scores every reference once per sample in its group: cache. lru_cache locks internally
    # and the values are immutable sympy objects, so sharing them across threads is safe.
    parsed = _parse_latex(answer)
    if not parsed:
        parsed = parse(
            answer,
            extraction_config=_EXPR,
            fallback_mode="no_fallback",
            parsing_timeout=None,  # type: ignore[arg-type]
        )
    return tuple(parsed)


def _digits(e: sympy.Basic) -> float | None:
    """Rough upper bound on |log10|e|| (digits to write e exactly) without evaluating e.

    None when e has free symbols. Conservative: it may overestimate, never evaluates big numbers.
    """
    if isinstance(e, sympy.Integer):
        return _int_digits(int(e))
    if isinstance(e, sympy.Rational):
        return _int_digits(int(e.p)) + _int_digits(int(e.q))
    if isinstance(e, sympy.Float):
        try:
            f = abs(float(e))
        except (OverflowError, ValueError):
            return math.inf
        return abs(math.log10(f)) if 0.0 < f < math.inf else (0.0 if f == 0.0 else math.inf)
    if e.free_symbols:
        return None
    if not e.args:  # pi, E, I, oo, nan
        return 1.0
    parts = [_digits(a) for a in e.args]
    if any(p is None for p in parts):
        return None
    sizes = [p for p in parts if p is not None]
    if isinstance(e, sympy.Pow):
        base, exp = sizes
        return _pow10(exp) * base if base else 0.0  # (+-1)^n, 0^n: no digits (and no inf * 0)
    if isinstance(e, sympy.Mul):
        return sum(sizes)
    if isinstance(e, sympy.Add):
        return max(sizes) + math.log10(len(sizes))
    if isinstance(e, _BIG_FUNCS):  # n! has ~ n*log10(n) digits
        n = _pow10(max(sizes))
        return math.inf if n > 1e15 else math.lgamma(n + 1) / math.log(10)
    if isinstance(e, sympy.binomial):  # C(n, k) <= 2^n
        return _pow10(max(sizes)) * math.log10(2)
    if isinstance(e, sympy.exp):
        return _pow10(sizes[0]) * math.log10(math.e)
    if isinstance(e, sympy.log):  # log x ~ digits(x) * ln 10
        return math.log10(max(sizes) * math.log(10) + 1.0) + 1.0
    return max(sizes)  # sin, atan, ...: no faster growth than their argument


def _int_digits(n: int) -> float:
    return math.log10(abs(n)) if n else 0.0  # math.log10 takes arbitrarily big ints


def _pow10(d: float) -> float:
    return math.inf if d > 300 else 10.0**d


def _runaway(expr: Parsed) -> bool:
    """True when sympy may spend (practically) forever comparing `expr`: see the module docstring."""
    if isinstance(expr, MatrixBase) and not isinstance(expr, sympy.Basic):
        return any(_runaway(x) for x in expr)
    if not isinstance(expr, sympy.Basic):
        return False  # strings: compared verbatim
    if expr.has(*_UNEVALUATED):
        return True
    for node in sympy.preorder_traversal(expr):
        if node.is_number:
            size = _digits(node)
            cap = _MAX_TOWER_DIGITS if isinstance(node, sympy.Pow) and not _plain(node.exp) else _MAX_DIGITS
            if size is not None and size > cap:
                return True
        elif isinstance(node, (sympy.Pow, MatPow)):
            base, exp = node.args
            if exp.is_number and not isinstance(base, sympy.Symbol):
                size = _digits(exp)
                if size is None or _pow10(size) > _MAX_SYMBOLIC_EXP:
                    return True
    return False


def _plain(e: sympy.Basic) -> bool:
    """Only numbers, sums and products: an exponent that sympy folds cheaply."""
    return all(isinstance(n, (sympy.Number, sympy.Add, sympy.Mul)) for n in sympy.preorder_traversal(e))


def _same_text(a: str, b: str) -> bool:
    return " ".join(a.split()) == " ".join(b.split())


def score_math(response: str, answer: str, format_penalty: float = -0.1) -> MathScore:
    """Score the last `\\boxed{}` of `response` against the reference `answer` (see module docstring).

    reward: 1.0 "correct", 0.0 "wrong" (also for refused runaway answers), `format_penalty` for
    "no_box" (no box at all) and "unparseable" (a box that is empty, unclosed, longer than the cap,
    or that math-verify cannot parse). `parsed` is the box's stripped text, None when it did not
    parse. Thread-safe; a few ms per call when warm.
    """
    limit = max(MAX_BOX_CHARS, 2 * len(answer))
    found, content = last_box(response, limit)
    if not found:
        return MathScore(format_penalty, None, "no_box")
    if not content:
        return MathScore(format_penalty, None, "unparseable")
    if _same_text(content, answer):  # verbatim: skip sympy entirely
        return MathScore(1.0, content, "correct")
    if _INTEGER.fullmatch(content) and _INTEGER.fullmatch(answer):
        ok = int(content) == int(answer)
        return MathScore(1.0 if ok else 0.0, content, "correct" if ok else "wrong")

    gold = _parse_reference(answer)
    pred = _parse_latex(content)
    if not pred:
        return MathScore(format_penalty, None, "unparseable")
    if not gold:
        # Not math (e.g. a name): only the verbatim check above could have matched.
        return MathScore(0.0, content, "wrong")
    try:
        refused = any(_runaway(p) for p in pred)
    except Exception:  # noqa: BLE001 - an exotic sympy object the guard does not know: let math-verify try
        refused = False
    if refused:
        return MathScore(0.0, content, "wrong")
    ok = verify(list(gold), pred, timeout_seconds=None, raise_on_error=False)
    return MathScore(1.0 if ok else 0.0, content, "correct" if ok else "wrong")


def score_math_json(response: str, answer: str) -> dict[str, float | str | None]:
    """`{"reward": ..., "parsed": ...}` for `gridrun reward math --response TEXT --answer TEXT`."""
    result = score_math(response, answer)
    return {"reward": result.reward, "parsed": result.parsed}
