"""``VigilExecutor``: a :class:`concurrent.futures.Executor` whose futures are Vigil jobs, as
``flux.job.FluxExecutor`` is for Flux.

Every job is submitted and followed (its eventlog, ``follow``) over one connection, pipelined: the executor keeps
no thread per job, only the connection's reader thread, one thread that resolves futures (so that a future's done
callbacks never run on the reader thread) and one that recovers from a lost rank 0.
"""

from __future__ import annotations

import concurrent.futures as cf
import concurrent.futures._base as _cfb
import errno as _errno
import os
import queue
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

from . import _wire
from .client import Client, _Verdict, new_submit_key
from .errors import NO_BROKER_HINT, ConnectError, ConnectionLost, JobException, VigilError, f58, lost_note
from .jobspec import check_options, from_command, parse_urgency


class VigilFuture(cf.Future):
    """The future of one job. ``result()`` is the job's exit code (an int, non-zero for a failed command, as the
    CLI reports it); it raises :class:`vigil.JobException` when a fatal exception ended the job (canceled, time
    limit, node lost...), :class:`vigil.VigilError` when the instance refused the job (e.g. ENOSPC), and
    :class:`vigil.ConnectionLost` when rank 0 was lost and did not come back in time.

    The future is *pending* until the job starts (its ``start`` event: the job shells run its tasks), then
    *running* (``running()`` is True) until it ends; a job that never starts (refused, canceled while queued)
    goes from pending to done.

    ``jobid()`` waits for and returns the job's id. ``cancel()`` follows ``concurrent.futures`` (and Flux's
    ``FluxExecutorFuture``): a pending future is cancelled, its job canceled in the instance too, and it returns
    True (``result()`` then raises ``CancelledError``); a running one is not, and it returns False, its job going
    on. A running job is stopped by canceling the job, ``Client.cancel(f.jobid())``: the future then raises
    :class:`vigil.JobException` (``type == "cancel"``)."""

    def __init__(self, executor: "VigilExecutor"):
        super().__init__()
        self._executor = executor
        self._jobid: Optional[int] = None
        self._id_set = threading.Event()
        self._cancel_sent = False

    def jobid(self, timeout: Optional[float] = None) -> int:
        """The job's id, once rank 0 accepted it; raises the submission's error if it was refused, TimeoutError."""
        if not self._id_set.wait(timeout):
            raise TimeoutError("the job has no id yet")
        if self._jobid is None:
            raise self.exception()  # type: ignore[misc]
        return self._jobid

    def _set_id(self, jobid: Optional[int]) -> None:
        self._jobid = jobid
        self._id_set.set()

    def cancel(self) -> bool:
        # Pending -> cancelled under the future's lock (running and done futures refuse), so the resolver thread
        # cannot start it meanwhile; it tells the waiters when it would have started it (``_start``).
        if not super().cancel():
            return False
        # Cancelled here, so canceled in the instance too: a job that would otherwise run for nobody.
        self._executor._cancel_job(self)
        return True


def _start(fut: VigilFuture) -> bool:
    """Mark ``fut`` running (on the resolver thread, when its job starts or ends): True if it is running now (or
    was already), False if it was cancelled (its waiters are told, once)."""
    with fut._condition:  # an RLock: set_running_or_notify_cancel takes it again
        if fut._state == _cfb.RUNNING:
            return True
        if fut._state in (_cfb.CANCELLED_AND_NOTIFIED, _cfb.FINISHED):
            return False
        return fut.set_running_or_notify_cancel()


def _arg(a: Any) -> str:
    """One more argument of a command given to ``submit`` (or ``map``) positionally."""
    if isinstance(a, bool) or not isinstance(a, (str, int, os.PathLike)):
        raise TypeError(f"a command's arguments must be strings, paths or ints, got {type(a).__name__} {a!r}")
    return os.fspath(a) if isinstance(a, os.PathLike) else str(a)


class _Job:
    """One job's progress: its submission, then its eventlog."""

    def __init__(self, fut: VigilFuture, spec: Dict[str, Any]):
        self.fut = fut
        self.payload: Dict[str, Any] = {"jobspec": spec, "stdin": False, "submit_key": new_submit_key()}
        self.jobid: Optional[int] = None
        self.verdict: Optional[_Verdict] = None
        # Since when its requests have failed for a lost rank 0 or connection (monotonic); None while answered.
        self.lost_since: Optional[float] = None
        # Whether its submission was ever written to a connection: until then, rank 0 cannot have accepted it.
        self.sent = False


