"""`make sim` progress: the line's wording, and one line per tenth of the run without a terminal."""

from __future__ import annotations

import pytest

from nstance.simulation.__main__ import _Progress, progress_line


def test_progress_line_estimates_the_rest() -> None:
    assert progress_line(25, 100, 1, 10.0) == "sim: 25/100 seeds, 1 failed, 10s elapsed, about 30s left"


@pytest.mark.parametrize(("total", "lines"), [(100, 10), (300, 10), (7, 7), (1, 0)])
def test_progress_without_a_terminal_prints_a_line_per_tenth(
    total: int, lines: int, capsys: pytest.CaptureFixture[str]
) -> None:
    progress = _Progress(total, terminal=False)
    for done in range(1, total + 1):
        progress.step(0, float(done))
    progress.finish()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == lines
    if lines:
        assert err[-1].startswith(f"sim: {total}/{total} seeds")
