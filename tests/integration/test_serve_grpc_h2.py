"""The runtime's own HTTP/2 front end for gRPC (``--grpc-server native``, the default), frame by frame.

tritonclient's calls against it are in test_serve_grpc.py (run against both front ends). Here a
raw HTTP/2 client sends what well-behaved clients never do: windows too small for the answer,
malformed and oversized frames, floods, a message larger than it claims, calls reset mid-way. Each
gets its status or closes only its own connection, and the server answers tritonclient afterwards.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.service_pb2 as triton_pb

from tests.integration.h2raw import (
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    PADDED,
    PING,
    RST_STREAM,
    WINDOW_UPDATE,
    RawH2,
    frame,
    grpc_message,
    mlp_answer,
    mlp_request,
)
from tests.integration.serve_engines import MlpBed, make_mlp_bed, run_ort
from tests.integration.serve_process import TALL_RCVBUF, Server, stall_and_send_more, tall_server

pytestmark = pytest.mark.integration

# RFC 9113 error codes the server is expected to send.
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR, REFUSED_STREAM, ENHANCE_YOUR_CALM = (
    0x0,
    0x1,
    0x3,
    0x6,
    0x7,
    0xB,
)


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> MlpBed:
    return make_mlp_bed(tmp_path_factory.mktemp("h2"), mlp_seed=11)


@pytest.fixture(scope="module")
def server(bed: MlpBed) -> Iterator[Server]:
    s = Server(bed.store, bed.key, bed.tmp, bed.gpu_file, "--max-request-bytes", "100000")
    s.wait()
    yield s
    s.stop()


def _still_serves(s: Server, bed: MlpBed) -> None:
    x = np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32)
    c = grpcclient.InferenceServerClient(s.grpc_url)
    inp = grpcclient.InferInput("x", [3, 64], "FP32")
    inp.set_data_from_numpy(x)
    got = c.infer("mlp", [inp]).as_numpy("y")
    np.testing.assert_allclose(got, run_ort(bed.mlp, {"x": x})["y"], rtol=1e-5, atol=1e-6)
    c.close()


def test_the_answer_waits_for_the_clients_window(server: Server, bed: MlpBed) -> None:
    """With a 100-byte stream window the first DATA frame carries 100 bytes and nothing more comes
    (a PING's answer arrives with no DATA before it); once the client opens the window the rest
    follows, and the answer equals ONNX Runtime's."""
    x = np.random.default_rng(2).standard_normal((32, 64)).astype(np.float32)  # y: 32 x 10 floats
    h = RawH2(server.grpc_port, {INITIAL_WINDOW_SIZE: 100})
    h.call(1, mlp_request(x))
    first, _ = h.until(DATA, 1)
    assert first is not None and len(first.payload) == 100
    h.send(PING, 0, 0, b"12345678")
    ack, between = h.until(PING, flags=ACK)
    assert ack is not None and not [f for f in between if f.kind == DATA], between
    h.send(WINDOW_UPDATE, 0, 1, (1 << 20).to_bytes(4, "big"))
    rest: bytes = first.payload
    while True:
        f, _ = h.until_stream(1)
        assert f is not None
        if f.kind == DATA:
            rest += f.payload
        elif f.kind == HEADERS and f.flags & END_STREAM:
            trailers = dict(h.decoder.decode(f.payload, raw=True))
            break
        else:  # the response headers
            h.decoder.decode(f.payload)
    assert trailers[b"grpc-status"] == b"0", trailers
    np.testing.assert_allclose(mlp_answer(rest[5:]), run_ort(bed.mlp, {"x": x})["y"], rtol=1e-5, atol=1e-6)
    h.close()


def test_calls_are_refused_with_a_status_and_the_connection_carries_on(server: Server, bed: MlpBed) -> None:
    """Each of these is refused with its status on its own stream; the same connection then answers
    a good call."""
    x = np.zeros((2, 64), np.float32)
    h = RawH2(server.grpc_port)
    sid = 1

    def refused(code: str, match: str) -> None:
        fields, message = h.answer(sid)
        assert fields.get("grpc-status") == code, fields
        assert re.search(match, fields.get("grpc-message", "")), fields
        assert message == b""

    # a message that states more than --max-request-bytes: refused at its prefix
    h.send(HEADERS, END_HEADERS, sid, h.headers_block())
    h.send(DATA, 0, sid, (1 << 30).to_bytes(5, "big"))
    refused("8", "over the limit of 100000 bytes")
    # a stream that ends inside its message
    sid += 2
    h.send(HEADERS, END_HEADERS, sid, h.headers_block())
    h.send(DATA, END_STREAM, sid, grpc_message(mlp_request(x))[:-7])
    refused("3", "the stream ended inside its message")
    # two messages in a unary call
    sid += 2
    h.send(HEADERS, END_HEADERS, sid, h.headers_block())
    h.send(DATA, END_STREAM, sid, grpc_message(mlp_request(x)) * 2)
    refused("3", "carries one message")
    # a method the service does not have, one of another service, and the health service's stream
    paths = (
        "/inference.GRPCInferenceService/RepositoryIndex",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        "/grpc.health.v1.Health/Watch",
    )
    for path in paths:
        sid += 2
        h.call(sid, b"", path=path)
        refused("12", "is not implemented")
    # a compression the server does not know
    sid += 2
    h.call(sid, mlp_request(x), grpc_encoding="snappy")
    refused("12", "grpc-encoding 'snappy' is not supported")
    # bytes that are no ModelInferRequest
    sid += 2
    h.call(sid, b"\x0a\x7fmlp")
    refused("3", "ModelInferRequest does not parse")
    # an unknown model
    sid += 2
    h.call(sid, mlp_request(x).replace(b"mlp", b"mlq"))
    refused("5", "unknown model 'mlq'")
    # and a good call on the same connection
    sid += 2
    h.call(sid, mlp_request(x))
    fields, message = h.answer(sid)
    assert fields["grpc-status"] == "0", fields
    np.testing.assert_allclose(mlp_answer(message), run_ort(bed.mlp, {"x": x})["y"], rtol=1e-5, atol=1e-6)
    h.close()


def test_padded_frames_are_read_without_their_padding(server: Server, bed: MlpBed) -> None:
    """A DATA frame with padding (RFC 9113 §6.1), then an unpadded call on the same connection."""
    x = np.random.default_rng(5).standard_normal((2, 64)).astype(np.float32)
    h = RawH2(server.grpc_port)
    h.send(HEADERS, END_HEADERS, 1, h.headers_block())
    h.send(DATA, END_STREAM | PADDED, 1, bytes((7,)) + grpc_message(mlp_request(x)) + b"\0" * 7)
    h.call(3, mlp_request(x[:1]))
    for sid, want in ((1, x), (3, x[:1])):
        fields, message = h.answer(sid)
        assert fields["grpc-status"] == "0", fields
        np.testing.assert_allclose(
            mlp_answer(message), run_ort(bed.mlp, {"x": want})["y"], rtol=1e-5, atol=1e-6
        )
    h.close()


def test_gzip_messages_are_decompressed(server: Server, bed: MlpBed) -> None:
    import gzip

    x = np.random.default_rng(3).standard_normal((4, 64)).astype(np.float32)
    h = RawH2(server.grpc_port)
    h.send(HEADERS, END_HEADERS, 1, h.headers_block(grpc_encoding="gzip"))
    h.send(DATA, END_STREAM, 1, grpc_message(gzip.compress(mlp_request(x)), compressed=True))
    fields, message = h.answer(1)
    assert fields["grpc-status"] == "0", fields
    np.testing.assert_allclose(mlp_answer(message), run_ort(bed.mlp, {"x": x})["y"], rtol=1e-5, atol=1e-6)
    h.close()


@pytest.mark.parametrize(
    "attack, code",
    [
        ("oversized-frame", FRAME_SIZE_ERROR),
        ("continuation-flood", ENHANCE_YOUR_CALM),
        ("ping-flood", ENHANCE_YOUR_CALM),
        ("window-past-2^31-1", FLOW_CONTROL_ERROR),
        ("even-stream", PROTOCOL_ERROR),
        ("data-on-idle-stream", PROTOCOL_ERROR),
    ],
)
def test_a_hostile_connection_gets_goaway_and_only_it_closes(
    server: Server, bed: MlpBed, attack: str, code: int
) -> None:
    h = RawH2(server.grpc_port)
    if attack == "oversized-frame":
        h.send(PING, 0, 0, b"\0" * ((1 << 20) + 1))
    elif attack == "continuation-flood":
        h.send(HEADERS, 0, 1, h.headers_block())
        for _ in range(80):
            h.send(CONTINUATION, 0, 1, b"\x00\x01a\x01b" * 200)  # 1 kB of literal fields each
    elif attack == "ping-flood":
        for i in range(1001):
            h.send(PING, 0, 0, i.to_bytes(8, "big"))
    elif attack == "window-past-2^31-1":
        h.send(WINDOW_UPDATE, 0, 0, (0x7FFFFFFF).to_bytes(4, "big"))
    elif attack == "even-stream":
        h.send(HEADERS, END_HEADERS, 2, h.headers_block())
    elif attack == "data-on-idle-stream":
        h.send(DATA, 0, 9, b"hello")
    assert h.goaway_code() == code
    assert h.read() is None  # and closed
    h.close()
    _still_serves(server, bed)


def test_not_http2_is_closed(server: Server, bed: MlpBed) -> None:
    h = RawH2(server.grpc_port, preface=False)
    h.send_raw(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
    assert h.goaway_code() == PROTOCOL_ERROR
    assert h.read() is None
    h.close()
    _still_serves(server, bed)


def test_streams_past_the_limit_are_refused_and_reset_ones_free_their_place(
    server: Server, bed: MlpBed
) -> None:
    """128 calls open at once (headers sent, messages not): the 129th is refused with REFUSED_STREAM
    (clients retry those). Once the client resets them all, new calls are served again."""
    errors_before = server.requests("error")
    h = RawH2(server.grpc_port)
    for i in range(128):
        h.send(HEADERS, END_HEADERS, 1 + 2 * i, h.headers_block())
    h.send(HEADERS, END_HEADERS, 257, h.headers_block())
    f, _ = h.until(RST_STREAM, 257)
    assert f is not None and int.from_bytes(f.payload, "big") == REFUSED_STREAM
    for i in range(128):
        h.send(RST_STREAM, 0, 1 + 2 * i, (0x8).to_bytes(4, "big"))
    x = np.zeros((1, 64), np.float32)
    h.call(259, mlp_request(x))
    fields, message = h.answer(259)
    assert fields["grpc-status"] == "0", fields
    assert mlp_answer(message).shape == (1, 10)
    h.close()
    assert server.requests("error") - errors_before == 128  # each reset call counted, none left in flight


def test_calls_past_the_limit_are_refused_and_counted_as_unavailable(bed: MlpBed) -> None:
    """With --max-connections 3, three calls open at once (headers sent, messages not) take every
    place: a fourth gets RESOURCE_EXHAUSTED, counted as `unavailable` (what the same limit is over
    HTTP). Once the three are reset, a call is served again."""
    s = Server(bed.store, bed.key, bed.tmp, bed.gpu_file, "--max-connections", "3")
    try:
        s.wait()
        h = RawH2(s.grpc_port)
        for stream in (1, 3, 5):
            h.send(HEADERS, END_HEADERS, stream, h.headers_block())
        h.send(HEADERS, END_HEADERS, 7, h.headers_block())
        fields, _ = h.answer(7)
        assert fields["grpc-status"] == "8" and "calls in flight" in fields["grpc-message"], fields
        metrics = s.metrics()
        assert 'trtforge_runtime_requests_total{model="mlp",outcome="unavailable"} 1.0' in metrics
        assert 'outcome="too_large"' not in metrics
        for stream in (1, 3, 5):
            h.send(RST_STREAM, 0, stream, (0x8).to_bytes(4, "big"))
        h.call(9, mlp_request(np.zeros((1, 64), np.float32)))
        fields, message = h.answer(9)
        assert fields["grpc-status"] == "0", fields
        assert mlp_answer(message).shape == (1, 10)
        h.close()
    finally:
        assert s.stop() == 0


def test_an_idle_connection_is_closed_with_goaway_and_only_when_idle(bed: MlpBed) -> None:
    """With ``--idle-timeout 2``: calls at 0.8 s and at 2.2 s (past the first deadline) are
    answered, since each answered call restarts the clock; a call that the batcher holds for 2.2 s
    (one instance, a 2.2 s queue delay), longer than the timeout, is answered too; then, with
    nothing in flight, the server sends GOAWAY (NO_ERROR) and closes."""
    live = "/inference.GRPCInferenceService/ServerLive"
    x = np.random.default_rng(12).standard_normal((1, 64)).astype(np.float32)
    s = Server(
        bed.store,
        bed.key,
        bed.tmp,
        bed.gpu_file,
        "--idle-timeout",
        "2",
        "--instances",
        "1",
        "--max-queue-delay-us",
        "2200000",
    )
    try:
        s.wait()
        h = RawH2(s.grpc_port)
        opened = time.monotonic()
        for sid, at in ((1, 0.8), (3, 2.2)):
            time.sleep(max(0.0, opened + at - time.monotonic()))
            h.call(sid, b"", path=live)
            fields, message = h.answer(sid)
            assert fields["grpc-status"] == "0", (at, fields)
            assert triton_pb.ServerLiveResponse.FromString(message).live
        sent = time.monotonic()
        h.call(5, mlp_request(x))
        fields, message = h.answer(5)
        held = time.monotonic() - sent
        assert fields["grpc-status"] == "0", fields
        assert held >= 2.0, f"the call was held {held:.2f} s, not past the idle timeout"
        np.testing.assert_allclose(mlp_answer(message), run_ort(bed.mlp, {"x": x})["y"], rtol=1e-5, atol=1e-6)
        assert h.goaway_code() == NO_ERROR
        assert h.read() is None
        h.close()
    finally:
        assert s.stop() == 0


def test_a_call_in_flight_at_shutdown_is_answered(bed: MlpBed) -> None:
    """SIGTERM once the server has read a call (a PING after it is answered, so it is past the
    call's frames) and while the call waits in the batcher: the client gets GOAWAY (NO_ERROR) and the
    call's answer, and the server exits 0. One instance with a long queue delay keeps the call there
    (its one-row batch, below the batch cap, waits for company while no other instance is free):
    without it the MLP's answer could come before the PING's, and the call would not be in flight at
    the signal."""
    x = np.random.default_rng(9).standard_normal((1, 64)).astype(np.float32)
    s = Server(
        bed.store, bed.key, bed.tmp, bed.gpu_file, "--instances", "1", "--max-queue-delay-us", "500000"
    )
    try:
        s.wait()
        h = RawH2(s.grpc_port)
        h.call(1, mlp_request(x))
        h.send(PING, 0, 0, b"drain-me")
        ack, before = h.until(PING, flags=ACK)
        assert ack is not None
        assert not [f for f in before if f.stream == 1], "the call was answered before the signal"
        s.proc.send_signal(signal.SIGTERM)
        goaway, answer, data = None, None, b""
        while (f := h.read()) is not None:
            if f.kind == GOAWAY:
                goaway = int.from_bytes(f.payload[4:8], "big")
            elif f.stream == 1 and f.kind == DATA:
                data += f.payload
            elif f.stream == 1 and f.kind == HEADERS and f.flags & END_STREAM:
                answer = dict(h.decoder.decode(f.payload, raw=True))
            elif f.stream == 1 and f.kind == HEADERS:
                h.decoder.decode(f.payload)
        assert goaway == NO_ERROR
        assert answer is not None and answer[b"grpc-status"] == b"0", answer
        np.testing.assert_allclose(
            mlp_answer(data[5:]), run_ort(bed.mlp, {"x": x})["y"], rtol=1e-5, atol=1e-6
        )
        h.close()
        assert s.exit_code() == 0, s.output()  # on its own, after the one SIGTERM
    finally:
        s.stop()


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, MlpBed]]:
    """An MLP with 8192 inputs a row (32 KiB): its messages are large enough to be read in place,
    straight into the call's message buffer, rather than through the shared scratch buffer."""
    bed = make_mlp_bed(tmp_path_factory.mktemp("h2wide"), mlp_seed=12, features=8192)
    s = Server(bed.store, bed.key, bed.tmp, bed.gpu_file)
    s.wait()
    yield s, bed
    s.stop()


