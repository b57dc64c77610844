"""S3 object backend: the file store's contract on ``s3://bucket/prefix``.

The commit protocol in ``store.py`` needs whole-object atomic PUT, GET, LIST and
DELETE, which S3 has natively: a PUT (or a completed multipart upload) is visible all
at once or not at all. What S3 lacks is a lock; ``lock()`` builds one from a
conditional write (``PUT ... If-None-Match: *`` on ``.spot-lock``, which S3 has honoured
since August 2024 and answers with 412 when the key exists), with an expiry so that a
holder that died does not block the store for ever. The expiry is judged on the S3
server's clock (the lock's LastModified against the same response's Date), never by a
time the holder wrote against the breaker's clock (a breaker an hour ahead broke every
live lock), and a lock is broken only by compare-and-swap: a PUT with ``If-Match`` on the
ETag judged expired takes it over, a DELETE with ``If-Match`` releases it.

The window, stated plainly: a lock holder that stalls for longer than ``lock_ttl``
between taking the lock and writing its manifest can have the lock taken over, and then
two writers' check-then-commit sections may overlap. The critical sections are a few
requests long (read the fence, HEAD the payload objects, PUT the manifest), and the
default TTL is 60 s, so this needs a stall of a minute inside those requests. The
manifest PUT is itself conditional (``If-None-Match: *``), so a commit can never
overwrite another one; the damage the window allows is a stale attempt's manifest
landing after a newer attempt's fence, which ``latest()`` then still ranks below every
newer attempt's checkpoint (order is step, then attempt).

Reads are whole or an error: every GET is checked against the length S3 declared (and
botocore's checksum where the object has one); a connection cut half-way is an
``IncompleteRead`` (retryable), never a shorter object. Every call is bounded: connect
and read timeouts per attempt, and no retry starts after ``call_deadline_seconds``, so a
store that stops answering fails a call in about that time instead of minutes.

Large payloads go up as multipart uploads through boto3's transfer manager (parts in
parallel); an upload that fails half-way, also because the payload source failed, is
aborted, so nothing becomes visible. Every PUT asks for server-side
encryption (SSE-S3 by default, SSE-KMS with a key id, or off with ``sse=None``).
"""

from __future__ import annotations

import contextlib
import datetime
import email.utils
import io
import json
import logging
import math
import os
import secrets
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

from spot_core.adaptors import aws
from spot_core.checkpoint.backend import judged_age
from spot_core.checkpoint.uri import s3_prefix
from spot_core.errors import CheckpointError, ConfigError, CorruptCheckpoint, IncompleteRead

if TYPE_CHECKING:  # collections.abc.Buffer from 3.12; typing_extensions is a typing-only need
    from typing_extensions import Buffer

T = TypeVar("T")

log = logging.getLogger(__name__)

LOCK_NAME = ".spot-lock"
DEFAULT_PART_SIZE = 8 << 20
MIN_PART_SIZE = 5 << 20
SSE_CHOICES = ("AES256", "aws:kms", None)
DEFAULT_LOCK_TTL = 60.0
LOCK_TTL_ENV = "SPOT_S3_LOCK_TTL"
# Bounds of one call. Per attempt: connect and read (silence between bytes) timeouts; over
# all of botocore's attempts: no retry starts after the deadline (so a call ends within
# about the deadline plus one attempt's timeouts). A short read is read again this often.
CONNECT_TIMEOUT_SECONDS = 5.0
READ_TIMEOUT_SECONDS = 20.0
CALL_DEADLINE_SECONDS = 60.0
READ_TRIES = 3
WRITE_TOKEN = "spot-write"  # metadata of a conditional PUT: which call wrote the object
MAX_LOCK_BYTES = 4 << 10  # a lock is ~100 bytes


