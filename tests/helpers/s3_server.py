"""A real S3 server for tests: moto's server mode on 127.0.0.1, behind the fault proxy of :mod:`s3_faults`;
clients reach it through the standard AWS environment variables, as users' jobs do."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dist_pool import free_port  # noqa: F401 - one helper for a free loopback port; the S3 tests and benchmarks take it from here
from s3_faults import FaultProxy, quiet_error

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
CLEARED = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")


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


def moto_s3_server(port: int = 0) -> tuple[object, str]:
    """moto's S3 service (alone: not its dispatcher over every AWS service, which looks the service up again on
    every request, about 45% of the server's CPU per GET) on ``port`` of 127.0.0.1, serving from a daemon thread;
    returns the server (``shutdown()`` stops it) and its URL."""
    from moto.moto_server.werkzeug_app import MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    class Handler(MotoRequestHandler):
        # werkzeug writes an answer's headers and body apart: with Nagle's algorithm the body waits for the
        # proxy's delayed ACK of the headers (40 to 200 ms a request, dwarfing what the server spends).
        disable_nagle_algorithm = True

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    server = make_server("127.0.0.1", port, create_backend_app("s3"), threaded=True, request_handler=Handler)
    server.handle_error = quiet_error  # logged, not printed on sys.stderr (see quiet_error)
    threading.Thread(target=server.serve_forever, daemon=True, name="local-s3").start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@contextlib.contextmanager
def local_s3() -> Iterator[LocalS3]:
    """moto's server on a free loopback port, the fault proxy before it; both stopped on exit."""
    import boto3

    server, url = moto_s3_server()
    try:
        with FaultProxy(url) as proxy:
            client = boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                                  aws_access_key_id="testing", aws_secret_access_key="testing")
            yield LocalS3(url, proxy, client)
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def shared_botocore_data() -> Iterator[None]:
    """Every botocore session made inside (each store a test resets makes two: s3fs's and obstore's credentials)
    reads botocore's data files through one loader, as the clients of one session do: parsing the S3 model and
    the endpoint rules again for each took about 3 of the S3 tests' 14 CPU-s. The loader caches what it parsed,
    keyed by the file, so no answer changes."""
    import botocore.session

    original = botocore.session.create_loader
    loaders: dict[str | None, object] = {}

    def create_loader(search_path_string: str | None = None) -> object:
        if search_path_string not in loaders:
            loaders[search_path_string] = original(search_path_string)
        return loaders[search_path_string]

    botocore.session.create_loader = create_loader
    try:
        yield
    finally:
        botocore.session.create_loader = original


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
