"""The repository speaks of the product as it is: no work sessions, engineers or who did what when.

History lives in ``git log``. This scans every tracked text file (docs, code, comments, docstrings,
chart templates, tests, notes) for phrases that tell the history of the work: an ordinal or numbered
"session", "sessions ago", "the last session", "this session's run", "we measured in session",
"engineer". Real uses of the word stay allowed: a gRPC, HTTP or TLS session, an ONNX Runtime
``InferenceSession``, ``requests.Session``, aiohttp's ``ClientSession``, a pytest session, a
session-scoped fixture, a process's session (``setsid``).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
THIS = Path(__file__).resolve()

_UNITS = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth"]
_TEENS = [
    "tenth",
    "eleventh",
    "twelfth",
    "thirteenth",
    "fourteenth",
    "fifteenth",
    "sixteenth",
    "seventeenth",
    "eighteenth",
    "nineteenth",
]
_TENS = [
    "twentieth",
    "thirtieth",
    "fortieth",
    "fiftieth",
    "sixtieth",
    "seventieth",
    "eightieth",
    "ninetieth",
    "hundredth",
]
_TENS_PREFIX = ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
ORDINAL = (
    r"(?:(?:" + "|".join(_TENS_PREFIX) + r")[- ](?:" + "|".join(_UNITS) + r")"
    r"|" + "|".join(_TENS + _TEENS + _UNITS) + r"|\d+(?:st|nd|rd|th))"
)
# "this session", "the last session's run": a session placed in time is a work session. A qualifier
# between (the last *pytest* session) makes it a real one.
# ("this session", "that session", "the same session" are ONNX Runtime's often enough to stay allowed;
# "in this session" is caught below.)
_WHEN = r"(?:last|previous|prior|earlier|later|next|past|former|recent)"
_SESSION = r"sessions?(?:'s|s')?"

PATTERNS: dict[str, re.Pattern[str]] = {
    # "a second session" is another one, not the second in a series
    "ordinal session": re.compile(rf"(?<!\ba\s)\b{ORDINAL}[- ]+{_SESSION}(?![\w-])", re.IGNORECASE),
    "session placed in time": re.compile(rf"\b{_WHEN}\s+{_SESSION}(?![\w-])", re.IGNORECASE),
    "in this session": re.compile(
        r"\b(?:in|during|since|until|from)\s+(?:this|that)\s+(?:work\s+)?session\b", re.IGNORECASE
    ),
    "sessions ago": re.compile(r"\bsessions?\s+(?:ago|back)\b", re.IGNORECASE),
    "numbered session": re.compile(r"\b(?:in|of|from|since|until|by)\s+sessions?\s+#?\d+\b", re.IGNORECASE),
    "session's work": re.compile(
        r"\bsession(?:'s|s')\s+(?:calls?|runs?|grid|tables?|serving|device|work|measurements?|numbers?|"
        r"changes?|commits?|notes?|A/B|paired|code|results?|figures?|medians?|ceilings?|sweeps?|"
        r"benchmarks?|machine|start|end|budget|fix(?:es)?)\b",
        re.IGNORECASE,
    ),
    "we ... in session": re.compile(
        r"\b(?:[Ww]e|I)\s+\w+\s+(?:it\s+)?in\s+(?:a\s+|the\s+|that\s+)?session\b"
    ),
    "engineer": re.compile(r"\bengineer(?:s|'s|s')?\b", re.IGNORECASE),
}

# every pattern above names one of these words: a file without them needs no closer look
_MAY_MATCH = re.compile(r"session|engineer", re.IGNORECASE)

FLAGGED = [
    "the thirty-third session's calls",
    "as before the fifteenth session (docs/design.md",
    "**Twenty-ninth session's run** (17:54 UTC",
    "in the 12th session",
    "the session's device calls were spent",
    "two sessions ago",
    "the last session",
    "measured in this session",
    "plus this session's fix",
    "the previous session's tables",
    "we measured in session 12",
    "We measured it in the session",
    "a platform engineer can't find it",
    "other engineers' test beds",
    "Engineer E's timelines",
    "the nineteenth to twenty-first sessions' runs",
]
ALLOWED = [
    "one gRPC session per connection",
    "an ONNX Runtime session per instance",
    "ort.InferenceSession(path, so)",
    "requests.Session()",
    "async with aiohttp.ClientSession() as s:",
    "the last pytest session out stops a test bed a pytest session started",
    "a session-scoped fixture",
    '@pytest.fixture(scope="session")',
    "Start `argv` in its own session (process group)",
    "the solo session costs the model's memory a second time",
    "a session with every CPU's threads",
    "the session token if any",
    "proof of possession, possession records",
    "the session's threads as the server's instance count",
    "The backend takes that session only for the validated manifest's sha256",
    "this session's intra-op threads",
    "new_solo_instance is a second session with every CPU's thread",
    "which must open the same session before the contract is imported",
    "the pre-load may have opened the session earlier",
    "Same session settings as trtforge's ONNX Runtime backend",
    "a TLS session resumes",
    "reverse-engineering the format",
    "the engineering of the store",
]


def _hits(text: str) -> list[tuple[str, str]]:
    return [(name, m.group(0)) for name, rx in PATTERNS.items() for m in rx.finditer(text)]


def _hits_in(text: str) -> list[tuple[str, str]]:
    """`_hits` of a whole file, looking only around each "session" or "engineer" (every pattern's words
    lie within 80 characters before such a word and 40 after it): the same hits, found faster."""
    windows: list[list[int]] = []
    for m in _MAY_MATCH.finditer(text):
        lo, hi = max(0, m.start() - 80), m.end() + 40
        if windows and lo <= windows[-1][1]:
            windows[-1][1] = hi
        else:
            windows.append([lo, hi])
    return [hit for lo, hi in windows for hit in _hits(text[lo:hi])]


@pytest.mark.parametrize("phrase", FLAGGED)
def test_history_phrases_are_caught(phrase: str) -> None:
    assert _hits(phrase), f"{phrase!r} tells the history of the work but no pattern catches it"


def test_looking_around_the_words_finds_what_the_whole_text_does() -> None:
    text = " ".join(["filler " * 30 + p for p in FLAGGED + ALLOWED])
    assert sorted(_hits_in(text)) == sorted(_hits(text))
    assert len(_hits_in(text)) >= len(FLAGGED)


@pytest.mark.parametrize("phrase", ALLOWED)
def test_real_uses_of_the_word_are_allowed(phrase: str) -> None:
    assert _hits(phrase) == [], f"{phrase!r} is a real use of the word"


def _tracked_files() -> list[Path]:
    """Every file git tracks (with files added but not yet committed); a checkout without git walks the
    tree instead, leaving out what is never tracked."""
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            check=True,
        ).stdout
        return sorted({ROOT / p for p in out.decode().split("\0") if p})
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", ".cluster", ".cache", "__pycache__", "node_modules", ".mypy_cache"}
        return sorted(p for p in ROOT.rglob("*") if p.is_file() and not skip & set(p.relative_to(ROOT).parts))


def _text(path: Path) -> str | None:
    try:
        data = path.read_bytes()
    except OSError:  # deleted in the working tree, a broken link
        return None
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def test_the_tree_has_no_history_phrases() -> None:
    """docs/ and the source tree describe the product as it is; the history is in `git log`."""
    found: list[str] = []
    files = [p for p in _tracked_files() if p.resolve() != THIS]
    assert any(p.parts[-2:] == ("docs", "design.md") for p in files), "the scan must see docs/"
    for path in files:
        text = _text(path)
        if text is None or not _MAY_MATCH.search(text):
            continue
        # a phrase broken over two lines of a comment or a paragraph is still one phrase
        joined = re.sub(r"[ \t]*\n[ \t]*(?:#+|//|\*|>)?[ \t]*", " ", text)
        for name, phrase in _hits_in(joined):
            found.append(f"{path.relative_to(ROOT)}: {name}: {phrase!r}")
    assert not found, "history of the work in the tree (say what the product does, in the present):\n" + (
        "\n".join(found)
    )
