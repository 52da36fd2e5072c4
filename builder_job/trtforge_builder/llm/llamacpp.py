"""llama.cpp's own tools, run as subprocesses: the test bed's quantizer, accuracy gate, canary and
tuner (backend ``llama.cpp``, never TensorRT-LLM; docs/llm.md).

The binaries come from ``--llama-bin-dir`` / ``$TRTFORGE_LLAMA_BIN_DIR``, else ``PATH``. Parsing
their output is pure (`parse_perplexity`, `bench_rows`, `best_settings`); running them is thin.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trtforge.contract.llm.artefact import GoldenTokens, golden_request
from trtforge.contract.llm.recipe import Recipe
from trtforge.contract.llm.result import llama_cpp_version

BIN_DIR_ENV = "TRTFORGE_LLAMA_BIN_DIR"

# The test bed's stand-in for each recipe: the llama.cpp type with the same weight width. llama.cpp
# runs no FP8 or NVFP4 kernels on CPU and calibrates nothing, so this is a size-alike, not the recipe
# (docs/llm.md §"What has run where").
TESTBED_GGUF_TYPE: dict[Recipe, str] = {
    Recipe.BF16: "BF16",
    Recipe.FP8: "Q8_0",
    Recipe.NVFP4: "Q4_K_M",
    Recipe.INT4_AWQ: "Q4_0",
    Recipe.W4A8_AWQ: "Q4_1",
}


class LlamaCppError(RuntimeError):
    """A llama.cpp tool is missing or failed; the message names the tool and carries its last output."""


def gguf_type_for(recipe: Recipe, override: str | None) -> str:
    return override or TESTBED_GGUF_TYPE[recipe]


_PPL_RE = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")


def parse_perplexity(output: str) -> float:
    """The final perplexity from ``llama-perplexity``'s log (``Final estimate: PPL = 12.3456 +/- ...``)."""
    m = _PPL_RE.search(output)
    if m is None:
        raise LlamaCppError(f"llama-perplexity printed no final estimate; its output ends: {output[-400:]!r}")
    return float(m.group(1))


@dataclass(frozen=True)
class BenchRow:
    threads: int
    batch: int
    ubatch: int
    prompt_tokens: int
    gen_tokens: int
    tokens_per_second: float


def bench_rows(output: str) -> list[BenchRow]:
    """The rows of ``llama-bench -o json``."""
    try:
        data = json.loads(output)
    except ValueError as e:
        raise LlamaCppError(f"llama-bench printed no JSON: {output[-400:]!r}") from e
    return [
        BenchRow(
            threads=int(r["n_threads"]),
            batch=int(r["n_batch"]),
            ubatch=int(r["n_ubatch"]),
            prompt_tokens=int(r["n_prompt"]),
            gen_tokens=int(r["n_gen"]),
            tokens_per_second=float(r["avg_ts"]),
        )
        for r in data
    ]


