"""gzip with a bound: every decompression of bytes that came from outside (a store, a registry,
a ConfigMap anyone with write access could have replaced) stops at a size, as it unpacks, so a
small input that expands to gigabytes (a gzip bomb) costs nothing but the error."""

from __future__ import annotations

import zlib


class TooBig(ValueError):
    """The input unpacks to more than the bound allows (or is not one whole gzip stream)."""


def gunzip(data: bytes, limit: int, what: str) -> bytes:
    """One gzip member, decompressed to at most `limit` bytes; TooBig past it, ValueError when
    it does not decompress."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(data, limit + 1)
    except zlib.error as exc:
        raise ValueError(f"{what} does not decompress: {exc}") from None
    if len(out) > limit or d.unconsumed_tail:
        raise TooBig(f"{what} unpacks to more than {limit} bytes: refused")
    if not d.eof or d.unused_data:
        raise ValueError(f"{what} is not one whole gzip stream")
    return out
