"""The Python codec against the Rust one: golden frames written by runtime/proto/tests/python_golden.rs."""

import json
import pathlib

import pytest

from vigil import _wire

GOLDEN = json.loads((pathlib.Path(__file__).parent / "golden" / "frames.json").read_text())


@pytest.mark.parametrize("case", GOLDEN["good"], ids=[c["name"] for c in GOLDEN["good"]])
def test_rust_frames_decode_to_their_fields_and_encode_back_byte_for_byte(case):
    frame = bytes.fromhex(case["frame"])
    m = _wire.decode_frame(frame)
    want = case["message"]
    got = {
        "msgtype": m.msgtype, "flags": m.flags, "topic": m.topic, "matchtag": m.matchtag, "nodeid": m.nodeid,
        "userid": m.userid, "errnum": m.errnum, "seq": m.seq, "route": m.route, "payload": m.payload.hex(),
    }
    assert got == want
    assert m.encode() == frame


@pytest.mark.parametrize("case", GOLDEN["bad"], ids=[c["error"] for c in GOLDEN["bad"]])
def test_malformed_frames_fail_the_same_check_as_in_rust(case):
    with pytest.raises(_wire.DecodeError) as e:
        _wire.decode_frame(bytes.fromhex(case["frame"]))
    assert e.value.kind == case["error"]


def test_a_request_built_here_is_what_rust_builds():
    # The golden "submit request": same topic, nodeid, matchtag and (compact) JSON payload.
    case = next(c for c in GOLDEN["good"] if c["name"] == "submit request")
    payload = json.loads(bytes.fromhex(case["message"]["payload"]))
    m = _wire.request("job-manager.submit", 0, payload, matchtag=7)
    assert m.encode().hex() == case["frame"]


def test_a_stream_length_is_checked_before_its_bytes_are_trusted():
    with pytest.raises(_wire.DecodeError) as e:
        _wire.check_length(_wire.MAX_FRAME + 1)
    assert e.value.kind == "TooLarge"
    with pytest.raises(_wire.DecodeError):
        _wire.check_length(3)
