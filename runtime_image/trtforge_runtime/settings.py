"""What `trtforge serve` is told (its command line, as the CLI parses it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trtforge_runtime.protocol.v2 import DEFAULT_MAX_JSON_BYTES


@dataclass
class Settings:
    store_uri: str
    engine_key: str
    model_name: str | None = None
    host: str = "0.0.0.0"
    port: int = 8000
    cache_dir: Path = Path("/var/cache/trtforge")
    max_batch_size: int | None = None
    max_queue_delay_us: int = 0
    learn_batch_cap: bool = True  # cap batches where bigger ones stop computing each row faster
    instances: int | None = None  # None: one per CPU for CPU backends, 1 otherwise
    solo: bool = True  # a lone request runs on a session with every CPU's threads (CPU backends)
    max_queue: int = 256
    max_request_bytes: int = 64 << 20
    drain_timeout_s: float = 30.0
    max_json_bytes: int = DEFAULT_MAX_JSON_BYTES
    max_body_memory: int | None = None  # bytes of bodies held at once; default 2 x max_request_bytes
    idle_timeout_s: float = 30.0  # no complete request head for this long: the connection is closed
    body_timeout_s: float = 60.0
    grpc_message_timeout_s: float = 60.0  # a gRPC call's request message must arrive whole within it
    max_connections: int = 1024
    grpc_port: int | None = 8001  # None: no gRPC endpoint; 0: any free port
    reuse_port: bool = False  # a worker of `serve --workers N`: share the ports (SO_REUSEPORT)
    listen_when_ready: bool = False  # a later worker: bind only once ready

    @property
    def body_memory(self) -> int:
        return max(self.max_body_memory or 0, 2 * self.max_request_bytes)
