"""The client facing a peer that is not a well-behaved broker: errors with errno and a reason, never a hang."""

import errno
import json
import socket
import struct
import threading

import pytest

import vigil
from vigil import _wire


def serve(tmp_path, talk):
    """A Unix socket whose first client gets ``talk(conn)``; returns its URI."""
    tmp_path.mkdir(exist_ok=True)
    path = str(tmp_path / "local-0")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)

    def run():
        conn, _ = srv.accept()
        try:
            talk(conn)
        finally:
            conn.close()
            srv.close()

    threading.Thread(target=run, daemon=True).start()
    return f"local://{path}"


def control(topic, payload):
    m = _wire.Message(_wire.CONTROL, topic, payload=json.dumps(payload).encode())
    return m.encode()


def test_garbage_instead_of_a_welcome_is_a_protocol_error(tmp_path):
    # Text read as a length is over the limit; a plausible length is followed by its magic, checked before the
    # client waits for the rest (the peer here sends 8 bytes of a 1 MiB "frame" and waits).
    uri = serve(tmp_path, lambda c: c.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n"))
    with pytest.raises(vigil.ConnectError) as e:
        vigil.Client(uri)
    assert e.value.errno == errno.EPROTO and "TooLarge" in str(e.value)
    done = threading.Event()
    uri = serve(tmp_path / "second", lambda c: (c.sendall(struct.pack(">I", 1 << 20) + b"HTTP"), done.wait(5)))
    with pytest.raises(vigil.ConnectError) as e:
        vigil.Client(uri, timeout=5)
    done.set()
    assert e.value.errno == errno.EPROTO and "BadMagic" in str(e.value)


def test_a_refusal_says_why(tmp_path):
    uri = serve(tmp_path, lambda c: c.sendall(control("refused", {"errstr": "permission denied: uid 7"})))
    with pytest.raises(vigil.ConnectError) as e:
        vigil.Client(uri)
    assert e.value.errno == errno.EPERM and "permission denied: uid 7" in str(e.value)


def test_a_peer_that_closes_or_cuts_a_frame_before_its_welcome(tmp_path):
    uri = serve(tmp_path, lambda c: None)
    with pytest.raises(vigil.ConnectError, match="connection closed by broker"):
        vigil.Client(uri)
    uri = serve(tmp_path / "second", lambda c: c.sendall(control("welcome", {"rank": 0})[:10]))
    with pytest.raises(vigil.ConnectError) as e:
        vigil.Client(uri)
    assert e.value.errno == errno.EPROTO and "stopping or restarting" in str(e.value)


def test_a_silent_peer_times_out(tmp_path):
    done = threading.Event()
    uri = serve(tmp_path, lambda c: done.wait(5))
    with pytest.raises(vigil.ConnectError) as e:
        vigil.Client(uri, timeout=0.3)
    done.set()
    assert e.value.errno == errno.ETIMEDOUT


def test_a_malformed_frame_after_the_welcome_ends_requests_in_flight(tmp_path):
    def talk(c):
        c.sendall(control("welcome", {"rank": 0, "size": 1}))
        c.recv(65536)  # the request
        c.sendall(struct.pack(">I", 0xFFFFFFFF) + b"VG\x01\x02")  # a length over MAX_FRAME

    c = vigil.Client(serve(tmp_path, talk))
    with pytest.raises(vigil.ConnectionLost) as e:
        c.jobs()
    assert e.value.errno == errno.EHOSTUNREACH and "lost connection to broker" in str(e.value)
