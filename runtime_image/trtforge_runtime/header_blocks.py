"""HTTP/2 header blocks decoded once per state of the connection's HPACK table.

A gRPC client sends each call's headers as an HPACK block. Once its table holds the call's fields,
most clients send the same few bytes on every call (tritonclient's grpc-core: one indexed byte per
field), and hpack's pure-Python decoder took ~28 µs for each, about a fifth of the front end's
Python per SqueezeNet call (docs/design.md, "Runtime gRPC").

:class:`HeaderBlocks` keeps the result of a block whose decode left the dynamic table as it found
it, under the block's bytes and the table's *version*, a count of the decodes that changed the
table. Decoding depends only on the block and the table, and the table changes only inside a decode,
so a block seen again at the same version decodes to the same headers and again leaves the table as
it is: it is answered from what was kept, and the table stays in step with the client's encoder.
Any decode that changes the table (a literal with incremental indexing, a size update) bumps the
version, so nothing kept before it is used again. Whether the table changed is read from hpack's
``header_table``: its first entry (held across the decode, so a new entry can never share its
identity), its length and its size limit.
"""

from __future__ import annotations

import hpack

MAX_KEPT_BLOCK = 1024  # longer blocks are decoded every time
KEPT = 16  # blocks kept per connection (the oldest go first)


class HeaderBlocks:
    """One connection's HPACK decoder; :meth:`decode` is ``dict(Decoder.decode(block, raw=True))``,
    with repeated blocks answered from what an earlier decode found (see the module docstring)."""

    __slots__ = ("_decoder", "_kept", "_version", "hits")

    def __init__(self, max_header_list_size: int) -> None:
        self._decoder = hpack.Decoder(max_header_list_size=max_header_list_size)
        self._kept: dict[bytes, tuple[int, dict[bytes, bytes]]] = {}
        self._version = 0
        self.hits = 0  # blocks answered from what was kept

    def decode(self, block: bytes) -> dict[bytes, bytes]:
        """The block's headers (names and values as bytes; the last value of a repeated name).
        hpack's errors (``hpack.HPACKError``) propagate: the connection must end. The dict returned
        may be returned again for the same block: callers must not change it."""
        kept = self._kept.get(block)
        if kept is not None and kept[0] == self._version:
            self.hits += 1
            return kept[1]
        table = self._decoder.header_table
        entries = table.dynamic_entries
        first, count, size = (entries[0] if entries else None), len(entries), table.maxsize
        try:
            headers = dict(self._decoder.decode(block, raw=True))
        finally:
            entries = table.dynamic_entries
            now_first = entries[0] if entries else None
            changed = now_first is not first or len(entries) != count or table.maxsize != size
            if changed:
                self._version += 1
        if not changed and len(block) <= MAX_KEPT_BLOCK:
            if len(self._kept) >= KEPT:
                del self._kept[next(iter(self._kept))]
            self._kept[block] = (self._version, headers)
        return headers
