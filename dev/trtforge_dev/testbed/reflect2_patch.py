"""Patch the vendored github.com/modern-go/reflect2 v1.0.1 for Go ≥ 1.18 (docs/design.md §"The test
bed").

From Go 1.18 the runtime's ``reflect.mapiterinit(t, m, it *hiter)`` fills a caller-allocated
iterator instead of returning one, and that iterator must have the runtime's full layout. v1.0.1
declares the old signature and a two-field struct, so the apiserver segfaults iterating maps. The
patch declares the new signature, gives ``hiter`` the runtime's field layout, and allocates it in
``UnsafeIterate``. Pure text edits; idempotent; refuses sources it does not recognise.
"""

from __future__ import annotations

import re
from pathlib import Path

REL_DIR = Path("vendor/github.com/modern-go/reflect2")

OLD_DECL = "func mapiterinit(rtype unsafe.Pointer, m unsafe.Pointer) *hiter"
NEW_DECL = "func mapiterinit(rtype unsafe.Pointer, m unsafe.Pointer, it *hiter)"

# The runtime's hiter (runtime/map.go, Go 1.18-1.21): pointer fields as unsafe.Pointer.
HITER_STRUCT = """type hiter struct {
	key         unsafe.Pointer
	value       unsafe.Pointer
	t           unsafe.Pointer
	h           unsafe.Pointer
	buckets     unsafe.Pointer
	bptr        unsafe.Pointer
	overflow    *[]unsafe.Pointer
	oldoverflow *[]unsafe.Pointer
	startBucket uintptr
	offset      uint8
	wrapped     bool
	B           uint8
	i           uint8
	bucket      uintptr
	checkBucket uintptr
}"""

_STRUCT_RE = re.compile(r"type hiter struct \{.*?\n\}", re.S)
_OLD_CALL_RE = re.compile(
    r"(?P<indent>\t)return &UnsafeMapIterator\{\n(?P<i2>\t+)hiter:(?P<sp>\s*)"
    r"mapiterinit\(type2\.rtype, \*\(\*unsafe\.Pointer\)\(obj\)\),\n"
)
NEW_CALL = "\tvar it hiter\n\tmapiterinit(type2.rtype, *(*unsafe.Pointer)(obj), &it)\n"


class PatchError(RuntimeError):
    pass


def patch_link(text: str) -> str:
    """unsafe_link.go: the new mapiterinit signature and the full hiter layout."""
    if NEW_DECL in text and HITER_STRUCT in text:
        return text
    if OLD_DECL not in text or not _STRUCT_RE.search(text):
        raise PatchError("unsafe_link.go does not declare the reflect2 v1.0.1 mapiterinit/hiter")
    text = text.replace(OLD_DECL, NEW_DECL)
    return _STRUCT_RE.sub(lambda _m: HITER_STRUCT, text, count=1)


def patch_map(text: str) -> str:
    """unsafe_map.go: UnsafeIterate allocates the iterator and passes it to mapiterinit."""
    if "mapiterinit(type2.rtype, *(*unsafe.Pointer)(obj), &it)" in text:
        return text
    m = _OLD_CALL_RE.search(text)
    if not m:
        raise PatchError("unsafe_map.go does not contain reflect2 v1.0.1's UnsafeIterate")
    replacement = f"{NEW_CALL}\treturn &UnsafeMapIterator{{\n{m['i2']}hiter:{m['sp']}&it,\n"
    return text[: m.start()] + replacement + text[m.end() :]


def apply(tree: Path) -> bool:
    """Patch the vendored reflect2 under a Kubernetes source `tree`; True if anything changed."""
    d = tree / REL_DIR
    changed = False
    for name, fn in (("unsafe_link.go", patch_link), ("unsafe_map.go", patch_map)):
        p = d / name
        if not p.is_file():
            raise PatchError(f"{p} is missing; is {tree} a Kubernetes source tree with vendor/?")
        old = p.read_text()
        new = fn(old)
        if new != old:
            p.write_text(new)
            changed = True
    return changed
