"""The Spark source's and sink's options hold the admin password, and Spark
prints a source's options in plans, logs and errors: wherever an endpoint or
the options around it are formatted, the password shows as ***."""

from __future__ import annotations

import pytest

from gateway.spark import options as opts

SECRET = "s3cret-admin-pass"


def test_an_endpoints_repr_and_str_show_the_user_but_not_the_password() -> None:
    endpoint = opts.endpoint({"url": "http://127.0.0.1:8161", "user": "ops", "password": SECRET})
    for text in (repr(endpoint), str(endpoint), f"{endpoint}", f"{endpoint!r}"):
        assert SECRET not in text
        assert "password='***'" in text and "user='ops'" in text and "http://127.0.0.1:8161" in text
    assert endpoint.password == SECRET  # still there for the requests themselves


def test_read_and_write_options_do_not_show_the_password_either() -> None:
    given = {"url": "http://127.0.0.1:8161", "user": "ops", "password": SECRET}
    read = opts.read_options({**given, "topic": "plant.>"}, streaming=False)
    write = opts.write_options({**given, "destination": "/topic/out", "stomp": "127.0.0.1:61613"})
    for options in (read, write):
        assert SECRET not in repr(options) and SECRET not in str(options)
        assert "***" in repr(options)


def test_a_password_in_the_url_is_redacted_in_repr_and_errors() -> None:
    endpoint = opts.endpoint({"url": f"http://ops:{SECRET}@127.0.0.1:1", "timeout": "2"})
    assert SECRET not in repr(endpoint) and "http://ops:***@127.0.0.1:1" in repr(endpoint)
    with pytest.raises(opts.OptionError) as bad:
        opts.endpoint({"url": f"ftp://ops:{SECRET}@127.0.0.1:1"})
    assert SECRET not in str(bad.value) and "ftp://ops:***@127.0.0.1:1" in str(bad.value)
    assert endpoint.password is None  # no password option: only the url's
