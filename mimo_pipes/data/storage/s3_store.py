"""One process's client of S3-compatible storage: s3fs (aiobotocore) with the endpoint, region and credentials of
the standard AWS environment variables and config files, at most ``concurrency`` requests in flight, each retried
on transient errors; every other failure is one line naming the URL."""

from __future__ import annotations

import os
import threading
from typing import Any

from mimo_pipes.data.storage.retries import is_transient, with_retries
from mimo_pipes.data.storage.s3_settings import S3Settings, settings_from_env
from mimo_pipes.errors import ConfigError

INSTALL = 'reading s3:// URLs needs s3fs: pip install "mimo-pipes[s3]"'


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
        return self._call(url, lambda: self.fs.cat_file(url, start=start, end=end))

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
        if names & {"NoCredentialsError", "PartialCredentialsError"}:
            return "no AWS credentials found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a profile in ~/.aws)"
        if any(code in text for code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "Forbidden")) or isinstance(error, PermissionError):
            return f"access denied: check the credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_PROFILE) ({text})"
        if "NoSuchBucket" in text or "bucket does not exist" in text.lower():
            return "no such bucket"
        if isinstance(error, FileNotFoundError) or "NoSuchKey" in text or "Not Found" in text:
            return "no such key"
        if names & {"EndpointConnectionError", "ClientConnectorError", "ConnectTimeoutError", "ConnectionRefusedError"}:
            return f"cannot reach the endpoint {self.endpoint or 'of AWS'} (AWS_ENDPOINT_URL)"
        if is_transient(error):
            return f"failed {self.settings.attempts} times ({text})"
        return text


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
