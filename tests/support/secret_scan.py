"""Finds a secret in what a run left behind: in the clear, or wrapped in base64, zlib, gzip or
zstd (Spark's event log is zstd by default; a pickle holds its strings as they are, so a pickled
secret is found in the clear)."""
from __future__ import annotations

import base64
import binascii
import re
import zlib
from pathlib import Path

import pyarrow as pa

_BASE64 = re.compile(rb"[A-Za-z0-9+/_-]{16,}={0,2}")
_COMPRESSED = re.compile(rb"\x78[\x01\x5e\x9c\xda]|\x1f\x8b")
_ZSTD = b"\x28\xb5\x2f\xfd"


def _decoded(token: bytes) -> list[bytes]:
    out = []
    for decode in (base64.b64decode, base64.urlsafe_b64decode):
        try:
            out.append(decode(token + b"=" * (-len(token) % 4)))
        except (binascii.Error, ValueError):
            pass
    return out


def _inflated(data: bytes) -> list[bytes]:
    out = []
    if data.startswith(_ZSTD):
        try:
            out.append(pa.input_stream(pa.BufferReader(data), compression="zstd").read())
        except OSError:
            pass
    for match in _COMPRESSED.finditer(data):
        wbits = 31 if match.group() == b"\x1f\x8b" else 15
        try:
            out.append(zlib.decompressobj(wbits).decompress(data[match.start():], 64 << 20))
        except zlib.error:
            pass
    return out


def wrapped(data: bytes, secret: bytes, depth: int = 3) -> str | None:
    """How `secret` appears in `data` ("clear", "base64", "compressed+base64+compressed", ...), or None."""
    if secret in data:
        return "clear"
    if depth == 0:
        return None
    for inner, how in [*((d, "base64") for m in _BASE64.finditer(data) for d in _decoded(m.group())),
                       *((d, "compressed") for d in _inflated(data))]:
        found = wrapped(inner, secret, depth - 1)
        if found:
            return f"{how}+{found}" if found != "clear" else how
    return None


def files_holding(root: Path, secret: str) -> dict[str, str]:
    """Every file under `root` that holds `secret`, and how."""
    hits = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        found = wrapped(path.read_bytes(), secret.encode())
        if found:
            hits[str(path)] = found
    return hits
