"""vigil.VigilExecutor against a real instance: 100 jobs' futures, failures raising, a cancel, an eventlog; and
across a restart of rank 0 on its state directory."""

import concurrent.futures as cf
import errno
import os
import signal
import time

import pytest

import vigil
from conftest import wait_for


def test_a_hundred_jobs_resolve_to_their_exit_codes(instance):
    with vigil.VigilExecutor(instance.uri) as ex:
        futs = {i: ex.submit(["sh", "-c", f"exit {i % 5}"], nodes=1, ntasks=1) for i in range(100)}
        # Refused by the instance: the future raises the refusal (errno and message).
        refused = ex.submit(["true"], nodes=9)
        # Ended by a fatal exception (its time limit): the future raises JobException.
        timed_out = ex.submit(["sleep", "60"], time_limit=1)
        # Running: its future cannot be cancelled (concurrent.futures' rule, Flux's too), its job can.
        long = ex.submit(["sleep", "60"])
        c = ex.client
        assert wait_for(90, lambda: c.job_info(long.jobid())["info"]["state"] == "RUN")
        assert wait_for(30, long.running)
        assert not long.cancel() and not long.cancelled() and long.running()
        time.sleep(0.5)
        assert c.job_info(long.jobid())["info"]["state"] == "RUN", "cancel() of a running future left its job alone"
        c.cancel(long.jobid())
        done, not_done = cf.wait(list(futs.values()), timeout=120)
        assert not not_done
        assert {i: f.result() for i, f in futs.items()} == {i: i % 5 for i in range(100)}
        assert len({f.jobid() for f in futs.values()}) == 100
        with pytest.raises(vigil.VigilError) as e:
            refused.result(timeout=30)
        assert e.value.errno == errno.EINVAL and "9 nodes" in str(e.value)
        with pytest.raises(vigil.JobException) as je:
            timed_out.result(timeout=60)
        assert je.value.type == "timelimit" and je.value.jobid == timed_out.jobid()
        with pytest.raises(vigil.JobException) as ce:
            long.result(timeout=60)
        assert ce.value.type == "cancel" and not long.cancelled()
        # The canceled job's eventlog: a fatal cancel exception, then its end.
        assert wait_for(30, lambda: c.job_info(long.jobid())["info"]["state"] == "INACTIVE")
        ev = list(c.eventlog(long.jobid()))
        names = [e["name"] for e in ev]
        assert names[-1] == "clean", names
        exc = next(e for e in ev if e["name"] == "exception")
        assert exc["context"]["type"] == "cancel" and exc["context"]["severity"] == 0 and "finish" in names
    # The CLI sees the same jobs.
    o = instance.vigil("jobs", "-a", "--json")
    assert o.returncode == 0, o


def test_a_future_is_pending_until_its_job_starts_then_running_until_it_ends(instance):
    with vigil.VigilExecutor(instance.uri) as ex:
        c = ex.client
        # Held (urgency 0): the job waits in the queue, and its future is pending.
        f = ex.submit(["sh", "-c", "sleep 2; exit 4"], urgency="hold")
        jid = f.jobid(timeout=30)
        assert wait_for(30, lambda: c.job_info(jid)["info"]["state"] == "PRIORITY" or
                        c.job_info(jid)["info"]["state"] == "SCHED")
        time.sleep(1)
        assert not f.running() and not f.done()
        # Released: the job starts, and its future is running until the job ends.
        c.rpc("job-manager.urgency", {"id": jid, "urgency": 16})
        assert wait_for(30, f.running), c.job_info(jid)["info"]["state"]
        assert "start" in [e["name"] for e in c.eventlog(jid)]
        assert not f.done()
        assert f.result(timeout=60) == 4
        assert not f.running() and f.done()
        # A held job canceled before it starts: from pending straight to cancelled; cancel() on a done future
        # says whether it was cancelled.
        held = ex.submit(["true"], urgency="hold")
        held.jobid(timeout=30)
        assert held.cancel() and held.cancelled() and held.cancel()
        assert cf.wait([held], timeout=30).done == {held}
        assert wait_for(30, lambda: c.job_info(held.jobid())["info"]["state"] == "INACTIVE")
        done = ex.submit(["true"])
        assert done.result(timeout=60) == 0 and not done.cancel()


def test_map_runs_a_command_for_each_item_and_yields_exit_codes_in_order(instance):
    with vigil.VigilExecutor(instance.uri) as ex:
        # Executor.map is inherited: map(command, items) runs `command ITEM`, as map(fn, items) calls fn(item).
        assert list(ex.map(["sh", "-c", "sleep 0.$((4 - $0)); exit $0"], range(4), timeout=120)) == [0, 1, 2, 3]
        # Several iterables give several arguments; paths are taken too.
        import pathlib
        codes = ex.map(["sh", "-c", "exit $(($0 + $1))"], [1, 2], [pathlib.PurePath("3"), "4"])
        assert list(codes) == [4, 6]
        # A failing item is a result; a refused one raises when map reaches it.
        assert list(ex.map(["sh", "-c", "exit $0"], ["7"])) == [7]
        with pytest.raises(TypeError, match="arguments must be strings, paths or ints"):
            list(ex.map(["echo"], [1.5]))
        with pytest.raises(TypeError, match="only a command list"):
            ex.submit({"version": 1}, "x")


