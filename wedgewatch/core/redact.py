"""Redaction of secrets in what wedgewatch writes or prints. Pure; one function per concern.

One place decides what looks secret, so evidence bundles, reports, log lines, `/status`
and `config show` agree:

* command lines (`redact_argv`, `redact_command_line`): the value of any flag whose last
  word is `key`, `token`, `secret`, `password`, `passwd` or `credential(s)` (`--api-key X`,
  `--hf-token=X`; `--max-num-batched-tokens` is left alone), secret-looking `NAME=value`
  assignments (`HF_TOKEN=X`) and the credentials of URLs in arguments;
* environment variables (`redact_env`): the value of any name containing `TOKEN`, `KEY`,
  `SECRET`, `PASSWORD`, `PASSWD`, `CREDENTIAL` or `AUTH` (`HF_TOKEN`, `AWS_SECRET_ACCESS_KEY`);
* URLs (`redact_url`, for target and other URLs): the password of `user:password@host` and
  the value of secret-looking query parameters (`?token=...`, `&api_key=...`);
* webhook URLs (`redact_webhook_url`): everything after the host, because Slack, Discord
  and Teams put the secret in the path: `https://hooks.slack.com/***`;
* free text (`secret_fragments` + `scrub_text`): the secret parts of configured URLs
  wherever a library's message or a detail embeds them; the last line of defence.

The mask is always `***`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "***"

# A flag whose last word names a secret: --api-key, --hf-token, --db-password (not
# --max-num-batched-tokens or --ssl-keyfile, whose values are not secrets).
_SECRET_FLAG = re.compile(
    r"(?i)^--?(?:[a-z0-9]+[-_])*(?:key|token|secret|password|passwd|credentials?)(?==|$)"
)
_SECRET_ENV_PARTS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH")
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
_SECRET_PARAM = re.compile(
    r"(?i)(?:^|[-_])(?:key|token|secret|password|passwd|credentials?|signature|sig|auth)$"
)


def is_secret_flag(word: str) -> bool:
    """Whether a command-line word is a flag whose value is a secret (`--api-key`, `--x-token=`)."""
    return _SECRET_FLAG.match(word) is not None


def redact_argv(argv: Sequence[str]) -> list[str]:
    """An argument vector with secret values masked: `--api-key X` -> `--api-key ***`,
    `--hf-token=X` -> `--hf-token=***`, `HF_TOKEN=X` -> `HF_TOKEN=***`, and
    `https://user:pw@host` -> `https://***@host`."""
    out: list[str] = []
    mask_next = False
    for word in argv:
        if mask_next:
            out.append(MASK)
            mask_next = False
            continue
        if is_secret_flag(word) and "=" in word:
            out.append(word.split("=", 1)[0] + "=" + MASK)
        elif is_secret_flag(word):
            out.append(word)
            mask_next = True
        else:
            out.append(_redact_word(word))
    return out


def _redact_word(word: str) -> str:
    """One argument on its own: a `NAME=value` assignment or a URL with credentials."""
    assignment = _ASSIGNMENT.match(word)
    if assignment and is_secret_env_name(assignment.group(1)):
        return f"{assignment.group(1)}={MASK}"
    if "://" in word and "@" in word:
        return _URL_IN_TEXT.sub(lambda m: _mask_userinfo(m.group(0)), word)
    return word


def _mask_userinfo(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    authority, slash, tail = rest.partition("/")
    if "@" not in authority:
        return url
    return f"{scheme}{sep}{MASK}@{authority.rsplit('@', 1)[1]}{slash}{tail}"


def redact_command_line(line: str) -> str:
    """A command line (words separated by spaces) with secret-looking flag values masked."""
    return " ".join(redact_argv(line.split(" ")))


def is_secret_env_name(name: str) -> bool:
    """Whether an environment variable's name looks like it holds a secret (`HF_TOKEN`)."""
    upper = name.upper()
    return any(part in upper for part in _SECRET_ENV_PARTS)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Environment variables with the values of secret-looking names masked (sorted by name)."""
    return {k: (MASK if is_secret_env_name(k) else v) for k, v in sorted(env.items())}


@functools.lru_cache(maxsize=4096)  # pure, and asked on every scrape
def redact_url(url: str) -> str:
    """A URL without its password and with secret-looking query values masked.

    `https://user:pw@hooks.example/x?token=abc&a=1` -> `https://user:***@hooks.example/x?token=***&a=1`.
    Text that is not a URL comes back unchanged.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        netloc = f"{user}:{MASK}@{host}" if colon else f"{user}@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(_SECRET_PARAM.search(k) for k, _ in pairs):
            query = urlencode(
                [(k, MASK if _SECRET_PARAM.search(k) else v) for k, v in pairs], safe="*"
            )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_webhook_url(url: str) -> str:
    """A webhook URL as it may be printed: scheme, host and port only, the rest masked
    (`https://hooks.slack.com/services/T0/B0/XYZ` -> `https://hooks.slack.com/***`).
    Text that is not a URL is masked whole."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return MASK
    if not parts.scheme or not parts.hostname:
        return MASK
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    netloc = (f"{MASK}@" if "@" in parts.netloc else "") + host
    netloc += f":{port}" if port is not None else ""
    rest = parts.path not in ("", "/") or parts.query or parts.fragment
    return urlunsplit((parts.scheme, netloc, "/" + MASK if rest else parts.path, "", ""))


def secret_fragments(urls: Iterable[str], *, keep_path: bool = False) -> tuple[str, ...]:
    """The secret parts of `urls` (credentials, query, fragment, and the path unless
    `keep_path`), longest first, so `scrub_text` can mask them wherever they appear."""
    found: set[str] = set()
    for url in urls:
        try:
            parts = urlsplit(url)
        except ValueError:
            found.add(url)
            continue
        if "@" in parts.netloc:
            userinfo = parts.netloc.rsplit("@", 1)[0]
            found.add(userinfo.partition(":")[2] or userinfo)
        if parts.query:
            found.add(parts.query)
        if not keep_path and parts.path not in ("", "/"):
            found.add(parts.path.lstrip("/"))
        if parts.fragment:
            found.add(parts.fragment)
    return tuple(sorted((f for f in found if len(f) >= 4), key=len, reverse=True))


def scrub_text(text: str, fragments: Sequence[str]) -> str:
    """`text` with every secret fragment masked (see `secret_fragments`)."""
    for fragment in fragments:
        if fragment in text:
            text = text.replace(fragment, MASK)
    return text
