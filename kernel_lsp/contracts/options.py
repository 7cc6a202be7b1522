"""The typed options of each job kind, with their defaults: the one place they are defined.

Nothing from kernel_lsp above contracts, so every layer may use them: the settings take their verify defaults from VerifyOptions,
the job builders (kinds.verify, kinds.profile, kinds.sanitize) put them on the wire, the worker's handlers and the
sandboxed child read them back. On the wire (a job's config) the keys are camelCase (`timedCalls`); in Python they
are the fields' names. One cattrs converter encodes (`to_config`) and decodes (`from_config`) them: a decode
rejects unknown keys and values of the wrong type (a string for a number, a bool for a count) with one message
naming them all; each class's `__post_init__` then checks what types cannot say (a device's name, a count of 0).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, get_origin

import cattrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from kernel_lsp.contracts.codec import failures

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
        problems = []
        if self.device not in VERIFY_DEVICES:
            problems.append(f"device: expected one of {', '.join(VERIFY_DEVICES)}, got {self.device!r}")
        if not set(self.baselines) <= set(BASELINE_KINDS):
            problems.append(f"baselines: expected some of {', '.join(BASELINE_KINDS)}, got {list(self.baselines)!r}")
        for name in ("trials", "timed_calls"):
            if getattr(self, name) < 1:
                problems.append(f"{camel(name)}: must be at least 1, got {getattr(self, name)!r}")
        if not self.hang_timeout_s > 0:
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
        problems = []
        if self.device not in VERIFY_DEVICES:
            problems.append(f"device: expected one of {', '.join(VERIFY_DEVICES)}, got {self.device!r}")
        problems += limit_problems(self.limits)
        if problems:
            raise ValueError(f"invalid profile options: {'; '.join(problems)}")


Options = TypeVar("Options")  # a frozen dataclass of a job kind's options: VerifyOptions, ProfileOptions, ...


def from_config(kind: type[Options], config: Mapping[str, Any], ignore: frozenset[str] = frozenset()) -> Options:
    """The options in a job's config (camelCase keys; lists for tuples), decoded by cattrs; keys in `ignore` (the
    job's own: candidate, reference, origins) are skipped, any other unknown key is an error, and so is every value
    of the wrong type (all of them named in one ValueError)."""
    names = {camel(f.name) for f in dataclasses.fields(kind)}
    unknown = sorted(set(config) - names - ignore)
    if unknown:
        raise ValueError(f"unknown {_label(kind)} options: {', '.join(unknown)} (known: {', '.join(sorted(names))})")
    try:
        return _converter(kind).structure({key: value for key, value in config.items() if key in names}, kind)
    except cattrs.BaseValidationError as exc:
        raise ValueError(f"invalid {_label(kind)} options: {'; '.join(_problems(exc))}") from None


def coerce(kind: type[Options], options: Options | Mapping[str, Any]) -> Options:
    """`options` as they are, or read from their config entries (`{"timedCalls": 5}`) by from_config."""
    return options if isinstance(options, kind) else from_config(kind, options)


def to_config(options: Any) -> dict[str, Any]:
    """The options as a job's config entries: camelCase keys, JSON values (lists for tuples)."""
    return _converter(type(options)).unstructure(options)


@functools.cache
def _converter(kind: type) -> cattrs.Converter:
    """The converter for one options class: its fields under their camelCase names, each value of exactly its
    type (cattrs alone would turn "5" into 5 and a string into a tuple of its characters)."""
    conv = cattrs.Converter(forbid_extra_keys=True, unstruct_collection_overrides={tuple: list})
    for scalar in (str, bool, int, float):  # by type, so that the generated function calls them, not int()
        conv.register_structure_hook(scalar, _scalar)
    conv.register_structure_hook_func(lambda hint: get_origin(hint) is tuple, _strings)
    conv.register_structure_hook_func(lambda hint: get_origin(hint) is dict, _mapping)
    renames = {f.name: override(rename=camel(f.name)) for f in dataclasses.fields(kind)}
    conv.register_structure_hook(kind, make_dict_structure_fn(kind, conv, _cattrs_forbid_extra_keys=True,
                                                              **renames))
    conv.register_unstructure_hook(kind, make_dict_unstructure_fn(kind, conv, **renames))
    return conv


def _scalar(value: Any, hint: type) -> Any:
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    elif hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:
        ok = isinstance(value, hint)
    if not ok:
        raise TypeError(f"expected {_describe(hint)}, got {value!r}")
    return value


def _strings(value: Any, hint: Any) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(item, str) for item in value):
        raise TypeError(f"expected {_describe(hint)}, got {value!r}")
    return tuple(value)


def _mapping(value: Any, hint: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"expected {_describe(hint)}, got {value!r}")
    return _json(dict(value))


def _problems(exc: BaseException) -> list[str]:
    """'timedCalls: expected ...' for each field cattrs found wrong."""
    return [f"{camel(path.lstrip('.'))}: {leaf}" if path else str(leaf) for path, leaf in failures(exc)]


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


def limit_problems(limits: Any) -> list[str]:
    if not isinstance(limits, dict):
        return []  # not a mapping: from_config says so
    unknown = sorted(set(limits) - LIMIT_KEYS)
    return [f"limits: unknown keys {', '.join(unknown)} (known: {', '.join(sorted(LIMIT_KEYS))})"] if unknown else []


def _describe(hint: Any) -> str:
    origin = get_origin(hint) or hint
    return {tuple: "a list of strings", dict: "an object", int: "a non-negative whole number", bool: "true or false",
            str: "a string", float: "a number"}.get(origin, str(hint))
