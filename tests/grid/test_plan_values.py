"""Every value the plan accepts is one the run accepts: integers where integers are meant,
finite positive learning rates, names that fit a path. Each refusal is one line naming the fix,
and nothing is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from gridrun.grid.compose import Composer
from gridrun.grid.errors import GridError
from gridrun.grid.spec import load_spec
from tests.grid.conftest import Gridrun, tree


@pytest.fixture(scope="module")
def composer() -> Composer:
    return Composer()


@pytest.mark.parametrize(("args", "expected"), [
    (["seed=1.5"], "seed 1.5 is not an integer"),
    (["seed=2.9"], "seed 2.9 is not an integer"),
    (["seed=true"], "seed True is not an integer"),
    (["seed=0,1.5"], "seed '1.5' is not an integer"),
    (["seed=18446744073709551616"], "seeds are integers from 0 to 4294967295"),
    (["seed=4294967296"], "seeds are integers from 0 to 4294967295"),
    (["optim.lr=-1"], "optim.lr must be a finite number > 0"),
    (["optim.lr=0"], "optim.lr must be a finite number > 0"),
    (["optim.lr=nan"], "optim.lr must be a finite number > 0"),
    (["optim.lr=inf"], "optim.lr must be a finite number > 0"),
    (["optim.eps=-1e-8"], "optim.eps must be a finite number > 0"),
    (["optim.beta2=1.0"], "optim.beta2 must be in [0, 1)"),
    (["optim.weight_decay=nan"], "optim.weight_decay must be a finite number >= 0"),
    (["optim.grad_clip=inf"], "optim.grad_clip must be a finite number > 0"),
    (["optim.min_lr_ratio=2"], "optim.min_lr_ratio must be in [0, 1]"),
    (["grpo.clip_high=nan"], "grpo.clip_low and grpo.clip_high must be finite numbers > 0"),
])
def test_values_the_run_would_reject_are_refused_at_plan_time(gridrun: Gridrun, results: Path, args: list[str],
                                                                expected: str) -> None:
    result = gridrun("plan", "conf=smoke", *args)
    assert result.code == 2, result.out
    assert result.err.startswith("gridrun: error: ") and result.err.count("\n") == 1, result.err
    assert expected in result.err, result.err
    assert not results.exists() or tree(results) == [], tree(results)


SWEEP = """
axes: {workflow: [voting], task: [arith], scale: [toy], policy: [shared], seed: [0, 1, 2], kind: [train]}
VARIANTS
EARLY
"""


def _spec(tmp_path: Path, composer: Composer, variants: str = "", early: str = "", args: tuple[str, ...] = ()) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(SWEEP.replace("VARIANTS", variants).replace("EARLY", early))
    load_spec(str(path), list(args), composer)


@pytest.mark.parametrize(("seeds", "message"), [
    ("[1.5]", "seed 1.5 is not an integer"),
    ("[true]", "seed True is not an integer"),
    ("[0, 2.9]", "seed 2.9 is not an integer"),
    ("[18446744073709551616]", "seeds are integers from 0 to 4294967295"),
])
def test_seeds_in_the_sweep_file_must_be_integers_the_run_takes(tmp_path: Path, composer: Composer, seeds: str,
                                                                  message: str) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(SWEEP.replace("seed: [0, 1, 2]", f"seed: {seeds}").replace("VARIANTS", "").replace("EARLY", ""))
    with pytest.raises(GridError, match=message):
        load_spec(str(path), [], composer)


def test_a_variant_name_too_long_for_a_path_is_refused(tmp_path: Path, composer: Composer) -> None:
    with pytest.raises(GridError, match="at most 64 characters"):
        _spec(tmp_path, composer, variants=f"variants:\n  {'v' * 300}: []")


def test_a_variant_given_twice_is_refused(tmp_path: Path, composer: Composer) -> None:
    variants = "variants:\n  natural: []\n  injected: [grpo.n=4]\n  natural: [grpo.n=2]"
    with pytest.raises(GridError, match="'natural' is given twice"):
        _spec(tmp_path, composer, variants=variants)


EARLY = "early_warning: {{fit_seeds: {fit}, held_out_seeds: {held}, search: {{chi2_factor: [2.0, 3.0]}}}}"


@pytest.mark.parametrize(("fit", "held", "args", "message"), [
    ("[0, 5]", "[2]", (), "early_warning.fit_seeds: seed 5 is not on the seed axis"),
    ("[0, 0]", "[2]", (), "early_warning.fit_seeds lists seed 0 twice"),
    ("[0]", "[2, 2]", (), "early_warning.held_out_seeds lists seed 2 twice"),
    ("[0, 1]", "[2]", ("seed=0,1",), "early_warning.held_out_seeds: seed 2 is not on the seed axis"),
])
def test_early_warning_seeds_must_be_planned_once(tmp_path: Path, composer: Composer, fit: str, held: str,
                                                   args: tuple[str, ...], message: str) -> None:
    with pytest.raises(GridError, match=message):
        _spec(tmp_path, composer, early=EARLY.format(fit=fit, held=held), args=args)


def test_a_valid_early_warning_plans(tmp_path: Path, composer: Composer) -> None:
    _spec(tmp_path, composer, early=EARLY.format(fit="[0, 1]", held="[2]"))
