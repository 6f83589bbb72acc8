"""Redaction of secrets in what wedgewatch writes or prints. Pure; one place.

One place decides what looks secret, so evidence bundles, reports, log lines, `/status`,
webhooks, CLI output and `config show` agree. Redaction is by NAME and by VALUE:

* free text (`redact_text`), the pass every writer applies to every string it writes:
  - URLs anywhere in the text: their userinfo (`http://***@host`, token-only or not)
    and the values of secret-looking query and fragment keys
    (`?apikey=***`, `?apiKey=***`, `?pwd=***`, `#token=***`);
  - JSON (or Python dict) values under secret-looking keys (`"secret_access_key": "***"`,
    also inside a `--kv-transfer-config` value);
  - the value of a secret flag (`--api-key X`, `--hf-token=X`), even across a line break,
    and every following word on that line up to the next `-flag` (a value with spaces);
  - secret-looking `NAME=value` assignments (`HF_TOKEN=X`, `secret_access_key=X`);
  - `Bearer X` credentials;
* structured values (`redact_value`): mappings lose the values of secret-looking keys,
  lists of strings are read as argument vectors (`redact_argv`), every string goes through
  `redact_text`;
* command lines (`redact_argv`, `redact_command_line`): as above, an argument vector
  masks exactly the word after a secret flag, whatever spaces it holds;
* environment variables (`redact_env`): the value of any name containing `TOKEN`, `KEY`,
  `SECRET`, `PASSWORD`, `PASSWD`, `CREDENTIAL` or `AUTH`, and every other value by value
  (a `VLLM_*` URL with a password);
* URLs (`redact_url`): the userinfo secret and secret-looking query and fragment values;
* webhook URLs (`redact_webhook_url`): everything after the host, because Slack, Discord
  and Teams put the secret in the path: `https://hooks.slack.com/***`;
* configured secrets (`secret_fragments` + `scrub_text`): the secret parts of configured
  URLs wherever a library's message or a detail embeds them.

A secret-looking key or flag is one whose last word (split at `-`, `_`, `.` and camelCase)
ends in `key`, `token`, `secret`, `password`, `passwd`, `pwd` or `credential(s)`, or is
`auth`, `authorization`, `pass`, `sig` or `signature`, or any of whose words contains
`secret` or `password` (`secret_access_key`, `apiKey`, `HF_TOKEN`; not `max_tokens` or
`ssl_keyfile`). The mask is always `***`.

Every pattern here is linear in the text (no quantifier that can be retried from every
position over an unbounded run): a hostile megabyte costs a fraction of a second of CPU.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from wedgewatch.core.text.patterns import on_first_use

MASK = "***"

# A flag whose last word names a secret: --api-key, --apikey, --hf-token, --db-password (not
# --max-num-batched-tokens or --ssl-keyfile, whose values are not secrets).
_SECRET_FLAG = on_first_use(
    globals(),
    "_SECRET_FLAG",
    r"(?i)^--?(?:[a-z0-9]+[-_])*[a-z0-9]*(?:key|token|secret|password|passwd|pwd|credentials?)"
    r"(?==|$)",
)
_SECRET_ENV_PARTS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH")
_ASSIGNMENT = on_first_use(globals(), "_ASSIGNMENT", r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)
# The scheme is bounded: an unbounded run would be tried again from every letter of a long
# word before a "://" (quadratic); a longer run still matches its last 32 characters, so the
# URL's userinfo and query are masked all the same.
_URL_IN_TEXT = on_first_use(
    globals(), "_URL_IN_TEXT", r"[A-Za-z][A-Za-z0-9+.-]{0,31}://[^\s'\"<>`]+"
)
_KEY_WORDS = on_first_use(globals(), "_KEY_WORDS", r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
_SECRET_ENDINGS = (
    "key",
    "token",
    "secret",
    "password",
    "passwd",
    "pwd",
    "credential",
    "credentials",
)
_SECRET_WORDS = frozenset({"auth", "authorization", "pass", "sig", "signature"})
# Nothing in a text can be secret-looking without one of these (a cheap first look).
_MAYBE_SECRET = re.compile(r"(?i)key|token|secret|pass|pwd|cred|auth|sig|bearer|@")
_PARAM = on_first_use(globals(), "_PARAM", r"(^|[&;?#])([^=&;#?]+)=([^&;#]*)")
_QUOTED_PAIR = on_first_use(
    globals(),
    "_QUOTED_PAIR",
    r"""(?P<q>["'])(?P<k>[^"'\\\n]{1,80})(?P=q)(?P<sep>\s*:\s*)"""
    r"""(?P<v>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|[^\s,{}\[\]"'`<>)]+)""",
)
_TEXT_ASSIGNMENT = on_first_use(
    globals(),
    "_TEXT_ASSIGNMENT",
    r"""(?<![\w.-])([A-Za-z_][A-Za-z0-9_.-]{0,80})="""
    r"""("(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|[^\s&;,#?'"`<>)\]}]+)""",
)
_BEARER = on_first_use(globals(), "_BEARER", r"(?i)\b(bearer)(\s+)([A-Za-z0-9._~+/=-]{6,})")
_WORD = on_first_use(globals(), "_WORD", r"\S+")
# A word that may be a secret flag (the full rule is `is_secret_flag`): a cheap first look.
_FLAG_HINT = on_first_use(
    globals(),
    "_FLAG_HINT",
    r"(?i)(?<!\S)['\"]?--?[a-z0-9_-]*(?:key|token|secret|password|passwd|pwd|credentials?)"
    r"(?=[=\s'\"]|$)",
)
_CLOSERS = frozenset("`'\")]}>,;")


_CACHED_CHARS = 512  # longer strings are not cached: a cache must not hold megabytes


def is_secret_key(name: str) -> bool:
    """Whether a key, parameter or variable name looks like it holds a secret (`apiKey`,
    `secret_access_key`, `HF_TOKEN`, `pwd`; not `max_tokens`, `ssl_keyfile`)."""
    return _is_secret_key(name) if len(name) <= _CACHED_CHARS else _secret_words(name)


@functools.lru_cache(maxsize=4096)  # the same label and key names come again and again
def _is_secret_key(name: str) -> bool:
    return _secret_words(name)


def _secret_words(name: str) -> bool:
    words = [w.lower() for w in _KEY_WORDS.findall(name)]
    if not words:
        return False
    last = words[-1]
    return (
        last.endswith(_SECRET_ENDINGS)
        or last in _SECRET_WORDS
        or any("secret" in w or "password" in w for w in words)
    )


def is_secret_flag(word: str) -> bool:
    """Whether a command-line word is a flag whose value is a secret (`--api-key`, `--x-token=`)."""
    return _SECRET_FLAG.match(word) is not None


def redact_argv(argv: Sequence[str]) -> list[str]:
    """An argument vector with secret values masked: `--api-key X` -> `--api-key ***` (the
    whole next word, spaces and all), `--hf-token=X` -> `--hf-token=***`, and every other
    word through `redact_text` (`HF_TOKEN=X`, URL credentials, JSON secrets)."""
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
            out.append(redact_text(word))
    return out


def redact_command_line(line: str) -> str:
    """A command line (a process title: words joined by spaces) with secrets masked; see
    `redact_text` (a secret flag's value runs to the next `-flag` or the end of the line)."""
    return redact_text(line)


def is_secret_env_name(name: str) -> bool:
    """Whether an environment variable's name looks like it holds a secret (`HF_TOKEN`)."""
    upper = name.upper()
    return any(part in upper for part in _SECRET_ENV_PARTS)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Environment variables (sorted by name) with the values of secret-looking names masked,
    and every other value redacted by value (`VLLM_X=http://u:***@host`)."""
    return {k: (MASK if is_secret_env_name(k) else redact_text(v)) for k, v in sorted(env.items())}


def _mask_params(text: str) -> str:
    """`a=1&token=x` -> `a=1&token=***` (query or fragment parameters; the rest unchanged)."""

    def one(m: re.Match[str]) -> str:
        if is_secret_key(unquote(m.group(2))) and m.group(3):
            return f"{m.group(1)}{m.group(2)}={MASK}"
        return m.group(0)

    return _PARAM.sub(one, text)


def redact_url(url: str) -> str:
    """A URL without its userinfo secret and with secret-looking query and fragment values
    masked.

    `https://user:pw@h/x?token=abc&a=1#apiKey=k` -> `https://user:***@h/x?token=***&a=1#apiKey=***`;
    a token-only userinfo is masked whole: `http://TOKEN@h` -> `http://***@h`.
    Text that is not a URL comes back unchanged.
    """
    return _redact_url_cached(url) if len(url) <= _CACHED_CHARS else _redact_url(url)


@functools.lru_cache(maxsize=4096)  # the configured targets' URLs come again and again
def _redact_url_cached(url: str) -> str:
    return _redact_url(url)


def _redact_url(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return _mask_params(url) if "=" in url else url
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        netloc = f"{user}:{MASK}@{host}" if colon and user else f"{MASK}@{host}"
    query = _mask_params(parts.query) if parts.query else ""
    fragment = _mask_params(parts.fragment) if "=" in parts.fragment else parts.fragment
    if (netloc, query, fragment) == (parts.netloc, parts.query, parts.fragment):
        return url
    return urlunsplit((parts.scheme, netloc, parts.path, query, fragment))


def _url_in_text(url: str) -> str:
    """A URL found in text: redacted, and its userinfo masked whole unless it is already
    redacted (`user:***`, as `redact_url` shows a target)."""
    body = url.rstrip(",.;:!?)]}")  # the sentence's punctuation is not the URL's
    if body != url:
        return _url_in_text(body) + url[len(body) :]
    shown = redact_url(url)
    authority = url.partition("://")[2].partition("/")[0]
    return shown if authority.rpartition("@")[0].endswith(":" + MASK) else _mask_userinfo(shown)


def _mask_userinfo(url: str) -> str:
    """`scheme://anything@host/...` -> `scheme://***@host/...` (in text, user names go too)."""
    scheme, sep, rest = url.partition("://")
    authority, slash, tail = rest.partition("/")
    if "@" not in authority:
        return url
    return f"{scheme}{sep}{MASK}@{authority.rsplit('@', 1)[1]}{slash}{tail}"


def _mask_flag_values(text: str) -> str:
    """The values of secret flags in free text: the next word (even on the next line), and
    the words after it on its line up to the next `-flag` (a value with spaces)."""
    words = list(_WORD.finditer(text))
    spans: list[tuple[int, int]] = []
    index = 0
    while index < len(words):
        word = words[index]
        bare = word.group(0).lstrip("'\"")
        if not is_secret_flag(bare.split("=", 1)[0]):
            index += 1
            continue
        if "=" in bare:
            start = word.start() + (len(word.group(0)) - len(bare)) + bare.index("=") + 1
            last = index
        elif index + 1 < len(words):
            start, last = words[index + 1].start(), index + 1
        else:
            break
        while (
            last + 1 < len(words)
            and not words[last + 1].group(0).startswith("-")
            and "\n" not in text[words[last].end() : words[last + 1].start()]
        ):
            last += 1
        # A closing quote, backtick or bracket of the markup around the value stays.
        end = words[last].end()
        while end - 1 > start and text[end - 1] in _CLOSERS:
            end -= 1
        if end > start and text[start:end] != MASK:
            spans.append((start, end))
        index = last + 1
    if not spans:
        return text
    pieces: list[str] = []  # joined once: one rebuild of the text per span is quadratic
    done = 0
    for start, end in spans:
        pieces += [text[done:start], MASK]
        done = end
    pieces.append(text[done:])
    return "".join(pieces)


def _mask_quoted_pairs(text: str) -> str:
    def one(m: re.Match[str]) -> str:
        if not is_secret_key(m.group("k")):
            return m.group(0)
        value = m.group("v")
        quote = value[0] if value[0] in "\"'" else ""
        return f"{m.group('q')}{m.group('k')}{m.group('q')}{m.group('sep')}{quote}{MASK}{quote}"

    return _QUOTED_PAIR.sub(one, text)


def _mask_assignments(text: str) -> str:
    def one(m: re.Match[str]) -> str:
        name = m.group(1)
        if is_secret_key(name) or (is_secret_env_name(name) and name.isupper()):
            quote = m.group(2)[0] if m.group(2)[0] in "\"'" else ""
            return f"{name}={quote}{MASK}{quote}"
        return m.group(0)

    return _TEXT_ASSIGNMENT.sub(one, text)


def redact_text(text: str) -> str:
    """Free text with every secret-looking value masked (see the module's docstring): URLs,
    JSON values under secret keys, secret flags' values, assignments, bearer tokens."""
    if not _MAYBE_SECRET.search(text):
        return text
    return _redact_short(text) if len(text) <= _CACHED_CHARS else _redact(text)


@functools.lru_cache(maxsize=8192)  # the same labels, titles and details come again and again
def _redact_short(text: str) -> str:
    return _redact(text)


def _redact(text: str) -> str:
    if "://" in text:
        text = _URL_IN_TEXT.sub(lambda m: _url_in_text(m.group(0)), text)
    if ":" in text and ("'" in text or '"' in text):
        text = _mask_quoted_pairs(text)
    if "-" in text and _FLAG_HINT.search(text):
        text = _mask_flag_values(text)
    if "=" in text:
        text = _mask_assignments(text)
    return _BEARER.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", text)


def redact_value(value: Any) -> Any:
    """A JSON-like value with every secret masked: mappings lose the values under
    secret-looking keys, lists of strings are read as argument vectors, strings go through
    `redact_text`. Numbers, booleans and None are kept (unless under a secret key)."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {
            k: (
                MASK
                if isinstance(k, str) and is_secret_key(k) and _is_filled_scalar(v)
                else redact_value(v)
            )
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        if value and all(isinstance(v, str) for v in value):
            return redact_argv(value)
        return [redact_value(v) for v in value]
    return value


def _is_filled_scalar(value: Any) -> bool:
    if isinstance(value, bool) or value is None:
        return False
    return isinstance(value, str | int | float) and value != ""


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
