"""The load test's /health poller tells its own wait for a CPU apart from the server's answer: on
a saturated host a poll's round trip can be mostly the poller waiting to run."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from dflash2.tools.loadprobe import BigBody, HealthAnswer, cpu_wait_s, probe_summary

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"), reason="needs Linux schedstat")


def test_cpu_wait_counts_the_time_a_busy_neighbour_on_the_same_cpu_takes():
    cpu = min(os.sched_getaffinity(0))
    before_affinity = os.sched_getaffinity(0)
    rival = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
    try:
        os.sched_setaffinity(0, {cpu})
        time.sleep(0.3)                                 # the rival is running
        waited, until = cpu_wait_s(), time.perf_counter() + 0.6
        while time.perf_counter() < until:              # both runnable on one CPU: each waits about half the time
            pass
        assert cpu_wait_s() - waited > 0.1
    finally:
        os.sched_setaffinity(0, before_affinity)
        rival.kill()
        rival.wait()


def test_the_summary_gives_each_poll_less_the_pollers_own_wait():
    answers = [HealthAnswer(10.0, 0.120, 200, 0.118), HealthAnswer(10.2, 0.030, 200, 0.001),
               HealthAnswer(10.4, 0.500, 0, 0.0)]             # a failed poll counts as a failure only
    big = BigBody(100, sent=10.1, answered=10.3, status=413)
    summary = probe_summary(answers, big, started=9.0)
    health, during = summary["health"], summary["health_during_big_body"]
    assert health["max_ms"] == pytest.approx(120) and health["max_ms_less_poller_wait"] == pytest.approx(29)
    assert health["failures"] == 1 and health["slowest"][0] == [1.0, 10.0, 120.0, 118.0]
    assert during["polls"] == 1 and during["max_ms_less_poller_wait"] == pytest.approx(29)
