"""A connection to a Vigil broker over its local connector (the Unix socket named by ``VIGIL_URI``), and the job
and resource requests the ``vigil`` command makes through it.

Threads: one reader thread per connection takes every frame off the socket and hands each response to the request
it answers (by matchtag); requests may be made from any thread. Callbacks given to :meth:`Client.rpc_async` run
on that reader thread and must not block.
"""

from __future__ import annotations

import base64
import errno as _errno
import os
import secrets
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Union

from . import _wire
from .errors import (
    DROPPED_HINT,
    NO_BROKER_HINT,
    NO_URI,
    ConnectError,
    ConnectionLost,
    JobException,
    VigilError,
    f58,
    lost_note,
    parse_jobid,
)
from .jobspec import check_options, from_command, parse_urgency

#: Environment variable naming the broker's URI.
URI_ENV = "VIGIL_URI"
#: How long past the instance's grace for rank 0 a client that lost it keeps trying (``RANK0_WAIT_MARGIN``).
RANK0_WAIT_MARGIN = 5.0
#: How often a client that lost rank 0 tries again, in seconds (``RESEND_EVERY``).
RESEND_EVERY = 0.5
#: The longest a client connected to a broker other than rank 0 waits for rank 0, in seconds (``RESEND_WAIT_MAX``).
RESEND_WAIT_MAX = 300.0
#: The exit code of a job ended by a fatal ``node-failure`` exception (``JOB_EXIT_NODE_LOST``).
JOB_EXIT_NODE_LOST = 69

JobId = Union[int, str]


def exit_code(status: int) -> int:
    """A POSIX wait status as a shell shows it: the code if exited, 128 + signal if killed."""
    return (status >> 8) & 0xFF if status & 0x7F == 0 else 128 + (status & 0x7F)


def job_exit_code(status: Optional[int], fatal: Optional[str]) -> int:
    """The exit code the CLI reports for a job (``shellproto::job_exit_code``): 69 for ``node-failure``; else the
    tasks' code, or 1 if that is 0 but a fatal exception ended the job; 1 when no task ran."""
    if fatal == "node-failure":
        return JOB_EXIT_NODE_LOST
    if status is None:
        return 1
    c = exit_code(status)
    return 1 if c == 0 and fatal is not None else c


def uri_to_path(uri: str) -> str:
    """The socket path of a ``local:///path`` URI (a bare absolute or relative path is accepted too)."""
    if uri.startswith("local://"):
        return uri[len("local://") :]
    if uri.startswith("/") or uri.startswith("."):
        return uri
    raise ConnectError(_errno.EINVAL, f"unsupported URI '{uri}': expected local:///path")


@dataclass
class Welcome:
    """What the broker said about itself on connect: its ``rank``, the instance ``size``, the ``instance`` name,
    the owner's ``uid``, and (rank 0 only) ``rank0_grace``: how long in seconds the other brokers keep their jobs
    while rank 0 restarts (0: they stop with it)."""

    rank: int = 0
    size: int = 0
    instance: str = ""
    uid: int = 0
    rank0_grace: float = 0.0


@dataclass
class OutputLine:
    """One chunk of a job's output: the task ``rank``, ``stream`` (``stdout``/``stderr``), ``data`` (bytes, without
    the newline) and ``eol`` (a newline ended it)."""

    rank: int
    stream: str
    data: bytes
    eol: bool = True

    @property
    def text(self) -> str:
        """``data`` as text (undecodable bytes replaced)."""
        return self.data.decode("utf-8", "replace")


class _Pending:
    __slots__ = ("callback", "streaming")

    def __init__(self, callback: Callable[[Optional[_wire.Message]], None], streaming: bool):
        self.callback = callback
        self.streaming = streaming


