"""A validation's standard error over problems and samples, worked out by hand."""

from __future__ import annotations

import math

import pytest

from gridrun.train.validate import accuracy_se


def test_the_se_is_clustered_by_problem() -> None:
    # 3 problems x 2 samples: right 2/2, 1/2, 0/2. Per-problem means 1, 0.5, 0 (mean 0.5);
    # their sample variance ((0.5^2 + 0 + 0.5^2) / 2) = 0.25, over n = 3 problems: 0.0833,
    # SE = 0.2887. Treating the 6 answers as independent would say sqrt(0.3 / 6) = 0.2236:
    # samples of one problem are correlated, so the clustered SE is the larger.
    assert accuracy_se([[True, True], [True, False], [False, False]]) == pytest.approx(math.sqrt(0.25 / 3))
    # One sample per problem: sqrt(p(1-p)/(n-1)); 1 right of 4: sqrt(0.1875 / 3) = 0.25.
    assert accuracy_se([[True], [False], [False], [False]]) == pytest.approx(0.25)
    # Every problem equally hard in each sample: no between-problem spread, SE 0.
    assert accuracy_se([[True, False], [False, True]]) == 0.0
    # One problem: no spread to measure.
    assert math.isnan(accuracy_se([[True, False]]))