def best_settings(rows: list[BenchRow]) -> tuple[dict[str, int | float | str], dict[str, float]]:
    """The settings to apply, and every measurement: threads from the fastest generation run, batch
    and micro-batch from the fastest prompt run (ties go to fewer threads, smaller batches)."""
    gen = [r for r in rows if r.gen_tokens > 0]
    prompt = [r for r in rows if r.prompt_tokens > 0 and r.gen_tokens == 0]
    if not gen or not prompt:
        raise LlamaCppError("llama-bench gave no generation or no prompt-processing rows")
    g = max(gen, key=lambda r: (r.tokens_per_second, -r.threads))
    p = max(prompt, key=lambda r: (r.tokens_per_second, -r.batch, -r.ubatch))
    settings: dict[str, int | float | str] = {
        "threads": g.threads,
        "batch_size": p.batch,
        "ubatch_size": p.ubatch,
    }
    measured = {
        f"{'tg' if r.gen_tokens else 'pp'}:threads={r.threads},batch={r.batch},ubatch={r.ubatch}": (
            r.tokens_per_second
        )
        for r in rows
    }
    return settings, measured


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LlamaCppTools:
    """The llama.cpp binaries in one folder (or on PATH)."""

    def __init__(self, bin_dir: Path | None = None) -> None:
        env = os.environ.get(BIN_DIR_ENV)
        self.bin_dir = bin_dir or (Path(env) if env else None)

    def tool(self, name: str) -> str:
        if self.bin_dir is not None:
            path = self.bin_dir / name
            if not path.is_file():
                raise LlamaCppError(
                    f"{name} is not in {self.bin_dir} (set --llama-bin-dir or ${BIN_DIR_ENV})"
                )
            return str(path)
        found = shutil.which(name)
        if found is None:
            raise LlamaCppError(f"{name} is not on PATH (set --llama-bin-dir or ${BIN_DIR_ENV})")
        return found

    def _exec(self, name: str, args: list[str], timeout: float = 1800.0) -> tuple[str, str]:
        cmd = [self.tool(name), *args]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise LlamaCppError(f"{name} ran past {timeout:.0f}s") from e
        if r.returncode != 0:
            raise LlamaCppError(f"{name} exited {r.returncode}: {(r.stdout + r.stderr)[-600:]}")
        return r.stdout, r.stderr

    def _run(self, name: str, args: list[str], timeout: float = 1800.0) -> str:
        out, err = self._exec(name, args, timeout)
        return out + err

    def version(self) -> str:
        return llama_cpp_version(self._run("llama-server", ["--version"]))

    def quantize(self, source: Path, dest: Path, gguf_type: str, threads: int) -> None:
        self._run("llama-quantize", ["--allow-requantize", str(source), str(dest), gguf_type, str(threads)])

    def perplexity(self, model: Path, text: Path, context: int, threads: int, chunks: int = 0) -> float:
        """Perplexity over the text's first `chunks` chunks of `context` tokens (0: all of it)."""
        args = ["-m", str(model), "-f", str(text), "-c", str(context), "-b", str(context), "-t", str(threads)]
        if chunks > 0:
            args += ["--chunks", str(chunks)]
        return parse_perplexity(self._run("llama-perplexity", args))

    def bench(
        self,
        model: Path,
        threads: list[int],
        batches: list[int],
        prompt: int,
        gen: int,
        repetitions: int = 2,
    ) -> list[BenchRow]:
        """Prompt processing over threads x batch sizes x micro-batch sizes (llama-bench runs every
        combination of its lists), then generation over threads alone (the batch size does not change
        it), `repetitions` runs each."""
        t = ",".join(map(str, threads))
        common = ["-m", str(model), "-t", t, "-r", str(repetitions), "-o", "json"]
        b = ",".join(map(str, batches))
        pp, _ = self._exec("llama-bench", [*common, "-b", b, "-ub", b, "-p", str(prompt), "-n", "0"])
        first = str(batches[0])
        tg, _ = self._exec("llama-bench", [*common, "-b", first, "-ub", first, "-p", "0", "-n", str(gen)])
        return bench_rows(pp) + bench_rows(tg)

    def golden(
        self,
        model: Path,
        prompt: str,
        n_predict: int,
        threads: int,
        timeout: float = 300.0,
        server_args: Sequence[str] = (),
    ) -> GoldenTokens:
        """Start ``llama-server`` on a loopback port (with `server_args`, e.g. a tuning record's
        flags, after its own), ask for the canary's greedy tokens, stop it."""
        port = _free_port()
        cmd = [
            self.tool("llama-server"), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
            "-c", "512", "-t", str(threads), "-np", "1", "--no-webui", *server_args,
        ]  # fmt: skip
        with tempfile.TemporaryFile(mode="w+") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
            base = f"http://127.0.0.1:{port}"
            try:
                deadline = time.monotonic() + timeout
                while True:
                    if proc.poll() is not None:
                        log.seek(0)
                        raise LlamaCppError(
                            f"llama-server exited {proc.returncode} before it was ready: {log.read()[-600:]}"
                        )
                    try:
                        with urllib.request.urlopen(f"{base}/health", timeout=5) as r:
                            if r.status == 200:
                                break
                    except (urllib.error.URLError, OSError):
                        pass
                    if time.monotonic() > deadline:
                        raise LlamaCppError(f"llama-server was not healthy within {timeout:.0f}s")
                    time.sleep(0.2)
                req = urllib.request.Request(
                    f"{base}/completion",
                    data=json.dumps(golden_request(prompt, n_predict)).encode(),
                    headers={"Content-Type": "application/json"},
                )
                with urllib.request.urlopen(req, timeout=timeout) as r:
                    body = json.loads(r.read())
            finally:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        tokens = [int(t) for t in body.get("tokens") or []]
        if len(tokens) != n_predict:
            raise LlamaCppError(
                f"llama-server returned {len(tokens)} tokens for the canary, expected {n_predict}"
            )
        return GoldenTokens(
            prompt=prompt, n_predict=n_predict, tokens=tokens, text=str(body.get("content", ""))
        )
