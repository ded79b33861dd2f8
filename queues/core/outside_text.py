"""Text from outside (a depositor's server, an operator's reason, Merritt's services), escaped
for where it goes. HTML is Django's autoescaping; here are the others.

- A log line: every log record goes through ``LogFormatter`` (``LOGGING`` in the settings), so
  a reason phrase with ESC or BEL bytes, or a newline that would forge a second line, reaches
  the daemons' log as visible escapes (``\\x1b``), one record on one line, whatever the code
  that logged it put in its arguments.
- A URL in words (a job's status message, a log line, a page, a mail): ``url_shown`` hides the
  password of its user-info (``https://user:***@host/``). A depositor's payload or callback URL,
  and the URL of one of Merritt's services (storage, inventory, EZID, ingest), may carry
  credentials, which are sent as HTTP Basic authentication; the words about it
  (a refusal, an outage, a failed download) go to ZooKeeper, where Merritt's services read them,
  to the logs and to every viewer of the console.
- A URL as data handed on (a job's node, a preserved object's record):
  ``url_without_credentials`` leaves its user-info out altogether.
- A Slack message: ``for_slack`` escapes the three characters Slack reads as markup (``&``,
  ``<``, ``>``; Slack's "Formatting text for app surfaces", *Escaping text*), so a reason
  cannot mention ``<!channel>`` or make a link.

Pure Python, no Django: the logging configuration imports it before the apps are loaded.
"""

from __future__ import annotations

import logging
import re
import traceback
from urllib.parse import urlsplit, urlunsplit

# C0 and C1 control characters, DEL, and the Unicode line and paragraph separators.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_CONTROL_BUT_NEWLINE = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _visible(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"


def for_log(text: str, *, lines: bool = False) -> str:
    """``text`` with every control character written as a visible escape; ``lines`` keeps
    newlines (a traceback's, which the formatter appends on lines of their own)."""
    return (_CONTROL_BUT_NEWLINE if lines else _CONTROL).sub(_visible, text)


# A URL's scheme and user name, then its password up to the authority's last "@" (where
# ``urlsplit`` ends the user-info), the authority ending at the first "/", "?" or "#".
_PASSWORD = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^/?#@:]*):[^/?#]*@")


def url_shown(url: str) -> str:
    """``url`` as words may show it: the password of its user-info, if any, as ``***``."""
    return _PASSWORD.sub(r"\1:***@", url) if "@" in url else url


# A URL's scheme, then its user-info up to the authority's last "@".
_USER_INFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#]*@")


def url_without_credentials(url: str) -> str:
    """``url`` as data handed on to others may carry it: without its user-info. The URL of
    one of Merritt's services written into a job's node or a preserved object's record
    (storage's, in the ``inventory`` node and ``mrt-ingest.txt``) is read by every client of
    ZooKeeper and kept with the object for good; the services' own clients keep the setting,
    password and all."""
    return _USER_INFO.sub(r"\1", url, count=1) if "@" in url else url


def url_with_credentials_of(url: str, service: str) -> str:
    """``url`` with the user-info of ``service``'s URL when it names none of its own and is on
    the same scheme, host and port: a URL handed on without them (``url_without_credentials``)
    fetched again by the console itself."""
    if "@" not in service or _USER_INFO.match(url):
        return url
    try:
        ours, theirs = urlsplit(url), urlsplit(service)
        same = (ours.scheme.lower(), ours.hostname, ours.port) == (
            theirs.scheme.lower(),
            theirs.hostname,
            theirs.port,
        )
    except ValueError:
        return url
    if not same or theirs.username is None:
        return url
    user_info = theirs.netloc.rsplit("@", 1)[0]
    return urlunsplit(ours._replace(netloc=f"{user_info}@{ours.netloc}"))


def for_slack(text: str) -> str:
    """``text`` as Slack shows it literally: ``&``, ``<`` and ``>`` as entities."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _own_words_on_one_line(text: str, exc: BaseException | None) -> str:
    """A formatted traceback ``text`` with each exception's own words (its type and message,
    outside text often: a service's error document) on one line, escaped: a newline in them
    would otherwise begin a line of its own, one that can read as another record. The frames'
    lines (file, line, code) stay as they are."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        words = "".join(traceback.format_exception_only(type(exc), exc))
        if "\n" in words.rstrip("\n") or "\r" in words:
            text = text.replace(words.rstrip("\n"), for_log(words.rstrip("\n")))
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return text


class LogFormatter(logging.Formatter):
    """The settings' log format, with each record's message (its arguments filled in) on one
    line and free of control characters, and its traceback free of all but its newlines."""

    def format(self, record: logging.LogRecord) -> str:
        # The record is escaped in place and given back as it came (other handlers may format
        # it their own way): a copy of every record cost a batched daemon a few percent of its
        # CPU, at a line a job and step.
        saved = record.msg, record.args, record.exc_text, record.stack_info
        try:
            record.msg, record.args = for_log(record.getMessage()), None
            if record.exc_info and not record.exc_text:
                record.exc_text = self.formatException(record.exc_info)
                record.exc_text = _own_words_on_one_line(record.exc_text, record.exc_info[1])
            if record.exc_text:
                record.exc_text = for_log(record.exc_text, lines=True)
            if record.stack_info:
                record.stack_info = for_log(record.stack_info, lines=True)
            return super().format(record)
        finally:
            record.msg, record.args, record.exc_text, record.stack_info = saved