class VigilExecutor(cf.Executor):
    """Run commands (or jobspecs) as jobs of the instance at ``uri`` (default ``$VIGIL_URI``).

    ``submit(["cmd", "arg"], nodes=1, ntasks=1)`` returns a :class:`VigilFuture` resolving to the job's exit
    code; the keyword options are those of :func:`vigil.jobspec.from_command` plus ``urgency``. A dict is taken
    as a jobspec. If rank 0 is lost, the executor waits for it as the CLI does (a state directory keeps the jobs:
    up to its grace plus 5 s), resends the submissions in flight with their keys (each makes one job) and follows
    every job again; past that, the futures of unfinished jobs raise :class:`vigil.ConnectionLost`.
    """

    def __init__(self, uri: Optional[str] = None, client: Optional[Client] = None):
        self._client = client if client is not None else Client(uri)
        self._lock = threading.Lock()
        self._jobs: Dict[int, _Job] = {}  # by id(fut)
        self._shutdown = False
        self._done_q: "queue.SimpleQueue[Optional[Callable[[], None]]]" = queue.SimpleQueue()
        self._lost: List[_Job] = []
        self._lost_cv = threading.Condition(self._lock)
        self._all_done = threading.Condition(self._lock)
        self._resolver = threading.Thread(target=self._resolve_loop, name="vigil-futures", daemon=True)
        self._resolver.start()
        self._recoverer = threading.Thread(target=self._recover_loop, name="vigil-recover", daemon=True)
        self._recoverer.start()

    @property
    def client(self) -> Client:
        """The executor's connection (for other requests: ``jobs()``, ``eventlog()``...)."""
        return self._client

    # -- submission ---------------------------------------------------------------------------------------------

    def submit(self, job: Union[Sequence[str], Mapping[str, Any]], /, *args: Any, **opts: Any) -> VigilFuture:  # type: ignore[override]
        """Submit ``job`` (a command list or a jobspec dict) and return its future (see the class doc).

        Positional ``args`` after a command are more of its arguments (strings, paths or ints), as
        ``Executor.submit(fn, *args)`` calls ``fn(*args)``: so the inherited ``map(["cmd"], items)`` runs
        ``cmd ITEM`` for each item and yields the exit codes in order."""
        if args:
            if isinstance(job, Mapping):
                raise TypeError("arguments after a jobspec: only a command list takes more arguments")
            job = list(job) + [_arg(a) for a in args]
        # Every option is checked here, at once, as the CLI checks its flags: a typo, a bad urgency or time
        # limit must not surface later, from the instance, in result().
        urgency = parse_urgency(opts.pop("urgency", None))
        if isinstance(job, Mapping):
            if opts:
                raise TypeError(f"options {sorted(opts)} apply to a command, not to a jobspec")
            spec = dict(job)
        else:
            check_options(opts, extra=("urgency",))
            spec = from_command(job, **opts)
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot submit after shutdown")
        if not self._client.connected and self._client._rank0_wait() is None:
            # The connection has ended (the instance is gone, or rank 0 with no state directory to come back
            # on): connect again now, or say that this job was not submitted, with the CLI's hint.
            try:
                self._client.reconnect()
            except ConnectError as e:
                raise ConnectError(e.errno, f"the job was not submitted: {e.strerror}") from None
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot submit after shutdown")
            fut = VigilFuture(self)
            j = _Job(fut, spec)
            if urgency is not None:
                j.payload["urgency"] = urgency
            self._jobs[id(fut)] = j
        self._send_submit(j)
        return fut

    def _send_submit(self, j: _Job) -> None:
        try:
            self._client.rpc_async("job-manager.submit", j.payload, lambda m: self._on_submit(j, m))
            j.sent = True
        except ConnectionLost:
            self._on_submit(j, None)

    def _on_submit(self, j: _Job, m: Optional[_wire.Message]) -> None:
        if m is None or m.errnum == _errno.EHOSTUNREACH:
            self._lose(j)
            return
        if m.errnum != 0:
            err = VigilError(m.errnum, m.errstr() or "submission refused")
            j.fut._set_id(None)
            self._finish(j, exc=err)
            return
        j.lost_since = None
        j.jobid = int((m.json() or {}).get("id"))
        j.fut._set_id(j.jobid)
        if j.fut._cancel_sent:
            self._send_cancel(j.jobid)
        self._send_follow(j)

    # -- following ----------------------------------------------------------------------------------------------

    def _send_follow(self, j: _Job) -> None:
        assert j.jobid is not None
        j.verdict = _Verdict(j.jobid)
        try:
            self._client.rpc_async(
                "job-manager.eventlog", {"id": j.jobid, "follow": True}, lambda m: self._on_event(j, m), streaming=True
            )
        except ConnectionLost:
            self._lose(j)

    def _on_event(self, j: _Job, m: Optional[_wire.Message]) -> None:
        if m is None or m.errnum == _errno.EHOSTUNREACH:
            self._lose(j)
            return
        assert j.verdict is not None
        if m.errnum == _errno.ENODATA:
            try:
                code = j.verdict.result()
            except JobException as e:
                self._finish(j, exc=e)
            else:
                self._finish(j, result=code)
            return
        if m.errnum != 0:
            self._finish(j, exc=VigilError(m.errnum, m.errstr() or "eventlog refused"))
            return
        j.lost_since = None
        ev = (m.json() or {}).get("event")
        if isinstance(ev, dict):
            j.verdict.add(ev)
            if ev.get("name") == "start":
                # In order with the job's end: both go through the resolver thread.
                self._done_q.put(lambda: _start(j.fut))

    # -- ends -----------------------------------------------------------------------------------------------------

    def _finish(self, j: _Job, result: Any = None, exc: Optional[BaseException] = None) -> None:
        with self._lock:
            self._jobs.pop(id(j.fut), None)
            self._all_done.notify_all()

        def resolve() -> None:
            if not _start(j.fut):
                return  # cancelled meanwhile
            try:
                if exc is not None:
                    j.fut.set_exception(exc)
                else:
                    j.fut.set_result(result)
            except cf.InvalidStateError:
                pass  # already resolved

        self._done_q.put(resolve)

    def _resolve_loop(self) -> None:
        while True:
            f = self._done_q.get()
            if f is None:
                return
            f()

    def _cancel_job(self, fut: VigilFuture) -> None:
        """``fut.cancel()``: cancel its job in the instance (once it has an id)."""
        fut._cancel_sent = True
        if fut._jobid is not None:
            self._send_cancel(fut._jobid)

    def _send_cancel(self, jobid: int) -> None:
        try:
            self._client.rpc_async(
                "job-manager.cancel", {"id": jobid, "note": "canceled through VigilExecutor"}, lambda m: None
            )
        except ConnectionLost:
            pass

    # -- rank 0 lost ----------------------------------------------------------------------------------------------

    def _lose(self, j: _Job) -> None:
        with self._lock:
            if j.lost_since is None:
                j.lost_since = time.monotonic()
            self._lost.append(j)
            self._lost_cv.notify_all()

    def _recover_loop(self) -> None:
        """Waits for jobs whose connection or rank 0 was lost; brings the connection back (CLI rules) and sends
        their submissions (same keys) or follows again; fails them if rank 0 does not come back in time."""
        while True:
            with self._lock:
                while not self._lost and not (self._shutdown and not self._jobs):
                    self._lost_cv.wait()
                if not self._lost:
                    return
            with self._lock:
                first = min(j.lost_since or time.monotonic() for j in self._lost)
            limit = self._client._rank0_wait()
            ok = limit is not None and self._client._recover(first + limit)
            time.sleep(0.05)  # let the rest of the jobs on the lost connection gather
            with self._lock:
                lost, self._lost = self._lost, []
            now = time.monotonic()
            for j in lost:
                if ok and limit is not None and now < (j.lost_since or now) + limit:
                    if j.jobid is None:
                        self._send_submit(j)
                    else:
                        self._send_follow(j)
                else:
                    self._finish(j, exc=self._lost_error(j))

    @staticmethod
    def _lost_error(j: _Job) -> ConnectionLost:
        """The error of a job whose rank 0 or connection was lost for good, by how far it got: followed (it may
        still run: the CLI's `vigil job attach` hint), sent but not acknowledged (it may have been accepted),
        or never sent (no job was submitted)."""
        if j.jobid is not None:
            return ConnectionLost(lost_note("lost connection to broker", f58(j.jobid)))
        j.fut._set_id(None)
        if j.sent:
            return ConnectionLost(
                "lost connection to broker before the submission was acknowledged: the job may have been accepted "
                "all the same (rank 0 may have made it durable before it was lost); look for it with `vigil jobs "
                "-a` before submitting it again"
            )
        return ConnectionLost(
            f"lost connection to broker: the job was not submitted (it never reached the broker; {NO_BROKER_HINT})"
        )

    # -- shutdown -----------------------------------------------------------------------------------------------

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No more submissions; with ``cancel_futures`` cancel every pending future and its job (running jobs go
        on, as ``concurrent.futures`` has it); with ``wait`` wait until every future is resolved. Then the
        connection is closed."""
        with self._lock:
            self._shutdown = True
            pending = [j.fut for j in self._jobs.values()]
            self._lost_cv.notify_all()
        if cancel_futures:
            for f in pending:
                f.cancel()
        if wait:
            with self._lock:
                while self._jobs:
                    self._all_done.wait()
            self._done_q.put(None)
            self._resolver.join()
            self._client.close()