def test_large_messages_are_read_whole_however_their_frames_and_reads_fall(
    wide: tuple[Server, MlpBed],
) -> None:
    """A 640 KiB message in one DATA frame, the same split over frames of odd sizes, three calls
    written at once, and a frame with bytes past its message: each answer equals ONNX Runtime's
    (or is the refusal), on one connection, and tritonclient is answered afterwards."""
    server, bed = wide
    rng = np.random.default_rng(7)
    h = RawH2(server.grpc_port)
    h.send(WINDOW_UPDATE, 0, 0, (8 << 20).to_bytes(4, "big"))

    def check(sid: int, x: np.ndarray) -> None:
        fields, message = h.answer(sid)
        assert fields.get("grpc-status") == "0", fields
        np.testing.assert_allclose(mlp_answer(message), run_ort(bed.mlp, {"x": x})["y"], rtol=1e-4, atol=1e-5)

    x = rng.standard_normal((20, 8192)).astype(np.float32)
    h.call(1, mlp_request(x))
    check(1, x)
    x = rng.standard_normal((20, 8192)).astype(np.float32)
    data = grpc_message(mlp_request(x))
    h.send(HEADERS, END_HEADERS, 3, h.headers_block())
    for start, end in ((0, 3), (3, 70001), (70001, 70002), (70002, len(data) - 1)):
        h.send(DATA, 0, 3, data[start:end])
    h.send(DATA, END_STREAM, 3, data[-1:])
    check(3, x)
    xs = [rng.standard_normal((n, 8192)).astype(np.float32) for n in (7, 1, 30)]
    h.send_raw(
        b"".join(
            frame(HEADERS, END_HEADERS, sid, h.headers_block())
            + frame(DATA, END_STREAM, sid, grpc_message(mlp_request(x)))
            for sid, x in zip((5, 7, 9), xs, strict=True)
        )
    )
    for sid, x in zip((5, 7, 9), xs, strict=True):
        check(sid, x)
    h.send(HEADERS, END_HEADERS, 11, h.headers_block())
    h.send(DATA, END_STREAM, 11, grpc_message(mlp_request(xs[0])) + b"\x00" * 50000)
    fields, _ = h.answer(11)
    assert fields.get("grpc-status") == "3" and "carries one message" in fields.get("grpc-message", ""), (
        fields
    )
    x = rng.standard_normal((2, 8192)).astype(np.float32)
    h.call(13, mlp_request(x))
    check(13, x)
    h.close()
    c = grpcclient.InferenceServerClient(server.grpc_url)
    inp = grpcclient.InferInput("x", [16, 8192], "FP32")
    x = rng.standard_normal((16, 8192)).astype(np.float32)
    inp.set_data_from_numpy(x)
    got = c.infer("mlp", [inp]).as_numpy("y")
    np.testing.assert_allclose(got, run_ort(bed.mlp, {"x": x})["y"], rtol=1e-4, atol=1e-5)
    c.close()


