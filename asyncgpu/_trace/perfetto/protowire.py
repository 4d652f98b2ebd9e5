"""Protobuf's wire format: the primitives the Perfetto writer, reader and streamed packets share.

A message is its fields one after another, in any order; a repeated field is its values one after another, and
for a scalar field the last occurrence wins. Each field is a tag, then a value::

    tag = varint(field_number << 3 | wire_type)

    wire type 0  VARINT  the value as a varint: 7 bits a byte, lowest group first, the high bit set on every
                         byte but the last (300 = 0b10_0101100 -> 0xac 0x02)
    wire type 1  I64     8 bytes, little-endian (fixed64, double)
    wire type 2  LEN     varint(length), then that many bytes: a string, bytes or a nested message
    wire type 5  I32     4 bytes, little-endian
    (3 and 4, the deprecated groups, appear in no Perfetto trace: the decoder rejects them)

    field 8 = 300:                  0x40 0xac 0x02       (0x40 = 8 << 3 | 0)
    field 11 holding 5 bytes:       0x5a 0x05 b0 .. b4   (0x5a = 11 << 3 | 2)

Encoding is column-wise (`Columns`): many messages of one shape are built a field at a time with numpy, one row
of bytes per message. Decoding is column-wise too (`decode`): the fields of many messages at once, one field per
pass. Neither needs the ``perfetto`` package.

Threads: any thread; nothing here holds state between calls.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

__all__ = ["NO_FIELD", "Columns", "Field", "decode", "length_field", "strings", "varint", "varint_field"]


# -- encoding one field --------------------------------------------------------------------------------------------
def varint(value: int) -> bytes:
    """``value`` (>= 0) as a varint."""
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def length_field(tag: int, data: bytes) -> bytes:
    """Field ``tag`` of wire type 2 (LEN) holding ``data``."""
    return varint(tag << 3 | 2) + varint(len(data)) + data


def varint_field(tag: int, value: int) -> bytes:
    """Field ``tag`` of wire type 0 (VARINT) holding ``value`` (>= 0)."""
    return varint(tag << 3) + varint(value)


# -- encoding many messages, column-wise ---------------------------------------------------------------------------
_VARINT_LIMITS = np.array([1 << (7 * k) for k in range(1, 10)], np.uint64)  # a value >= 128**k takes k + 1 bytes


def _varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Protobuf varints of uint64 ``values``: their bytes (one row each, as wide as the longest) and lengths
    (None: one byte each, the common case of small ids)."""
    v = np.asarray(values, np.uint64)
    if not v.size or int(v.max()) < 0x80:
        return v.astype(np.uint8).reshape(-1, 1), None
    lengths = (np.searchsorted(_VARINT_LIMITS, v, side="right") + 1).astype(np.int32)
    width = int(lengths.max())
    out = np.empty((len(v), width), np.uint8)
    for k in range(width):
        out[:, k] = (v >> np.uint64(7 * k)).astype(np.uint8) | 0x80
    out[np.arange(len(v)), lengths - 1] &= 0x7F
    return out, lengths


class Columns:
    """Many protobuf messages of one shape, built field by field as columns of bytes: piece ``k`` of message
    ``i`` is the first ``lengths[k][i]`` bytes of row ``i`` of ``pieces[k]`` (all of it where ``lengths[k]`` is
    None); a message is its pieces in order. A piece is a field's tag and value together."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.pieces: list[np.ndarray] = []  # (n, width) uint8, or (width,): the same bytes in every message
        self.lengths: list[np.ndarray | None] = []

    def _add(self, piece: np.ndarray, lengths: np.ndarray | None, present: np.ndarray | None) -> None:
        if present is not None:
            lengths = (np.full(self.n, piece.shape[-1], np.int32) if lengths is None else lengths) * present
        self.pieces.append(piece)
        self.lengths.append(lengths)

    def const(self, data: bytes, present: np.ndarray | None = None) -> None:
        """The same bytes in every message (where ``present``)."""
        self._add(np.frombuffer(data, np.uint8), None, present)

    def varint(self, tag: bytes, values: np.ndarray, present: np.ndarray | None = None) -> None:
        """A varint field: its ``tag`` and one value per message (where ``present``)."""
        piece, lengths = _varints(values)
        head = np.broadcast_to(np.frombuffer(tag, np.uint8), (self.n, len(tag)))
        self._add(np.hstack((head, piece)), None if lengths is None else lengths + len(tag), present)

    def fixed64(self, tag: bytes, values: np.ndarray, present: np.ndarray | None = None) -> None:
        """A fixed64 field: its ``tag`` and doubles or uint64s, 8 bytes little-endian."""
        v = np.ascontiguousarray(values, "<f8" if values.dtype.kind == "f" else "<u8")
        head = np.broadcast_to(np.frombuffer(tag, np.uint8), (self.n, len(tag)))
        self._add(np.hstack((head, v.view(np.uint8).reshape(self.n, 8))), None, present)

    def message(self, tag: bytes, inner: Columns, present: np.ndarray | None = None) -> None:
        """A length-delimited field holding ``inner``."""
        self.varint(tag, inner.size(), present)
        self.pieces += inner.pieces
        self.lengths += inner.lengths if present is None else [_lengths_where(n, p, present) for p, n in inner._sized()]

    def _sized(self) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        return zip(self.pieces, self.lengths)

    def size(self) -> np.ndarray:
        """Each message's length in bytes."""
        total = np.zeros(self.n, np.int64)
        for piece, lengths in self._sized():
            total += piece.shape[-1] if lengths is None else lengths
        return total

    def tobytes(self) -> bytes:
        """The messages, one after another."""
        width = sum(p.shape[-1] for p in self.pieces)
        matrix = np.empty((self.n, width), np.uint8)
        keep = np.empty((self.n, width), bool)
        at = 0
        for piece, lengths in self._sized():
            w = piece.shape[-1]
            matrix[:, at : at + w] = piece
            keep[:, at : at + w] = True if lengths is None else np.arange(w) < lengths[:, None]
            at += w
        return matrix[keep].tobytes()


