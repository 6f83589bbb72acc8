"""Redaction of secrets in what wedgewatch writes or prints. Pure.

One place decides what looks secret, so evidence bundles, reports and log lines agree:

* command lines: the value of any flag whose last word is `key`, `token`, `secret`,
  `password`, `passwd` or `credential(s)` (`--api-key X`, `--hf-token=X`); flags such as
  `--max-num-batched-tokens` are left alone;
* environment variables: the value of any name containing `TOKEN`, `KEY`, `SECRET`,
  `PASSWORD`, `PASSWD`, `CREDENTIAL` or `AUTH` (`HF_TOKEN`, `AWS_SECRET_ACCESS_KEY`);
* URLs: the password of `user:password@host` and the value of secret-looking query
  parameters (`?token=...`, `&api_key=...`).

The mask is always `***`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "***"

# A flag whose last word names a secret: --api-key, --hf-token, --db-password (not
# --max-num-batched-tokens or --ssl-keyfile, whose values are not secrets).
_SECRET_FLAG = re.compile(
    r"(?i)^--?(?:[a-z0-9]+[-_])*(?:key|token|secret|password|passwd|credentials?)(?==|$)"
)
_SECRET_ENV_PARTS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH")
_SECRET_PARAM = re.compile(
    r"(?i)(?:^|[-_])(?:key|token|secret|password|passwd|credentials?|signature|sig|auth)$"
)


def is_secret_flag(word: str) -> bool:
    """Whether a command-line word is a flag whose value is a secret (`--api-key`, `--x-token=`)."""
    return _SECRET_FLAG.match(word) is not None


def redact_argv(argv: Sequence[str]) -> list[str]:
    """An argument vector with the values of secret-looking flags masked."""
    out: list[str] = []
    mask_next = False
    for word in argv:
        if mask_next:
            out.append(MASK)
            mask_next = False
            continue
        if is_secret_flag(word) and "=" in word:
            out.append(word.split("=", 1)[0] + "=" + MASK)
        else:
            out.append(word)
            mask_next = is_secret_flag(word)
    return out


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