class _Connection:
    """One socket to one broker and its reader thread."""

    def __init__(self, uri: str, timeout: float):
        path = uri_to_path(uri)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(timeout)
            s.connect(path)
        except OSError as e:
            s.close()
            msg = f"cannot connect to {path}: {e.strerror or e}"
            if e.errno in (_errno.ECONNREFUSED, _errno.ENOENT):
                msg += f" ({NO_BROKER_HINT})"
            raise ConnectError(e.errno or _errno.EIO, msg) from None
        self.sock = s
        self.rfile = s.makefile("rb")
        try:
            first = self._read()
        except socket.timeout:
            self.close()
            raise ConnectError(_errno.ETIMEDOUT, f"no welcome from the broker at {path} within {timeout} s") from None
        except (OSError, EOFError, _wire.DecodeError) as e:
            self.close()
            # Accepted, then dropped before its welcome: the broker was going away (the CLI's hint).
            dropped = isinstance(e, (ConnectionError, EOFError)) or getattr(e, "kind", "") == "Truncated"
            hint = f" ({DROPPED_HINT})" if dropped else ""
            raise ConnectError(_errno.EPROTO, f"protocol error during connect: {e}{hint}") from None
        if first is None:
            self.close()
            raise ConnectError(_errno.EPERM, "broker refused connection: connection closed by broker")
        if first.msgtype == _wire.CONTROL and first.topic == "refused":
            self.close()
            raise ConnectError(_errno.EPERM, f"broker refused connection: {first.errstr() or 'no reason given'}")
        if first.msgtype != _wire.CONTROL or first.topic != "welcome":
            self.close()
            raise ConnectError(_errno.EPROTO, f"protocol error during connect: unexpected '{first.topic}'")
        w = first.json() or {}
        self.welcome = Welcome(
            rank=int(w.get("rank", 0)),
            size=int(w.get("size", 0)),
            instance=str(w.get("instance", "")),
            uid=int(w.get("uid", 0)),
            rank0_grace=float(w.get("rank0_grace", 0.0) or 0.0),
        )
        s.settimeout(None)
        self.wlock = threading.Lock()
        self.plock = threading.Lock()
        self.pending: Dict[int, _Pending] = {}
        self.closed = False
        self.reader = threading.Thread(target=self._run, name="vigil-reader", daemon=True)
        self.reader.start()

    def _read_exact(self, n: int) -> bytes:
        b = self.rfile.read(n)
        if b is None or len(b) < n:
            raise EOFError(f"truncated frame ({0 if b is None else len(b)} of {n} bytes)")
        return b

    def _read(self) -> Optional[_wire.Message]:
        head = self.rfile.read(4)
        if not head:
            return None
        if len(head) < 4:
            raise _wire.DecodeError("Truncated", f"truncated frame ({len(head)} bytes)")
        (n,) = struct.unpack(">I", head)
        _wire.check_length(n)
        # The magic and version before a large length from an unknown peer is trusted (as frame.rs reads).
        first = self._read_exact(4)
        _wire.check_start(first)
        return _wire.decode_body(first + self._read_exact(n - 4))

    def _run(self) -> None:
        try:
            while True:
                m = self._read()
                if m is None:
                    break
                if m.msgtype != _wire.RESPONSE:
                    continue
                with self.plock:
                    p = self.pending.get(m.matchtag)
                    if p is not None and (not p.streaming or m.errnum != 0):
                        del self.pending[m.matchtag]
                if p is not None:
                    p.callback(m)
        except (OSError, ValueError, EOFError):
            pass
        finally:
            with self.plock:
                self.closed = True
                waiters = list(self.pending.values())
                self.pending.clear()
            for p in waiters:
                p.callback(None)

    def send(self, m: _wire.Message, p: Optional[_Pending]) -> None:
        with self.plock:
            if self.closed:
                raise ConnectionLost()
            if p is not None:
                self.pending[m.matchtag] = p
        try:
            with self.wlock:
                self.sock.sendall(m.encode())
        except OSError:
            with self.plock:
                self.pending.pop(m.matchtag, None)
            raise ConnectionLost() from None

    def forget(self, tag: int) -> None:
        with self.plock:
            self.pending.pop(tag, None)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def _error(m: _wire.Message) -> VigilError:
    return VigilError(m.errnum, m.errstr() or os.strerror(m.errnum))


