"""Peak memory of `tracegym import`, beside a floor measured in the same run.

For each generated input (`--mb` MB of OTLP/JSON lines, the same requests as one JSON array, an
openai-chat `.jsonl`, and a gzip bomb of a few MB unpacking to `--bomb-mb` MB), one fresh
interpreter imports it into an empty home and reports its peak RSS; the floor is another fresh
interpreter that only reads the file and parses it with `json.loads` (a line at a time for JSON
lines, which is what the parsing alone needs); for the bomb, the unpacked size (what unpacking
it whole would hold). Prints MB and the ratio to the floor; the bomb must be refused, with a
ratio far below 1.
Before, 45 MB of JSON lines took 425 MB (openai-chat: 1,536 MB) and a 2 MB
gzip 8.4 GB.

    .venv/bin/python benchmarks/import_memory.py [--mb 45] [--bomb-mb 2048]
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
from pathlib import Path

_REPORT = "import resource, sys; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"


def _otlp_request(trace: int, spans: int) -> dict:
    def span(i: int) -> dict:
        return {
            "traceId": f"{trace:032x}",
            "spanId": f"{i + 1:016x}",
            "name": "execute_tool get_order",
            "kind": 1,
            "startTimeUnixNano": "1700000000000000000",
            "endTimeUnixNano": "1700000001000000000",
            "attributes": [
                {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
                {"key": "gen_ai.tool.name", "value": {"stringValue": "get_order"}},
                {"key": "gen_ai.tool.call.result", "value": {"stringValue": f"W{i:06d} ok"}},
            ],
        }

    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": "svc"}}]}
    scope = {"scope": {"name": "app"}, "spans": [span(i) for i in range(spans)]}
    return {"resourceSpans": [{"resource": resource, "scopeSpans": [scope]}]}


def _chat_run(i: int) -> dict:
    messages: list[dict] = [{"role": "user", "content": f"where is order W{i}?"}]
    for j in range(20):
        arguments = json.dumps({"order_id": f"W{i}"})
        function = {"name": "get_order", "arguments": arguments}
        call = {"id": f"c{i}_{j}", "type": "function", "function": function}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}_{j}", "content": "delivered"})
    messages.append({"role": "assistant", "content": "done"})
    return {"id": f"run{i}", "messages": messages, "outcome": {"success": True}}


def _write_lines(path: Path, make, size: int) -> None:
    written, i = 0, 0
    with open(path, "w") as handle:
        while written < size:
            line = json.dumps(make(i)) + "\n"
            handle.write(line)
            written += len(line)
            i += 1


def _inputs(folder: Path, mb: int, bomb_mb: int) -> dict[str, tuple[str, Path]]:
    size = mb * 1_000_000
    lines = folder / "otlp.jsonl"
    _write_lines(lines, lambda i: _otlp_request(i + 1, 50), size)
    array = folder / "otlp.json"
    with open(lines) as source, open(array, "w") as target:
        target.write("[" + ",".join(line.strip() for line in source) + "]")
    chat = folder / "chat.jsonl"
    _write_lines(chat, _chat_run, size)
    bomb = folder / "bomb.json.gz"
    head = json.dumps(_otlp_request(1, 1)).split('"execute_tool get_order"', 1)
    with gzip.open(bomb, "wb", compresslevel=9) as handle:
        handle.write((head[0] + '"').encode())
        chunk = b"a" * (1 << 20)
        for _ in range(bomb_mb):
            handle.write(chunk)
        handle.write(('"' + head[1]).encode())
    return {
        "otlp-json lines": ("otlp-json", lines),
        "otlp-json array": ("otlp-json", array),
        "openai-chat lines": ("openai-chat", chat),
        "otlp-json gzip bomb": ("otlp-json", bomb),
    }


def _peak_mb(code: str) -> float:
    """Peak RSS in MB of a fresh interpreter running `code`."""
    result = subprocess.run(
        [sys.executable, "-c", f"{code}\n{_REPORT}"], capture_output=True, text=True, check=True
    )
    return int(result.stdout.strip().splitlines()[-1]) / 1024


def _import_peak(fmt: str, path: Path, home: Path) -> tuple[float, int]:
    code = (
        "import resource, sys\n"
        "from tracegym.store.importers import ImportFormatError, import_path\n"
        "try:\n"
        f"    import_path({fmt!r}, {str(path)!r}, {str(home)!r})\n"
        "except ImportFormatError as exc:\n"
        "    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
        "    print(exc, file=sys.stderr)\n"
        "    sys.exit(3)\n"
    )
    result = subprocess.run([sys.executable, "-c", f"{code}{_REPORT}"], capture_output=True,
                            text=True, check=False)  # fmt: skip
    if result.returncode not in (0, 3):
        raise RuntimeError(result.stderr)
    return int(result.stdout.strip().splitlines()[-1]) / 1024, result.returncode


def _floor_peak(path: Path, bomb_mb: int) -> float:
    """Parsing alone; for the bomb, what unpacking it whole would hold at the least."""
    if path.suffix == ".gz":
        return float(bomb_mb)
    if path.suffix == ".jsonl":
        code = f"import json\nfor line in open({str(path)!r}, 'rb'):\n    json.loads(line)"
    else:
        code = f"import json\njson.loads(open({str(path)!r}, 'rb').read())"
    return _peak_mb(code)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=45, help="size of each generated input")
    parser.add_argument("--bomb-mb", type=int, default=2048, help="what the gzip bomb unpacks to")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        inputs = _inputs(folder, args.mb, args.bomb_mb)
        print(f"{'input':22} {'file MB':>8} {'floor MB':>9} {'import MB':>10} {'ratio':>6}")
        for n, (label, (fmt, path)) in enumerate(inputs.items()):
            floor = _floor_peak(path, args.bomb_mb)
            peak, status = _import_peak(fmt, path, folder / f"home{n}")
            size = path.stat().st_size / 1e6
            note = " (refused)" if status == 3 else ""
            print(f"{label:22} {size:8.1f} {floor:9.0f} {peak:10.0f} {peak / floor:6.2f}{note}")


if __name__ == "__main__":
    main()
