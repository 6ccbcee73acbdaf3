"""A real S3-protocol server (moto's standalone server) on loopback, and the environment that
points obstore (and subprocesses) at it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import boto3
import pytest
from moto.server import ThreadedMotoServer

BUCKET = "rollway-test"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test",
        region_name="us-east-1",
    ).create_bucket(Bucket=BUCKET)  # fmt: skip
    yield endpoint
    server.stop()


@pytest.fixture
def s3_env(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Configure obstore the standard way: AWS_* environment variables."""
    for key, value in {
        "AWS_ENDPOINT_URL": s3_endpoint,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
    }.items():
        monkeypatch.setenv(key, value)
    return f"s3://{BUCKET}/runs-{time.monotonic_ns()}"
