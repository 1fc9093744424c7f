"""bench executor's CPU count of a server: every process in the server's process group, its workers included."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from benchmarks.executor import group_cpu_seconds

# a group leader that only waits, and a worker of its own that spins, then stays alive
SPIN = """
import multiprocessing as mp, time
def spin():
    end = time.process_time() + 0.6
    while time.process_time() < end:
        pass
    time.sleep(30)
if __name__ == "__main__":
    mp.get_context("fork").Process(target=spin).start()
    time.sleep(30)
"""


def test_a_group_s_cpu_seconds_count_its_workers():
    leader = subprocess.Popen([sys.executable, "-c", SPIN], start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while group_cpu_seconds(leader.pid) < 0.6 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert group_cpu_seconds(leader.pid) >= 0.6
        assert group_cpu_seconds(leader.pid + 10**7) == 0.0  # no such group
    finally:
        os.killpg(leader.pid, signal.SIGKILL)  # the group this test made: the leader and its worker
        leader.wait()
