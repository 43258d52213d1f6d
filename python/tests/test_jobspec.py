"""Jobspecs built here are the ones `vigil submit -N -n -c -g -t --job-name` builds (its --dry-run output)."""

import json
import os
import subprocess

import pytest

from conftest import vigil_bin
from vigil import jobspec_from_command

CASES = [
    ({}, []),
    ({"nodes": 2, "ntasks": 4}, ["-N2", "-n4"]),
    ({"nodes": 2, "ntasks": 3}, ["-N2", "-n3"]),
    ({"ntasks": 3}, ["-n3"]),
    ({"nodes": 2}, ["-N2"]),
    ({"nodes": 1, "ntasks": 2, "cores_per_task": 2, "gpus_per_task": 1}, ["-N1", "-n2", "-c2", "-g1"]),
    ({"nodes": 1, "exclusive": True, "time_limit": 90.0, "name": "py"},
     ["-N1", "--exclusive", "-t", "1.5m", "--job-name", "py"]),
    # A duration string, as -t takes one (RFC 23).
    ({"time_limit": "10m"}, ["-t", "10m"]),
    ({"time_limit": "2h"}, ["-t", "2h"]),
    ({"time_limit": "45s"}, ["-t", "45s"]),
]


@pytest.mark.parametrize("opts,flags", CASES, ids=[" ".join(f) or "defaults" for _, f in CASES])
def test_the_jobspec_of_a_command_is_the_clis(opts, flags, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIGIL_")}
    cmd = ["app", "--flag", "x y"]
    out = subprocess.run([vigil_bin(), "submit", "--dry-run", *flags, *cmd], cwd=tmp_path, env=env,
                         capture_output=True, text=True, check=True)
    cli = json.loads(out.stdout)
    # The CLI's process has its own `_` and PWD: compare with the environment it saw.
    ours = jobspec_from_command(cmd, cwd=str(tmp_path), env=cli["attributes"]["system"]["environment"], **opts)
    assert ours == cli


def test_bad_counts_are_refused_naming_the_keyword_option():
    # Named as the caller wrote them: keyword options, not the CLI's flags.
    with pytest.raises(ValueError, match=r"^ntasks=2 is fewer tasks than the 3 node\(s\) of nodes=3"):
        jobspec_from_command(["true"], nodes=3, ntasks=2)
    with pytest.raises(ValueError, match=r"^nodes=0: must be at least 1"):
        jobspec_from_command(["true"], nodes=0)
    for opt, bad in (("ntasks", 0), ("cores_per_task", 0), ("gpus_per_task", -1)):
        with pytest.raises(ValueError, match=f"^{opt}={bad}: must be at least"):
            jobspec_from_command(["true"], **{opt: bad})
    with pytest.raises(ValueError, match="non-empty list"):
        jobspec_from_command("true")
    with pytest.raises(ValueError, match="^exclusive=True requires nodes"):
        jobspec_from_command(["true"], exclusive=True)


def test_the_default_environment_is_this_processs_without_vigil_variables(monkeypatch):
    monkeypatch.setenv("VIGIL_URI", "local:///nowhere")
    monkeypatch.setenv("PY_API_TEST", "1")
    env = jobspec_from_command(["true"])["attributes"]["system"]["environment"]
    assert env["PY_API_TEST"] == "1" and not any(k.startswith("VIGIL_") for k in env)


def test_time_limits_are_seconds_or_durations_and_bad_ones_name_the_option():
    def duration(t):
        return jobspec_from_command(["true"], env={}, time_limit=t)["attributes"]["system"]["duration"]

    assert [duration(t) for t in (90, 1.5, "90", "30s", "10m", "1h", "250ms", "inf", None)] == [
        90.0, 1.5, 90.0, 30.0, 600.0, 3600.0, 0.25, 0.0, 0.0]
    for bad in ("10x", "ten", "", "1 m", "-5m"):
        with pytest.raises(ValueError, match="time_limit"):
            duration(bad)
    with pytest.raises(TypeError, match="time_limit"):
        duration([10])


def test_a_bad_environment_is_refused_naming_env():
    with pytest.raises(TypeError, match="env"):
        jobspec_from_command(["true"], env={"A": 1})
    with pytest.raises(TypeError, match="env"):
        jobspec_from_command(["true"], env=["A=1"])


def test_unknown_option_error_is_exported():
    import vigil
    assert "UnknownOptionError" in vigil.__all__ and issubclass(vigil.UnknownOptionError, TypeError)
    with pytest.raises(vigil.UnknownOptionError, match="unknown option tasks"):
        vigil.jobspec.check_options({"tasks": 2})
