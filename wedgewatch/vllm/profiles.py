"""Launch profiles: named `vllm serve` flag sets, shipped in `profiles.toml` beside this module.

A profile is data about how vLLM is started; `wedgewatch.launch` builds the command line
from one, and the configuration validates user profiles (`[profiles.NAME]`) against it.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Mapping
from importlib import resources

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class Profile(BaseModel):
    """One launch profile: `vllm serve` flags and environment, plus optional knobs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    description: str = Field(
        "", description="One line shown by `wedgewatch launch --list-profiles`."
    )
    args: tuple[str, ...] = Field((), description="`vllm serve` flags, in order.")
    env: Mapping[str, str] = Field(default_factory=dict, description="Environment variables.")
    kv_cache_dtype: str | None = Field(None, description="Adds `--kv-cache-dtype VALUE`.")
    block_size: int | None = Field(None, gt=0, description="Adds `--block-size N`.")
    speculative_config: str | None = Field(
        None, description="Adds `--speculative-config JSON` (speculative decoding)."
    )
    dev_endpoints: bool = Field(
        False,
        description="Start vLLM with VLLM_SERVER_DEV_MODE=1: its abort endpoint (the abort "
        "cure) and every other dev route, unauthenticated, on the API port.",
    )
    prefix_cache_retention_interval: int | None = Field(
        None,
        ge=0,
        description="Flag on vLLM >= 0.27, else the VLLM_PREFIX_CACHE_RETENTION_INTERVAL variable.",
    )


def builtin_profiles() -> dict[str, Profile]:
    """The profiles shipped with the package (`wedgewatch/vllm/profiles.toml`)."""
    text = resources.files("wedgewatch.vllm").joinpath("profiles.toml").read_text(encoding="utf-8")
    return {name: Profile.model_validate(body) for name, body in tomllib.loads(text).items()}


class ProfileError(ValueError):
    """A user profile that cannot be used; the message names the profile, the key and the rule."""


def _profile_problems(name: str, error: ValidationError) -> list[str]:
    problems = []
    for item in error.errors():
        key = ".".join(str(part) for part in item["loc"]) or "(profile)"
        if item["type"] == "extra_forbidden":
            close = difflib.get_close_matches(key, list(Profile.model_fields), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            problems.append(f"profile {name!r}: unknown key {key!r}{hint}")
        else:
            message = str(item["msg"]).removeprefix("Value error, ")
            problems.append(f"profile {name!r}: {key} = {item.get('input')!r}: {message}")
    return problems


def merge_profiles(
    shipped: Mapping[str, Profile], overrides: Mapping[str, Mapping[str, object]]
) -> dict[str, Profile]:
    """User profiles from the config file replace shipped ones key by key, or add new ones.

    Raises ProfileError naming every bad profile key at once.
    """
    merged = dict(shipped)
    problems: list[str] = []
    for name, body in overrides.items():
        if not isinstance(body, Mapping):
            problems.append(
                f"profile {name!r} must be a table of keys ([profiles.{name}]), "
                f"not {type(body).__name__}"
            )
            continue
        base = merged[name].model_dump(exclude_unset=True) if name in merged else {}
        try:
            merged[name] = Profile.model_validate({**base, **body})
        except ValidationError as exc:
            problems.extend(_profile_problems(name, exc))
    if problems:
        raise ProfileError("; ".join(problems))
    return merged
