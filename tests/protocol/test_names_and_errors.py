import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsqcli import errors
from nsqcli.errors import LocalProtocolError
from nsqcli.protocol import validate_channel, validate_topic


@pytest.mark.parametrize("name", ["a", "t.1_-X", "x" * 64, "ch#ephemeral", "x" * 54 + "#ephemeral"])
def test_valid_names(name):
    assert validate_topic(name) == name
    assert validate_channel(name) == name


@pytest.mark.parametrize("name", ["", "x" * 65, "a b", "a/b", "é", "#ephemeral", "a#eph", "a\n"])
def test_invalid_names(name):
    with pytest.raises(LocalProtocolError, match="invalid topic name"):
        validate_topic(name)


@given(st.text(max_size=70))
def test_validation_never_crashes(name):
    try:
        validate_topic(name)
    except LocalProtocolError:
        pass


def test_server_error_mapping():
    e = errors.server_error(b"E_BAD_TOPIC PUB topic name 'x y' is not valid", "127.0.0.1:4150")
    assert isinstance(e, errors.BadTopicError) and isinstance(e, errors.ServerError)
    assert e.code == "E_BAD_TOPIC" and e.fatal and e.address == "127.0.0.1:4150"
    assert str(e) == "127.0.0.1:4150: E_BAD_TOPIC PUB topic name 'x y' is not valid"
    fin = errors.server_error(b"E_FIN_FAILED FIN abc failed")
    assert isinstance(fin, errors.FinFailedError) and not fin.fatal
    auth = errors.server_error(b"E_UNAUTHORIZED AUTH failed")
    assert isinstance(auth, errors.AuthError)
    unknown = errors.server_error(b"E_NEW_THING something")
    assert type(unknown) is errors.ServerError and unknown.code == "E_NEW_THING" and unknown.fatal


def test_timeout_is_builtin_timeout():
    e = errors.Timeout("read timed out", "127.0.0.1:1")
    assert isinstance(e, TimeoutError) and isinstance(e, errors.TransportError)
    assert e.address == "127.0.0.1:1"