def _lengths_where(lengths: np.ndarray | None, piece: np.ndarray, present: np.ndarray) -> np.ndarray:
    """A piece's lengths where ``present``, 0 elsewhere."""
    return (np.full(len(present), piece.shape[-1], np.int32) if lengths is None else lengths) * present


# -- decoding, column-wise ------------------------------------------------------------------------------------------
class Field:
    """One field number's occurrences in many messages: ``msg``, the message of each; ``value``, a varint or
    fixed value, or where a length-delimited one starts; ``end``, where that one ends (-1 for the others)."""

    __slots__ = ("msg", "value", "end")

    def __init__(self, msg: np.ndarray, value: np.ndarray, end: np.ndarray) -> None:
        self.msg, self.value, self.end = msg, value, end

    def sub(self) -> tuple[np.ndarray, np.ndarray]:
        """Where each length-delimited occurrence lies: (start, end)."""
        return self.value.astype(np.int64), self.end

    def per_message(self, n: int, default: int = 0) -> np.ndarray:
        """The value per message (the last occurrence wins, as protobuf's), ``default`` where absent."""
        out = np.full(n, default, np.uint64)
        out[self.msg] = self.value
        return out


NO_FIELD = Field(  # a field no message holds: `decode(...).get(number, NO_FIELD)`
    np.zeros(0, np.int64), np.zeros(0, np.uint64), np.zeros(0, np.int64)
)


def _read_varints(buf: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The varints at ``pos``: (values, lengths in bytes)."""
    first = buf[pos]
    value = first.astype(np.uint64)
    length = np.ones(len(pos), np.int64)
    more = np.flatnonzero(first >= 0x80)
    k = 1
    while more.size:
        if k == 10:
            raise ValueError("a varint longer than 10 bytes")
        value[more] &= ~np.uint64(0x80 << (7 * (k - 1)))  # drop the continuation bit just read
        b = buf[pos[more] + k]
        value[more] |= b.astype(np.uint64) << np.uint64(7 * k)
        length[more] += 1
        more = more[b >= 0x80]
        k += 1
    return value, length


def decode(buf: np.ndarray, start: np.ndarray, end: np.ndarray) -> dict[int, Field]:
    """The fields of the messages at ``[start, end)`` of ``buf``, all messages at once, one field per pass."""
    stop = np.asarray(end, np.int64)
    msg, cur = np.arange(len(stop)), np.asarray(start, np.int64)
    first = np.flatnonzero(cur < stop)
    msg, cur = msg[first], cur[first]
    found: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
    while msg.size:
        tag, k = _read_varints(buf, cur)
        field, wire, pos = (tag >> np.uint64(3)).astype(np.int64), (tag & np.uint64(7)).astype(np.int8), cur + k
        if ((wire == 3) | (wire == 4) | (wire > 5)).any():
            raise ValueError("a field of an unknown wire type")
        value, until, nxt = np.zeros(len(msg), np.uint64), np.full(len(msg), -1, np.int64), pos.copy()
        for kind, size in ((0, 0), (2, 0), (1, 8), (5, 4)):
            m = np.flatnonzero(wire == kind)
            if not m.size:
                continue
            at = pos[m]
            if kind == 0:
                value[m], k = _read_varints(buf, at)
                nxt[m] += k
            elif kind == 2:
                length, k = _read_varints(buf, at)
                value[m] = at + k
                until[m] = nxt[m] = at + k + length.astype(np.int64)
            else:
                raw = np.ascontiguousarray(buf[at[:, None] + np.arange(size)])
                value[m] = raw.view("<u8" if size == 8 else "<u4").ravel()
                nxt[m] += size
        if (nxt > stop[msg]).any():
            raise ValueError("a field runs past the end of its message")
        for f in np.flatnonzero(np.bincount(field)).tolist():
            sel = np.flatnonzero(field == f)
            found.setdefault(f, []).append((msg[sel], value[sel], until[sel]))
        live = np.flatnonzero(nxt < stop[msg])
        msg, cur = msg[live], nxt[live]
    return {f: Field(*(np.concatenate(c) for c in zip(*parts))) for f, parts in found.items()}


def strings(data: bytes, field: Field) -> list[str]:
    """The length-delimited occurrences of ``field`` in ``data``, decoded as UTF-8 text."""
    start, end = field.sub()
    return [data[a:b].decode("utf-8") for a, b in zip(start.tolist(), end.tolist())]
