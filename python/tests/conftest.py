"""Real instances for the Python API's tests, started as the Rust instance tests start theirs
(runtime/cli/tests/common/mod.rs): `vigil start --test-size=N` whose initial program writes its VIGIL_URI and waits
for a stop file, or `vigil broker` processes of a system instance with a state directory. Every test gets its own
directory (TMPDIR and cwd of every process); every process whose command line or environment holds it is killed
at the end, so nothing outlives a test.

The binaries: $VIGIL_BIN if set, else target/debug/vigil, else target/ci/vigil (vigil-shell must be beside it).
"""

import os
import pathlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def vigil_bin() -> str:
    env = os.environ.get("VIGIL_BIN")
    if env:
        return env
    for p in (ROOT / "target" / "debug" / "vigil", ROOT / "target" / "ci" / "vigil"):
        if p.exists():
            return str(p)
    pytest.skip("no vigil binary: build it (cargo build -p vigil -p vigil-shell) or set VIGIL_BIN")


def clean_env(d: pathlib.Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIGIL_")}
    env["TMPDIR"] = str(d)
    env["PATH"] = f"{os.path.dirname(vigil_bin())}:{env.get('PATH', '/usr/bin:/bin')}"
    env.pop("RUST_LOG", None)
    return env


def kill_marked(marker: str) -> None:
    """Kill every process whose command line or environment contains ``marker``.

    All of them are stopped (SIGSTOP) before any is killed: `vigil start` gives its brokers a parent-death signal
    (SIGTERM), and a broker that saw its parent die first would shut down cleanly (ending jobs with a `shutdown`
    exception) instead of being lost, which is what the tests that call this mean."""
    me = os.getpid()
    marked = []
    for p in pathlib.Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == me:
            continue
        try:
            blob = (p / "cmdline").read_bytes() + (p / "environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in blob:
            marked.append(int(p.name))
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in marked:
            try:
                os.kill(pid, sig)
            except OSError:
                pass


def wait_for(timeout: float, f) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if f():
            return True
        time.sleep(0.1)
    return f()


class Instance:
    """`vigil start --test-size=N` driven from outside through ``uri``."""

    def __init__(self, size: int, attrs=()):
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="vigil-py-"))
        os.chmod(self.dir, 0o755)
        d = self.dir
        script = (
            f"echo \"$VIGIL_URI\" > '{d}/uri.tmp' && mv '{d}/uri.tmp' '{d}/uri'; "
            f"while [ ! -e '{d}/stop' ]; do sleep 0.1; done; exit 0"
        )
        cmd = [vigil_bin(), "start", f"--test-size={size}"]
        for a in attrs:
            cmd += ["-S", a]
        cmd += ["sh", "-c", script]
        self.log = open(d / "start.log", "wb")
        self.proc = subprocess.Popen(cmd, cwd=d, env=clean_env(d), stdout=self.log, stderr=subprocess.STDOUT)
        if not wait_for(60, lambda: (d / "uri").exists() or self.proc.poll() is not None):
            pass
        if not (d / "uri").exists():
            self.stop()
            raise RuntimeError(f"instance of {size} did not start: {(d / 'start.log').read_text()}")
        self.uri = (d / "uri").read_text().strip()
        self.env = clean_env(d)
        self.env["VIGIL_URI"] = self.uri

    def vigil(self, *args, timeout=60) -> subprocess.CompletedProcess:
        return subprocess.run([vigil_bin(), *args], cwd=self.dir, env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    def stop(self) -> None:
        (self.dir / "stop").write_text("0\n")
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
        kill_marked(str(self.dir))
        self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class SystemInstance:
    """`vigil broker` processes of a system instance on loopback TCP with a state directory on rank 0 (as
    runtime/cli/tests/instance_statedir.rs); rank 0 can be killed and started again."""

    def __init__(self, size: int):
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="vigil-py-"))
        os.chmod(self.dir, 0o755)
        self.size = size
        d = self.dir
        key = d / "overlay.key"
        subprocess.run([vigil_bin(), "keygen", str(key)], cwd=d, env=clean_env(d), check=True, capture_output=True)
        hosts = []
        for r in range(size):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            s.close()
            hosts.append(f'{{ host = "n{r}", bind = "tcp://127.0.0.1:{port}", connect = "tcp://127.0.0.1:{port}" }}')
        self.statedir = d / "state"
        self.config = d / "vigil.toml"
        self.config.write_text(
            f'[bootstrap]\ninstance = "sys"\noverlay_key = "{key}"\nstatedir = "{self.statedir}"\n'
            f"hosts = [ {', '.join(hosts)} ]\n"
        )
        self.uri = f"local://{d / 'r0' / 'local-0'}"
        self.env = clean_env(d)
        self.env["VIGIL_URI"] = self.uri
        self.brokers = {}
        self.logs = []
        for r in range(size):
            self.start_broker(r)
        if not self.wait_up(60):
            raise RuntimeError(f"the instance did not come up: {self.vigil('uptime')}")

    def start_broker(self, rank: int) -> subprocess.Popen:
        log = open(self.dir / f"broker{rank}.log", "ab")
        self.logs.append(log)
        p = subprocess.Popen(
            [vigil_bin(), "broker", f"--rank={rank}", f"--config={self.config}", f"--rundir={self.dir / f'r{rank}'}",
             "-S", "resource.synthetic=pack:1 core:1 pu:1"],
            cwd=self.dir, env=clean_env(self.dir), stdout=log, stderr=subprocess.STDOUT)
        self.brokers[rank] = p
        return p

    def vigil(self, *args, timeout=30) -> subprocess.CompletedProcess:
        return subprocess.run([vigil_bin(), *args], cwd=self.dir, env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    def wait_up(self, timeout: float) -> bool:
        def up():
            o = self.vigil("uptime")
            return o.returncode == 0 and " run " in o.stdout
        return wait_for(timeout, up)

    def stop(self) -> None:
        kill_marked(str(self.dir))
        for p in self.brokers.values():
            p.wait()
        for log in self.logs:
            log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def instance():
    inst = Instance(2)
    try:
        yield inst
    finally:
        inst.stop()


@pytest.fixture
def system_instance():
    inst = SystemInstance(2)
    try:
        yield inst
    finally:
        inst.stop()


def pytest_report_header(config):
    import vigil

    return f"vigil module: {vigil.__file__}; vigil binary: {os.environ.get('VIGIL_BIN', '(search target/)')}"
