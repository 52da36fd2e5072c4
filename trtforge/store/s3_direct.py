"""Direct S3 reads: a GET signed here (AWS Signature Version 4) and sent with ``http.client``.

Why (docs/design.md, "Runtime cold start"): importing boto3 and building its S3 client takes about
0.3 s of one core (0.13-0.16 s each on the test machine), all of it holding the GIL, and a runtime
starting from ``s3://`` paid it before it could ask for the first byte of its engine. The standard
library needs about 0.03 s. :class:`~trtforge.store.s3.S3Store` streams objects (``iter_chunks``,
and so ``read_bytes`` and ``get``) this way when :func:`direct_target` finds that the request would
be the one boto3 sends; everything else (writes, lists, deletes, ``exists``) and every read this path
cannot begin cleanly goes through boto3, which then retries and reports as it always did.

When a read is direct (:func:`direct_target`, a pure function of the store's settings and the
environment), and otherwise why not:

- static credentials in the store's settings (the environment or the mounted secret): boto3's other
  sources (web identity, instance metadata, profiles, SSO) stay boto3's;
- nothing in the environment that changes how boto3 connects: an ``AWS_*`` variable other than the
  store's settings and a few that only tune retries or checksums, a proxy, or a shared config file
  (``AWS_CONFIG_FILE``, ``~/.aws/config``);
- with an endpoint (MinIO, Ceph RGW, moto): ``http(s)://host[:port]`` with no path, addressed
  path-style, as :func:`~trtforge.store.s3.make_client` configures boto3;
- without one (AWS itself): the bucket's regional endpoint ``https://<bucket>.s3.<region>.amazonaws.com``
  in the ``aws`` partition, for a bucket whose name is one DNS label (no dots, not a directory
  bucket).

TLS trusts the CA bundle boto3 trusts: ``AWS_CA_BUNDLE``, else certifi's, else botocore's own (not
the system's).

A read begins with the response's status. 200: the body streams; an error midway is a
:class:`~trtforge.store.base.StoreError`, as from boto3. 404 whose error code is ``NoSuchKey``: the
object does not exist. Anything else (a signature the server refuses, a redirect to another region,
throttling, a 5xx, a connection that fails) is :class:`DirectUnavailable`: the store logs it once,
stops reading directly and reads through boto3. A mistake here can cost a request, never a wrong
answer: every engine file is checked against its sha256 after the read.

Imports: the standard library only.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import hmac
import http.client
import importlib.util
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
CONNECT_TIMEOUT_S = 5.0  # as make_client's boto3 config
READ_TIMEOUT_S = 60.0
# The S3 store's settings (trtforge.store.s3.s3_settings reads them from the environment or the
# mounted secret).
SETTINGS = (
    "AWS_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
)
# Those settings and variables that only tune what a direct GET does not do (retries: a failed
# direct read falls back to boto3, which retries; checksums: a GET sends none and the sha256 check
# covers the body; the metadata service: static credentials only).
HARMLESS_AWS_ENV = frozenset(SETTINGS) | frozenset(
    {
        "AWS_MAX_ATTEMPTS",
        "AWS_RETRY_MODE",
        "AWS_REQUEST_CHECKSUM_CALCULATION",
        "AWS_RESPONSE_CHECKSUM_VALIDATION",
        "AWS_EC2_METADATA_DISABLED",
        "AWS_CA_BUNDLE",  # trusted here too (DirectTarget.ca_file)
    }
)
PROXY_ENV = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
AWS_REGION_RE = re.compile(r"^(us|eu|ap|sa|ca|me|af|il|mx)-[a-z]+-[0-9]+$")
BUCKET_LABEL_RE = re.compile(r"^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")


class DirectUnavailable(Exception):
    """A direct read could not begin; the message says why. The store reads through boto3."""


@dataclass(frozen=True)
class DirectTarget:
    """Where and as whom a direct read goes: `scheme` http or https, `hostname` and `port` (None:
    the scheme's default) to connect to, `base` the path before an object key ("/<bucket>"
    path-style, "" virtual-hosted), and the SigV4 region and static credentials."""

    scheme: str
    hostname: str
    port: int | None
    base: str
    region: str
    access_key: str
    secret_key: str
    session_token: str | None = None
    ca_file: str | None = None  # ``AWS_CA_BUNDLE``; None: the bundle boto3 trusts by default

    @property
    def host(self) -> str:
        """The Host header: the host name (an IPv6 address in brackets), with a port that is not
        the scheme's default."""
        name = f"[{self.hostname}]" if ":" in self.hostname else self.hostname
        return name if self.port is None else f"{name}:{self.port}"

    def __repr__(self) -> str:  # never the secret
        return f"DirectTarget({self.scheme}://{self.host}{self.base}, region {self.region})"


