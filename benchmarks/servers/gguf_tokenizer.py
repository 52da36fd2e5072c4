"""Write a Hugging Face tokenizer folder from a GGUF's own tokenizer, for aiperf's ``--tokenizer``.

Runs in the aiperf venv (gguf and transformers there; no torch): the GGUF's ``tokenizer.*`` fields,
read with the ``gguf`` package and named as transformers names them, through transformers'
``convert_gguf_tokenizer`` into a ``PreTrainedTokenizerFast`` that is saved.

    python gguf_tokenizer.py MODEL.gguf OUT_DIR
"""

from __future__ import annotations

import sys
from typing import Any


def tokenizer_fields(path: str) -> tuple[str, dict[str, Any]]:
    from gguf import GGUFReader
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING, GGUF_TOKENIZER_MAPPING, _gguf_parse_value

    reader = GGUFReader(path)
    fields = reader.fields
    arch = _gguf_parse_value(fields["general.architecture"].parts[fields["general.architecture"].data[0]], fields["general.architecture"].types)
    if arch not in GGUF_CONFIG_MAPPING:
        raise SystemExit(f"{path}: architecture {arch!r} is not one transformers converts")
    names = GGUF_TOKENIZER_MAPPING["tokenizer"]
    out: dict[str, Any] = {}
    for key, field in fields.items():
        if not key.startswith("tokenizer.ggml."):
            continue
        short = key[len("tokenizer.") :]
        if short not in names:
            continue
        value = [_gguf_parse_value(field.parts[i], field.types) for i in field.data]
        out[names[short]] = value[0] if len(value) == 1 else value
    return str(arch), out


def main(argv: list[str]) -> int:
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.ggml import convert_gguf_tokenizer

    path, out_dir = argv
    arch, fields = tokenizer_fields(path)
    fast, extra = convert_gguf_tokenizer(arch, fields)
    kwargs: dict[str, Any] = dict(extra)
    for name in ("bos", "eos", "unk", "pad"):
        tid = fields.get(f"{name}_token_id")
        if isinstance(tid, int) and 0 <= tid < len(fields.get("tokens", [])):
            kwargs[f"{name}_token"] = fields["tokens"][tid]
    PreTrainedTokenizerFast(tokenizer_object=fast, **kwargs).save_pretrained(out_dir)
    print(out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
