"""The instruments of ``manage.py bench``: its lean HTTP client against a real site, its CPU
meter, which counts the benchmark's own process apart from the processes it starts, and
the load average every table prints."""

import json
import subprocess
import sys
from io import StringIO

import pytest

from harness.management.commands.bench import Command, CpuMeter, KeptConnection

SPEC = {"agent": "demo.steps", "input": {"steps": 1, "step_seconds": 0}}


def test_the_kept_connection_sends_creates_on_one_socket_and_reads_only_their_status(
        embedded_site):
    client = KeptConnection(embedded_site.port, embedded_site.token)
    single = client.request("POST", "/api/runs/", json.dumps(SPEC).encode())
    batch = client.request("POST", "/api/runs/batch/", json.dumps({"runs": [SPEC] * 3}).encode())
    try:
        assert client.send(single) == 201
        kept = client.socket
        assert client.send(batch) == 201
        assert client.send(single) == 201
        assert client.send(client.request("GET", "/api/runs/?limit=1")) == 200
        assert client.socket is kept  # every response read to its end, the socket kept
    finally:
        client.close()
    stranger = KeptConnection(embedded_site.port, "not-a-key")
    try:
        assert stranger.send(stranger.request("POST", "/api/runs/", json.dumps(SPEC).encode())) \
            == 401
    finally:
        stranger.close()


BURN = """
import sys, time
end = time.process_time() + 0.4
while time.process_time() < end:
    pass
print("burnt", flush=True)
sys.stdin.read()
"""


@pytest.mark.django_db  # on PostgreSQL the meter reads the server's processes too
def test_the_cpu_meter_counts_the_benchmark_apart_from_the_processes_it_started():
    child = subprocess.Popen([sys.executable, "-c", BURN], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        meter = CpuMeter({"system": [child.pid]})
        assert child.stdout.readline().strip() == "burnt"  # it has burnt 0.4 s of CPU
        spent = meter.per(1)
    finally:
        child.stdin.close()
        child.wait(30)
    assert spent["system"] >= 300  # ms
    assert spent["client"] < 100  # this process waited; the child's CPU is not its own
    assert spent["total"] == spent["system"] + spent["client"] + spent["PostgreSQL"]


def printed(load: float) -> str:
    out = StringIO()
    command = Command(stdout=out)
    command.load = load
    command.print_table([("1 live", "something measured", [1.0, 2.0, 3.0], "a note",
                          f"{load:.2f}-0.10")])
    return out.getvalue()


def test_every_table_prints_the_load_and_warns_when_the_machine_was_loaded():
    quiet, loaded = printed(0.4), printed(3.5)
    assert "load average (1 min): 0.40 at the start" in quiet
    assert "warning" not in quiet
    assert "load average (1 min): 3.50 at the start" in loaded
    assert "warning: the machine was loaded when the benchmark started" in loaded
    assert "3.50-0.10" in loaded  # the row's own load, at its part's start and end
