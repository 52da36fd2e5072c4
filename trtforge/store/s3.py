"""A store on any S3-compatible object store: ``s3://<bucket>/<prefix>``.

Configuration, the usual AWS names: ``AWS_ENDPOINT_URL`` (empty for AWS itself),
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION`` (or
``AWS_DEFAULT_REGION``). Each is read from the environment, else from a file of that name under
``$TRTFORGE_S3_CREDENTIALS_DIR`` (a mounted Secret whose keys are those names). With an endpoint
set, path-style addressing is used (what MinIO, Ceph RGW and moto expect).

Every request goes through one botocore S3 client, built on first use: botocore signs it (AWS
Signature Version 4), retries it, resolves the endpoint, and finds credentials where the settings
name none (its chain: environment, shared files and ``AWS_PROFILE``, web identity as with IRSA,
container and instance-profile credentials). Reads stream the response body; every engine file is
checked against its sha256 after the read (:func:`~trtforge.store.base.verify`).

Atomicity: S3 objects appear whole on the final PUT or CompleteMultipartUpload; a writer that dies
mid-upload leaves an incomplete multipart upload, which is invisible (a bucket lifecycle rule
``AbortIncompleteMultipartUpload`` reclaims its parts). ``commit`` is a conditional create
(``If-None-Match: *``), so one of several racing writers wins and the others get 412. Where the
server does not implement conditional writes (it answers 501 NotImplemented, or the variable
``TRTFORGE_S3_CONDITIONAL_WRITES=0`` says so), ``commit`` falls back to HEAD then PUT and logs that
a race is then possible in a window of one round trip.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, cast

from trtforge.logs import fields
from trtforge.store.base import ObjectNotFound, PutResult, StoreError, stream_to, verify
from trtforge.store.local import check_relpath

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef

log = logging.getLogger(__name__)

CREDENTIALS_DIR_ENV = "TRTFORGE_S3_CREDENTIALS_DIR"
CONDITIONAL_ENV = "TRTFORGE_S3_CONDITIONAL_WRITES"
# The store's settings (s3_settings reads them from the environment or the mounted secret).
SETTINGS = (
    "AWS_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
)
DEFAULT_REGION = "us-east-1"  # where neither the settings nor botocore's config name one
PART_SIZE = 8 << 20  # multipart part size; S3's minimum part is 5 MiB
_NOT_FOUND = {"404", "NoSuchKey", "NotFound"}
_RACE_LOST = {"PreconditionFailed", "412", "ConditionalRequestConflict", "409"}
_NO_CONDITIONAL = {"NotImplemented", "501"}
_UNKNOWN_KEY = {"InvalidAccessKeyId", "InvalidClientTokenId", "UnrecognizedClientException"}
_BAD_SIGNATURE = {"SignatureDoesNotMatch"}
_BAD_TOKEN = {"ExpiredToken", "InvalidToken", "TokenRefreshRequired", "ExpiredTokenException"}
_DENIED = {"AccessDenied", "AllAccessDisabled", "403"}
_WRONG_REGION = {
    "AuthorizationHeaderMalformed",
    "PermanentRedirect",
    "IllegalLocationConstraintException",
    "301",
}
# The permission each operation needs, for the message of a 403.
_PERMISSION = {
    "read": "s3:GetObject",
    "look up": "s3:GetObject",
    "list": "s3:ListBucket",
    "delete": "s3:DeleteObject",
}


def s3_settings(env: dict[str, str] | None = None) -> dict[str, str]:
    """The S3 settings from the environment, filled in from files under $TRTFORGE_S3_CREDENTIALS_DIR."""
    env = dict(os.environ if env is None else env)
    out = {k: env[k] for k in SETTINGS if env.get(k)}
    cred_dir = env.get(CREDENTIALS_DIR_ENV)
    if cred_dir:
        d = Path(cred_dir)
        if not d.is_dir():
            raise StoreError(
                f"{CREDENTIALS_DIR_ENV}={cred_dir} is not a directory (mount the S3 secret there)"
            )
        for k in SETTINGS:
            f = d / k
            if k not in out and f.is_file():
                value = f.read_text().strip()
                if value:
                    out[k] = value
    return out


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/some/prefix` -> (bucket, "some/prefix")."""
    if not uri.startswith("s3://"):
        raise StoreError(f"{uri!r} is not an s3:// URI")
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    if not bucket:
        raise StoreError(f"store URI {uri!r} names no bucket; expected s3://<bucket>/<prefix>")
    return bucket, prefix.strip("/")


