"""One encode and one decode for the reports that cross a process boundary (contracts.verify_report,
contracts.keeper_report, contracts.sanitize_report, contracts.profile_report, contracts.cute_dsl_report, a sandbox
child's frames: contracts.sandbox_reply, the candidate's process's replies to the judge: contracts.candidate_replies,
the jobs' results' metrics: contracts.job_metrics, and a Ray actor's: contracts.actor_info), by cattrs: a received
dict becomes the typed report or a ContractError naming every key that is unknown, missing or of the wrong type; a
typed report becomes the wire's dict (msgpack and JSON safe), under the wire's names."""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, get_args, get_origin

import cattrs
from cattrs.cols import homogenous_tuple_structure_factory, list_structure_factory
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from kernel_lsp.contracts.actor_info import ActorInfo
from kernel_lsp.contracts.candidate_replies import SettleReply
from kernel_lsp.contracts.cute_dsl_report import CuteDslReport
from kernel_lsp.contracts.job_metrics import (
    BuildMetrics,
    CuteDslMetrics,
    DeviceInfoMetrics,
    KernelResources,
    RunMetrics,
    VerifyMetrics,
)
from kernel_lsp.contracts.keeper_report import KeeperEnd
from kernel_lsp.contracts.profile_report import (
    EnergyReading,
    KernelMetrics,
    KernelProfile,
    Metric,
    ProfileHint,
    ProfileIsolation,
    ProfileReport,
    PtxasFigures,
)
from kernel_lsp.contracts.sanitize_report import SanitizerErrorEntry, SharedInitAnswer, ToolRunReport, WarmCall
from kernel_lsp.contracts.verify_report import Floor, Isolation, Timing, Timings, Unavailable, VerifyReport

T = TypeVar("T")
Wire = dict[str, Any]  # a report's encoded form, as msgpack and JSON carry it: what `encode` gives, `decode` takes

# fields the wire leaves out when they hold nothing (the reports written before them had no such key)
ABSENT_WHEN_NONE: dict[type, tuple[str, ...]] = {Timing: ("check_ms",), Timings: ("schedule",),
                                                 Floor: ("schedule", "datasheet"),
                                                 Isolation: ("processes", "namespaces"),
                                                 ToolRunReport: ("shared_init",),
                                                 SharedInitAnswer: ("problem", "patterns", "fill_bytes"),
                                                 KernelProfile: ("sass", "energy_mj_per_call"),
                                                 EnergyReading: ("average_power_w",),
                                                 ProfileIsolation: ("processes", "namespaces"),
                                                 CuteDslMetrics: ("version", "isolation"),
                                                 SettleReply: ("output",)}
# groups of fields the wire leaves out when every one of them holds nothing, and carries together (null where one
# is missing) otherwise: what one source gives (ncu's figures of a launch, a static profile's place, a GPU run's)
ABSENT_TOGETHER: dict[type, tuple[tuple[str, ...], ...]] = {
    KernelProfile: (("duration_ms", "point", "occupancy_pct", "grid", "block"), ("arch", "file", "line")),
    ProfileHint: (("file", "line"),),
    ProfileReport: (("energy", "isolation", "reference_energy"),)}
RENAMED: dict[type, dict[str, str]] = {Timings: {"compile_error": "compileError"},
                                       KeeperEnd: {"left_count": "leftCount", "disk_bytes": "diskBytes",
                                                   "disk_limit": "diskLimit"},
                                       ToolRunReport: {"wall_s": "wallS", "timed_out": "timedOut",
                                                       "not_printed": "notPrinted", "shared_init": "sharedInit"},
                                       WarmCall: {"exit_code": "exitCode", "timed_out": "timedOut", "wall_s": "wallS"},
                                       SanitizerErrorEntry: {"other_access": "otherAccess"},
                                       SharedInitAnswer: {"fill_bytes": "fillBytes"},
                                       CuteDslReport: {"error_type": "errorType"},
                                       VerifyMetrics: {"duration_s": "durationS"},
                                       KernelResources: {"stack_bytes": "stackBytes", "local_bytes": "localBytes",
                                                         "shared_bytes": "sharedBytes", "tensor_core": "tensorCore",
                                                         "bulk_copies": "bulkCopies"},
                                       DeviceInfoMetrics: {"cuda_available": "cudaAvailable"},
                                       RunMetrics: {"duration_s": "durationS"},
                                       BuildMetrics: {"duration_s": "durationS", "build_directory": "buildDirectory"},
                                       ActorInfo: {"cuda_visible_devices": "cudaVisibleDevices"}}


class ContractError(ValueError):
    """A report that does not match its contract: what the sender got wrong, every key of it."""


