"""Every citation of a design record resolves: `docs/design.md §"Engine keys"` names a heading there.

Code, docs and chart comments cite docs/design.md by section name, in a few spellings:
``docs/design.md §"Engine keys"``, ``(docs/design.md, "Runtime gRPC")``, ``docs/design.md "The GIL
between batches"`` and, unquoted, ``(docs/design.md, Engine keys)``. A citation may break over two lines
of a comment or docstring. A reference without a section (``docs/design.md says why``) is not a
citation.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"

# design.md, then `§`, a comma or spaces, then a quoted section name, or (after a comma) an unquoted one
# starting with a capital letter and running to the next `)`, `.`, `;`, `:` or `,`.
_CITATION = re.compile(
    r"design\.md(?:\s*§\s*|,\s*|\s+)(?:\"(?P<dq>[^\"]{1,80})\"|'(?P<sq>[^']{1,80})')"
    r"|design\.md,\s+(?P<bare>[A-Z][^).;:,\"'\n]{0,60})"
)
_CONTINUATION = re.compile(r"[ \t]*\n[ \t]*(?:#+|//|\*|>|\"\"\"|\")?[ \t]*")


def headings(markdown: str) -> set[str]:
    """The text of every Markdown heading, outside fenced code blocks."""
    out: set[str] = set()
    fenced = False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        m = re.match(r"#{1,6}\s+(.+?)\s*#*\s*$", line)
        if m and not fenced:
            out.add(m.group(1).strip())
    return out


def citations(text: str) -> list[str]:
    """The section names `text` cites in docs/design.md, a citation broken over lines joined."""
    joined = _CONTINUATION.sub(" ", text)
    found = []
    for m in _CITATION.finditer(joined):
        if m.group("dq") or m.group("sq"):
            found.append(re.sub(r"\s+", " ", m.group("dq") or m.group("sq")).strip())
        else:
            found.append("bare:" + m.group("bare").strip())
    return found


def resolves(citation: str, names: set[str]) -> bool:
    if citation.startswith("bare:"):
        # unquoted: the words after the comma begin with a section's name ("Engine keys. Same key")
        bare = citation.removeprefix("bare:")
        return any(bare == n or bare.startswith(n + " ") for n in names)
    return citation in names


def test_citation_forms_are_read() -> None:
    text = (
        'a (docs/design.md §"Engine\n    keys") b; c (docs/design.md, "Runtime\n# cold start") d\n'
        'e (docs/design.md, TensorRT); f docs/design.md "The GIL between batches" g\n'
        "h (docs/design.md, Engine keys. Same key, i) docs/design.md says why; (docs/design.md)\n"
        "j (design.md, 'Runtime gRPC') k"
    )
    assert citations(text) == [
        "Engine keys",
        "Runtime cold start",
        "bare:TensorRT",
        "The GIL between batches",
        "bare:Engine keys",
        "Runtime gRPC",
    ]
    names = {"Engine keys", "TensorRT"}
    assert resolves("bare:Engine keys", names) and resolves("bare:TensorRT", names)
    assert not resolves("bare:TensorRT policies", {"TensorRT policy"})
    assert not resolves("Engine key", names)


def test_headings_skip_code_blocks() -> None:
    assert headings("# Title\n## Engine keys ##\n```\n# a comment\n```\n### Learning the batch cap\n") == {
        "Title",
        "Engine keys",
        "Learning the batch cap",
    }


def _files() -> list[Path]:
    out = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout
    return sorted({ROOT / p for p in out.decode().split("\0") if p})


def _text(path: Path) -> str | None:
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def test_every_citation_names_a_section_of_design_md() -> None:
    names = headings(DESIGN.read_text())
    cited: dict[str, list[str]] = {}
    for path in _files():
        if path == DESIGN or path.resolve() == Path(__file__).resolve():
            continue
        text = _text(path)
        if text is None or "design.md" not in text:
            continue
        for c in citations(text):
            cited.setdefault(c, []).append(str(path.relative_to(ROOT)))
    assert cited, "found no citation at all: the scan is broken"
    broken = {c: sorted(set(where)) for c, where in cited.items() if not resolves(c, names)}
    assert not broken, (
        "citations of docs/design.md that name no heading there (keep the section, or fix the citation):\n"
        + "\n".join(f"  {c.removeprefix('bare:')!r}: {', '.join(w)}" for c, w in sorted(broken.items()))
    )


@pytest.mark.parametrize(
    "section",
    ["Engine keys", "Runtime cold start", "Scale", "TensorRT", "Runtime protocols", "Adapting to load"],
)
def test_the_most_cited_sections_exist(section: str) -> None:
    assert section in headings(DESIGN.read_text())
