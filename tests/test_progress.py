"""`dynsched run`'s progress: off a terminal, plain lines every few seconds instead of a silent tqdm."""

from __future__ import annotations

import io

from services.progress import Progress


def test_off_a_terminal_progress_prints_plain_lines_and_a_final_one() -> None:
    out = io.StringIO()
    with Progress(total=8, desc="demo", stream=out, interval_s=0.0) as progress:
        progress.update(2)
        progress.update(20)  # more than the total is shown as the total
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("demo: micro-step 2/8 (25%), ")
    assert lines[-1].startswith("demo: micro-step 8/8 (100%), ")


def test_between_intervals_and_when_disabled_nothing_is_printed() -> None:
    quiet, disabled = io.StringIO(), io.StringIO()
    with Progress(total=8, desc="demo", stream=quiet, interval_s=3600.0) as progress:
        progress.update(3)
    with Progress(total=8, desc="demo", stream=disabled, enabled=False) as progress:
        progress.update(3)
    assert quiet.getvalue().splitlines() == [quiet.getvalue().splitlines()[-1]]  # only the final line
    assert disabled.getvalue() == ""
