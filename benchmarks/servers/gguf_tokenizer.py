"""Write a Hugging Face tokenizer folder from a GGUF's own tokenizer, for aiperf's ``--tokenizer``.

Runs in the aiperf venv (transformers there; no torch): the GGUF's ``tokenizer.*`` fields as
transformers names them, read with the ``gguf`` package (transformers' own GGUF reader needs torch),
through transformers' ``convert_gguf_tokenizer`` into a ``PreTrainedTokenizerFast`` that is saved.

    python gguf_tokenizer.py MODEL.gguf OUT_DIR
"""

from __future__ import annotations

import sys
from typing import Any


def _transformers_parts() -> tuple[Any, Any]:
    """transformers' tokenizer field names and converter (moved in transformers 5)."""
    try:
        from transformers.integrations.gguf import gguf_tokenizer_mapping as m

        return m.GGUF_TOKENIZER_MAPPING, m.convert_gguf_tokenizer
    except ImportError:
        from transformers.integrations import ggml

        return ggml.GGUF_TOKENIZER_MAPPING, ggml.convert_gguf_tokenizer  # type: ignore[attr-defined]


def tokenizer_fields(path: str, mapping: Any) -> tuple[str, dict[str, Any], dict[str, Any]]:
    from gguf import GGUFReader
    from transformers.integrations.ggml import _gguf_parse_value

    fields = GGUFReader(path).fields

    def value(key: str) -> Any:
        f = fields[key]
        v = [_gguf_parse_value(f.parts[i], f.types) for i in f.data]
        return v[0] if len(v) == 1 else v

    groups = {
        group: {name: value(f"tokenizer.{k}") for k, name in renames.items() if f"tokenizer.{k}" in fields}
        for group, renames in mapping.items()
    }
    tok, cfg = groups["tokenizer"], groups.get("tokenizer_config", {})
    for name in ("bos", "eos", "unk", "pad"):
        tid = tok.get(f"{name}_token_id")
        cfg[f"{name}_token"] = tok["tokens"][tid] if isinstance(tid, int) else None
    return str(value("general.architecture")), tok, cfg


def main(argv: list[str]) -> int:
    from transformers import PreTrainedTokenizerFast

    path, out_dir = argv
    mapping, convert_gguf_tokenizer = _transformers_parts()
    arch, tok, cfg = tokenizer_fields(path, mapping)
    fast, extra = convert_gguf_tokenizer(arch, tok)
    kwargs = {k: v for k, v in {**cfg, **extra}.items() if v is not None}
    PreTrainedTokenizerFast(tokenizer_object=fast, **kwargs).save_pretrained(out_dir)
    print(out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
