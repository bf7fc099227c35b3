"""The object-store driver: whole, create-only objects over any fsspec filesystem.

Nothing is ever modified in place: every write is one whole object (one PUT). On S3
(``s3://``, ``s3a://``) the driver talks to the S3 API through s3fs's ``call_s3`` so that
each operation is exactly one request it controls:

* create-only writes are ``PutObject`` with ``If-None-Match: *`` (AWS S3 and moto honour
  it; an S3-compatible store that ignores it silently loses create-only semantics, and with
  them the fence by which a writer taking over shuts out the one before it);
* listings are ``ListObjectsV2`` with ``Prefix``, ``Delimiter`` and ``StartAfter``, paged
  by continuation token, never cached, so a poll of an idle log costs one request;
* the lease is taken over and renewed with ``If-Match`` on the previous ETag, so two
  writers can never both believe they hold it.

On other filesystems (``memory://``, gcs, az, …) create-only is "check, then write" and the
lease's compare-and-swap is "read, compare, then write": both have a race window between
the check and the write. ``memory://`` is process-global, so a race needs two threads of
one process.

Transient failures (5xx, throttling, timeouts, connection resets) are retried with
:class:`~destinations._retry.RetryPolicy`; s3fs and botocore retry some of them inside
each attempt too. A create-only write whose earlier attempt may have landed (a transient
error) and that then meets ``FileExistsError`` reads the object back: the same bytes mean
it was ours.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import logging
import secrets
import threading
import time
from typing import Any, Callable, TypeVar

import fsspec  # type: ignore[import-untyped,unused-ignore]
import fsspec.asyn  # type: ignore[import-untyped,unused-ignore]

from ._base import Destination, LockHeld, WriterLock
from ._loop_executor import serve_at_exit
from ._names import check_name, is_temp_name
from ._owner import LEASE_NAME, describe_holder, owner_record, parse_record
from ._registry import split_protocol
from ._retry import RetryPolicy, is_transient

# Under the persistlog hierarchy: one logger ("persistlog") silences or raises all of it.
logger = logging.getLogger("persistlog." + __name__)

T = TypeVar("T")

#: Request kinds counted by :meth:`ObjectStoreDestination.stats`.
REQUEST_KINDS = ("PUT", "GET", "LIST", "DELETE", "HEAD")


class PreconditionFailed(OSError):
    """A compare-and-swap write or delete found a different version than expected."""


#: The storage option this driver reads itself: ``{"tries": n, "retry_seconds": s}``, how
#: many attempts a request gets in all and the seconds after which no retry starts
#: (defaults: ``RetryPolicy``'s, 6 and 20). The CLI's ``-o persistlog.tries=3`` sets it.
OWN_OPTIONS = "persistlog"

# What S3 clients get unless the storage options say otherwise: botocore and s3fs each
# retry too, which multiplied the attempts of this driver's own policy (an unreachable
# endpoint took minutes to fail). botocore makes one attempt with a bounded connect time;
# this driver's policy does the retrying, with backoff and a time bound.
_S3_CONFIG = {"retries": {"max_attempts": 1, "mode": "standard"}, "connect_timeout": 5}


def _one_retry_layer(options: dict[str, Any]) -> None:
    """Fill in ``_S3_CONFIG`` under ``config_kwargs`` where the options leave it unset."""
    config = dict(options.get("config_kwargs") or {})
    for key, value in _S3_CONFIG.items():
        config.setdefault(key, value)
    options["config_kwargs"] = config


class ObjectStoreDestination(Destination):
    """A "directory" (key prefix) of immutable objects in an fsspec filesystem.

    ``storage_options`` go untouched to ``fsspec.filesystem(protocol, **storage_options)``.
    ``retry_policy`` may be replaced on the instance (tests use short waits).
    """

    appendable = False

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        super().__init__(url, storage_options)
        protocol, rest = split_protocol(url)
        self.protocol = protocol
        fs_options = dict(self.storage_options)
        # Read here, never passed to fsspec.
        own = fs_options.pop(OWN_OPTIONS, None) or {}
        if not isinstance(own, dict) or set(own) - {"tries", "retry_seconds"}:
            raise ValueError(
                f'storage option "{OWN_OPTIONS}" takes a dict with "tries" and "retry_seconds", not {own!r}'
            )
        tries, seconds = own.get("tries"), own.get("retry_seconds")
        if protocol in ("s3", "s3a"):
            _one_retry_layer(fs_options)
        self.fs: fsspec.AbstractFileSystem = fsspec.filesystem(protocol, **fs_options)
        # Its requests must work at interpreter exit too, when open logs are sealed.
        serve_at_exit(self.fs)
        # Rebuilt with the normalised protocol: fsspec strips "s3://" but not "S3://".
        self.root: str = self.fs._strip_protocol(f"{protocol}://{rest}").rstrip("/")
        if not self.root.strip("/"):
            raise ValueError(f"{url!r} names no bucket or directory")
        fs_protocols = (
            self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        )
        self._s3 = "s3" in fs_protocols
        if self._s3:
            self._bucket, _, key = self.root.partition("/")
            # The trailing "/" keeps sibling prefixes ("log" and "log2") apart.
            self._prefix = f"{key}/" if key else ""
        # memory:// flushes are free; a remote PUT costs a request (and money).
        self.default_flush_interval = 0.05 if protocol == "memory" else 1.0
        self.retry_policy = RetryPolicy()
        if tries is not None:
            if not isinstance(tries, int) or isinstance(tries, bool) or tries < 1:
                raise ValueError(f"{OWN_OPTIONS}.tries must be an integer >= 1, not {tries!r}")
            self.retry_policy.tries = tries
        if seconds is not None:
            if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds < 0:
                raise ValueError(f"{OWN_OPTIONS}.retry_seconds must be a number of seconds >= 0, not {seconds!r}")
            self.retry_policy.seconds = float(seconds)
        #: Keys per LIST request on S3 (None: the store's default, 1000).
        self.list_page_size: int | None = None
        self._stats = dict.fromkeys(REQUEST_KINDS, 0)
        self._stats_lock = threading.Lock()

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from (url, options) in another process; never carries a live client.
        return (type(self), (self.url, self.storage_options))

    # -- request accounting and retries ------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Requests sent so far, by kind (``PUT``, ``GET``, ``LIST``, ``DELETE``, ``HEAD``).

        Every attempt counts, retries included: this is what the store bills.
        """
        with self._stats_lock:
            return dict(self._stats)

    def _request(self, kind: str, what: str, fn: Callable[[], T]) -> T:
        def attempt() -> T:
            with self._stats_lock:
                self._stats[kind] += 1
            return fn()

        try:
            return self.retry_policy.call(attempt, f"{self}: {what}")
        except (OSError, ValueError, TypeError, PreconditionFailed):
            raise
        except Exception as e:
            # Client-library errors (no credentials, an unreachable endpoint...) leave this
            # package as built-ins, as the Destination contract says.
            notes = "".join(f" ({note})" for note in getattr(e, "__notes__", ()))
            if type(e).__name__ == "NoCredentialsError":
                notes += (" (give the key and secret as storage options, or set the usual AWS "
                          "credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a profile)")
            raise OSError(f"{self}: {what}: {type(e).__name__}: {e}{notes}") from e

    def _path(self, name: str) -> str:
        return f"{self.root}/{check_name(name)}"

    def _key(self, name: str) -> str:
        return self._prefix + check_name(name)

    def _call_s3(self, kind: str, method: str, **kwargs: Any) -> Any:
        return self._request(
            kind,
            f"{method} {kwargs.get('Key', kwargs.get('Prefix', ''))}",
            lambda: self.fs.call_s3(method, **kwargs),
        )

    # -- the Destination primitives ------------------------------------------------------

    def ensure(self) -> None:
        """Make the directory; on S3 only check that the bucket exists (never created)."""
        if self._s3:
            self._check_bucket()
            return
        # Not counted in stats(): most object stores have no directories to make.
        self.retry_policy.call(
            lambda: self.fs.makedirs(self.root, exist_ok=True), f"{self}: makedirs"
        )

    def _check_bucket(self) -> None:
        try:
            self._call_s3("HEAD", "head_bucket", Bucket=self._bucket)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"bucket {self._bucket!r} of {self.url} does not exist (buckets are never created)"
            ) from None

    def exists(self) -> bool:
        """Whether the directory exists; on S3, whether any object lies under the prefix."""
        if self._s3:
            try:
                self._check_bucket()
            except FileNotFoundError:
                return False
            if not self._prefix:
                return True
            resp = self._call_s3(
                "LIST", "list_objects_v2", Bucket=self._bucket, Prefix=self._prefix, MaxKeys=1
            )
            return bool(resp.get("KeyCount", 0) or resp.get("Contents"))

        def isdir() -> bool:
            self.fs.invalidate_cache(self.root)
            return bool(self.fs.isdir(self.root))

        return self._request("HEAD", f"isdir {self.root}", isdir)

    def describe_missing(self) -> str:
        if not self._s3:
            return super().describe_missing()
        return self.why_not_creatable() or f"no object in bucket {self._bucket!r} has the prefix {self._prefix!r}"

    def why_not_creatable(self) -> str | None:
        if self._s3:
            try:
                self._check_bucket()
            except FileNotFoundError:
                return f"the bucket {self._bucket!r} does not exist"
        return None

    def list(self, start_after: str | None = None) -> list[str]:
        """Names in lexical order; on S3 a missing bucket raises ``FileNotFoundError``."""
        return list(self._listed(start_after))

    def list_sizes(self) -> dict[str, int]:
        """Names and sizes from the listing's own entries: no request per object (but for
        an entry a filesystem lists without its size)."""
        return {name: self.size(name) if size is None else size for name, size in self._listed(None).items()}

    def _listed(self, start_after: str | None) -> dict[str, int | None]:
        entries = self._list_s3(start_after) if self._s3 else self._list_fs()
        return {
            name: size
            for name, size in sorted(entries, key=lambda entry: entry[0])
            if not is_temp_name(name) and (start_after is None or name > start_after)
        }

    def _list_s3(self, start_after: str | None) -> builtins.list[tuple[str, int | None]]:
        kwargs: dict[str, Any] = {"Bucket": self._bucket, "Prefix": self._prefix, "Delimiter": "/"}
        if start_after is not None:
            kwargs["StartAfter"] = self._prefix + start_after
        if self.list_page_size is not None:
            kwargs["MaxKeys"] = self.list_page_size
        entries: builtins.list[tuple[str, int | None]] = []
        while True:
            try:
                resp = self._call_s3("LIST", "list_objects_v2", **kwargs)
            except FileNotFoundError:
                raise FileNotFoundError(
                    f"bucket {self._bucket!r} of {self.url} does not exist"
                ) from None
            entries.extend((obj["Key"][len(self._prefix) :], int(obj["Size"])) for obj in resp.get("Contents", ()))
            token = resp.get("NextContinuationToken")
            if not resp.get("IsTruncated") or not token:
                return entries
            kwargs["ContinuationToken"] = token

    def _list_fs(self) -> builtins.list[tuple[str, int | None]]:
        def ls() -> builtins.list[dict[str, Any]]:
            # fsspec caches listings per instance; a follower must see new files now.
            self.fs.invalidate_cache(self.root)
            try:
                return list(self.fs.ls(self.root, detail=True))
            except FileNotFoundError:
                return []

        entries = self._request("LIST", f"ls {self.root}", ls)
        return [
            (e["name"].rstrip("/").rsplit("/", 1)[-1], None if e.get("size") is None else int(e["size"]))
            for e in entries
            if e.get("type") == "file"
        ]

    def read(self, name: str, offset: int = 0, length: int | None = None) -> bytes:
        if offset < 0 or (length is not None and length < 0):
            raise ValueError(f"bad range: offset={offset} length={length}")
        path = self._path(name)
        if length == 0:
            self.size(name)  # still FileNotFoundError for a missing file
            return b""
        end = None if length is None else offset + length
        try:
            data = self._request(
                "GET", f"read {path}", lambda: self.fs.cat_file(path, start=offset or None, end=end)
            )
        except OSError as e:
            # S3 answers 416 when the range starts at or past the end: short read, not error.
            if offset and _error_code(e) == "InvalidRange" and self.size(name) <= offset:
                return b""
            raise
        return bytes(data)

    def size(self, name: str) -> int:
        if self._s3:
            resp = self._call_s3("HEAD", "head_object", Bucket=self._bucket, Key=self._key(name))
            return int(resp["ContentLength"])
        path = self._path(name)

        def info() -> dict[str, Any]:
            self.fs.invalidate_cache(path)
            return dict(self.fs.info(path))

        found = self._request("HEAD", f"info {path}", info)
        if found.get("type") != "file":
            raise FileNotFoundError(path)
        return int(found["size"])

    def create(self, name: str, data: bytes) -> None:
        self._put_if(name, bytes(data), None)

    def replace(self, name: str, data: bytes) -> None:
        if self._s3:
            self._call_s3(
                "PUT", "put_object", Bucket=self._bucket, Key=self._key(name), Body=bytes(data)
            )
            return
        path = self._path(name)
        self._request("PUT", f"write {path}", lambda: self.fs.pipe_file(path, bytes(data)))

    def delete(self, name: str) -> None:
        if self._s3:
            # S3 answers 204 for a missing key too.
            self._call_s3("DELETE", "delete_object", Bucket=self._bucket, Key=self._key(name))
            return
        path = self._path(name)

        def rm() -> None:
            try:
                self.fs.rm_file(path)
            except FileNotFoundError:
                pass

        self._request("DELETE", f"delete {path}", rm)

    def lock(self, owner: str, ttl: float = 30.0) -> WriterLock:
        """Take the ``LEASE`` object; see :class:`Lease`.

        A lease whose ``expires`` (the holder's wall clock) has passed is taken over; hosts'
        clocks must agree to well within ``ttl``. Unreadable lease contents count as expired.
        A lease recorded under this same ``owner`` is taken back at once: owners are unique
        per writer, so it can only be this writer's own.
        """
        if ttl <= 0:
            raise ValueError(f"lease ttl must be positive, not {ttl}")
        token = secrets.token_hex(8)
        try:
            return self._take_lease(owner, token, ttl)
        except LockHeld:
            raise
        except BaseException:
            # Interrupted (Ctrl-C), or failed, maybe after the lease was written and before
            # the caller has the handle that releases it: let it go now, or every open
            # would wait for it to expire.
            self._drop_lease_of(owner, token)
            raise

    def _drop_lease_of(self, owner: str, token: str) -> None:
        """Delete the lease if it is the one ``owner`` wrote with ``token``."""
        try:
            raw, version = self._read_versioned(LEASE_NAME)
            info = parse_record(raw)
            if info is not None and info.get("owner") == owner and info.get("token") == token:
                self._delete_if(LEASE_NAME, version)
        except (PreconditionFailed, OSError) as e:
            logger.info("%s: leaving the lease of an interrupted lock to expire: %s", self, e)

    def _take_lease(self, owner: str, token: str, ttl: float) -> Lease:
        holder = ""
        for _ in range(5):
            body = _lease_body(owner, token, ttl)
            try:
                version = self._put_if(LEASE_NAME, body, None)
                return Lease(self, owner, token, ttl, version)
            except FileExistsError:
                pass
            try:
                raw, version = self._read_versioned(LEASE_NAME)
            except FileNotFoundError:
                continue  # released between our two requests: try to create again
            holder = describe_holder(raw)
            info = parse_record(raw)
            expires = info.get("expires") if info else None
            ours = info is not None and info.get("owner") == owner
            if isinstance(expires, (int, float)) and expires > time.time() and not ours:
                raise LockHeld(
                    f"{self.url} is leased by another writer: {holder}", holder, float(expires)
                )
            if ours:
                # Written by this very writer: a renewal that landed though its answer was
                # lost (the lease then names a version we never learnt).
                logger.info("%s: taking back a lease this writer wrote", self)
            else:
                logger.warning(
                    "%s: taking over the expired lease of %s", self, holder or "an unknown writer"
                )
            try:
                version = self._put_if(LEASE_NAME, body, version)
                return Lease(self, owner, token, ttl, version)
            except (PreconditionFailed, FileNotFoundError, FileExistsError):
                continue  # another writer moved first: look again
        raise LockHeld(f"{self.url}: the lease is contended, last seen with {holder}", holder)

    # -- versioned (compare-and-swap) operations used by the lease ---------------------

    def _read_versioned(self, name: str) -> tuple[bytes, str]:
        """The object's bytes and a version token for :meth:`_put_if`/:meth:`_delete_if`."""
        if self._s3:
            key = self._key(name)
            result: tuple[bytes, str] = self._request(
                "GET",
                f"get {key}",
                lambda: fsspec.asyn.sync(self.fs.loop, _s3_get, self.fs, self._bucket, key),
            )
            return result
        data = self.read(name)
        return data, hashlib.sha256(data).hexdigest()

    def _put_if(self, name: str, data: bytes, version: str | None) -> str:
        """Write ``name`` if its version is ``version`` (None: only if it does not exist).

        Returns the new version. Raises ``FileExistsError`` (create-only conflict) or
        :class:`PreconditionFailed`/``FileNotFoundError`` (the version moved on).
        """
        retried = False

        def on_retry(_: BaseException) -> None:
            nonlocal retried
            retried = True

        def attempt() -> str:
            with self._stats_lock:
                self._stats["PUT"] += 1
            return self._put_if_once(name, data, version)

        try:
            return self.retry_policy.call(attempt, f"{self}: conditional put {name}", on_retry)
        except (FileExistsError, PreconditionFailed, FileNotFoundError):
            # An attempt that "failed" transiently may have landed: then the bytes are ours.
            # A create-only conflict is always checked, since the client library may have
            # retried a PUT whose response was lost without telling us.
            if retried or version is None:
                try:
                    current, new_version = self._read_versioned(name)
                except FileNotFoundError:
                    current, new_version = b"", ""
                if new_version and current == data:
                    logger.info("%s: %s was written by an earlier attempt of ours", self, name)
                    return new_version
            raise

    def _put_if_once(self, name: str, data: bytes, version: str | None) -> str:
        if self._s3:
            condition = {"IfNoneMatch": "*"} if version is None else {"IfMatch": version}
            try:
                resp = self.fs.call_s3(
                    "put_object", Bucket=self._bucket, Key=self._key(name), Body=data, **condition
                )
            except OSError as e:
                if version is not None and _error_code(e) == "PreconditionFailed":
                    raise PreconditionFailed(f"{self.url}/{name} changed since it was read") from e
                raise
            return str(resp["ETag"])
        path = self._path(name)
        if version is None:
            try:
                self.fs.pipe_file(path, data, mode="create")
            except TypeError:  # a filesystem predating pipe_file(mode=...)
                if self.fs.exists(path):
                    raise FileExistsError(path) from None
                self.fs.pipe_file(path, data)
        else:
            current = bytes(self.fs.cat_file(path))
            if hashlib.sha256(current).hexdigest() != version:
                raise PreconditionFailed(f"{self.url}/{name} changed since it was read")
            self.fs.pipe_file(path, data)
        return hashlib.sha256(data).hexdigest()

    def _delete_if(self, name: str, version: str) -> None:
        """Delete ``name`` if it still has ``version``; else :class:`PreconditionFailed`."""
        if self._s3:
            try:
                self._call_s3(
                    "DELETE",
                    "delete_object",
                    Bucket=self._bucket,
                    Key=self._key(name),
                    IfMatch=version,
                )
            except OSError as e:
                if _error_code(e) == "PreconditionFailed":
                    raise PreconditionFailed(f"{self.url}/{name} changed since it was read") from e
                raise
            return
        try:
            _, current = self._read_versioned(name)
        except FileNotFoundError:
            return
        if current != version:
            raise PreconditionFailed(f"{self.url}/{name} changed since it was read")
        self.delete(name)


