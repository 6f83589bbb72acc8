"""`on_first_use`: a regular expression compiled when first used, then bound in its place."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import pytest

from wedgewatch.core.text import redact
from wedgewatch.core.text.patterns import on_first_use


def test_the_first_use_compiles_and_binds_the_pattern_in_its_place() -> None:
    """Before: a stand-in; the first attribute read answers as `re.compile` would and leaves
    the compiled pattern under the name, so later calls use it directly."""
    namespace: dict[str, Any] = {}
    namespace["WORDS"] = on_first_use(namespace, "WORDS", r"(?i)\bsecret\w*", re.ASCII)
    assert not isinstance(namespace["WORDS"], re.Pattern)
    assert namespace["WORDS"].findall("a Secrets b secretary") == ["Secrets", "secretary"]
    assert namespace["WORDS"] == re.compile(r"(?i)\bsecret\w*", re.ASCII)


def test_a_stand_in_bound_under_another_name_fails_loudly() -> None:
    """A stand-in whose name is not where it is bound would compile on every use: refused."""
    namespace: dict[str, Any] = {}
    namespace["OTHER"] = on_first_use(namespace, "WORDS", r"\w+")
    with pytest.raises(RuntimeError, match="WORDS is not bound"):
        namespace["OTHER"].match("x")


def test_redaction_compiles_its_rules_as_it_needs_them() -> None:
    """A fresh process that imports the redaction rules and masks a text with no secret
    compiles none of the deferred rules; masking a secret flag compiles the ones it uses."""
    code = (
        "import re\n"
        "from wedgewatch.core.text import redact\n"
        "assert redact.redact_text('ok: 4 running') == 'ok: 4 running'\n"
        "print(sorted(k for k, v in vars(redact).items() if isinstance(v, re.Pattern)))\n"
        "redact.redact_text('--api-key s3cret')\n"
        "print(sorted(k for k, v in vars(redact).items() if isinstance(v, re.Pattern)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, after = done.stdout.splitlines()
    assert before == "['_MAYBE_SECRET']"
    assert "_FLAG_HINT" in after
    assert "_SECRET_FLAG" in after
    assert redact.redact_text("--api-key s3cret") == "--api-key ***"