class S3Backend:
    """Objects under ``s3://bucket/prefix``; keys are relative POSIX paths."""

    concurrent_reads = True  # each GET waits on the network: overlapping them pays

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        sse: str | None = "AES256",
        sse_kms_key_id: str | None = None,
        part_size: int = DEFAULT_PART_SIZE,
        max_concurrency: int = 8,
        lock_ttl: float | None = None,
        lock_timeout: float = 120.0,
        call_deadline_seconds: float = CALL_DEADLINE_SECONDS,
        client: Any = None,
        session: aws.Access = None,
    ) -> None:
        if sse not in SSE_CHOICES:
            raise ConfigError(
                f"sse={sse!r} is not one of {SSE_CHOICES}; use 'AES256' (SSE-S3), "
                "'aws:kms' with sse_kms_key_id, or None to turn it off"
            )
        if part_size < MIN_PART_SIZE:
            raise ConfigError(f"part_size {part_size} is below S3's 5 MiB minimum part size")
        if isinstance(call_deadline_seconds, bool) or not (
            isinstance(call_deadline_seconds, (int, float)) and 0 < call_deadline_seconds < 1e6
        ):
            raise ConfigError(
                f"call_deadline_seconds={call_deadline_seconds!r} must be a number of seconds "
                f"above 0 (default {CALL_DEADLINE_SECONDS:g})"
            )
        self.bucket, self.prefix = bucket, s3_prefix(prefix)
        self.call_deadline_seconds = float(call_deadline_seconds)
        access = aws.access_of(session)  # the engine's credentials, or boto3's chain
        self.endpoint_url = access.endpoint("s3", endpoint_url) or aws.s3_endpoint()
        self.region = (
            region
            or access.region
            or os.environ.get("AWS_REGION")
            or os.environ.get("AWS_DEFAULT_REGION")
            or "us-east-1"
        )
        self.sse, self.sse_kms_key_id = sse, sse_kms_key_id
        self.part_size, self.max_concurrency = part_size, max(1, max_concurrency)
        self.lock_ttl = float(lock_ttl or os.environ.get(LOCK_TTL_ENV) or DEFAULT_LOCK_TTL)
        self.lock_timeout = lock_timeout
        self.client = client or aws.shared_client(  # one per credentials, region, endpoint
            "s3",
            region=self.region,
            endpoint_url=self.endpoint_url,
            session=access,
            max_pool_connections=max(10, self.max_concurrency + 2),
            retry_attempts=5,
            connect_timeout_seconds=min(CONNECT_TIMEOUT_SECONDS, self.call_deadline_seconds),
            read_timeout_seconds=min(READ_TIMEOUT_SECONDS, self.call_deadline_seconds),
        )
        aws.honour_deadlines(self.client)  # also a client the caller made

    def __repr__(self) -> str:
        return f"S3Backend('s3://{self.bucket}/{self.prefix}')"

    # -- writes ------------------------------------------------------------------
    def put_bytes(self, key: str, data: bytes) -> None:
        self._call(
            "put",
            self.client.put_object,
            Bucket=self.bucket,
            Key=self._key(key),
            Body=bytes(data),
            **self._sse(),
        )

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """PUT only if nothing is stored under ``key``; False if something was.

        A retried PUT whose first answer was lost finds its own write (412): the token in
        the object's metadata tells it apart from another writer's, so it is True, not a
        conflict (a lock taker would otherwise wait out its own lock's lifetime)."""
        token = secrets.token_hex(16)
        try:
            self._call(
                "put",
                self.client.put_object,
                Bucket=self.bucket,
                Key=self._key(key),
                Body=bytes(data),
                IfNoneMatch="*",
                Metadata={WRITE_TOKEN: token},
                **self._sse(),
            )
            return True
        except _Conflict as conflict:
            return conflict.retried and self._written_with(key, token)

    def _written_with(self, key: str, token: str) -> bool:
        try:
            metadata = self._head(key).get("Metadata") or {}
        except FileNotFoundError:
            return False
        mine = bool(metadata.get(WRITE_TOKEN) == token)
        if mine:
            log.info("a retried conditional PUT of %s found its own first write", key)
        return mine

    def put_stream(self, key: str, chunks: Iterable[bytes | memoryview]) -> int:
        full, buffer = self._key(key), bytearray()
        iterator = iter(chunks)
        for chunk in iterator:
            buffer += chunk
            if len(buffer) >= self.part_size:
                return self._multipart(full, buffer, iterator)
        self._call(
            "put",
            self.client.put_object,
            Bucket=self.bucket,
            Key=full,
            Body=bytes(buffer),
            **self._sse(),
        )
        return len(buffer)

    def _multipart(self, key: str, buffer: bytearray, rest: Iterator[bytes | memoryview]) -> int:
        """Hand the stream to boto3's transfer manager: parallel parts, and the upload is
        aborted (nothing visible) if reading the source or any part fails."""
        from boto3.s3.transfer import TransferConfig

        reader = _ChunkReader(buffer, rest)
        config = TransferConfig(
            multipart_threshold=self.part_size,
            multipart_chunksize=self.part_size,
            max_concurrency=self.max_concurrency,
            use_threads=True,
        )
        self._call(
            "multipart upload",
            self.client.upload_fileobj,
            reader,
            self.bucket,
            key,
            ExtraArgs=self._sse(),
            Config=config,
            bounded=False,  # minutes for a large payload; each part's request is bounded
        )
        return reader.consumed

    def _abort(self, key: str, upload: str) -> None:
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload)
        except Exception as exc:  # noqa: BLE001 - cleanup must not hide the original error
            log.warning("could not abort multipart upload of %s: %s", key, exc)

    def delete(self, key: str) -> None:
        self._call("delete", self.client.delete_object, Bucket=self.bucket, Key=self._key(key))

    def delete_prefix(self, prefix: str) -> None:
        """Every object under ``prefix``, and any multipart upload left there by a crash."""
        full = self._key(prefix) + "/"
        keys = [o["Key"] for o in self._list(full, delimiter=None)]
        for start in range(0, len(keys), 1000):
            batch = [{"Key": k} for k in keys[start : start + 1000]]
            self._call(
                "delete",
                self.client.delete_objects,
                Bucket=self.bucket,
                Delete={"Objects": batch, "Quiet": True},
            )
        uploads = self._call(
            "list uploads", self.client.list_multipart_uploads, Bucket=self.bucket, Prefix=full
        ).get("Uploads", [])
        for upload in uploads:
            self._abort(upload["Key"], upload["UploadId"])

    # -- reads -------------------------------------------------------------------
    def get_bytes(self, key: str, max_bytes: int | None = None) -> bytes:
        """The whole object or an error: a read cut short is read again (``READ_TRIES``,
        within the call deadline), then ``IncompleteRead``; never a prefix of it."""
        with aws.within(self.call_deadline_seconds):
            tries = 1
            while True:
                try:
                    return self._get_whole(key, max_bytes)
                except IncompleteRead as exc:
                    if tries >= READ_TRIES or aws.past_deadline() is not None:
                        raise
                    log.debug("reading %s again: %s", key, exc)
                    tries += 1

    def _get_whole(self, key: str, max_bytes: int | None) -> bytes:
        response = self._get(key)
        length = int(response.get("ContentLength") or 0)
        if max_bytes is not None and length > max_bytes:
            response["Body"].close()  # judged by its length before any byte is read
            raise CorruptCheckpoint(
                f"object {key} holds more than {max_bytes} bytes "
                f"({length}); no writer of this store made it (remove it)"
            )
        return b"".join(self._body(key, response, length + 1))  # one read, one copy

    def iter_chunks(self, key: str, chunk_size: int) -> Iterator[bytes]:
        yield from self._body(key, self._get(key), chunk_size)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Bytes ``start`` to ``start + length`` of the object (a GET with ``Range``), whole
        or an error as ``get_bytes``: a read cut short is read again within the call
        deadline, then ``IncompleteRead``; an object shorter than the range is one too
        (the caller's digest check says what it is)."""
        end = start + length - 1
        with aws.within(self.call_deadline_seconds):
            tries = 1
            while True:
                try:
                    response = self._call(
                        "get",
                        self.client.get_object,
                        Bucket=self.bucket,
                        Key=self._key(key),
                        Range=f"bytes={start}-{end}",
                        missing=key,
                    )
                    return b"".join(self._body(key, response, length + 1))
                except IncompleteRead as exc:
                    if tries >= READ_TRIES or aws.past_deadline() is not None:
                        raise
                    log.debug("reading %s [%d, %d] again: %s", key, start, end, exc)
                    tries += 1

    def _body(self, key: str, response: dict[str, Any], chunk_size: int) -> Iterator[bytes]:
        """The body's chunks, then ``IncompleteRead`` unless exactly the declared length
        came. Why here: botocore checks the length (and the checksum S3 stored, if any)
        only when a read reaches the end, and a connection cut early ends it quietly."""
        body, declared, got = response["Body"], int(response.get("ContentLength") or 0), 0
        try:
            while chunk := self._read(key, body, chunk_size, got, declared):
                got += len(chunk)
                if got > declared:
                    break
                yield chunk
        finally:
            body.close()
        if got != declared:
            raise self._incomplete(key, got, declared, "the stream ended early")

    def _read(self, key: str, body: Any, size: int, got: int, declared: int) -> bytes:
        import http.client

        from botocore.exceptions import BotoCoreError
        from urllib3.exceptions import HTTPError

        try:
            chunk: bytes = body.read(size)  # b"" at the end: botocore checks length there
            return chunk
        except (BotoCoreError, HTTPError, http.client.HTTPException, OSError) as exc:
            raise self._incomplete(key, got, declared, f"{type(exc).__name__}: {exc}") from exc

    def _incomplete(self, key: str, got: int, declared: int, why: str) -> IncompleteRead:
        return IncompleteRead(
            f"S3 read of s3://{self.bucket}/{self._key(key)} stopped after {got} of "
            f"{declared} bytes ({why}); the connection was cut, not the object: retry"
        )

    def size(self, key: str) -> int:
        return int(self._head(key)["ContentLength"])

    def age_seconds(self, key: str) -> float:
        """One HEAD: the object's LastModified against the same response's Date, both
        the S3 server's clock (whole seconds)."""
        return server_age(self._head(key))

    def exists(self, key: str) -> bool:
        try:
            self._head(key)
            return True
        except FileNotFoundError:
            return False

    def children(self, prefix: str) -> list[str]:
        full = (self._key(prefix) + "/") if prefix else (self.prefix + "/" if self.prefix else "")
        names: set[str] = set()
        paginator = self.client.get_paginator("list_objects_v2")
        pages = self._call(
            "list", lambda: list(paginator.paginate(Bucket=self.bucket, Prefix=full, Delimiter="/"))
        )
        for page in pages:
            names.update(
                p["Prefix"][len(full) :].rstrip("/") for p in page.get("CommonPrefixes", [])
            )
            names.update(o["Key"][len(full) :] for o in page.get("Contents", []))
        return sorted(n for n in names if n and not n.startswith(LOCK_NAME))

    def prefix_size(self, prefix: str) -> int:
        """Total bytes stored under ``prefix`` (one LIST; no object is read)."""
        return sum(int(o["Size"]) for o in self._list(self._key(prefix) + "/", delimiter=None))

    def _get(self, key: str) -> dict[str, Any]:
        return cast(  # boto3 response
            "dict[str, Any]",
            self._call(
                "get", self.client.get_object, Bucket=self.bucket, Key=self._key(key), missing=key
            ),
        )

    def _head(self, key: str) -> dict[str, Any]:
        return cast(  # boto3 response
            "dict[str, Any]",
            self._call(
                "head", self.client.head_object, Bucket=self.bucket, Key=self._key(key), missing=key
            ),
        )

    def _list(self, full_prefix: str, delimiter: str | None) -> list[dict[str, Any]]:
        paginator = self.client.get_paginator("list_objects_v2")
        extra = {"Delimiter": delimiter} if delimiter else {}
        pages = self._call(
            "list",
            lambda: list(paginator.paginate(Bucket=self.bucket, Prefix=full_prefix, **extra)),
        )
        return [o for page in pages for o in page.get("Contents", [])]

    # -- locking -----------------------------------------------------------------
    @contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive section across processes and machines (see the module docstring)."""
        token = secrets.token_hex(8)
        self._acquire(token)
        try:
            yield
        finally:
            self._release(token)

    def _acquire(self, token: str) -> None:
        deadline, wait = time.monotonic() + self.lock_timeout, 0.005
        # expires_at (this machine's clock) only for older versions, which break by it
        body = json.dumps({"owner": token, "expires_at": time.time() + self.lock_ttl}).encode()
        seen: _Seen | None = None
        while not self.put_if_absent(LOCK_NAME, body):
            taken, seen = self._take_if_expired(body, seen)
            if taken:
                return
            if time.monotonic() >= deadline:
                raise CheckpointError(
                    f"timed out after {self.lock_timeout:.0f}s waiting for the lock on "
                    f"s3://{self.bucket}/{self.prefix}; another writer holds it (is one hung? "
                    f"a stale lock expires after {self.lock_ttl:.0f}s)",
                    retryable=True,
                )
            time.sleep(wait)
            wait = min(wait * 2, 0.1)

    def _take_if_expired(self, body: bytes, seen: _Seen | None) -> tuple[bool, _Seen | None]:
        """Take the lock over if it expired: older than ``lock_ttl`` on the S3 server's own
        clock (its LastModified against the same response's Date), or, when the server's
        clock cannot tell, unchanged (one ETag) for ``lock_ttl`` on this process's
        monotonic clock. Never this machine's wall clock against a time its holder wrote:
        a breaker whose clock is ahead would break live locks. The takeover is a PUT with
        ``If-Match`` on the ETag judged expired, so of two breakers exactly one wins and a
        lock renewed or replaced meanwhile is never overwritten. (True, None) when taken."""
        try:
            response = self._head(LOCK_NAME)
        except FileNotFoundError:
            return False, None  # released meanwhile: try to put it again
        etag, now = str(response.get("ETag") or ""), time.monotonic()
        if seen is None or seen.etag != etag:
            seen = _Seen(etag, now)
        age = judged_age(server_age(response), f"s3://{self.bucket}/{self._key(LOCK_NAME)}")
        if not etag or not (
            (age is not None and age > self.lock_ttl) or now - seen.since > self.lock_ttl
        ):
            return False, seen
        try:
            self._call(
                "put",
                self.client.put_object,
                Bucket=self.bucket,
                Key=self._key(LOCK_NAME),
                Body=body,
                IfMatch=etag,
                **self._sse(),
            )
        except (_Conflict, FileNotFoundError):
            return False, None  # another breaker, or its holder, changed it first
        log.warning(
            "took over an expired lock on s3://%s/%s (unchanged for %s)",
            self.bucket,
            self.prefix,
            f"{age:.0f}s by the store's clock" if age is not None else f"{now - seen.since:.0f}s",
        )
        return True, None

    def _release(self, token: str) -> None:
        """Delete the lock if it is still ours: a DELETE with ``If-Match`` on the ETag of
        the object read, so a lock another writer took over meanwhile is never deleted."""
        try:
            response = self._get(LOCK_NAME)
            with contextlib.closing(response["Body"]) as stream:
                data = stream.read(MAX_LOCK_BYTES + 1)
            owner = json.loads(data).get("owner") if len(data) <= MAX_LOCK_BYTES else None
            if owner != token:
                log.warning(
                    "the lock on s3://%s/%s expired while held and was taken over",
                    self.bucket,
                    self.prefix,
                )
                return
            self._call(
                "delete",
                self.client.delete_object,
                Bucket=self.bucket,
                Key=self._key(LOCK_NAME),
                IfMatch=str(response["ETag"]),
            )
        except (FileNotFoundError, _Conflict):
            log.warning("the lock on s3://%s/%s expired while held", self.bucket, self.prefix)
        except (ValueError, AttributeError, KeyError, CheckpointError) as exc:
            log.warning(
                "could not release the lock on s3://%s/%s: %s", self.bucket, self.prefix, exc
            )

    # -- helpers -----------------------------------------------------------------
    def _key(self, key: str) -> str:
        parts = key.strip("/").split("/") if key else []
        if any(p in ("", ".", "..") or "\x00" in p for p in parts):
            raise ValueError(f"invalid object key {key!r}")
        return "/".join([self.prefix, *parts] if self.prefix else parts)

    def _sse(self) -> dict[str, Any]:  # Any: spread beside _call's own keywords
        if self.sse is None:
            return {}
        extra: dict[str, Any] = {"ServerSideEncryption": self.sse}
        if self.sse == "aws:kms" and self.sse_kms_key_id:
            extra["SSEKMSKeyId"] = self.sse_kms_key_id
        return extra

    def _call(
        self,
        what: str,
        fn: Callable[..., T],
        *args: Any,
        missing: str | None = None,
        bounded: bool = True,
        **kwargs: Any,
    ) -> T:
        """One S3 call: throttling backed off; 404 -> FileNotFoundError; 412 -> _Conflict;
        anything else -> CheckpointError (an OSError subclass is not used: the store's
        save path would mislabel it as a disk problem). No retry starts after the call
        deadline, unless not ``bounded`` (a multipart upload: its parts retry on threads of
        their own, each request bounded by the client's timeouts)."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            with aws.within(self.call_deadline_seconds if bounded else float("inf")):
                return aws.call_raw(fn, *args, **kwargs)
        except aws.DeadlinePassed as exc:
            raise CheckpointError(
                f"S3 {what} on s3://{self.bucket}/{self.prefix} gave up: {exc}; the store "
                "is unreachable or stalled (check the endpoint and network), retry later",
                retryable=True,
            ) from exc
        except ClientError as exc:
            code = aws.error_code(exc)
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("NoSuchKey", "404", "NotFound") or (
                status == 404 and code != "NoSuchBucket"
            ):
                raise FileNotFoundError(2, "no such object", missing or what) from None
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
                retries = exc.response.get("ResponseMetadata", {}).get("RetryAttempts") or 0
                raise _Conflict(code, retried=retries > 0) from None
            error = aws.translate(exc, f"S3 {what} on s3://{self.bucket}/{self.prefix}")
            raise CheckpointError(str(error), retryable=error.retryable) from exc
        except BotoCoreError as exc:
            raise CheckpointError(
                f"S3 {what} on s3://{self.bucket}/{self.prefix} failed: {exc}; "
                "check the endpoint URL, network and credentials",
                retryable=True,
            ) from exc


class _ChunkReader(io.RawIOBase):
    """A read-only, non-seekable file over an iterator of chunks (what upload_fileobj reads)."""

    def __init__(self, head: bytearray, rest: Iterator[bytes | memoryview]) -> None:
        super().__init__()
        self._pending = memoryview(bytes(head))
        self._rest = rest
        self.consumed = 0

    def readable(self) -> bool:
        return True

    def readinto(self, target: Buffer) -> int:
        while not self._pending:
            chunk = next(self._rest, None)
            if chunk is None:
                return 0
            self._pending = memoryview(chunk).cast("B")
        with memoryview(target) as view:  # the caller's buffer (a bytearray), as bytes
            n = min(len(view), len(self._pending))
            view[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        self.consumed += n
        return n

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            return b"".join(iter(lambda: self.read(1 << 20), b""))
        pieces, wanted = [], size
        while wanted > 0:
            if not self._pending:
                chunk = next(self._rest, None)
                if chunk is None:
                    break
                self._pending = memoryview(chunk).cast("B")
            take = min(wanted, len(self._pending))
            pieces.append(self._pending[:take])
            self._pending = self._pending[take:]
            wanted -= take
        out = b"".join(pieces)  # the one copy
        self.consumed += len(out)
        return out


def server_age(response: dict[str, Any]) -> float:
    """Seconds from an S3 response's ``LastModified`` to its ``Date`` header: the
    object's age on the server's clock; NaN when either is missing or unreadable."""
    modified = response.get("LastModified")
    date = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    if not isinstance(modified, datetime.datetime) or not isinstance(date, str):
        return math.nan
    try:  # HTTP dates are GMT; a naive parse (no zone, or two joined by a proxy) is too
        served = email.utils.parsedate_to_datetime(date)
        if served.tzinfo is None:
            served = served.replace(tzinfo=datetime.UTC)
        return (served - modified).total_seconds()
    except (TypeError, ValueError, OverflowError):
        return math.nan


@dataclass(frozen=True)
class _Seen:
    """The lock object as a waiter first saw it: its ETag, and when (monotonic seconds)."""

    etag: str
    since: float


class _Conflict(Exception):
    """A conditional S3 write found the key already there (412) or raced another (409);
    ``retried``: botocore sent the request more than once (an earlier try may have written)."""

    def __init__(self, code: str, *, retried: bool = False) -> None:
        super().__init__(code)
        self.retried = retried
