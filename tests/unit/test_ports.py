"""quarry.ports: the ports the tests and `kube.py --free-ports` hand to servers never collide,
in one process or across processes (xdist workers, another checkout's run), and never come
from the kernel's ephemeral range (where every bind(0) and client socket takes its ports)."""

from __future__ import annotations

import json
import runpy
import socket
import subprocess
import sys
from pathlib import Path

from quarry import ports
from quarry.ports import free_port, free_port_block, free_ports

TESTS = Path(__file__).resolve().parents[1]


def test_one_process_never_gets_a_port_twice():
    taken = free_ports(300)
    assert len(set(taken)) == len(taken)


def test_ports_are_outside_the_ephemeral_range_and_bindable():
    low, high = ports._range()
    first = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for port in free_ports(20):
        assert low <= port <= high < first
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # nothing listens there


def test_concurrent_processes_never_share_a_port():
    """Four processes pick ports at the same moment (as xdist workers do) while this one
    holds its own: no port is handed out twice."""
    mine = free_ports(50)
    script = (
        "import json, sys; from quarry.ports import free_ports; "
        "sys.stdin.readline(); print(json.dumps(free_ports(100)), flush=True); "
        "sys.stdin.readline()"  # hold the ports until the others have picked theirs
    )
    children = [
        subprocess.Popen(
            [sys.executable, "-c", script],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=TESTS,
            env={"PYTHONPATH": str(TESTS), "PATH": "/usr/bin:/bin"},
        )
        for _ in range(4)
    ]
    try:
        for child in children:
            child.stdin.write("go\n")
            child.stdin.flush()
        theirs = [json.loads(child.stdout.readline()) for child in children]
    finally:
        for child in children:
            child.communicate("done\n", timeout=30)
    every = mine + [port for picked in theirs for port in picked]
    assert all(len(picked) == 100 for picked in theirs)
    assert len(set(every)) == len(every)


def test_a_port_is_free_when_handed_out():
    port = free_port()
    with socket.socket() as server:
        server.bind(("127.0.0.1", port))
        server.listen()
        assert free_port() != port


def test_a_block_is_consecutive_and_never_shared():
    base = free_port_block(5)
    singles = set(free_ports(200))
    assert not singles & set(range(base, base + 5))
    for port in range(base, base + 5):
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_ports_are_not_handed_out_in_sequence():
    """Code that adds to a port it was given (a metrics base + a service index) must not
    land on the next port handed out."""
    taken = free_ports(50)
    steps = sum(1 for a, b in zip(taken, taken[1:], strict=False) if b == a + 1)
    assert steps < 5


def test_kube_free_ports_come_from_here():
    """`kube.py --free-ports` gives every port of the chart's services a port of this scheme
    (below the ephemeral range: a pod's port once went to a client socket before the pod
    bound it), all distinct."""
    kube = runpy.run_path(str(TESTS.parent / "deploy/local/kube.py"), run_name="kube")
    args = kube["free_port_values"]()
    values = dict(arg.split("=", 1) for arg in args[1::2])
    assert args[::2] == ["--set"] * len(values)
    assert {"services.console.port", "services.branchManager.metricsPort"} <= set(values)
    chosen = [int(port) for port in values.values()]
    low, high = ports._range()
    assert len(set(chosen)) == len(chosen)
    assert all(low <= port <= high for port in chosen)
