"""The webhook's URL and request headers: checked once, when the alerts are configured (:func:`check_webhook_url`,
:func:`check_header`), and never shown whole: a Slack or Discord webhook's path is its secret, so every message
names it by scheme and host only (:func:`redacted`, :func:`scrub`); a header's value (a bearer token) is never shown
at all."""

from __future__ import annotations

import re
import urllib.parse

__all__ = ["check_env_name", "check_header", "check_webhook_url", "redacted", "scrub"]

#: whitespace and control characters: ``http.client`` refuses them in a request line, echoing the path
_NOT_IN_URL = re.compile(r"[\x00-\x20\x7f-\x9f]")
#: a header's name: an HTTP token (RFC 9110, section 5.1)
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
#: an environment variable's name as POSIX shells accept it: a name, not a value pasted in its place
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: control characters other than a tab: ``http.client`` refuses them in a header, echoing the value (a secret)
_NOT_IN_HEADER = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def redacted(url: str) -> str:
    """``scheme://host`` of ``url``: what a warning may say of a webhook (its path, query, user and port left
    out); ``<webhook>`` when even that cannot be parsed."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname
    except ValueError:
        return "<webhook>"
    return f"{parts.scheme}://{host}" if parts.scheme and host else "<webhook>"


def scrub(text: str, url: str) -> str:
    """``text`` (an error message) with every part of ``url`` that could be a secret replaced: the whole URL by
    :func:`redacted`, then its path, query, fragment and user info (each as given and percent-decoded) by ``...``."""
    text = text.replace(url, redacted(url))
    try:
        parts = urllib.parse.urlsplit(url)
        secrets = [parts.path, parts.query, parts.fragment, parts.netloc.rpartition("@")[0]]
    except ValueError:
        secrets = [url.split("://", 1)[-1]]
    for secret in sorted({s for s in secrets if len(s) > 1}, key=len, reverse=True):
        for form in {secret, urllib.parse.unquote(secret)}:
            text = text.replace(form, "...")
    return text


def check_webhook_url(url: str, env: str) -> str:
    """``url`` (read from ``$env``) if it is a well-formed http(s) URL with a host, else ``ValueError`` naming
    ``env`` and what is wrong, without echoing the URL's path (a secret)."""
    where = f"the webhook URL in ${env} (alerts.webhook_env)"
    accepted = "expected http(s)://HOST/PATH, e.g. https://hooks.slack.com/services/..."
    if _NOT_IN_URL.search(url):
        raise ValueError(f"{where} holds whitespace or a control character; {accepted}")
    try:
        parts = urllib.parse.urlsplit(url)
        host, _ = parts.hostname, parts.port  # .port raises for a port that is not a number in range
    except ValueError as err:
        raise ValueError(f"{where} cannot be parsed ({scrub(str(err), url)}); {accepted}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(
            f"{where} must start with http:// or https://; its scheme is {parts.scheme!r}"
            + (" (none: is 'https://' missing?)" if not parts.scheme else "")
            + f"; {accepted}"
        )
    if not host:
        raise ValueError(f"{where} has no host; {accepted}")
    return url


def check_env_name(env: str, where: str) -> str:
    """``env`` if it is an environment variable's name, else ``ValueError`` naming ``where``, without echoing
    ``env`` (a secret pasted in place of the name would be)."""
    if not isinstance(env, str) or not _ENV_NAME.fullmatch(env):
        raise ValueError(
            f"{where} is the NAME of an environment variable holding the secret (letters, digits and '_', e.g. "
            "'ALERT_AUTH'), so that the secret stays out of configs and logs; got something else (not shown: it "
            "may be the secret)."
        )
    return env


def check_header(name: str, value: str, env: str) -> str:
    """``value`` (read from ``$env``) for request header ``name`` if it can be sent as one, else ``ValueError``
    naming ``env`` and never the value (a bearer token is a secret)."""
    if not _HEADER_NAME.fullmatch(name):
        raise ValueError(
            f"alerts.headers_env: {name!r} is not an HTTP header name (letters, digits and !#$%&'*+-.^_`|~)."
        )
    if _NOT_IN_HEADER.search(value):
        raise ValueError(
            f"the value of header {name} in ${env} (alerts.headers_env) holds a line break or a control character "
            "(not shown: it is a secret); set the variable to the header's value on one line."
        )
    return value