@functools.cache
def converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True, unstruct_collection_overrides={tuple: list})
    conv.register_structure_hook(float, _number)  # an int is a float on the wire (msgpack keeps 0 as an int)
    for exact in (str, int, bool):  # as sent: cattrs would turn 3 into "3" and "5" or 5.5 into 5
        conv.register_structure_hook(exact, _exactly)
    # an array, as sent: cattrs would take a str as the list of its characters
    conv.register_structure_hook_factory(lambda kind: get_origin(kind) in (list, tuple), _sequence_hook)
    conv.register_structure_hook_func(lambda kind: kind is object, lambda value, _: value)  # NVML's: kept as read
    conv.register_structure_hook_factory(dataclasses.is_dataclass, lambda cls, conv: _object_only(
        cls, make_dict_structure_fn(cls, conv, _cattrs_forbid_extra_keys=True)))
    conv.register_structure_hook_func(lambda kind: kind == (float | str), _number_or_text)  # a Metric's value
    _metrics_hooks(conv)
    for cls in _held_first([*ABSENT_WHEN_NONE, *RENAMED, *ABSENT_TOGETHER]):  # cattrs looks a held class's hook up
        renames = RENAMED.get(cls, {})                                        # as it builds
        absent = ABSENT_WHEN_NONE.get(cls, ())
        fields = {name: override(rename=renames.get(name), omit_if_default=name in absent)
                  for name in {*renames, *absent}}
        conv.register_unstructure_hook(cls, _without_empty_groups(make_dict_unstructure_fn(cls, conv, **fields),
                                                                  ABSENT_TOGETHER.get(cls, ()), renames))
        structure = make_dict_structure_fn(cls, conv, _cattrs_forbid_extra_keys=True,
                                           **{k: override(rename=v) for k, v in renames.items()})
        conv.register_structure_hook(cls, _object_only(cls, structure))
    return conv


def _object_only(cls: type, structure: Callable[[Any, Any], T]) -> Callable[[Any, Any], T]:
    """`structure`, refusing what is not an object first (cattrs would say "'str' object has no attribute
    'keys'")."""
    def structure_object(value: Any, kind: Any) -> T:
        if not isinstance(value, Mapping):
            raise TypeError(f"expected an object ({cls.__name__}), got {type(value).__name__} {value!r:.40}")
        return structure(value, kind)
    return structure_object


def _held_first(classes: list[type]) -> list[type]:
    """`classes` once each, every one after the classes of the list it holds (in a field, a tuple's items, an
    Optional), directly or through a dataclass not in the list (VerifyMetrics holds Timings through VerifyReport)."""
    ordered: list[type] = []
    seen: set[type] = set()

    def visit(cls: type) -> None:
        if cls in seen:
            return
        seen.add(cls)
        for hint in typing.get_type_hints(cls).values():
            for held in _classes_in(hint):
                if held in classes or dataclasses.is_dataclass(held):
                    visit(held)
        if cls in classes:
            ordered.append(cls)
    for cls in classes:
        visit(cls)
    return ordered


def _classes_in(hint: Any) -> list[type]:
    args = get_args(hint)
    return [c for arg in args for c in _classes_in(arg)] if args else [hint] if isinstance(hint, type) else []


def _without_empty_groups(unstructure: Callable[[Any], Wire], groups: tuple[tuple[str, ...], ...],
                          renames: dict[str, str]) -> Callable[[Any], Wire]:
    """`unstructure`, leaving out each group of ABSENT_TOGETHER whose fields all hold None."""
    if not groups:
        return unstructure

    def without(obj: Any) -> Wire:
        wire = unstructure(obj)
        for group in groups:
            if all(getattr(obj, name) is None for name in group):
                for name in group:
                    wire.pop(renames.get(name, name), None)
        return wire
    return without


def _metrics_hooks(conv: cattrs.Converter) -> None:
    """KernelMetrics as the wire's one object: ncu's sections, or `ptxas` (a static profile's figures)."""
    sections = dict[str, dict[str, Metric]]

    def structure(value: Any, _: Any) -> KernelMetrics:
        ptxas, parts, errors = value.get("ptxas"), [], []
        for part, kind, note in (({k: v for k, v in value.items() if k != "ptxas"}, sections, "its sections"),
                                 (ptxas, PtxasFigures | None, "Structuring class KernelMetrics @ attribute ptxas")):
            try:
                parts.append(conv.structure(part, kind))
            except Exception as exc:  # each part's errors, not only the first
                exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # the sections: no key of their own
                errors.append(exc)
        if errors:
            raise cattrs.ClassValidationError("While structuring KernelMetrics", errors, KernelMetrics)
        return KernelMetrics(*parts)

    def unstructure(metrics: KernelMetrics) -> Wire:
        wire = conv.unstructure(metrics.sections, sections)
        return {**wire, "ptxas": conv.unstructure(metrics.ptxas)} if metrics.ptxas is not None else wire
    conv.register_structure_hook(KernelMetrics, _object_only(KernelMetrics, structure))
    conv.register_unstructure_hook(KernelMetrics, unstructure)