class Client:
    """A connection to the broker at ``uri`` (default: ``$VIGIL_URI``), as the ``vigil`` command makes it.

    Raises :class:`ConnectError` (with the CLI's hint when nothing listens on the socket). Request methods raise
    :class:`VigilError` with the errno and message of the instance's refusal, and :class:`ConnectionLost` when the
    connection ends with the request in flight. Usable as a context manager; thread-safe.
    """

    def __init__(self, uri: Optional[str] = None, timeout: float = 30.0):
        if uri is None:
            uri = os.environ.get(URI_ENV)
            if not uri:
                raise ConnectError(_errno.EINVAL, NO_URI)
        self.uri = uri
        self._timeout = timeout
        self._tag = 0
        self._tag_lock = threading.Lock()
        self._conn = _Connection(uri, timeout)

    # -- connection ---------------------------------------------------------------------------------------------

    @property
    def welcome(self) -> Welcome:
        """The welcome of the broker this client is connected to."""
        return self._conn.welcome

    @property
    def connected(self) -> bool:
        """Whether the connection is still open."""
        return not self._conn.closed

    def reconnect(self) -> None:
        """Connect again to the same URI (after a lost connection); raises :class:`ConnectError`."""
        new = _Connection(self.uri, self._timeout)
        old, self._conn = self._conn, new
        old.close()

    def close(self) -> None:
        """Close the connection; requests in flight end with :class:`ConnectionLost`."""
        self._conn.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _next_tag(self) -> int:
        with self._tag_lock:
            self._tag = self._tag % 0xFFFFFFFF + 1
            return self._tag

    # -- requests -----------------------------------------------------------------------------------------------

    def rpc_async(
        self,
        topic: str,
        payload: Any,
        callback: Callable[[Optional[_wire.Message]], None],
        nodeid: int = 0,
        streaming: bool = False,
    ) -> int:
        """Send a request; ``callback(message)`` gets each response (a streaming request's, until one with a
        non-zero ``errnum``: ENODATA is the normal end), and ``callback(None)`` if the connection ends first. It
        runs on the reader thread: it must not block. Raises :class:`ConnectionLost` if the connection has ended.
        Returns the request's matchtag."""
        tag = self._next_tag()
        m = _wire.request(topic, nodeid, payload if payload is not None else {}, matchtag=tag,
                          flags=_wire.FLAG_STREAMING if streaming else 0)
        self._conn.send(m, _Pending(callback, streaming))
        return tag

    def rpc(self, topic: str, payload: Any = None, nodeid: int = 0, timeout: Optional[float] = None) -> Any:
        """Send a request to rank ``nodeid`` (default 0; ``vigil._wire.NODEID_ANY`` for the nearest broker) and
        return its response's JSON payload. Raises :class:`VigilError`, :class:`ConnectionLost`, or TimeoutError
        after ``timeout`` seconds."""
        done = threading.Event()
        box: List[Optional[_wire.Message]] = []

        def got(m: Optional[_wire.Message]) -> None:
            box.append(m)
            done.set()

        conn = self._conn
        tag = self.rpc_async(topic, payload, got, nodeid)
        if not done.wait(timeout):
            conn.forget(tag)
            raise TimeoutError(f"{topic}: no answer within {timeout} s")
        m = box[0]
        if m is None:
            raise ConnectionLost()
        if m.errnum != 0:
            raise _error(m)
        return m.json()

    def rpc_stream(self, topic: str, payload: Any = None, nodeid: int = 0) -> Iterator[Any]:
        """Send a streaming request and yield each response's JSON payload until the stream ends (ENODATA).
        Raises :class:`VigilError` on an error response, :class:`ConnectionLost` if the connection ends first."""
        import queue

        q: "queue.SimpleQueue[Optional[_wire.Message]]" = queue.SimpleQueue()
        conn = self._conn
        tag = self.rpc_async(topic, payload, q.put, nodeid, streaming=True)
        try:
            while True:
                m = q.get()
                if m is None:
                    raise ConnectionLost()
                if m.errnum == _errno.ENODATA:
                    return
                if m.errnum != 0:
                    raise _error(m)
                yield m.json()
        finally:
            conn.forget(tag)

    # -- rank 0 restarts ----------------------------------------------------------------------------------------

    def _rank0_wait(self) -> Optional[float]:
        """How long to wait for a lost rank 0, in seconds, or None not to wait (CLI rules: connected to rank 0,
        only if the instance keeps its jobs across a restart, up to its grace plus a margin; else up to 5 min)."""
        w = self.welcome
        if w.rank != 0:
            return RESEND_WAIT_MAX
        if w.rank0_grace > 0 and w.rank0_grace != float("inf"):
            return w.rank0_grace + RANK0_WAIT_MARGIN
        return None

    def _rank0_deadline(self) -> Optional[float]:
        """:meth:`_rank0_wait` from now, as a ``time.monotonic()`` deadline."""
        limit = self._rank0_wait()
        return None if limit is None else time.monotonic() + limit

    def _recover(self, deadline: float) -> bool:
        """After a lost connection or EHOSTUNREACH: wait a turn and connect again if the connection ended.
        False when the deadline passed or (connected to another rank) our own broker is gone."""
        while time.monotonic() + RESEND_EVERY <= deadline:
            time.sleep(RESEND_EVERY)
            if self.connected:
                return True
            try:
                self.reconnect()
                return True
            except ConnectError:
                if self.welcome.rank != 0:
                    return False
        return False

    def _rank0_back(self, e: "VigilError", deadline: Optional[float]) -> "tuple[bool, Optional[float]]":
        """After request error ``e``: re-raise it unless it says rank 0 was lost (EHOSTUNREACH); else wait for rank 0
        to come back, within ``deadline`` (set from now on the first loss). Returns whether it came back, and the
        deadline to keep for the next loss of the same request."""
        if e.errno != _errno.EHOSTUNREACH:
            raise e
        if deadline is None:
            deadline = self._rank0_deadline()
        return (deadline is not None and self._recover(deadline)), deadline

    # -- jobs -----------------------------------------------------------------------------------------------------

    def submit(
        self,
        job: Union[Sequence[str], Mapping[str, Any]],
        urgency: Optional[int] = None,
        **opts: Any,
    ) -> int:
        """Submit a job and return its id (an int; :func:`vigil.f58` prints it as the CLI does).

        ``job`` is a command (a list of strings, built as ``vigil submit`` builds it; ``opts`` are those of
        :func:`vigil.jobspec.from_command`: ``nodes``, ``ntasks``, ``cores_per_task``, ``gpus_per_task``,
        ``time_limit``, ``cwd``, ``env``, ``name``, ``exclusive``) or a jobspec (a dict, RFC 14/25).
        ``urgency`` 0-31 (0 holds the job). Sent again with the same submission key if rank 0 is lost with it in
        flight, so it makes one job. Raises :class:`VigilError` (e.g. ENOSPC, EINVAL with the field named)."""
        urgency = parse_urgency(urgency)
        if isinstance(job, Mapping) and opts:
            raise TypeError(f"options {sorted(opts)} apply to a command, not to a jobspec")
        if not isinstance(job, Mapping):
            check_options(opts, extra=("urgency",))
        spec = dict(job) if isinstance(job, Mapping) else from_command(job, **opts)
        payload: Dict[str, Any] = {"jobspec": spec, "stdin": False, "submit_key": new_submit_key()}
        if urgency is not None:
            payload["urgency"] = urgency
        deadline = None
        while True:
            try:
                r = self.rpc("job-manager.submit", payload)
                return int(r["id"])
            except VigilError as e:
                back, deadline = self._rank0_back(e, deadline)
                if not back:
                    raise VigilError(
                        e.errno,
                        f"{e.strerror}: the job may have been accepted all the same (rank 0 may have made it "
                        f"durable before it was lost); look for it with `vigil jobs -a` before submitting it again",
                    ) from None

    def _follow(self, topic: str, jobid: int) -> Iterator[Any]:
        """The stream of ``topic`` for job ``jobid`` from its start, following it across restarts of rank 0 (the
        CLI's ``await_rank0``): yields ``None`` once when a new stream starts over after a restart, then its items."""
        payload = {"id": jobid, "follow": True} if topic == "job-manager.eventlog" else {"id": jobid}
        deadline = None
        while True:
            try:
                for v in self.rpc_stream(topic, payload):
                    deadline = None  # rank 0 answers: a later loss gets a wait of its own
                    yield v
                return
            except VigilError as e:
                back, deadline = self._rank0_back(e, deadline)
                if not back:
                    raise ConnectionLost(lost_note(e.strerror, f58(jobid))) from None
                yield None

    def wait(self, jobid: JobId) -> int:
        """Wait for a job to end and return its exit code (as ``vigil job wait``); raises :class:`JobException`
        if a fatal exception ended it (``.exit_code`` has the code the CLI reports), :class:`VigilError`
        (ENOENT: no such job) or :class:`ConnectionLost` with the CLI's hint if rank 0 does not come back."""
        jid = parse_jobid(jobid)
        v = _Verdict(jid)
        for item in self._follow("job-manager.eventlog", jid):
            if item is None:
                v = _Verdict(jid)
            else:
                v.add(item.get("event") or {})
        return v.result()

    def attach(self, jobid: JobId) -> "JobOutput":
        """Follow a job's output to its end (as ``vigil job attach``): iterate the result for :class:`OutputLine`
        items in order; afterwards ``.exit_code`` and ``.exception`` say how it ended."""
        return JobOutput(self, parse_jobid(jobid))

    def cancel(self, jobid: JobId, note: str = "") -> None:
        """Cancel a job (a ``cancel`` exception; a running job's tasks are killed). Raises :class:`VigilError`
        (ENOENT unknown job, EINVAL already inactive, EPERM not yours)."""
        self.rpc("job-manager.cancel", {"id": parse_jobid(jobid), "note": note})

    def jobs(self, all: bool = False, all_users: bool = False) -> List[Dict[str, Any]]:
        """The jobs rank 0 knows (``vigil jobs --json``): active ones, or every one with ``all``; yours unless
        ``all_users``. Each a dict: ``id``, ``id_f58``, ``state``, ``userid``, ``name``, ``t_submit``... newest
        first."""
        req: Dict[str, Any] = {"all": all}
        if not all_users:
            req["userid"] = os.getuid()
        # Rank 0 answers a page at a time (about 16 MB of JSON); ``next`` names the page's oldest job when more follow.
        jobs: List[Dict[str, Any]] = []
        while True:
            r = self.rpc("job-manager.list", req)
            jobs.extend(r.get("jobs", []))
            if r.get("next") is None:
                return jobs
            req["before"] = r["next"]

    def job_info(self, jobid: JobId) -> Dict[str, Any]:
        """A job's state, jobspec and R (``vigil job info --json``): ``{"info", "jobspec", "R"}``."""
        return self.rpc("job-manager.info", {"id": parse_jobid(jobid)})

    def eventlog(self, jobid: JobId, follow: bool = False) -> Iterator[Dict[str, Any]]:
        """A job's eventlog entries (RFC 18: ``timestamp``, ``name``, ``context``), as ``vigil job eventlog``; with
        ``follow``, until the job is inactive."""
        for v in self.rpc_stream("job-manager.eventlog", {"id": parse_jobid(jobid), "follow": follow}):
            e = v.get("event") if isinstance(v, dict) else None
            if e is not None:
                yield e

    # -- resources ----------------------------------------------------------------------------------------------

    def resource_status(self) -> Dict[str, Any]:
        """Rank 0's view of the nodes (``vigil resource status``' request): ranks by state, drains, totals."""
        return self.rpc("resource.status", {})

    def resource_list(self) -> Dict[str, Any]:
        """Free, allocated and down resources (``vigil resource list``' request)."""
        return self.rpc("resource.list", {})