def test_done_callbacks_may_use_the_client(instance):
    # Futures are resolved off the connection's reader thread: a callback may make requests.
    with vigil.VigilExecutor(instance.uri) as ex:
        seen = []
        f = ex.submit(["true"])
        f.add_done_callback(lambda f: seen.append(ex.client.job_info(f.jobid())["info"]["state"]))
        assert f.result(timeout=30) == 0
        assert wait_for(10, lambda: seen == ["INACTIVE"]), seen


def test_futures_survive_a_restart_of_rank_0_on_its_state_directory(system_instance):
    inst = system_instance
    # Jobs run on rank 1, which keeps them while rank 0 is away.
    o = inst.vigil("resource", "drain", "0", "rank 0 restarts in this test")
    assert o.returncode == 0, o
    ex = vigil.VigilExecutor(inst.uri)
    assert ex.client.welcome.rank0_grace > 0
    running = ex.submit(["sh", "-c", "sleep 3; exit 7"])
    c = ex.client
    assert wait_for(30, lambda: c.job_info(running.jobid())["info"]["state"] == "RUN")
    os.kill(inst.brokers[0].pid, signal.SIGKILL)
    inst.brokers[0].wait()
    # Submitted while rank 0 is down: sent again (same key) once it is back.
    during = ex.submit(["true"])
    time.sleep(2)
    inst.start_broker(0)
    assert running.result(timeout=90) == 7
    assert during.result(timeout=60) == 0
    # One job per submission, though it was sent more than once.
    jobs = c.jobs(all=True)
    assert sorted(j["id"] for j in jobs) == sorted([running.jobid(), during.jobid()])
    restarts = [e for e in c.eventlog(running.jobid()) if e["name"] == "restart"]
    assert restarts, list(c.eventlog(running.jobid()))
    # And Client.wait follows a job across a restart too.
    jid = c.submit(["sh", "-c", "sleep 3; exit 5"])
    assert wait_for(30, lambda: c.job_info(jid)["info"]["state"] == "RUN")
    os.kill(inst.brokers[0].pid, signal.SIGKILL)
    inst.brokers[0].wait()
    w = vigil.Client(inst.uri.replace("r0/local-0", "r1/local-1"))
    assert w.welcome.rank == 1
    inst.start_broker(0)
    assert w.wait(jid) == 5
    ex.shutdown()


def test_futures_raise_with_the_clis_hint_when_rank_0_is_lost_for_good(instance):
    # A test instance keeps no state directory (no grace for rank 0): its loss ends every unfinished future.
    ex = vigil.VigilExecutor(instance.uri)
    f = ex.submit(["sleep", "60"])
    jid = f.jobid(timeout=30)
    from conftest import kill_marked
    kill_marked(str(instance.dir))
    with pytest.raises(vigil.ConnectionLost) as e:
        f.result(timeout=30)
    assert e.value.errno == errno.EHOSTUNREACH and f"vigil job attach {vigil.f58(jid)}" in str(e.value)
    with pytest.raises(RuntimeError):
        ex.shutdown()
        ex.submit(["true"])


def test_bad_options_are_refused_at_submit_naming_the_option(instance):
    with vigil.VigilExecutor(instance.uri) as ex:
        with pytest.raises(ValueError, match="urgency 40"):
            ex.submit(["true"], urgency=40)
        with pytest.raises(TypeError, match="env"):
            ex.submit(["true"], env={"A": 1})
        with pytest.raises(ValueError, match="time_limit"):
            ex.submit(["true"], time_limit="10x")
        # A typo: named, with the options there are.
        with pytest.raises(TypeError, match=r"unknown option tasks: .*\bntasks\b.*\burgency\b"):
            ex.submit(["true"], tasks=2)
        with pytest.raises(ValueError, match="urgency 40"):
            ex.client.submit(["true"], urgency=40)
        with pytest.raises(TypeError, match="unknown option tasks"):
            ex.client.submit(["true"], tasks=2)
        # The CLI's duration forms and urgency words are taken.
        f = ex.submit(["true"], time_limit="10m", urgency="default")
        assert f.result(timeout=60) == 0
        assert ex.client.job_info(f.jobid())["jobspec"]["attributes"]["system"]["duration"] == 600.0


def test_a_submit_after_the_instance_ended_says_no_job_was_submitted(instance):
    ex = vigil.VigilExecutor(instance.uri)
    assert ex.submit(["true"]).result(timeout=60) == 0
    out = instance.vigil("shutdown")
    assert out.returncode == 0, out.stderr
    assert wait_for(30, lambda: not ex.client.connected)
    try:
        f = ex.submit(["true"])
        with pytest.raises(vigil.VigilError) as e:
            f.result(timeout=30)
        err = e.value
    except vigil.VigilError as raised:
        err = raised
    assert isinstance(err, (vigil.ConnectError, vigil.ConnectionLost))
    msg = str(err)
    assert "not submitted" in msg and "no broker listens there" in msg, msg
    assert "not yet acknowledged" not in msg and "may still be running" not in msg, msg
    ex.shutdown(wait=False)
