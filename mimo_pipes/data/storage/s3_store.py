"""One process's client of S3-compatible storage, with the endpoint, region and credentials of the standard AWS
environment variables and config files (as botocore resolves them), at most ``concurrency`` requests in flight,
each retried on transient errors; every other failure is one line naming the URL. Objects are read with obstore
(its requests run in Rust, outside the GIL: about a tenth of the CPU time per request that s3fs spends in
Python, which the processing threads of the same process would otherwise wait for); keys are listed with s3fs."""

from __future__ import annotations

import os
import threading
from typing import Any

from mimo_pipes.data.storage.retries import is_transient, with_retries
from mimo_pipes.data.storage.s3_settings import S3Settings, settings_from_env
from mimo_pipes.data.storage.s3_url import bucket_and_key
from mimo_pipes.errors import ConfigError

INSTALL = 'reading s3:// URLs needs s3fs and obstore: pip install "mimo-pipes[s3]"'


class StorageError(OSError):
    """A request that failed for good: ``text`` says why in one line, naming the URL."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"{url}: {reason}")
        self.url = url
        self.reason = reason


class S3Store:
    """Reads objects whole or by byte range, lists and globs keys. ``requests`` counts requests sent (retries
    included), ``retries`` the transient failures that were tried again."""

    def __init__(self, settings: S3Settings) -> None:
        try:
            import obstore  # noqa: F401 - only checked here
            import s3fs
        except ImportError:
            raise ConfigError("--dataset", INSTALL) from None
        self.settings = settings
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        # Retries are ours (below), so every request is counted and bounded once, not in three layers.
        self.fs = s3fs.S3FileSystem(
            skip_instance_cache=True, use_listings_cache=False,
            client_kwargs={"endpoint_url": endpoint} if endpoint else {},
            config_kwargs={"connect_timeout": settings.timeout_s, "read_timeout": settings.timeout_s,
                           "retries": {"total_max_attempts": 1}, "max_pool_connections": max(10, settings.concurrency)},
        )
        self.fs.retries = 1
        self.endpoint = endpoint
        self.requests = 0
        self.retries = 0
        self._gate = threading.BoundedSemaphore(settings.concurrency)
        self._count = threading.Lock()
        self._buckets: dict[str, Any] = {}

    def _bucket(self, bucket: str) -> Any:
        """obstore's client of ``bucket`` (one per bucket), credentials and region as botocore finds them."""
        with self._count:
            if bucket not in self._buckets:
                self._buckets[bucket] = object_client(bucket, self.endpoint, self.settings)
            return self._buckets[bucket]

    def _call(self, url: str, call: Any) -> Any:
        def once() -> Any:
            with self._gate:
                with self._count:
                    self.requests += 1
                return call()

        def retried(error: BaseException) -> None:
            with self._count:
                self.retries += 1

        try:
            return with_retries(once, attempts=self.settings.attempts, backoff_s=self.settings.backoff_s, on_retry=retried)
        except Exception as error:  # noqa: BLE001 - every failure becomes one line naming the URL
            raise StorageError(url, self.reason(error)) from error

    def read(self, url: str, start: int | None = None, end: int | None = None) -> bytes:
        """The object's bytes (``start``..``end``-1 when given)."""
        import obstore

        bucket, key = bucket_and_key(url)
        client = self._bucket(bucket)
        options: dict[str, Any] = {}
        if start is not None or end is not None:
            options["range"] = (start or 0, end) if end is not None else {"offset": start or 0}
        if options.get("range") and end is not None and end <= (start or 0):
            return b""
        return self._call(url, lambda: bytes(obstore.get(client, key, options=options or None).bytes()))

    def info(self, url: str) -> dict:
        return self._call(url, lambda: self.fs.info(url))

    def glob(self, pattern: str) -> list[str]:
        """Keys matching ``pattern``, sorted, as ``s3://`` URLs."""
        return sorted("s3://" + key for key in self._call(pattern, lambda: self.fs.glob(pattern)))

    def is_file(self, url: str) -> bool:
        return bool(self._call(url, lambda: self.fs.isfile(url)))

    def is_dir(self, url: str) -> bool:
        return bool(self._call(url, lambda: self.fs.isdir(url)))

    def listing(self, url: str) -> list[str]:
        """Every object under the folder ``url``, as ``s3://`` URLs, sorted."""
        return sorted("s3://" + key for key in self._call(url, lambda: self.fs.find(url)))

    def reason(self, error: BaseException) -> str:
        """Why a request failed, in words a user acts on."""
        text = " ".join(str(error).split()) or type(error).__name__
        names = {type(e).__name__ for e in _chain(error)}
        if names & {"NoCredentialsError", "PartialCredentialsError"} or "no AWS credentials" in text:
            return "no AWS credentials found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a profile in ~/.aws)"
        if (any(code in text for code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "Forbidden"))
                or isinstance(error, PermissionError) or names & {"PermissionDeniedError", "UnauthenticatedError"}):
            return f"access denied: check the credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_PROFILE) ({text})"
        if "NoSuchBucket" in text or "bucket does not exist" in text.lower():
            return "no such bucket"
        if isinstance(error, FileNotFoundError) or "NoSuchKey" in text or "Not Found" in text or "NotFoundError" in names:
            return "no such key"
        if (names & {"EndpointConnectionError", "ClientConnectorError", "ConnectTimeoutError", "ConnectionRefusedError"}
                or "Connection refused" in text or "error trying to connect" in text):
            return f"cannot reach the endpoint {self.endpoint or 'of AWS'} (AWS_ENDPOINT_URL)"
        if is_transient(error):
            return f"failed {self.settings.attempts} times ({text})"
        return text


