"""Retrying one storage request on transient errors with exponential backoff, a bounded number of times."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

TRANSIENT_CODES = {"500", "502", "503", "504", "SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "Throttling"}
TRANSIENT_NAMES = {
    "ClientPayloadError", "ServerDisconnectedError", "ClientOSError", "ServerTimeoutError", "IncompleteRead",
    "ConnectionResetError", "ConnectionError", "TimeoutError", "ReadTimeoutError", "ConnectTimeoutError",
    "EndpointConnectionError", "ConnectionClosedError", "ResponseStreamingError", "ProtocolError", "ContentLengthError",
    "RetryableError",  # the multi-storage client's: a 429, 503 or 408 answer, a timeout, a read cut short
}

# What obstore's errors (one class, GenericError, for most failures) say of a transient failure.
TRANSIENT_TEXT = ("503", "500 Internal", "SlowDown", "Service Unavailable", "Connection reset", "timed out", "IncompleteBody",
                  "body error", "connection closed", "error sending request")


def is_transient(error: BaseException) -> bool:
    """Whether ``error``, or one it was raised from, is worth another try: a 5xx / SlowDown answer, a reset or cut
    connection, a timeout. Missing keys, denied access and bad requests are not."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if type(error).__name__ in TRANSIENT_NAMES or isinstance(error, (ConnectionError, TimeoutError)):
            return True
        response = getattr(error, "response", None)
        if isinstance(response, dict):
            code = str(response.get("Error", {}).get("Code", ""))
            status = str(response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
            if code in TRANSIENT_CODES or status in TRANSIENT_CODES:
                return True
        text = str(error)
        if any(marker in text for marker in TRANSIENT_TEXT):
            return True
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    return False


def with_retries(call: Callable[[], T], *, attempts: int, backoff_s: float, on_retry: Callable[[BaseException], None] | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> T:
    """``call()``, tried up to ``attempts`` times while it fails transiently, waiting ``backoff_s * 2**k`` before try k+1."""
    for attempt in range(attempts):
        try:
            return call()
        except Exception as error:  # noqa: BLE001 - sorted below: transient ones are tried again
            if attempt + 1 >= attempts or not is_transient(error):
                raise
            if on_retry is not None:
                on_retry(error)
            sleep(backoff_s * 2**attempt)
    raise AssertionError("unreachable")  # the loop returns or raises
