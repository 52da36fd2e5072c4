"""`trtforge stage-model`: the verify step. Prove this namespace holds its model (docs/security.md).

Runs in the tenant's namespace, with the tenant's own source: a ``pvc://`` claim of that namespace
mounted read-only (paths cleaned, symlinks out of the claim refused), or ``s3://`` / ``https://`` with
credentials from the tenant's own Secret (environment). It reads the model (redirects only as
:func:`trtforge_builder.fetch.redirect_refusal` allows), checks the pin and that the bytes are an ONNX
model, and streams them to the engine broker (``PUT /models/<sha256>``). The broker takes them only
from the pod of the verify Job the operator created, hashes them itself, keeps one copy per digest in
the store's staging area for build Jobs, and records that this namespace holds the model through the
source the operator gave this Job. It holds no store credentials.

The last stdout line and the termination message: ``{"sha256", "sizeBytes", "fingerprint"}``, or a
failure (``{"error", "reason"}``) with the exit codes of ``trtforge build``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from trtforge.contract.build_result import FailureReason
from trtforge.logs import fields

log = logging.getLogger("trtforge_builder")

TOKEN_FILE_ENV = "TRTFORGE_BROKER_TOKEN_FILE"
UPLOAD_TIMEOUT_S = 600.0
UPLOAD_REASONS: dict[int, FailureReason] = {422: "ModelIntegrity", 413: "ModelTooLarge"}
RETRIES_PER_BROKER = 3


def register(sub: Any) -> None:
    p = sub.add_parser(
        "stage-model",
        help="prove this namespace holds its model: stream it to the engine broker (verify step)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", required=True, help="model URI: pvc://claim/path, s3://bucket/key, https://...")
    p.add_argument("--sha256", default=None, help="the pin (spec.model.sha256), if any")
    p.add_argument("--secret-name", default=None, help="spec.model.secretRef.name, recorded with the proof")
    p.add_argument(
        "--broker",
        required=True,
        help="engine broker URL; a comma-separated list is tried in turn (no Service IPs)",
    )
    p.add_argument(
        "--allow-redirect-host",
        action="append",
        default=[],
        help="a host (port 443) or host:port an https redirect may lead to (spec.model.allowedRedirectHosts)",
    )
    p.add_argument("--workdir", default=None, help="scratch directory for s3/https downloads")
    p.add_argument(
        "--format",
        default="onnx",
        choices=["onnx", "gguf"],
        help="what the bytes must be: an ONNX model (default) or a GGUF file (an LLM source)",
    )
    p.set_defaults(func=handle)


def _token() -> str | None:
    path = os.environ.get(TOKEN_FILE_ENV)
    if not path:
        return None
    try:
        return Path(path).read_text().strip()
    except OSError as e:
        from trtforge_builder.errors import BuildError

        raise BuildError(
            f"broker token file {path} (${TOKEN_FILE_ENV}): {e.strerror or e}", "InvalidArgument"
        ) from e


def upload(brokers: list[str], path: Path, sha256: str, size: int, token: str | None) -> dict[str, Any]:
    """PUT the file to the first broker that answers; retries with backoff across the list.

    4xx answers are final (the broker refused these bytes or this token); connection errors and 5xx
    move on to the next broker."""
    from trtforge_builder.errors import BuildError

    last = ""
    for round_ in range(RETRIES_PER_BROKER):
        for base in brokers:
            url = f"{base.rstrip('/')}/models/{sha256}"
            with open(path, "rb") as f:
                req = urllib.request.Request(url, data=f, method="PUT")
                req.add_header("Content-Length", str(size))
                req.add_header("Content-Type", "application/octet-stream")
                if token:
                    req.add_header("Authorization", f"Bearer {token}")
                try:
                    with urllib.request.urlopen(req, timeout=UPLOAD_TIMEOUT_S) as resp:
                        answer: dict[str, Any] = json.loads(resp.read() or b"{}")
                        return answer
                except urllib.error.HTTPError as e:
                    body = e.read().decode(errors="replace")
                    try:
                        why = str(json.loads(body).get("error") or body)
                    except ValueError:
                        why = body.strip() or e.reason
                    if 400 <= e.code < 500:
                        reason: FailureReason = UPLOAD_REASONS.get(e.code, "UploadRefused")
                        raise BuildError(
                            f"broker {base} refused the model: HTTP {e.code}: {why}", reason, step="stage"
                        ) from e
                    last = f"broker {base}: HTTP {e.code}: {why}"
                except (urllib.error.URLError, OSError) as e:
                    last = f"broker {base}: {getattr(e, 'reason', e)}"
                log.warning("upload failed, trying the next broker", extra=fields(error=last))
        time.sleep(min(8.0, 0.5 * 2**round_))
    raise BuildError(f"no engine broker took the model: {last}", "StoreUnavailable", step="stage")


def handle(args: argparse.Namespace) -> int:
    from trtforge.contract.build_result import BUILD_EXIT_CODES, BuildFailure
    from trtforge.contract.possession import source_fingerprint
    from trtforge_builder.cli import _emit
    from trtforge_builder.errors import BuildError
    from trtforge_builder.fetch import fetch_model
    from trtforge_builder.model_format import gguf_problem, onnx_problem

    brokers = [b.strip() for b in args.broker.split(",") if b.strip()]
    pin = args.sha256.lower() if args.sha256 else None
    try:
        if not brokers:
            raise BuildError("--broker: no URL given", "InvalidArgument", step="parse-arguments")
        if not args.model.startswith(("pvc://", "s3://", "https://", "http://")):
            raise BuildError(
                f"--model {args.model}: a verify step reads pvc://, s3:// or https:// sources only",
                "InvalidArgument",
                step="parse-arguments",
            )
        with tempfile.TemporaryDirectory(prefix="trtforge-stage-", dir=args.workdir) as tmp:
            fetched = fetch_model(args.model, Path(tmp), pin, args.allow_redirect_host)
            gguf = args.format == "gguf"
            problem = gguf_problem(fetched.path) if gguf else onnx_problem(fetched.path)
            if problem is not None:
                what = "a GGUF file" if gguf else "an ONNX model"
                raise BuildError(
                    f"model {args.model}: the bytes read ({fetched.size_bytes}, sha256 "
                    f"{fetched.sha256[:12]}) are not {what}: {problem}; nothing was uploaded",
                    "InvalidModel",
                    step="check-model",
                )
            answer = upload(brokers, fetched.path, fetched.sha256, fetched.size_bytes, _token())
    except BuildError as e:
        log.error(str(e), extra=fields(reason=e.reason, step=e.step))
        _emit(e.failure().to_line())
        return e.exit_code
    except Exception as e:
        log.exception("unexpected error while staging the model")
        msg = f"unexpected {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        _emit(BuildFailure(error=msg, reason="Error", exit_code=BUILD_EXIT_CODES["Error"]).to_line())
        return BUILD_EXIT_CODES["Error"]
    fp = source_fingerprint(args.model, args.secret_name, pin)
    if answer.get("fingerprint") not in (None, fp):
        log.warning("the broker recorded another source fingerprint", extra=fields(broker=answer))
    _emit(json.dumps({"sha256": fetched.sha256, "sizeBytes": fetched.size_bytes, "fingerprint": fp}))
    log.info("model verified by the broker", extra=fields(sha256=fetched.sha256, bytes=fetched.size_bytes))
    return 0