def object_client(bucket: str, endpoint: str | None, settings: S3Settings) -> Any:
    """An obstore client of ``bucket``: botocore's credentials (environment, profiles, config files, roles) and
    region, the endpoint given, path-style addressing, no retries of its own (:meth:`S3Store._call` retries)."""
    import botocore.session
    from obstore.store import S3Store as ObjectStore

    session = botocore.session.get_session()

    def credentials() -> dict[str, Any]:
        found = session.get_credentials()
        if found is None:
            raise PermissionError("no AWS credentials found")
        frozen = found.get_frozen_credentials()
        return {"access_key_id": frozen.access_key, "secret_access_key": frozen.secret_key, "token": frozen.token,
                "expires_at": None}

    timeout = f"{settings.timeout_s}s"
    options = {"timeout": timeout, "connect_timeout": timeout, "pool_max_idle_per_host": str(max(10, settings.concurrency))}
    if endpoint is not None and endpoint.startswith("http://"):
        options["allow_http"] = "true"
    config: dict[str, Any] = {"region": session.get_config_variable("region") or "us-east-1"}
    if endpoint is not None:
        config["endpoint"] = endpoint
    return ObjectStore(bucket, client_options=options, retry_config={"max_retries": 0}, credential_provider=credentials,
                       virtual_hosted_style_request=False, **config)


def _chain(error: BaseException | None) -> list[BaseException]:
    found: list[BaseException] = []
    while error is not None and error not in found:
        found.append(error)
        error = error.__cause__ or error.__context__
    return found


_STORES: dict[int, S3Store] = {}
_LOCK = threading.Lock()


def store() -> S3Store:
    """This process's store (one per process: s3fs's event loop does not survive a fork)."""
    with _LOCK:
        pid = os.getpid()
        if pid not in _STORES:
            _STORES.clear()
            _STORES[pid] = S3Store(settings_from_env())
        return _STORES[pid]


def reset_store() -> None:
    """Forget this process's store (the next :func:`store` reads the environment again: tests change it)."""
    with _LOCK:
        _STORES.clear()