def test_no_call_is_read_while_the_client_does_not_read(tmp_path: Path) -> None:
    """Calls with 1 MiB answers, with the flow-control windows wide open, from a client that reads
    nothing: the server answers until its writes back up, then reads no call, neither the next one
    nor more sent in writes of their own; once the client reads, every call is answered, equal to
    ONNX Runtime's. (Unlike the HTTP fast path, which stops taking requests it has read, the
    connection stops reading: calls read before it stopped, or in one read after it resumes, are
    all answered, bounded by the read size and the call limit.)"""
    x = np.random.default_rng(22).standard_normal((32, 64)).astype(np.float32)
    with tall_server(tmp_path, mlp_seed=22) as (server, bed):
        want = run_ort(bed.mlp, {"x": x})["y"]
        message = mlp_request(x)
        h = RawH2(server.grpc_port, {INITIAL_WINDOW_SIZE: (1 << 31) - 1}, rcvbuf=TALL_RCVBUF)
        h.send(WINDOW_UPDATE, 0, 0, ((1 << 31) - 1 - 65535).to_bytes(4, "big"))
        sids = iter(range(1, 1 << 20, 2))
        st = stall_and_send_more(server, lambda: h.call(next(sids), message), want.nbytes)

        def check(sid: int) -> None:
            fields, got = h.answer(sid)
            assert fields["grpc-status"] == "0", fields
            np.testing.assert_allclose(mlp_answer(got), want, rtol=1e-5, atol=1e-6)

        for k in range(st.sent):  # reading resumes once the answers drain; what it reads is answered
            check(1 + 2 * k)
        assert server.answered() - st.base == st.sent
        h.close()
