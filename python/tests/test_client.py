"""vigil.Client against a real 2-broker instance: submit, wait, attach, cancel, list, eventlog, resource status,
and its errors (errno and message, the CLI's hints)."""

import errno
import os
import time

import pytest

import vigil


def test_no_uri_and_no_broker_say_what_the_cli_says(monkeypatch, tmp_path):
    monkeypatch.delenv("VIGIL_URI", raising=False)
    with pytest.raises(vigil.ConnectError) as e:
        vigil.Client()
    assert "VIGIL_URI is not set" in str(e.value) and e.value.errno == errno.EINVAL
    with pytest.raises(vigil.ConnectError) as e:
        vigil.Client(f"local://{tmp_path}/local-0")
    assert e.value.errno == errno.ENOENT and "no broker listens there" in str(e.value)
    with pytest.raises(vigil.ConnectError) as e:
        vigil.Client("tcp://host:1")
    assert "expected local:///path" in str(e.value)


def test_submit_wait_attach_eventlog_list_and_resources(instance):
    c = vigil.Client(instance.uri)
    assert (c.welcome.rank, c.welcome.size) == (0, 2)
    jid = c.submit(["sh", "-c", "echo out $0; echo err >&2; exit 3", "arg"], nodes=2, ntasks=2)
    assert c.wait(jid) == 3
    # The CLI sees the same job, exit code and id.
    o = instance.vigil("job", "wait", vigil.f58(jid))
    assert o.returncode == 3, o
    out = c.attach(vigil.f58(jid))
    lines = sorted((l.rank, l.stream, l.text) for l in out)
    assert lines == [(0, "stderr", "err"), (0, "stdout", "out arg"), (1, "stderr", "err"), (1, "stdout", "out arg")]
    assert out.exit_code == 3 and out.exception is None
    names = [e["name"] for e in c.eventlog(jid)]
    assert names[0] == "submit" and "start" in names and "finish" in names and names[-1] == "clean"
    listed = {j["id"]: j for j in c.jobs(all=True)}
    assert listed[jid]["state"] == "INACTIVE" and listed[jid]["id_f58"] == vigil.f58(jid)
    assert c.job_info(jid)["info"]["id"] == jid
    st = c.resource_status()
    assert sorted(r["rank"] for r in st["ranks"]) == [0, 1] and all(r["up"] for r in st["ranks"])
    c.close()


def test_cancel_ends_a_running_job_with_a_cancel_exception(instance):
    c = vigil.Client(instance.uri)
    jid = c.submit(["sleep", "60"])
    from conftest import wait_for
    assert wait_for(20, lambda: c.job_info(jid)["info"]["state"] == "RUN"), c.job_info(jid)
    c.cancel(jid, note="from pytest")
    with pytest.raises(vigil.JobException) as e:
        c.wait(jid)
    assert e.value.type == "cancel" and e.value.note == "from pytest" and e.value.exit_code != 0
    exc = [x for x in c.eventlog(jid) if x["name"] == "exception"]
    assert exc and exc[0]["context"]["type"] == "cancel"
    # Canceling it again: the instance's refusal, with its errno.
    with pytest.raises(vigil.VigilError) as e2:
        c.cancel(jid)
    assert e2.value.errno == errno.EINVAL and "inactive" in str(e2.value)


def test_refusals_carry_errno_and_message(instance):
    c = vigil.Client(instance.uri)
    with pytest.raises(vigil.VigilError) as e:
        c.submit(["true"], nodes=9)
    assert e.value.errno == errno.EINVAL and "9 nodes" in e.value.strerror
    with pytest.raises(vigil.VigilError) as e:
        c.wait(12345)
    assert e.value.errno == errno.ENOENT
    with pytest.raises(vigil.VigilError) as e:
        c.submit({"version": 1, "resources": [], "tasks": []})
    assert e.value.errno == errno.EINVAL and e.value.strerror
    with pytest.raises(vigil.VigilError) as e:
        c.rpc("no-such.service", {})
    assert e.value.errno == errno.ENOSYS


def test_a_lost_connection_raises_with_the_clis_hint(instance):
    c = vigil.Client(instance.uri)
    jid = c.submit(["sleep", "60"])
    # A test instance keeps no state directory: losing rank 0 ends the wait at once, with the hint.
    assert c.welcome.rank0_grace == 0
    t = time.monotonic()
    os.kill(instance.proc.pid, 9)
    from conftest import kill_marked
    kill_marked(str(instance.dir))
    with pytest.raises(vigil.ConnectionLost) as e:
        c.wait(jid)
    assert e.value.errno == errno.EHOSTUNREACH
    assert "lost connection to broker (rank 0 stopped or restarted)" in str(e.value)
    assert f"vigil job attach {vigil.f58(jid)}" in str(e.value)
    assert time.monotonic() - t < 10
    with pytest.raises(vigil.ConnectionLost):
        c.jobs()


def test_job_ids_in_every_rfc19_form():
    # RFC 19's example FLUID in each form it names, read in its order; the forms not read say so.
    from vigil.errors import parse_jobid

    fluid = 6731191091817518
    for form in ["ƒuZZybuNNy", "fuZZybuNNy", "0x17e9fb8df16c2e", "0017.e9fb.8df1.6c2e", " 6731191091817518\n", fluid]:
        assert parse_jobid(form) == fluid, form
    with pytest.raises(ValueError, match="mnemonic"):
        parse_jobid("reform-remote-galileo--heart-package-academy")
    with pytest.raises(ValueError, match="dotted hex has four groups"):
        parse_jobid("f1.2")
    for bad in ["0x", "0xg1", "0x10000000000000000", "1e3", "+5", "", "٣"]:
        with pytest.raises(ValueError, match="invalid job id"):
            parse_jobid(bad)
