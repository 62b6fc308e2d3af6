"""A moto S3 server on 127.0.0.1 for the object-lake tests: one per test process, a fresh
bucket per test, and the environment that points s3fs at it (subprocesses inherit it).

A test using `s3_bucket` skips (saying why) when the `s3` extra or moto is not installed."""

from __future__ import annotations

import atexit
import logging
import uuid
from collections.abc import Iterator

import pytest

_endpoint: str | None = None


def endpoint() -> str:
    """The moto server's URL, started on first use (loopback only, a free port)."""
    global _endpoint
    if _endpoint is None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        atexit.register(server.stop)
        host, port = server.get_host_and_port()
        _endpoint = f"http://{host}:{port}"
    return _endpoint


def s3_environment() -> dict[str, str]:
    """What s3fs (botocore) needs to talk to the moto server: made-up keys, no other lookup."""
    return {
        "AWS_ENDPOINT_URL": endpoint(),
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }


@pytest.fixture
def s3_bucket(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh, empty bucket on the moto server, its `s3://` URL; the environment is set."""
    s3fs = pytest.importorskip("s3fs", reason="S3 needs the s3 extra: pip install 'tracegym[s3]'")
    pytest.importorskip("moto.server", reason="the S3 tests need moto: pip install 'moto[server]'")

    for name, value in s3_environment().items():
        monkeypatch.setenv(name, value)
    bucket = f"tg-{uuid.uuid4().hex[:16]}"
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    fs.call_s3("create_bucket", Bucket=bucket)
    yield f"s3://{bucket}"