def make_client(settings: dict[str, str]) -> S3Client:
    """A botocore S3 client for the store's `settings`: their keys where they name some, else
    botocore's credential chain; their region, else botocore's configured one, else us-east-1.

    botocore without boto3: boto3 adds nothing the store uses, and its import costs start-up time
    (docs/design.md, "Runtime cold start")."""
    import botocore.session
    from botocore.config import Config

    endpoint = settings.get("AWS_ENDPOINT_URL")
    config = Config(
        connect_timeout=5,
        read_timeout=60,
        retries={"max_attempts": 3, "mode": "standard"},
        s3={"addressing_style": "path"} if endpoint else {},
        # Do not add checksum trailers some S3-compatible servers do not understand.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    # botocore's DEBUG records print each request's headers, a session token among them: its
    # loggers stay at INFO or above, whatever the root logger's level.
    for name in ("botocore", "urllib3"):
        if logging.getLogger(name).level < logging.INFO:
            logging.getLogger(name).setLevel(logging.INFO)
    session = botocore.session.Session()
    region = (
        settings.get("AWS_REGION")
        or settings.get("AWS_DEFAULT_REGION")
        or session.get_config_variable("region")
        or DEFAULT_REGION
    )
    client = session.create_client(
        "s3",
        region_name=region,
        endpoint_url=endpoint or None,
        aws_access_key_id=settings.get("AWS_ACCESS_KEY_ID"),
        aws_secret_access_key=settings.get("AWS_SECRET_ACCESS_KEY"),
        aws_session_token=settings.get("AWS_SESSION_TOKEN"),
        config=config,
    )
    return cast("S3Client", client)


def _code(e: Exception) -> str:
    resp: dict[str, Any] = getattr(e, "response", None) or {}
    code = str(resp.get("Error", {}).get("Code", ""))
    status = str(resp.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    return code or status


def _status(e: Exception) -> str:
    resp: dict[str, Any] = getattr(e, "response", None) or {}
    return str(resp.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))


def describe_error(
    where: str, bucket: str, region: str | None, what: str, path: str, e: Exception
) -> StoreError:
    """One clear message for a failed request: which store (`where`) and object, what failed, and
    what to do. Pure: the exception botocore raised (or an OSError) in, the StoreError out; nothing
    of a secret is in it (botocore's errors carry none)."""
    from botocore.exceptions import (
        ClientError,
        ConnectTimeoutError,
        EndpointConnectionError,
        NoCredentialsError,
        NoRegionError,
        PartialCredentialsError,
        SSLError,
    )

    if isinstance(e, StoreError):
        return e
    if isinstance(e, SSLError):
        return StoreError(
            f"{where}: the endpoint's TLS certificate is not trusted ({what} {path}): {e}; set "
            "AWS_CA_BUNDLE to the CA bundle that signs it"
        )
    if isinstance(e, EndpointConnectionError | ConnectTimeoutError):
        return StoreError(f"{where}: cannot reach the endpoint to {what} {path}: {e}")
    if isinstance(e, NoCredentialsError | PartialCredentialsError):
        detail = f" ({e})" if isinstance(e, PartialCredentialsError) else ""
        return StoreError(
            f"{where}: no S3 credentials to {what} {path}{detail}; set AWS_ACCESS_KEY_ID and "
            f"AWS_SECRET_ACCESS_KEY, mount them under ${CREDENTIALS_DIR_ENV}, or give the pod an "
            "identity botocore finds (IRSA web identity, AWS_PROFILE, an instance profile)"
        )
    if isinstance(e, NoRegionError):
        return StoreError(f"{where}: no region to {what} {path}; set AWS_REGION")
    if isinstance(e, ClientError):
        code = _code(e)
        error: dict[str, Any] = dict(e.response.get("Error", {}))
        detail = f"{code} {error.get('Message') or ''}".strip()
        if code in _NOT_FOUND:
            return ObjectNotFound(f"{where}: {path} does not exist")
        if code == "NoSuchBucket":
            return StoreError(f"{where}: bucket {bucket!r} does not exist ({what} {path})")
        if code in _UNKNOWN_KEY:
            return StoreError(
                f"{where}: the server does not know the access key ({what} {path}: {code}); check "
                "AWS_ACCESS_KEY_ID, and that the endpoint and region are the bucket's"
            )
        if code in _BAD_SIGNATURE:
            return StoreError(
                f"{where}: the server refused the request's signature ({what} {path}: {code}); "
                "AWS_SECRET_ACCESS_KEY is not the secret of AWS_ACCESS_KEY_ID, or something between "
                "changed the request"
            )
        if code in _BAD_TOKEN:
            return StoreError(
                f"{where}: the session token was refused ({what} {path}: {detail}); renew "
                "AWS_SESSION_TOKEN with its keys, or let botocore refresh them (IRSA, an instance profile)"
            )
        if code in _WRONG_REGION:
            right = error.get("Region") or (
                e.response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("x-amz-bucket-region")
            )
            hint = f"set AWS_REGION={right}" if right else "set AWS_REGION to the bucket's region"
            return StoreError(
                f"{where}: bucket {bucket!r} is not in region {region or DEFAULT_REGION} ({what} "
                f"{path}: {detail}); {hint}"
            )
        if code in _DENIED:
            need = _PERMISSION.get(what, "s3:PutObject")
            on = f"s3://{bucket}" if need == "s3:ListBucket" else f"s3://{bucket}/*"
            return StoreError(
                f"{where}: access denied to {what} {path} ({code}); grant the store's identity {need} on {on}"
            )
        return StoreError(f"{where}: {what} {path} failed: {detail if detail != code else e}")
    return StoreError(f"{where}: {what} {path} failed: {type(e).__name__}: {e}")


class S3Store:
    """An :class:`~trtforge.store.base.EngineStore` on an S3 bucket and prefix."""

    read_only = False

    def __init__(
        self,
        uri: str,
        client: S3Client | None = None,
        settings: dict[str, str] | None = None,
        part_size: int = PART_SIZE,
    ) -> None:
        self.uri = uri.rstrip("/")
        self.bucket, self.prefix = parse_s3_uri(uri)
        self.settings = s3_settings() if settings is None else settings
        self.endpoint = self.settings.get("AWS_ENDPOINT_URL") or "AWS S3"
        self._client = client
        self._client_lock = threading.Lock()
        self.part_size = max(part_size, 5 << 20)
        self.conditional_writes = os.environ.get(CONDITIONAL_ENV, "1") not in ("0", "false", "no")

    def __repr__(self) -> str:
        return f"S3Store({self.uri!r} at {self.endpoint})"

    @property
    def client(self) -> S3Client:
        """The botocore client, made on first use (a store that is only opened never pays for it)."""
        if self._client is None:
            with self._client_lock:
                if self._client is None:
                    self._client = make_client(self.settings)
        return self._client

    def _key(self, path: str) -> str:
        check_relpath(path)
        return f"{self.prefix}/{path}" if self.prefix else path

    @property
    def _where(self) -> str:
        return f"store {self.uri} (endpoint {self.endpoint})"

    def _error(self, what: str, path: str, e: Exception) -> StoreError:
        """One clear message: which store, which object, what failed and why (describe_error)."""
        region = self.settings.get("AWS_REGION") or self.settings.get("AWS_DEFAULT_REGION")
        if self._client is not None:
            region = self._client.meta.region_name
        return describe_error(self._where, self.bucket, region, what, path, e)

    # -- writes ------------------------------------------------------------------------------
    def put(self, path: str, src: BinaryIO) -> PutResult:
        key = self._key(path)
        h = hashlib.sha256()
        first = _read_full(src, self.part_size)
        h.update(first)
        if len(first) < self.part_size:
            try:
                self.client.put_object(Bucket=self.bucket, Key=key, Body=first)
            except Exception as e:
                raise self._error("write", path, e) from e
            return PutResult(path=path, sha256=h.hexdigest(), size_bytes=len(first))
        try:
            upload_id = self.client.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"]
        except Exception as e:
            raise self._error("start a multipart upload of", path, e) from e
        parts: list[CompletedPartTypeDef] = []
        size = 0
        try:
            chunk = first
            while chunk:
                n = len(parts) + 1
                resp = self.client.upload_part(
                    Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=n, Body=chunk
                )
                parts.append({"PartNumber": n, "ETag": resp["ETag"]})
                size += len(chunk)
                log.debug("s3 part uploaded", extra=fields(path=path, part=n, bytes=size))
                chunk = _read_full(src, self.part_size)
                h.update(chunk)
            self.client.complete_multipart_upload(
                Bucket=self.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
            )
        except BaseException as e:
            try:
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            except Exception:
                pass
            if isinstance(e, Exception):
                raise self._error("write", path, e) from e
            raise
        return PutResult(path=path, sha256=h.hexdigest(), size_bytes=size)

    def put_bytes(self, path: str, data: bytes) -> PutResult:
        return self.put(path, io.BytesIO(data))

    def commit(self, path: str, data: bytes) -> bool:
        key = self._key(path)
        if self.conditional_writes:
            try:
                self.client.put_object(Bucket=self.bucket, Key=key, Body=data, IfNoneMatch="*")
                return True
            except Exception as e:
                code = _code(e)
                if code in _RACE_LOST or _status(e) in ("409", "412"):
                    return False
                if code not in _NO_CONDITIONAL and _status(e) != "501":
                    raise self._error("commit", path, e) from e
                log.warning(
                    "the S3 server does not implement conditional writes (If-None-Match); committing "
                    "with HEAD then PUT, so two builders racing within one round trip could both write",
                    extra=fields(store=self.uri, endpoint=self.endpoint),
                )
                self.conditional_writes = False
        if self.exists(path):
            return False
        try:
            self.client.put_object(Bucket=self.bucket, Key=key, Body=data)
        except Exception as e:
            raise self._error("commit", path, e) from e
        return True

    # -- reads -------------------------------------------------------------------------------
    def iter_chunks(self, path: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(path))["Body"]
        except Exception as e:
            raise self._error("read", path, e) from e
        try:
            yield from body.iter_chunks(chunk_size)
        except Exception as e:  # a body that ends early is botocore's IncompleteReadError
            raise self._error("read", path, e) from e
        finally:
            body.close()

    def get(self, path: str, dst: BinaryIO, expected_sha256: str | None = None) -> PutResult:
        return verify(stream_to(self.iter_chunks(path), dst, path), expected_sha256, f"store {self.uri}")

    def read_bytes(self, path: str) -> bytes:
        return b"".join(self.iter_chunks(path))

    def exists(self, path: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(path))
            return True
        except Exception as e:
            err = self._error("look up", path, e)
            if isinstance(err, ObjectNotFound):
                return False
            raise err from e

    def list(self, prefix: str) -> list[str]:
        full = f"{self.prefix}/{prefix.lstrip('/')}" if self.prefix else prefix.lstrip("/")
        strip = len(self.prefix) + 1 if self.prefix else 0
        out: list[str] = []
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=full
            ):
                out.extend(obj["Key"][strip:] for obj in page.get("Contents", []))
        except Exception as e:
            raise self._error("list", prefix or "/", e) from e
        return sorted(out)

    def delete(self, path: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(path))
        except Exception as e:
            raise self._error("delete", path, e) from e


def _read_full(src: BinaryIO, n: int) -> bytes:
    """Read up to `n` bytes, looping over short reads (pipes, sockets)."""
    buf = bytearray()
    while len(buf) < n:
        chunk = src.read(n - len(buf))
        if not chunk:
            break
        buf += chunk
    return bytes(buf)
