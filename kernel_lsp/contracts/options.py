"""The typed options of each job kind, with their defaults: the one place they are defined.

Stdlib only and nothing from kernel_lsp, so every layer may use them: the settings take their verify defaults
from VerifyOptions, the job builders (kinds.verify, kinds.profile) put them on the wire, the worker's handlers and
the sandboxed child read them back. On the wire (a job's config) the keys are camelCase (`timedCalls`); in Python
they are the fields' names. `from_config` rejects unknown keys and wrong types with one message naming them all.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, get_type_hints

VERIFY_DEVICES = ("auto", "cuda", "cpu")
BASELINE_KINDS = ("eager", "compile")
LIMIT_KEYS = frozenset({"wallTimeS", "hostMemoryBytes", "gpuMemoryFraction", "outputBytes",  # SandboxLimits
                        "diskBytes"})
DEFAULT_LAUNCH_COUNT = 8  # launches profiled: each is replayed once per section pass, so this bounds the time
DEFAULT_JOB_LIMITS = {"wallTimeS": 900}  # a first run builds the extension (and measures the ceilings): minutes
DEFAULT_JOB_TIMEOUT_S = 600.0  # the client's limit on a whole job (the setting jobTimeoutS)
SANDBOX_SHARE_OF_JOB = 0.9  # the rest of a job's time: the warm-up, waiting for the GPU, starting a child
DEFAULT_HANG_TIMEOUT_S = 60.0  # a first call may compile or autotune its kernels


def verify_limits(job_timeout_s: float) -> dict[str, Any]:
    """The sandbox's limits for a verification whose client waits `job_timeout_s`: its wall time ends first, so a
    candidate whose build or import never ends is a run-timeout, not an "unavailable" job."""
    return {"wallTimeS": round(job_timeout_s * SANDBOX_SHARE_OF_JOB, 3)}


@dataclass(frozen=True)
class VerifyOptions:
    """What a caller may set on a "verify" job; the candidate, the reference and the files come from the files."""

    device: str = "auto"  # auto: cuda when the worker has a GPU, else cpu (Triton under TRITON_INTERPRET=1)
    trials: int = 5  # timed trials (each: timedCalls calls of the candidate and of each baseline)
    timed_calls: int = 100
    warmup: int = 10  # untimed calls before the trials
    seed: int = 0  # of the correctness input sets
    tolerances: dict[str, dict[str, float]] = field(default_factory=dict)  # dtype name -> {"atol", "rtol"}
    baselines: tuple[str, ...] = BASELINE_KINDS
    allowed_kernels: tuple[str, ...] = ()  # fnmatch patterns of stock kernels a candidate may also run
    timing: bool = True  # off: correctness and integrity only
    allow_network: bool = False  # the candidate's process may open sockets (off: refused by seccomp)
    # refuse to run the candidate when its sandbox (process/namespaces.py) cannot start, rather than warn
    require_isolation: bool = False
    # a request to the candidate's process hangs after this plus, per forward, 100x the reference's slowest call
    # (or 10x the candidate's own slowest forward, if longer): verify/run.py HangLimits
    hang_timeout_s: float = DEFAULT_HANG_TIMEOUT_S
    limits: dict[str, Any] = field(default_factory=lambda: verify_limits(DEFAULT_JOB_TIMEOUT_S))  # the sandbox's

    def __post_init__(self) -> None:
        problems = type_problems(self)
        if self.device not in VERIFY_DEVICES:
            problems.append(f"device: expected one of {', '.join(VERIFY_DEVICES)}, got {self.device!r}")
        if not set(self.baselines) <= set(BASELINE_KINDS):
            problems.append(f"baselines: expected some of {', '.join(BASELINE_KINDS)}, got {list(self.baselines)!r}")
        for name in ("trials", "timed_calls"):
            if isinstance(getattr(self, name), int) and getattr(self, name) < 1:
                problems.append(f"{camel(name)}: must be at least 1, got {getattr(self, name)!r}")
        if isinstance(self.hang_timeout_s, (int, float)) and not self.hang_timeout_s > 0:
            problems.append(f"hangTimeoutS: must be more than 0, got {self.hang_timeout_s!r}")
        problems += limit_problems(self.limits)
        if problems:
            raise ValueError(f"invalid verify options: {'; '.join(problems)}")


@dataclass(frozen=True)
class ProfileOptions:
    """What a caller may set on a "profile" job."""

    device: str = "auto"  # cpu: the static profile (ptxas and SASS) even where the worker has a GPU
    kernels: tuple[str, ...] = ()  # the kernels to profile; empty: the candidate's own
    sections: tuple[str, ...] = ()  # ncu sections; empty: profilers.ncu.DEFAULT_SECTIONS
    launch_count: int = DEFAULT_LAUNCH_COUNT
    allow_network: bool = False  # as VerifyOptions.allow_network
    limits: dict[str, Any] = field(default_factory=dict)  # empty: the measuring child 900 s, ncu 600 s

    def __post_init__(self) -> None:
        problems = type_problems(self)
        if self.device not in VERIFY_DEVICES:
            problems.append(f"device: expected one of {', '.join(VERIFY_DEVICES)}, got {self.device!r}")
        problems += limit_problems(self.limits)
        if problems:
            raise ValueError(f"invalid profile options: {'; '.join(problems)}")


Options = TypeVar("Options")  # a frozen dataclass of a job kind's options: VerifyOptions, ProfileOptions, ...


def from_config(kind: type[Options], config: Mapping[str, Any], ignore: frozenset[str] = frozenset()) -> Options:
    """The options in a job's config (camelCase keys; lists for tuples); keys in `ignore` (the job's own:
    candidate, reference, origins) are skipped, any other unknown key is an error."""
    names = {camel(f.name): f.name for f in dataclasses.fields(kind)}
    unknown = sorted(set(config) - set(names) - ignore)
    if unknown:
        raise ValueError(f"unknown {_label(kind)} options: {', '.join(unknown)} (known: {', '.join(sorted(names))})")
    hints = get_type_hints(kind)
    values = {}
    for key, name in names.items():
        if key in config:
            value = config[key]
            values[name] = tuple(value) if _is_tuple(hints[name]) and isinstance(value, list) else value
    return kind(**values)


def coerce(kind: type[Options], options: Options | Mapping[str, Any]) -> Options:
    """`options` as they are, or read from their config entries (`{"timedCalls": 5}`) by from_config."""
    return options if isinstance(options, kind) else from_config(kind, options)


def to_config(options: Any) -> dict[str, Any]:
    """The options as a job's config entries: camelCase keys, JSON values (lists for tuples)."""
    return {camel(f.name): _json(getattr(options, f.name)) for f in dataclasses.fields(options)}


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def snake(key: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", key.replace("-", "_")).lower()


def _label(kind: type) -> str:
    return kind.__name__.removesuffix("Options").lower()  # VerifyOptions -> verify


def _json(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, dict):
        return {key: _json(item) for key, item in value.items()}
    return value


def _is_tuple(hint: Any) -> bool:
    return getattr(hint, "__origin__", None) is tuple


def type_problems(options: Any) -> list[str]:
    """Each field whose value is not of its annotated type (bool is not a number here)."""
    problems = []
    for name, hint in get_type_hints(type(options)).items():
        value = getattr(options, name)
        origin = getattr(hint, "__origin__", hint)
        if origin is tuple:
            ok = isinstance(value, tuple) and all(isinstance(item, str) for item in value)
        elif origin is dict:
            ok = isinstance(value, dict)
        elif hint is int:
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        elif hint is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        elif hint is bool:
            ok = isinstance(value, bool)
        else:
            ok = isinstance(value, origin)
        if not ok:
            problems.append(f"{camel(name)}: expected {_describe(hint)}, got {value!r}")
    return problems


def limit_problems(limits: Any) -> list[str]:
    if not isinstance(limits, dict):
        return []  # said by type_problems
    unknown = sorted(set(limits) - LIMIT_KEYS)
    return [f"limits: unknown keys {', '.join(unknown)} (known: {', '.join(sorted(LIMIT_KEYS))})"] if unknown else []


def _describe(hint: Any) -> str:
    origin = getattr(hint, "__origin__", hint)
    return {tuple: "a list of strings", dict: "an object", int: "a non-negative whole number", bool: "true or false",
            str: "a string", float: "a number"}.get(origin, str(hint))
