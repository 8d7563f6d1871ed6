"""rl/threads.py: the warm-up's torch thread count from /proc/stat-like text (pure unit tests)."""

from __future__ import annotations

import os

import pytest

from rl.threads import busy_between, busy_cores, cpu_jiffies, threads_for

# /proc/stat's layout: the all-cores line first (user nice system idle iowait irq softirq steal ...),
# then one line per core, then counters that are not jiffies.
BEFORE = """cpu  1000 10 490 8000 500 0 0 0 0 0
cpu0 500 5 245 4000 250 0 0 0 0 0
cpu1 500 5 245 4000 250 0 0 0 0 0
intr 123456 0 0
ctxt 987654
"""
AFTER = """cpu  1700 10 690 8300 600 0 0 0 0 0
cpu0 1200 5 445 4000 250 0 0 0 0 0
cpu1 500 5 245 4300 350 0 0 0 0 0
"""


def test_idle_counts_iowait_too_and_total_sums_every_field_of_the_all_cores_line() -> None:
    assert cpu_jiffies(BEFORE) == (8000 + 500, 1000 + 10 + 490 + 8000 + 500)
    assert cpu_jiffies(AFTER) == (8300 + 600, 1700 + 10 + 690 + 8300 + 600)


def test_one_of_two_cores_busy_between_two_readings_counts_as_one_busy_core() -> None:
    # 1300 jiffies elapsed over both cores, 400 of them idle or waiting on I/O
    assert busy_between(cpu_jiffies(BEFORE), cpu_jiffies(AFTER), cores=2) == pytest.approx(2 * 900 / 1300)
    assert busy_between((100, 200), (200, 300), cores=4) == 0.0, "every jiffy idle: nobody busy"
    assert busy_between((100, 200), (100, 300), cores=4) == 4.0, "no jiffy idle: every core busy"


def test_readings_without_elapsed_jiffies_count_every_core_busy() -> None:
    assert busy_between((100, 200), (100, 200), cores=8) == 8.0


def test_the_warm_up_takes_the_idle_cores_at_least_one_at_most_all() -> None:
    assert threads_for(cores=8, busy=0.4) == 8
    assert threads_for(cores=8, busy=2.6) == 5
    assert threads_for(cores=2, busy=11.0) == 1, "an overloaded machine: one thread, not zero"
    assert threads_for(cores=2, busy=-0.5) == 2, "never more threads than cores"


@pytest.mark.parametrize("text", ["", "cpu  1 2 3\n", "cpu  a b c d e\n"])
def test_text_of_another_shape_is_an_error_busy_cores_falls_back_on(text: str) -> None:
    with pytest.raises((ValueError, IndexError)):
        cpu_jiffies(text)


def test_busy_cores_on_this_machine_lies_between_none_and_all() -> None:
    assert 0.0 <= busy_cores(sample_s=0.05) <= (os.cpu_count() or 1)