class Lease(WriterLock):
    """A writer's lease: the ``LEASE`` object naming it, valid until its ``expires``.

    :meth:`renew` rewrites it with a fresh expiry only if it is still the version this
    lease wrote (S3 ``If-Match``); :meth:`release` deletes it under the same condition.
    """

    def __init__(
        self, dest: ObjectStoreDestination, owner: str, token: str, ttl: float, version: str
    ) -> None:
        self._dest = dest
        self.owner = owner
        self.token = token
        self.ttl = ttl
        self._version: str | None = version
        self._mutex = threading.Lock()

    def __repr__(self) -> str:
        return f"Lease({self._dest.url!r}, owner={self.owner!r}, held={self._version is not None})"

    def renew(self) -> None:
        """Push the expiry ``ttl`` seconds ahead; ``LockHeld`` if another writer took over."""
        with self._mutex:
            if self._version is None:
                raise LockHeld(f"the lease on {self._dest.url} was released", "")
            body = _lease_body(self.owner, self.token, self.ttl)
            try:
                self._version = self._dest._put_if(LEASE_NAME, body, self._version)
                return
            except PreconditionFailed:
                pass
            except FileNotFoundError:
                # Deleted by hand or by a careless tool: nobody holds it, so claim it again.
                try:
                    self._version = self._dest._put_if(LEASE_NAME, body, None)
                    return
                except FileExistsError:
                    pass
            self._version = None
            try:
                holder = describe_holder(self._dest.read(LEASE_NAME))
            except FileNotFoundError:
                holder = ""
            raise LockHeld(
                f"the lease on {self._dest.url} was taken over by {holder or 'another writer'}",
                holder,
            )

    def release(self) -> None:
        """Delete the lease if it is still ours; idempotent. The version is forgotten
        only once the delete returned (a renewal waits meanwhile): a KeyboardInterrupt in
        between leaves the next call to delete it."""
        with self._mutex:
            version = self._version
            if version is None:
                return
            try:
                self._dest._delete_if(LEASE_NAME, version)
            except (PreconditionFailed, FileNotFoundError):
                logger.info("%s: lease was no longer ours at release", self._dest)
            self._version = None


def _lease_body(owner: str, token: str, ttl: float) -> bytes:
    record = owner_record(owner, token=token, ttl=ttl, expires=time.time() + ttl)
    return json.dumps(record, sort_keys=True).encode()


def _error_code(exc: BaseException) -> str:
    """The S3 error code behind an s3fs-translated exception, or ""."""
    response = getattr(exc.__cause__, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


async def _s3_get(fs: Any, bucket: str, key: str) -> tuple[bytes, str]:
    # Body and ETag from one GetObject, so the version matches the bytes.
    resp = await fs._call_s3("get_object", Bucket=bucket, Key=key)
    async with resp["Body"] as body:
        data = await body.read()
    return bytes(data), str(resp["ETag"])