def new_submit_key() -> str:
    """A submission key: 128 random bits in hex (a resent submission with the same key makes one job)."""
    return secrets.token_hex(16)


class _Verdict:
    """A job's exit code from its eventlog entries (``vigil job wait``'s rules)."""

    def __init__(self, jobid: int):
        self.jobid = jobid
        self.status: Optional[int] = None
        self.fatal: Optional[Dict[str, Any]] = None

    def add(self, e: Dict[str, Any]) -> None:
        name = e.get("name")
        ctx = e.get("context") or {}
        if name == "finish":
            self.status = int(ctx.get("status", 0))
        elif name == "exception" and int(ctx.get("severity", 1)) == 0 and self.fatal is None:
            self.fatal = ctx
        elif name == "requeue":
            self.status, self.fatal = None, None

    def exit_code(self) -> int:
        return job_exit_code(self.status, None if self.fatal is None else str(self.fatal.get("type", "")))

    def result(self) -> int:
        code = self.exit_code()
        if self.fatal is not None:
            raise JobException(self.jobid, str(self.fatal.get("type", "")), str(self.fatal.get("note", "")), code)
        return code


class JobOutput:
    """A job's output as :meth:`Client.attach` follows it; iterate for :class:`OutputLine` items. After the
    iteration: ``exit_code`` (as ``vigil job attach`` exits) and ``exception`` (the fatal :class:`JobException`,
    or None). Across a restart of rank 0 nothing is given twice."""

    def __init__(self, client: Client, jobid: int):
        self.client = client
        self.jobid = jobid
        self.exit_code: Optional[int] = None
        self.exception: Optional[JobException] = None
        self.events: List[Dict[str, Any]] = []

    def __iter__(self) -> Iterator[OutputLine]:
        verdict = _Verdict(self.jobid)
        lines = events = 0
        skip_lines = skip_events = 0
        for v in self.client._follow("job-info.attach", self.jobid):
            if v is None:
                # A new stream starts from the job's first event and line again.
                skip_lines, skip_events = lines, events
                continue
            if "output" in v:
                if skip_lines:
                    skip_lines -= 1
                    continue
                lines += 1
                o = v["output"]
                data = o.get("data", "")
                raw = base64.b64decode(data) if o.get("enc") == "base64" else data.encode("utf-8")
                yield OutputLine(int(o.get("rank", 0)), str(o.get("stream", "stdout")), raw, bool(o.get("eol", True)))
            elif "event" in v:
                if skip_events:
                    skip_events -= 1
                    continue
                events += 1
                self.events.append(v["event"])
                verdict.add(v["event"])
        self.exit_code = verdict.exit_code()
        try:
            verdict.result()
        except JobException as e:
            self.exception = e
