"""llama-server's command line, health answers and canary requests (trtforge_runtime.llm.llama_server),
and the canary's comparison (trtforge_runtime.llm.canary)."""

from __future__ import annotations

from pathlib import Path

import pytest
from trtforge_runtime.llm import llama_server as ls
from trtforge_runtime.llm.canary import compare
from trtforge_runtime.llm.probes import Health

from trtforge.contract.llm import GoldenTokens


def test_argv_sets_metrics_and_the_tuned_settings() -> None:
    argv = ls.argv(
        ls.LlamaServerArgs(
            model=Path("/m.gguf"),
            port=9000,
            alias="smol",
            threads=4,
            tuning=("--threads", "1", "--batch-size", "256"),
            extra=("--seed", "1"),
        )
    )
    assert argv[0] == "llama-server" and "--metrics" in argv
    pairs = dict(zip(argv[1::2], argv[2::2], strict=False))
    assert pairs["-m"] == "/m.gguf" and pairs["--port"] == "9000"
    assert argv[argv.index("--threads") + 1] == "1" and argv[argv.index("--batch-size") + 1] == "256"
    assert "-t" not in argv  # the record's threads win over the deployment's
    assert argv[argv.index("-a") + 1] == "smol"
    assert argv[-2:] == ["--seed", "1"]
    no_record = ls.argv(ls.LlamaServerArgs(model=Path("/m.gguf"), port=1, threads=4))
    assert no_record[no_record.index("-t") + 1] == "4"


def test_argv_refuses_an_extra_flag_the_supervisor_owns() -> None:
    with pytest.raises(ValueError, match=r"\['--port'\].*set by the supervisor"):
        ls.argv(ls.LlamaServerArgs(model=Path("/m.gguf"), port=1, extra=("--port", "2")))
    with pytest.raises(ValueError, match="threads 0"):
        ls.argv(ls.LlamaServerArgs(model=Path("/m.gguf"), port=1, threads=0))


@pytest.mark.parametrize(
    ("status", "body", "want"),
    [
        (200, {"status": "ok"}, Health.UP),
        (
            503,
            {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}},
            Health.STARTING,
        ),
        (503, {"error": {"message": "slots busy"}}, Health.UNAVAILABLE),
        (503, None, Health.UNAVAILABLE),
        (404, None, Health.ERROR),
        (None, None, Health.DOWN),
    ],
)
def test_health_answers(status: int | None, body: dict[str, object] | None, want: Health) -> None:
    assert ls.classify_health(status, body) is want


def test_canary_request_is_greedy_and_asks_for_token_ids() -> None:
    body = ls.canary_request("Hi", 8)
    assert body["temperature"] == 0.0 and body["top_k"] == 1 and body["n_predict"] == 8
    assert body["return_tokens"] is True and body["cache_prompt"] is False
    assert ls.canary_tokens({"tokens": [1, 2, 3], "content": "x"}) == [1, 2, 3]
    with pytest.raises(ValueError, match="token id list"):
        ls.canary_tokens({"content": "x"})


def test_canary_compare_names_the_first_different_token() -> None:
    golden = GoldenTokens(prompt="Hi", n_predict=3, tokens=[5, 6, 7], text="")
    assert compare(golden, [5, 6, 7]).passed
    out = compare(golden, [5, 9, 7])
    assert not out.passed and "token 1 is 9; the checkpoint recorded 6" in out.message
    short = compare(golden, [5, 6])
    assert not short.passed and "2 tokens" in short.message


def test_canary_text_compare_names_where_it_differs() -> None:
    from trtforge_runtime.llm.canary import compare_text

    assert compare_text(" Paris.", " Paris.").passed
    out = compare_text(" Paris.", " Lyon.")
    assert not out.passed and "character 1" in out.message
