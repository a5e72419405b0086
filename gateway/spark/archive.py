"""A client of the broker's archive API (``/api/v1/archive``), with the stdlib's
urllib and pyarrow: the driver lists topics and their offsets, an executor
streams its offset range as Arrow record batches.

The batches go to Spark as they are (cast to the exact Arrow schema Spark
expects for the declared columns), never as Python rows: that is what makes a
read fast.  Nothing here holds more than one record batch of a response.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from typing import Any
from urllib.error import HTTPError, URLError
from urllib.parse import quote, urlencode
from urllib.request import Request, urlopen

from gateway.spark.options import Endpoint, Selection, redacted_url
from gateway.spark.planning import TopicInfo, first_at_or_after

ARROW_STREAM = "application/vnd.apache.arrow.stream"
READ_BUFFER_BYTES = 1 << 20


class ArchiveError(RuntimeError):
    """The broker refused or failed a request; the message carries its reason."""

    def __init__(self, message: str, *, status: int | None = None, body: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body or {}


class DataLossError(ArchiveError):
    """HTTP 410: retention dropped offsets the read asked for."""

    @property
    def earliest(self) -> int:
        return int(self.body["earliest"])


class ArchiveClient:
    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint

    def _open(self, path: str, accept: str) -> Any:
        headers = {"Accept": accept}
        if self.endpoint.user is not None:
            token = f"{self.endpoint.user}:{self.endpoint.password or ''}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(token).decode()
        request = Request(self.endpoint.url + path, headers=headers)
        context = self.endpoint.tls_context() if self.endpoint.url.startswith("https:") else None
        try:
            return urlopen(request, timeout=self.endpoint.timeout_s, context=context)
        except HTTPError as error:
            with error:
                raise _error_from(error, path, self.endpoint) from None
        except URLError as error:
            raise ArchiveError(f"cannot reach the broker's admin API at {redacted_url(self.endpoint.url)}: {error.reason}") from None

    def _json(self, path: str) -> Any:
        with self._open(path, "application/json") as response:
            return json.loads(response.read())

    def topics(self, selection: Selection) -> list[TopicInfo]:
        """Every archived topic the selection takes, sorted by name: the
        broker matches each core pattern; a regular expression is matched
        here, against the whole list."""
        found: dict[str, TopicInfo] = {}
        for pattern in selection.patterns or [None]:
            query = "?" + urlencode({"pattern": pattern}) if pattern is not None else ""
            for t in self._json("/api/v1/archive" + query)["topics"]:
                if selection.matches(t["topic"]):
                    found[t["topic"]] = TopicInfo(t["topic"], int(t["earliest"]), int(t["latest"]))
        return [found[name] for name in sorted(found)]

    def batches(self, topic: str, start: int, end: int) -> Iterator[Any]:
        """The record batches of offsets ``start``..``end - 1`` of ``topic``.
        Raises :class:`DataLossError` if retention dropped ``start``."""
        import pyarrow as pa

        path = f"/api/v1/archive/{quote(topic, safe='')}/messages?" + urlencode({"from": start, "to": end})
        with self._open(path, ARROW_STREAM) as response:
            content_type = response.headers.get("content-type", "")
            if not content_type.startswith(ARROW_STREAM):
                raise ArchiveError(f"{path}: expected {ARROW_STREAM}, got {content_type!r}")
            # Buffered: pyarrow reads each IPC message in several small reads,
            # and http.client pays per read to undo the chunked encoding.
            with pa.ipc.open_stream(io.BufferedReader(response, READ_BUFFER_BYTES)) as stream:
                yield from stream


    def time_of(self, topic: str, offset: int) -> int | None:
        """The timestamp (µs since the epoch) of one archived message; None
        if retention dropped it."""
        try:
            for batch in self.batches(topic, offset, offset + 1):
                if batch.num_rows:
                    return int(batch.column(3).cast("int64")[0].as_py()) * 1000  # ms -> µs
        except DataLossError:
            return None
        return None

    def offset_for_time(self, topic: str, instant_us: int, start: int, end: int) -> int:
        """The first offset in ``start``..``end - 1`` archived at or after
        ``instant_us``, else ``end`` (about log2(end - start) one-row reads)."""
        return first_at_or_after(instant_us, start, end, lambda offset: self.time_of(topic, offset))


def _error_from(error: HTTPError, path: str, endpoint: Endpoint) -> ArchiveError:
    text = error.read(64 * 1024)
    try:
        body = json.loads(text)
        reason = body.get("reason") if isinstance(body, dict) else None
    except ValueError:
        body, reason = None, None
    if not isinstance(body, dict):
        body = {}
    message = f"broker answered {error.code} to GET {path}: {reason or text[:200].decode('utf-8', 'replace') or error.reason}"
    if error.code == 401:
        # The broker answers 401 alike to no credentials and to wrong ones.
        if endpoint.user is None:
            message = f"the broker's admin API at {redacted_url(endpoint.url)} needs a user: set the user and password options (an admin user with the read role)"
        else:
            message = f"the broker's admin API at {redacted_url(endpoint.url)} refused user {endpoint.user!r}: wrong user or password"
    if error.code == 410 and "earliest" in body:
        return DataLossError(message, status=410, body=body)
    return ArchiveError(message, status=error.code, body=body)
