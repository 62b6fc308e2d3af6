"""Ingest past one process: agents -> rotel -> two `tracegym collect` processes -> one lake.

Two agents (OpenTelemetry SDK tracer providers with the OTLP/HTTP exporter) each send spans to
their own rotel (a Rust OpenTelemetry collector shipped as the `rotel` wheel, the `collector`
extra); each rotel exports OTLP/HTTP to its own `tracegym collect` process; both receivers write
the spool of ONE home (each process appends to files of its own), and `tracegym compact` turns
that spool into the lake. The lake must hold exactly the spans the agents sent, each once, with
the resource of the agent that sent it.

One rotel per receiver, not one rotel fanning out to two: rotel's exporters each get every
span, so a fan-out into one home would store each span twice (compaction does not deduplicate).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import pytest

rotel = pytest.importorskip(
    "rotel", reason="rotel is not installed (pip install 'tracegym[collector]')"
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

AGENTS = ("agent-a", "agent-b")
RUNS_PER_AGENT = 40  # each run: a root and 4 children
SETTLE_S = 90.0  # how long the spans may take to reach the spool (a busy 2-core machine)


def rotel_binary() -> Path:
    binary = Path(rotel.__file__).parent / "rotel-agent"
    if not os.access(binary, os.X_OK):
        pytest.skip(f"the rotel wheel has no runnable rotel-agent at {binary}")
    return binary


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def clean_env() -> dict[str, str]:
    """The environment without OTLP settings or a lake URL that would redirect anything."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OTEL_", "ROTEL_")) and k != "TRACEGYM_LAKE_URL"
    }
    env["HF_HUB_OFFLINE"] = "1"
    return env


def wait_until(check: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def stop(process: subprocess.Popen, sig: int) -> None:
    """Stop a process this test started, by its id; kill it if it does not exit."""
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout=60)  # a niced process on a loaded machine exits slowly
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)


def spool_lines(home: Path) -> int:
    return sum(len(path.read_bytes().splitlines()) for path in (home / "spool").glob("*.jsonl"))


@pytest.fixture
def processes() -> Iterator[list[tuple[subprocess.Popen, int]]]:
    """Processes started by the test with the signal that stops each; stopped in reverse."""
    started: list[tuple[subprocess.Popen, int]] = []
    yield started
    for process, sig in reversed(started):
        stop(process, sig)


def start_receiver(home: Path, workdir: Path, processes: list) -> int:
    port = free_port()
    with (workdir / f"collect-{port}.log").open("wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tracegym.cli",
                "--home",
                str(home),
                "collect",
                "--port",
                str(port),
            ],
            cwd=workdir,
            env=clean_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    processes.append((process, signal.SIGINT))  # Ctrl-C: `collect` stops cleanly
    return port  # not waited for here: the two start side by side


def start_rotel(receiver_port: int, workdir: Path, processes: list) -> int:
    http_port, grpc_port = free_port(), free_port()
    with (workdir / f"rotel-{http_port}.log").open("wb") as log:
        process = subprocess.Popen(
            [
                str(rotel_binary()),
                "start",
                f"--otlp-http-endpoint=127.0.0.1:{http_port}",
                f"--otlp-grpc-endpoint=127.0.0.1:{grpc_port}",
                "--exporter=otlp",
                "--otlp-exporter-protocol=http",
                f"--otlp-exporter-endpoint=http://127.0.0.1:{receiver_port}",
                f"--pid-file={workdir / f'rotel-{http_port}.pid'}",
                f"--log-file={workdir / f'rotel-{http_port}.log.txt'}",
            ],
            cwd=workdir,
            env=clean_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    processes.append((process, signal.SIGTERM))
    wait_until(lambda: listening(http_port), f"rotel on port {http_port}")
    return http_port


def send_runs(service: str, rotel_port: int) -> list[tuple[str, str]]:
    """One agent's runs through the SDK's OTLP/HTTP exporter; returns the (trace, span) ids."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{rotel_port}/v1/traces", timeout=30)
    provider.add_span_processor(BatchSpanProcessor(exporter, max_export_batch_size=32))
    tracer = provider.get_tracer("tests.collector")
    sent: list[tuple[str, str]] = []

    def ids(span) -> tuple[str, str]:
        context = span.get_span_context()
        return format(context.trace_id, "032x"), format(context.span_id, "016x")

    for run in range(RUNS_PER_AGENT):
        with tracer.start_as_current_span(f"invoke_agent {service}") as root:
            root.set_attribute("run", run)
            sent.append(ids(root))
            for step in range(4):
                with tracer.start_as_current_span(f"execute_tool step{step}") as child:
                    child.set_attribute("tool.arguments", f'{{"run": {run}, "step": {step}}}')
                    sent.append(ids(child))
    assert provider.force_flush(30_000), f"{service}: the SDK could not flush to rotel"
    provider.shutdown()
    return sent


def test_rotel_relays_two_agents_into_two_receivers_and_one_lake(tmp_path, processes):
    home, workdir = tmp_path / "home", tmp_path / "work"
    workdir.mkdir()
    receivers = [start_receiver(home, workdir, processes) for _ in AGENTS]
    for port in receivers:  # a CLI start takes seconds on a loaded machine
        wait_until(lambda port=port: healthy(port), f"tracegym collect on {port}", 90)
    relays = [start_rotel(port, workdir, processes) for port in receivers]

    sent = {service: send_runs(service, port) for service, port in zip(AGENTS, relays, strict=True)}
    total = sum(len(ids) for ids in sent.values())
    assert total == len(AGENTS) * RUNS_PER_AGENT * 5

    wait_until(lambda: spool_lines(home) >= total, f"{total} spans in the spool", SETTLE_S)
    for process, sig in reversed(processes):  # rotels first, then the receivers
        stop(process, sig)
        assert process.returncode == 0 or process.returncode == -sig, process.args
    spool_files = sorted((home / "spool").glob("*.jsonl"))
    writers = {path.name.split("-")[-2] for path in spool_files}  # <start>-<host>-<pid>-<rand>
    assert len(writers) == 2, spool_files  # both receiver processes wrote

    compacted = subprocess.run(
        [sys.executable, "-m", "tracegym.cli", "--home", str(home), "compact"],
        cwd=workdir,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert compacted.returncode == 0, compacted.stderr
    assert f"{total} spans" in compacted.stdout, compacted.stdout
    assert not list((home / "spool").glob("*.jsonl"))  # everything moved into the lake

    lake = (home / "lake" / "spans").as_posix() + "/**/*.parquet"
    rows = duckdb.sql(
        "SELECT trace_id, span_id, json_extract_string(resource, '$.\"service.name\"') "
        "FROM read_parquet(?)",
        params=[lake],
    ).fetchall()
    stored = Counter((trace, span) for trace, span, _ in rows)
    expected = Counter(ids for service_ids in sent.values() for ids in service_ids)
    assert stored == expected  # nothing lost, nothing duplicated
    services = {(trace, span): service for trace, span, service in rows}
    for service, ids in sent.items():
        assert {services[key] for key in ids} == {service}
