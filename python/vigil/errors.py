"""Exceptions of the Vigil Python API, and the hints the ``vigil`` command gives with them."""

from __future__ import annotations

import errno as _errno
from typing import Optional

#: What a command says when nothing listens on the socket (``runtime/cli/src/cli/mod.rs``, ``connect_error``).
NO_BROKER_HINT = (
    "no broker listens there: the instance has ended, or this node's broker is down or restarting; with a state "
    "directory, rank 0 keeps the jobs across its restart"
)
#: What a command says when the broker dropped it before its welcome (same place).
DROPPED_HINT = (
    "the broker dropped the connection before welcoming it: it is stopping or restarting; with a state directory, "
    "rank 0 keeps the jobs across its restart"
)
#: The ``errstr`` of a request whose connection ended before its answer (``vigil_client::RpcError``).
DISCONNECTED = "lost connection to broker"
#: ``VIGIL_URI`` unset (``vigil_client::ConnectError::NoUri``).
NO_URI = (
    "VIGIL_URI is not set: run this command inside an instance (vigil start ...), or set "
    "VIGIL_URI=local:///RUNDIR/local-0"
)


def lost_note(errstr: str, jobid: str) -> str:
    """The hint of a client that lost rank 0 while it followed job ``jobid`` (f58), as ``vigil job wait`` says it."""
    return (
        f"{errstr} (rank 0 stopped or restarted): job {jobid} may still be running. If rank 0 keeps a state "
        f"directory, once it is back `vigil job attach {jobid}` shows the job's whole output and exits with its exit "
        f"code (`vigil job wait {jobid}`: the exit code alone); without one, the job ended with rank 0"
    )


class VigilError(OSError):
    """An error from the instance or the connection to it: ``errno`` (POSIX, e.g. 2 ENOENT for an unknown job, 28
    ENOSPC for a request the instance can never satisfy, 113 EHOSTUNREACH for a lost rank 0 or connection) and
    ``strerror`` (the broker's message). ``str(e)`` is the message alone, as the CLI prints it."""

    def __init__(self, errnum: int, message: str):
        super().__init__(errnum, message)

    def __str__(self) -> str:
        return str(self.strerror)


class ConnectError(VigilError):
    """The broker could not be reached or refused the connection (``errno``: the socket's, e.g. ECONNREFUSED or
    ENOENT; EINVAL for no or a bad URI; EPERM for a refusal; EPROTO for a peer that does not speak Vigil)."""


class ConnectionLost(VigilError):
    """The connection to the broker ended with requests in flight (``errno`` EHOSTUNREACH, as the Rust client
    reports it); the message carries the CLI's hint."""

    def __init__(self, message: str = DISCONNECTED):
        super().__init__(_errno.EHOSTUNREACH, message)


class JobException(Exception):
    """A job ended by a fatal (severity 0) exception (RFC 21): ``type`` (``cancel``, ``timeout``, ``node-failure``,
    ``exec``...), ``note``, ``jobid`` and the ``exit_code`` the CLI reports for it (``vigil job wait``)."""

    def __init__(self, jobid: int, type_: str, note: str, exit_code: int):
        super().__init__(f"job {f58(jobid)}: exception type={type_}: {note}")
        self.jobid = jobid
        self.type = type_
        self.note = note
        self.exit_code = exit_code


_F58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def f58(jobid: int) -> str:
    """A job id in the compact f58 form the CLI prints (RFC 19), e.g. ``f2UkWB``."""
    n = int(jobid)
    if n == 0:
        return "f1"
    out = []
    while n:
        n, d = divmod(n, 58)
        out.append(_F58[d])
    return "f" + "".join(reversed(out))


_FORMS = "expected f58 (f3Yq9b), decimal, hex (0x1a2b) or dotted hex (0000.0001.a2b0.0000)"


def parse_jobid(s: "int | str") -> int:
    """A job id given as an int or in an RFC 19 form, read in RFC 19's order: dotted hex (contains ``.``), words
    (contains ``-``: not read), f58 (``f...`` or ``ƒ...``), emoji (not read), hex (``0x...``), decimal; whitespace
    around it ignored. ValueError naming the text and why otherwise (as ``vigil``'s own ``JobId::parse``)."""
    if isinstance(s, int):
        return s
    t = s.strip()

    def bad(why: str) -> ValueError:
        return ValueError(f"invalid job id '{s}': {why}")

    def hexa(h: str, most: int) -> int:
        if not h or len(h) > most or any(c not in "0123456789abcdefABCDEF" for c in h):
            raise bad(_FORMS)
        return int(h, 16)

    if "." in t:
        groups = t.split(".")
        if len(groups) != 4:
            raise bad("dotted hex has four groups of hex digits (0000.0001.a2b0.0000)")
        n = 0
        for g in groups:
            n = (n << 16) | hexa(g, 4)
        return n
    if "-" in t:
        raise bad("mnemonic (words) job ids are not read here: give the f58, decimal or hex form")
    if t[:1] in ("f", "ƒ"):
        body = t[1:]
        if not body:
            raise bad(_FORMS)
        n = 0
        for c in body:
            d = _F58.find(c)
            if d < 0:
                raise bad(_FORMS)
            n = n * 58 + d
        if n >= 1 << 64:
            raise bad("more than 64 bits")
        return n
    if t.encode()[:2] == b"\xf0\x9f":
        raise bad("emoji job ids are not read here: give the f58, decimal or hex form")
    if t.startswith("0x"):
        return hexa(t[2:], 16)
    if not t or not t.isascii() or not t.isdigit():
        raise bad(_FORMS)
    n = int(t)
    if n >= 1 << 64:
        raise bad("more than 64 bits")
    return n
