"""The Vigil wire codec (version 1, ``docs/wire-format.md``): one message per frame.

::

    u32 length (big-endian) of everything after this field, at most MAX_FRAME bytes
    header (28 bytes, big-endian integers):
      magic "VG" | version u8 (=1) | type u8 | flags u8 | nroute u8 | topic_len u16
      matchtag u32 | nodeid u32 | userid u32 | errnum u32 | seq u32
    route stack: nroute x u32
    topic: topic_len bytes of UTF-8
    payload: the rest (JSON, possibly empty)

The same layout as ``vigil_proto::message`` (Rust), checked in the same order; ``tests/test_wire.py`` decodes and
re-encodes the frames that the Rust codec produced (``tests/golden/frames.json``, written and checked by
``runtime/proto/tests/python_golden.rs``).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any, List, Optional

MAGIC = b"VG"
WIRE_VERSION = 1
#: Largest accepted frame (bytes after the length field): 64 MiB.
MAX_FRAME = 64 << 20
#: Largest route stack.
MAX_ROUTE = 64
#: Fixed header size after the length field, in bytes.
HEADER_LEN = 28
#: ``nodeid``: the nearest broker that offers the service, else upstream.
NODEID_ANY = 0xFFFFFFFF
#: ``nodeid``: the parent of the broker this client is attached to.
NODEID_UPSTREAM = 0xFFFFFFFE

#: Message types (header byte 3).
REQUEST, RESPONSE, EVENT, CONTROL = 1, 2, 3, 4
#: Request flag: the sender wants no response.
FLAG_NORESPONSE = 1
#: Request flag: a stream of responses ended by ENODATA.
FLAG_STREAMING = 2

_HEAD = struct.Struct(">2sBBBBHIIIII")  # after the length prefix
assert _HEAD.size == HEADER_LEN


class DecodeError(ValueError):
    """A malformed frame; ``kind`` names the check that failed, as the Rust ``DecodeError`` variant does."""

    def __init__(self, kind: str, detail: str):
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


@dataclass
class Message:
    """One decoded message; ``payload`` is the raw JSON bytes (possibly empty)."""

    msgtype: int
    topic: str
    flags: int = 0
    matchtag: int = 0
    nodeid: int = NODEID_ANY
    userid: int = 0
    errnum: int = 0
    seq: int = 0
    route: List[int] = field(default_factory=list)
    payload: bytes = b""

    def json(self) -> Any:
        """The payload as JSON (``None`` when empty or not JSON)."""
        if not self.payload:
            return None
        try:
            return json.loads(self.payload)
        except ValueError:
            return None

    def errstr(self) -> Optional[str]:
        """An error response's ``errstr``, if its payload has one."""
        v = self.json()
        if isinstance(v, dict) and isinstance(v.get("errstr"), str):
            return v["errstr"]
        return None

    def encode(self) -> bytes:
        """One frame, length prefix included."""
        topic = self.topic.encode("utf-8")[:0xFFFF]
        route = self.route[:MAX_ROUTE]
        head = _HEAD.pack(
            MAGIC,
            WIRE_VERSION,
            self.msgtype,
            self.flags,
            len(route),
            len(topic),
            self.matchtag,
            self.nodeid,
            self.userid,
            self.errnum,
            self.seq,
        )
        body = b"".join([head, struct.pack(f">{len(route)}I", *route), topic, self.payload])
        return struct.pack(">I", len(body)) + body


def request(topic: str, nodeid: int, payload: Any, matchtag: int = 0, flags: int = 0) -> Message:
    """A request for ``topic`` to rank ``nodeid`` with a JSON payload (compact, as serde_json writes it)."""
    data = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return Message(REQUEST, topic, flags=flags, matchtag=matchtag, nodeid=nodeid, payload=data)


def check_length(length: int) -> None:
    """Check a frame's length prefix before its bytes are read (``DecodeError`` ``TooLarge``/``Truncated``)."""
    if length > MAX_FRAME:
        raise DecodeError("TooLarge", f"frame of {length} bytes exceeds the {MAX_FRAME}-byte limit")
    if length < HEADER_LEN:
        raise DecodeError("Truncated", f"truncated frame ({length} bytes)")


def check_start(head: bytes) -> None:
    """Check the first 4 bytes after the length prefix (magic, version) before the rest of a frame is read."""
    if head[:2] != MAGIC:
        raise DecodeError("BadMagic", f"bad magic {bytes(head[:2])!r}: not a Vigil peer")
    if head[2] != WIRE_VERSION:
        raise DecodeError("Version", f"unsupported wire version {head[2]} (this client speaks {WIRE_VERSION})")


def decode_body(body: bytes) -> Message:
    """Decode the bytes after the length prefix; raises :class:`DecodeError`."""
    if len(body) < HEADER_LEN:
        raise DecodeError("Truncated", f"truncated frame ({len(body)} bytes)")
    magic, version, mtype, flags, nroute, topic_len, matchtag, nodeid, userid, errnum, seq = _HEAD.unpack_from(body)
    if magic != MAGIC:
        raise DecodeError("BadMagic", f"bad magic {magic!r}: not a Vigil peer")
    if version != WIRE_VERSION:
        raise DecodeError("Version", f"unsupported wire version {version} (this client speaks {WIRE_VERSION})")
    if mtype not in (REQUEST, RESPONSE, EVENT, CONTROL):
        raise DecodeError("BadType", f"unknown message type {mtype}")
    if nroute > MAX_ROUTE:
        raise DecodeError("RouteTooDeep", f"route stack of {nroute} entries exceeds {MAX_ROUTE}")
    need = HEADER_LEN + 4 * nroute + topic_len
    if len(body) < need:
        raise DecodeError("Truncated", f"truncated frame ({len(body)} bytes)")
    route = list(struct.unpack_from(f">{nroute}I", body, HEADER_LEN))
    t0 = HEADER_LEN + 4 * nroute
    try:
        topic = bytes(body[t0 : t0 + topic_len]).decode("utf-8")
    except UnicodeDecodeError:
        raise DecodeError("BadTopic", "topic is not valid UTF-8") from None
    return Message(mtype, topic, flags, matchtag, nodeid, userid, errnum, seq, route, bytes(body[need:]))


def decode_frame(frame: bytes) -> Message:
    """Decode one complete frame (length prefix included); the length must match exactly."""
    if len(frame) < 4:
        raise DecodeError("Truncated", f"truncated frame ({len(frame)} bytes)")
    (length,) = struct.unpack_from(">I", frame)
    if length > MAX_FRAME:
        raise DecodeError("TooLarge", f"frame of {length} bytes exceeds the {MAX_FRAME}-byte limit")
    if len(frame) - 4 != length:
        raise DecodeError("Truncated", f"truncated frame ({len(frame)} bytes)")
    return decode_body(frame[4:])