def direct_target(
    settings: Mapping[str, str], env: Mapping[str, str], bucket: str, shared_config: bool
) -> DirectTarget | str:
    """The target of a direct read of `bucket` with the store's `settings`, or why boto3 reads.

    `env` is the process environment; `shared_config`: a shared AWS config file exists (boto3 would
    read it)."""
    access, secret = settings.get("AWS_ACCESS_KEY_ID"), settings.get("AWS_SECRET_ACCESS_KEY")
    if not access or not secret:
        return "no static credentials in the store's settings (boto3 finds them elsewhere)"
    other = sorted(k for k in env if k.startswith("AWS_") and k not in HARMLESS_AWS_ENV and env[k])
    if other:
        return f"{', '.join(other)} set (boto3 would use it)"
    proxies = sorted(k for k in env if k.upper() in PROXY_ENV and env[k])
    if proxies:
        return f"{', '.join(proxies)} set (boto3 would connect through it)"
    if shared_config:
        return "a shared AWS config file exists (boto3 would read it)"
    region = settings.get("AWS_REGION") or settings.get("AWS_DEFAULT_REGION") or "us-east-1"
    token = settings.get("AWS_SESSION_TOKEN") or None
    ca = env.get("AWS_CA_BUNDLE") or None
    endpoint = settings.get("AWS_ENDPOINT_URL")
    if endpoint:
        try:
            u = urlsplit(endpoint)
            port = u.port
        except ValueError:
            return "AWS_ENDPOINT_URL is not a URL this path and boto3 would read alike"
        if u.username or u.password:  # never echoed: it holds a secret
            return "AWS_ENDPOINT_URL has a user name or password in it"
        if u.scheme not in ("http", "https") or not u.hostname or u.path not in ("", "/"):
            return f"endpoint {endpoint!r} is not http(s)://host[:port]"
        if u.query or u.fragment:
            return f"endpoint {endpoint!r} has parts beyond http(s)://host[:port]"
        default = 443 if u.scheme == "https" else 80
        port = None if port == default else port
        base = "/" + quote(bucket, safe="")
        return DirectTarget(u.scheme, u.hostname, port, base, region, access, secret, token, ca)
    if not AWS_REGION_RE.match(region):
        return f"region {region!r} is outside the aws partition's commercial regions"
    if not BUCKET_LABEL_RE.match(bucket) or bucket.endswith("--x-s3"):
        return f"bucket {bucket!r} is not one DNS label (virtual-hosted addressing)"
    host = f"{bucket}.s3.{region}.amazonaws.com"
    return DirectTarget("https", host, None, "", region, access, secret, token, ca)


def object_path(target: DirectTarget, key: str) -> str:
    """The request path (and SigV4's canonical URI, which S3 does not encode twice) of `key`."""
    return f"{target.base}/{quote(key, safe='/~')}"


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def signed_headers(
    target: DirectTarget,
    method: str,
    path: str,
    now: dt.datetime,
    payload_sha256: str = EMPTY_SHA256,
) -> dict[str, str]:
    """The headers of a SigV4-signed request with no query and no body: Host, the date, the payload
    hash, the session token if any, and Authorization (docs/design.md, "Runtime cold start")."""
    amz_date = now.astimezone(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    day = amz_date[:8]
    headers = {"host": target.host, "x-amz-content-sha256": payload_sha256, "x-amz-date": amz_date}
    if target.session_token:
        headers["x-amz-security-token"] = target.session_token
    names = sorted(headers)
    canonical = "\n".join(
        [method, path, "", *(f"{n}:{headers[n].strip()}" for n in names), "", ";".join(names), payload_sha256]
    )
    scope = f"{day}/{target.region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = _hmac(
        _hmac(_hmac(_hmac(f"AWS4{target.secret_key}".encode(), day), target.region), "s3"), "aws4_request"
    )
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={target.access_key}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return headers


