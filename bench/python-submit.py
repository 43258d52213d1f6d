#!/usr/bin/env python3
"""Submit rate of the Python API (``vigil.VigilExecutor``) against ``vigil submit --cc``, in the same run.

One ``vigil start --test-size=2`` instance; per run, JOBS ``true`` jobs through each path, the order alternating
between runs, the queue empty before each phase. Two figures per path:
  - submit rate: jobs / seconds from the first submission until every job has its id (the executor: every
    future's ``jobid()``; the CLI: ``vigil submit --cc 1-JOBS true`` exited, having printed every id);
  - throughput: jobs / seconds from the first submission until every job is inactive (the executor: every future
    resolved to its exit code; the CLI: rank 0's list of active jobs empty, polled
    through the API every 0.5 s, every 20 ms once 20 or fewer remain).
Prints a markdown table of medians (min-max) over RUNS runs (bench/results/python.md keeps it, with the run's
context) and writes every sample to bench/results/python.json.

    bench/python-submit.py [JOBS] [RUNS]     defaults: 1000 3
VIGIL: the vigil binary (default: target/release/vigil, else target/ci/vigil; vigil-shell beside it). The module
is imported from python/ unless an installed ``vigil`` is found first.
"""

import concurrent.futures as cf
import json
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
try:
    import vigil
except ImportError:
    sys.path.insert(0, str(ROOT / "python"))
    import vigil


def vigil_bin() -> str:
    if os.environ.get("VIGIL"):
        return os.environ["VIGIL"]
    for p in (ROOT / "target" / "release" / "vigil", ROOT / "target" / "ci" / "vigil"):
        if p.exists():
            return str(p)
    sys.exit("no vigil binary: build it (cargo build --profile ci -p vigil -p vigil-shell) or set VIGIL")


def start_instance(d: pathlib.Path, env: dict) -> "tuple[subprocess.Popen, str]":
    script = f"echo \"$VIGIL_URI\" > '{d}/uri.tmp' && mv '{d}/uri.tmp' '{d}/uri'; while [ ! -e '{d}/stop' ]; do sleep 0.1; done"
    p = subprocess.Popen([vigil_bin(), "start", "--test-size=2", "sh", "-c", script], cwd=d, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.monotonic() + 60
    while not (d / "uri").exists():
        if p.poll() is not None or time.monotonic() > end:
            sys.exit("the instance did not start")
        time.sleep(0.05)
    return p, (d / "uri").read_text().strip()


def drain(c: "vigil.Client") -> None:
    """Until rank 0 has no active job. Each poll lists every active job, a cost to rank 0 of its own: every
    0.5 s while more than 20 remain, then every 20 ms."""
    while True:
        active = len(c.jobs())
        if active == 0:
            return
        time.sleep(0.5 if active > 20 else 0.02)


def via_executor(uri: str, n: int) -> "tuple[float, float]":
    with vigil.VigilExecutor(uri) as ex:
        t0 = time.monotonic()
        futs = [ex.submit(["true"]) for _ in range(n)]
        for f in futs:
            f.jobid()
        t_ids = time.monotonic()
        codes = [f.result() for f in cf.as_completed(futs)]
        t_done = time.monotonic()
    assert codes == [0] * n, "a job failed"
    return n / (t_ids - t0), n / (t_done - t0)


def via_cli(c: "vigil.Client", env: dict, cwd: pathlib.Path, n: int) -> "tuple[float, float]":
    t0 = time.monotonic()
    out = subprocess.run([vigil_bin(), "submit", f"--cc=1-{n}", "true"], cwd=cwd, env=env, capture_output=True,
                         text=True, check=True)
    t_ids = time.monotonic()
    assert len(out.stdout.split()) == n, out.stderr
    drain(c)
    t_done = time.monotonic()
    return n / (t_ids - t0), n / (t_done - t0)


def fmt(xs: "list[float]") -> str:
    return f"{statistics.median(xs):.0f} ({min(xs):.0f}-{max(xs):.0f})"


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    d = pathlib.Path(tempfile.mkdtemp(prefix="vigil-pybench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIGIL_")}
    env.update(TMPDIR=str(d), PATH=f"{os.path.dirname(vigil_bin())}:{env.get('PATH', '/usr/bin:/bin')}")
    inst, uri = start_instance(d, env)
    env["VIGIL_URI"] = uri
    samples = {"executor": [], "cli": []}
    try:
        c = vigil.Client(uri)
        via_executor(uri, 50)  # warm-up, untimed
        drain(c)
        for r in range(runs):
            order = ["executor", "cli"] if r % 2 == 0 else ["cli", "executor"]
            for how in order:
                drain(c)
                s = via_executor(uri, n) if how == "executor" else via_cli(c, env, d, n)
                samples[how].append(s)
                print(f"run {r + 1} {how}: submit {s[0]:.0f} jobs/s, throughput {s[1]:.0f} jobs/s", file=sys.stderr)
        c.close()
    finally:
        (d / "stop").write_text("0\n")
        try:
            inst.wait(timeout=30)
        except subprocess.TimeoutExpired:
            inst.kill()
        shutil.rmtree(d, ignore_errors=True)
    rows = []
    for how, label in (("executor", "`VigilExecutor().submit([\"true\"])`"), ("cli", "`vigil submit --cc 1-N true`")):
        sub = [s[0] for s in samples[how]]
        thr = [s[1] for s in samples[how]]
        rows.append((label, fmt(sub), fmt(thr), statistics.median(sub), statistics.median(thr)))
    ratio_sub = rows[0][3] / rows[1][3]
    ratio_thr = rows[0][4] / rows[1][4]
    table = [
        f"| path | jobs | runs | submit (jobs/s) | throughput to all inactive (jobs/s) |",
        "|---|---:|---:|---|---|",
        *[f"| {r[0]} | {n} | {runs} | {r[1]} | {r[2]} |" for r in rows],
        f"| executor / CLI | | | {ratio_sub:.2f} | {ratio_thr:.2f} |",
    ]
    print("\n".join(table))
    out = ROOT / "bench" / "results"
    (out / "python.json").write_text(json.dumps({
        "jobs": n, "runs": runs, "vigil": os.path.relpath(vigil_bin(), ROOT), "python": platform.python_version(),
        "samples": {k: [{"submit_jobs_per_s": a, "throughput_jobs_per_s": b} for a, b in v] for k, v in samples.items()},
    }, indent=1) + "\n")


if __name__ == "__main__":
    main()