def _number_or_text(value: Any, _: Any) -> float | str:
    return value if isinstance(value, str) else _number(value, float)


def _number(value: Any, _: type) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number, got {type(value).__name__} {value!r:.40}")
    return float(value)


def _sequence_hook(kind: Any, conv: cattrs.Converter) -> Callable[[Any, Any], Any]:
    args = get_args(kind)
    if get_origin(kind) is list:
        inner = list_structure_factory(kind, conv)
    elif len(args) == 2 and args[1] is Ellipsis:
        inner = homogenous_tuple_structure_factory(kind, conv)
    else:  # a fixed length: (low, high)
        def inner(value: Any, _: Any) -> tuple:
            if len(value) != len(args):
                raise ValueError(f"expected {len(args)} items, got {len(value)}")
            return tuple(conv.structure(item, arg) for item, arg in zip(value, args))

    def structure(value: Any, _: Any) -> Any:
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"expected an array, got {type(value).__name__} {value!r:.40}")
        return inner(value, kind)
    return structure


def _exactly(value: Any, kind: type) -> Any:
    if type(value) is not kind and not (kind is int and isinstance(value, int) and not isinstance(value, bool)):
        raise TypeError(f"expected {kind.__name__}, got {type(value).__name__} {value!r:.40}")
    return value


def decode(cls: type[T], data: object) -> T:
    """`data` as `cls`; ContractError names each key that is unknown, missing or of the wrong type."""
    if not isinstance(data, Mapping):
        raise ContractError(f"{cls.__name__}: expected a mapping, got {type(data).__name__}")
    try:
        return converter().structure(data, cls)
    except (cattrs.BaseValidationError, TypeError, ValueError) as exc:
        raise ContractError(f"{cls.__name__}: {'; '.join(_problems(exc))}") from None


def encode(report: object) -> Wire:
    """The wire's dict of a typed report (lists for tuples, the wire's names)."""
    return converter().unstructure(report)


def decode_verify_report(data: object) -> VerifyReport | Unavailable:
    """What the judge returned: a VerifyReport, or Unavailable (`{"verdict": "unavailable", "reason"}`)."""
    if isinstance(data, Mapping) and data.get("verdict") == "unavailable":
        return decode(Unavailable, data)
    return decode(VerifyReport, data)


def _problems(exc: BaseException) -> list[str]:
    """One line per leaf error, with the key path cattrs recorded on its way down."""
    lines = []
    for path, leaf in failures(exc):
        if isinstance(leaf, cattrs.ForbiddenExtraKeysError):
            lines.append(f"{path or 'report'}: unknown key(s) {sorted(leaf.extra_fields)}")
        elif isinstance(leaf, KeyError):
            lines.append(f"{path}: missing")
        else:
            lines.append(f"{path or 'report'}: {leaf}")
    return lines


def failures(exc: BaseException, path: str = "") -> list[tuple[str, BaseException]]:
    """The leaf errors of a cattrs structure error, in order, each with the key path cattrs noted on its way down
    ('.timing.median_ms', '[2]'); a plain error is its own leaf at `path`. Every reader of cattrs's errors (the
    reports' decode here, the jobs' options, the worker's messages) walks them through this."""
    if not isinstance(exc, cattrs.BaseValidationError):
        return [(path, exc)]
    found: list[tuple[str, BaseException]] = []
    for inner in exc.exceptions:
        note = getattr(inner, "__notes__", None) or []
        where = _where(note[-1] if note else "")
        found.extend(failures(inner, f"{path}{where}"))
    return found or [(path, exc)]


def _where(note: str) -> str:
    """'.key' or '[index]' from a cattrs note ("Structuring class Timing @ attribute median_ms")."""
    if "@ attribute " in note:
        return "." + note.rsplit("@ attribute ", 1)[1].split()[0]
    if "@ index " in note:
        return f"[{note.rsplit('@ index ', 1)[1].split()[0]}]"
    if "@ key " in note:  # the key's repr, spaces and all (ncu's metric names have them)
        return f"[{note.rsplit('@ key ', 1)[1]}]"
    return ""