def error_code(body: bytes) -> str:
    """The ``<Code>`` of an S3 XML error body ("" if it has none)."""
    m = re.search(rb"<Code>([^<]{1,100})</Code>", body[:4096])
    return m.group(1).decode("ascii", "replace") if m else ""


def ca_bundle() -> str | None:
    """The CA bundle boto3 verifies TLS against: certifi's where installed, else botocore's own
    (None: neither is installed, and the system's is used)."""
    for name, file in (("certifi", "cacert.pem"), ("botocore", "cacert.pem")):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            path = Path(spec.origin).parent / file
            if path.is_file():
                return str(path)
    return None


def shared_config_exists(env: Mapping[str, str]) -> bool:
    """Whether boto3 would read a shared config or credentials file."""
    home = Path(env.get("HOME") or os.path.expanduser("~"))
    return (home / ".aws" / "config").exists() or (home / ".aws" / "credentials").exists()


@functools.cache
def tls_context(cafile: str | None) -> ssl.SSLContext:
    """One verifying TLS context per CA bundle (loading a bundle parses every certificate in it)."""
    return ssl.create_default_context(cafile=cafile)


class NotFound(Exception):
    """The object does not exist (404 NoSuchKey)."""


class DirectResponse:
    """A 200 response whose body is still to be read, and its connection; :meth:`close` ends both."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        self._conn, self._resp = conn, resp

    def read(self, n: int) -> bytes:
        """Up to `n` bytes of the body; b"" at its end. Raises http.client.IncompleteRead when the
        connection ends before the Content-Length it announced."""
        data = self._resp.read(n)
        if not data and self._resp.length:  # read(n) ends quietly short of Content-Length
            raise http.client.IncompleteRead(b"", self._resp.length)
        return data

    def close(self) -> None:
        self._resp.close()
        self._conn.close()


def open_get(target: DirectTarget, key: str, now: dt.datetime | None = None) -> DirectResponse:
    """The 200 response to a GET of `key`, its body unread (the caller closes it). Raises
    :class:`NotFound` for 404 NoSuchKey and :class:`DirectUnavailable` for anything else."""
    path = object_path(target, key)
    headers = signed_headers(target, "GET", path, now or dt.datetime.now(dt.UTC))
    where = f"GET {path} at {target.scheme}://{target.host}"
    conn: http.client.HTTPConnection
    try:
        if target.scheme == "https":
            ctx = tls_context(target.ca_file or ca_bundle())
            conn = http.client.HTTPSConnection(
                target.hostname, target.port, timeout=CONNECT_TIMEOUT_S, context=ctx
            )
        else:
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=CONNECT_TIMEOUT_S)
    except (OSError, ValueError) as e:
        raise DirectUnavailable(f"{where} failed: {type(e).__name__}: {e}") from e
    try:
        conn.connect()
        if conn.sock is not None:
            conn.sock.settimeout(READ_TIMEOUT_S)
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
    except (OSError, http.client.HTTPException, ValueError) as e:
        conn.close()
        raise DirectUnavailable(f"{where} failed: {type(e).__name__}: {e}") from e
    if resp.status == 200:
        return DirectResponse(conn, resp)
    try:
        body = resp.read(4096)
    except (OSError, http.client.HTTPException):
        body = b""
    finally:
        resp.close()
        conn.close()
    code = error_code(body)
    if resp.status == 404 and code == "NoSuchKey":
        raise NotFound(key)
    raise DirectUnavailable(f"{where} answered {resp.status} {code}".rstrip())
