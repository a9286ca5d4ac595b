"""A real S3 server for tests: moto's server mode on 127.0.0.1, behind the fault proxy of :mod:`s3_faults`;
clients reach it through the standard AWS environment variables, as users' jobs do."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from s3_faults import FaultProxy

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
CLEARED = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LocalS3:
    """The server's own URL, the proxy in front of it, and a boto3 client straight to the server (for uploads)."""

    server_url: str
    proxy: FaultProxy
    client: object

    def env(self, **extra: str) -> dict[str, str]:
        """The environment a job needs to read from this server through the proxy."""
        return {**CREDENTIALS, "AWS_ENDPOINT_URL": self.proxy.url, **extra}

    def upload(self, local: Path, url: str) -> str:
        """Every file under the folder ``local`` put under the ``s3://bucket/prefix`` URL; returns it."""
        bucket, _, prefix = url[len("s3://"):].partition("/")
        with contextlib.suppress(Exception):
            self.client.create_bucket(Bucket=bucket)
        for path in sorted(Path(local).rglob("*")):
            if path.is_file():
                key = "/".join(p for p in (prefix.rstrip("/"), path.relative_to(local).as_posix()) if p)
                self.client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
        return url.rstrip("/")


@contextlib.contextmanager
def local_s3() -> Iterator[LocalS3]:
    """moto's server on a free loopback port, the fault proxy before it; both stopped on exit."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        with FaultProxy(f"http://127.0.0.1:{port}") as proxy:
            client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                                  aws_access_key_id="testing", aws_secret_access_key="testing")
            yield LocalS3(f"http://127.0.0.1:{port}", proxy, client)
    finally:
        server.stop()


@contextlib.contextmanager
def s3_environment(env: dict[str, str]) -> Iterator[None]:
    """``env`` set in this process (the AWS variables it does not name cleared), the storage client rebuilt from it;
    everything put back on exit."""
    from mimo_pipes.data.storage.s3_store import reset_store

    saved = {key: os.environ.get(key) for key in (*env, *CLEARED)}
    for key in CLEARED:
        os.environ.pop(key, None)
    os.environ.update(env)
    reset_store()
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        reset_store()
