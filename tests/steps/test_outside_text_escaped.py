"""Text from outside escaped for where it goes (issue 52, item 13): a depositor server's reason
phrase with ESC and BEL bytes reaches the log as visible escapes, one record on one line, through
the log format the settings configure; Slack's markup characters in an operator's words are
shown, not read."""

from __future__ import annotations

import io
import logging
import socket
import sys
import threading

import pytest

from queues.core.outside_text import (
    LogFormatter,
    for_slack,
    url_shown,
    url_with_credentials_of,
    url_without_credentials,
)
from queues.steps.fetch import DownloadError, fetch_bytes

# Outside text a log call may carry in its arguments: the escape, and a newline forging a line.
REASON = "Not Found\x1b[2J\x1b]0;owned\x07\nINFO forged line"


class RawReason:
    """A loopback server whose every answer is a 404 with ESC and BEL in its reason phrase
    (a terminal escape that clears the screen and retitles the window)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/payload.zip"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _peer = self.listener.accept()
            except OSError:
                return
            with conn:
                request = b""
                while b"\r\n\r\n" not in request:
                    data = conn.recv(4096)
                    if not data:
                        break
                    request += data
                status = b"HTTP/1.1 404 Not Found\x1b[2J\x1b]0;owned\x07\r\n"
                conn.sendall(status + b"Content-Length: 0\r\nConnection: close\r\n\r\n")

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def server():
    raw = RawReason()
    yield raw
    raw.close()


@pytest.fixture
def log_lines():
    """What a logger writes through the handler the settings configure (its formatter)."""
    configured = [h for h in logging.getLogger().handlers if isinstance(h.formatter, LogFormatter)]
    assert configured, (
        "LOGGING's console handler does not use queues.core.outside_text.LogFormatter"
    )
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(configured[0].formatter)
    logger = logging.getLogger("queues.daemons")
    logger.addHandler(handler)
    yield logger, out
    logger.removeHandler(handler)


def test_a_reason_phrase_reaches_the_log_escaped(server, log_lines):
    logger, out = log_lines
    with pytest.raises(DownloadError) as raised:
        fetch_bytes(server.url, retries=0)
    assert "\x1b" in str(raised.value)  # the client keeps what the server said, raw
    logger.warning("jid0000000001 Downloading: %s", raised.value)
    try:
        raise raised.value
    except DownloadError:
        logger.warning("jid0000000001 Downloading raised", exc_info=True)
    # And a message whose own arguments would forge a line.
    logger.warning("%s", REASON)
    written = out.getvalue()
    assert "\x1b" not in written and "\x07" not in written
    assert "\\x1b[2J\\x1b]0;owned\\x07" in written
    assert "\\nINFO forged line" in written
    # One line per record, but the traceback's own lines.
    lines = written.splitlines()
    assert sum(1 for line in lines if " WARNING queues.daemons " in line) == 3
    assert not any(line.startswith("INFO forged") for line in lines)


def test_slack_markup_in_outside_text_is_shown_not_read():
    reason = "redeploy <!channel> & <https://evil.example|click>"
    assert for_slack(reason) == (
        "redeploy &lt;!channel&gt; &amp; &lt;https://evil.example|click&gt;"
    )


def test_the_log_formatter_gives_the_record_back_as_it_came() -> None:
    """It escapes the record in place to format it: another handler still gets the record's
    own message, arguments and traceback."""
    try:
        raise ValueError(REASON)
    except ValueError:
        record = logging.LogRecord(
            "queues.daemons", logging.WARNING, __file__, 1, "%s", (REASON,), sys.exc_info()
        )
    line = LogFormatter("%(message)s").format(record)
    assert "\x1b" not in line and "\\x1b" in line
    assert record.msg == "%s" and record.args == (REASON,)
    assert record.exc_text is None and record.getMessage() == REASON
    assert "\x1b" in logging.Formatter("%(message)s").format(record)


def test_an_exceptions_own_words_stay_on_their_line_in_a_traceback() -> None:
    """A service's error document with a newline, in an exception's message, logged with its
    traceback: the forged line stays inside the exception's one line (escaped), the frames keep
    theirs, and so does an exception it was raised from."""
    forged = "2026-01-01 00:00:00,000 INFO queues.alerts alert message 7 sent"
    try:
        try:
            raise OSError(f"inventory: 500\n{forged}")
        except OSError as inner:
            raise RuntimeError(f"storage refused: HTTP 503\r\n{forged}") from inner
    except RuntimeError:
        record = logging.LogRecord(
            "queues.daemons", logging.WARNING, __file__, 1, "raised", (), sys.exc_info()
        )
    text = LogFormatter("%(asctime)s %(levelname)s %(name)s %(message)s").format(record)
    lines = text.splitlines()
    assert not any(line.startswith("2026-01-01") for line in lines), text
    assert f"RuntimeError: storage refused: HTTP 503\\r\\n{forged}" in lines
    assert f"OSError: inventory: 500\\n{forged}" in lines
    assert sum(1 for line in lines if line.startswith("Traceback (most recent call last):")) == 2
    assert any(line.strip().startswith('File "') for line in lines)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://user:s3cret@example.org/a", "https://user:***@example.org/a"),
        # urlsplit ends the user-info at the authority's last "@".
        ("http://u:p@ss@example.org:81/p?q=@", "http://u:***@example.org:81/p?q=@"),
        ("https://:s3cret@example.org", "https://:***@example.org"),
        ("http://u:s3cret@example.org?x", "http://u:***@example.org?x"),
        ("http://user@example.org/", "http://user@example.org/"),  # no password
        ("http://example.org/a@b", "http://example.org/a@b"),  # an "@" past the authority
        ("file:///srv/a", "file:///srv/a"),
    ],
)
def test_a_url_is_shown_without_its_password(url: str, shown: str) -> None:
    assert url_shown(url) == shown


@pytest.mark.parametrize(
    ("url", "handed"),
    [
        ("https://user:s3cret@example.org/a", "https://example.org/a"),
        ("http://u:p@ss@example.org:81/p?q=@", "http://example.org:81/p?q=@"),
        ("http://user@example.org/", "http://example.org/"),
        ("http://example.org/a@b", "http://example.org/a@b"),
        ("file:///srv/a", "file:///srv/a"),
    ],
)
def test_a_url_handed_on_goes_without_its_user_info(url: str, handed: str) -> None:
    assert url_without_credentials(url) == handed


@pytest.mark.parametrize(
    ("url", "fetched"),
    [
        ("http://store:35121/manifest/9501/a", "http://u:p%40ss@store:35121/manifest/9501/a"),
        ("HTTP://store:35121/m", "http://u:p%40ss@store:35121/m"),
        # Another port, host or scheme: not the service's, nothing added.
        ("http://store:8080/m", "http://store:8080/m"),
        ("http://other:35121/m", "http://other:35121/m"),
        ("https://store:35121/m", "https://store:35121/m"),
        # Its own user-info is kept.
        ("http://me:x@store:35121/m", "http://me:x@store:35121/m"),
        ("file:///srv/m", "file:///srv/m"),
    ],
)
def test_a_url_fetched_again_takes_the_services_user_info(url: str, fetched: str) -> None:
    assert url_with_credentials_of(url, "http://u:p%40ss@store:35121/") == fetched
    assert url_with_credentials_of(url, "http://store:35121/") == url


def test_a_manifest_line_refused_shows_its_url_without_the_password() -> None:
    from queues.steps.checkm import ManifestError, parse_checkm

    text = "#%checkm_0.7\n#%fields | nfo:fileUrl | nfo:hashAlgorithm | nfo:hashValue\n"
    text += "gopher://u:s3cret@example.org/a | | \n"
    with pytest.raises(ManifestError) as refused:
        parse_checkm(text)
    assert "gopher://u:***@example.org/a" in str(refused.value)
    assert "s3cret" not in str(refused.value)
