"""A master that is SIGSTOPped (not killed) answers nothing: TCP still connects (the kernel
accepts into the backlog), no gRPC answer ever comes. Every caller's deadline then passes;
what they say must be the retryable Unavailable naming the master and the time waited,
not a bare "DEADLINE_EXCEEDED: Deadline Exceeded" (fail17b, issue 17 item 3).

Real processes: ``kvstored master`` and one ``kvstored node``. With the master stopped:
the master client raises Unavailable "master at X did not answer ListNodes within 500 ms";
``kvstorectl nodes`` exits 3 (unreachable) printing the same; the node's link logs
``master_link_failed`` with it. SIGCONT: each answers again, with no restart.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import NodeProcess, _ctl, _wait, start_each, start_master, wait_healthy

from kvstored.cli.ctl_common import EXIT_UNREACHABLE
from kvstored.client.master import MasterClient
from kvstored.errors import Unavailable


def test_a_stopped_master_is_unavailable_named_with_the_time_waited(
        workdir: Path, procs: list[Any]) -> None:
    master = start_master(workdir, procs)
    node = NodeProcess(workdir / "n1", master.address, "n1")
    start_each([node], procs)
    wait_healthy(master.address, {"n1"})
    assert master.proc is not None
    os.kill(master.proc.pid, signal.SIGSTOP)
    try:
        with MasterClient(master.address, timeout_s=0.5) as m, pytest.raises(
                Unavailable, match=rf"master at {master.address} did not answer ListNodes "
                                   r"within 500 ms \(the process may be stopped"):
            m.list_nodes()
        out = _ctl(master.address, "--timeout-s", "0.5", "nodes")
        assert out.returncode == EXIT_UNREACHABLE, (out.returncode, out.stderr)
        assert f"UNAVAILABLE: master at {master.address} did not answer" in out.stderr, out.stderr
        assert "Deadline Exceeded" not in out.stderr, out.stderr
        _wait("the node's link names the stopped master", lambda: any(
            "master_link_failed" in line and "did not answer this node's round" in line
            for line in node.log_path.read_text().splitlines()))
    finally:
        os.kill(master.proc.pid, signal.SIGCONT)
    # the stop outlasted n1's node lease, so the master dropped n1 on waking: n1 registers
    # and syncs again by itself
    wait_healthy(master.address, {"n1"})
