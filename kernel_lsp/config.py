"""Typed settings, read from initializationOptions, workspace/configuration and [tool.kernel-lsp].

Keys are camelCase in JSON (snake_case and kebab-case are accepted too, for pyproject.toml), one flat list of
names; the code reads them in sections (`Settings.compile`, `.verify`, `.agent`, ...), each wire name placed by
`WHERE`.
An invalid value produces one problem message and the default is kept for that key. Values are structured by a
cattrs converter (cattrs comes with lsprotocol) with strict hooks per type, then each setting's own checks.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

import cattrs

from kernel_lsp.contracts.options import BASELINE_KINDS, DEFAULT_JOB_TIMEOUT_S, VERIFY_DEVICES, VerifyOptions, camel, snake

CHECK_NAMES = ("compile", "resourceUsage", "hostCompile", "pythonSyntax")
RESOURCE_USAGE_MODES = ("diagnostic", "codeLens", "both", "off")
WATCH_MODES = ("auto", "client", "watchdog", "off")
BACKENDS = ("local", "ray")
AGENT_OBJECTIVES = ("speed", "energy")
AGENT_TARGETS = ("auto", "cuda", "triton", "cute", "cute-dsl")  # what the agent writes kernels in
# compute-sanitizer's four (profilers.sanitizer), then kernel-lsp's own shared-memory check (profile.sanitize.CHECKS)
SANITIZER_TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck", "shared-init")
SECRET_SETTINGS = frozenset({"anthropic_api_key"})  # never echoed in messages or logs
_VERIFY = VerifyOptions()  # the verify settings' defaults are the verify job's
_ARCH_RE = re.compile(r"^(sm|compute)_\d+[a-z]?$")


@dataclass(frozen=True)
class CompileSettings:
    """The compile check: nvcc, the host compiler, clangd, when checks run and what they report."""

    nvcc_path: str = ""  # empty: PATH, then $CUDA_HOME/bin, then /usr/local/cuda/bin
    arch: tuple[str, ...] = ("sm_90",)
    extra_flags: tuple[str, ...] = ()
    include_dirs: tuple[str, ...] = ()
    host_compiler: str = ""  # empty: $CXX, then c++, then g++
    clangd: str = ""  # the first squiggle in plain .cu files; empty: clangd or clangd-NN on PATH; "off": never
    python_path: str = ""  # interpreter whose torch headers load_inline sources compile against
    torch_include_dirs: tuple[str, ...] = ()
    cutlass_include: str = ""  # empty: $CUTLASS_PATH/include, else the nvidia-cutlass package's headers
    debounce_ms: int = 500
    on_change: bool = True
    timeout_s: float = 120.0
    max_parallel: int = 2
    resource_usage: str = "codeLens"  # a lens per kernel; "both" adds an Information diagnostic
    checks: dict[str, bool] = field(default_factory=lambda: {name: True for name in CHECK_NAMES})


@dataclass(frozen=True)
class DiagnosticsSettings:
    """What is published as diagnostics."""

    ignore: tuple[str, ...] = ()  # finding codes (or code prefixes ending in '*') never reported
    max_per_file: int = 500  # at most this many per file: the most severe, one counting the rest; 0: all


@dataclass(frozen=True)
class WorkerSettings:
    """Where jobs run: the worker (local, unix, tcp) or a Ray pool, and their limits."""

    address: str = ""  # empty: a local worker started on the first job; or unix:PATH / tcp:HOST:PORT
    token_file: str = ""  # token for a tcp worker (else $KERNEL_LSP_TOKEN)
    job_timeout_s: float = DEFAULT_JOB_TIMEOUT_S  # a verification's sandbox gets 90% (contracts.options.verify_limits)
    max_frame_mib: int = 64
    backend: str = "local"  # local: one worker (the worker setting); ray: a pool of Ray actors
    ray_address: str = ""  # empty: a Ray instance started by kernel-lsp (or $RAY_ADDRESS); "auto" or HOST:PORT
    ray_actors: int = 0  # 0: one actor per GPU of the cluster (2 CPU actors without GPUs)


@dataclass(frozen=True)
class VerifySettings:
    """Verification: pairing candidates with references, the judge's options, when it runs."""

    references: dict[str, str] = field(default_factory=dict)  # candidate path or glob -> reference, workspace-relative
    kernelbench_roots: tuple[str, ...] = ()  # folders holding level<N>/ problems, workspace-relative or absolute
    on_save: bool = True
    device: str = _VERIFY.device  # auto: cuda when the worker has a GPU, else cpu
    trials: int = _VERIFY.trials
    timed_calls: int = _VERIFY.timed_calls
    warmup_calls: int = _VERIFY.warmup
    tolerances: dict[str, dict[str, float]] = field(default_factory=dict)  # dtype name -> {"atol", "rtol"}
    baselines: tuple[str, ...] = _VERIFY.baselines
    allowed_kernels: tuple[str, ...] = _VERIFY.allowed_kernels  # stock kernels a candidate may also run
    allow_network: bool = _VERIFY.allow_network  # a candidate's process may open sockets
    require_isolation: bool = True  # the agent, bench and campaign refuse candidates when no sandbox can start
    hang_timeout_s: float = _VERIFY.hang_timeout_s  # plus 100x the reference's call per forward: it hangs
    closed_files: bool = True  # verify closed candidates again when a file they depend on changes


@dataclass(frozen=True)
class SanitizeSettings:
    """compute-sanitizer and kernel-lsp's shared-memory check."""

    after_verify: bool = False  # compute-sanitizer after a candidate's first verified run of new content
    tools: tuple[str, ...] = SANITIZER_TOOLS  # the tools a sanitize job runs, in this order
    timeout_s: float = 300.0  # per tool: a sanitized forward call is 10-100x slower than a plain one


@dataclass(frozen=True)
class AgentSettings:
    """The optimization agent: the model, its budgets, what it writes and checks."""

    model: str = "claude-sonnet-4-5"
    max_tokens: int = 8192  # per model turn
    temperature: float | None = None  # None: the model's default (newer models refuse the parameter)
    thinking_budget: int = 0  # extended thinking's tokens per turn, on top of agent_max_tokens; 0: off
    prompt_caching: bool = True  # cache breakpoints: later turns read the conversation so far at 1/10 the price
    context_tokens: int = 60_000  # a conversation past this many prompt tokens is compacted; 0: never
    timeout_s: float = 120.0  # the longest silence from the model API, before or within an answer
    max_retries: int = 4  # per model turn, on 429, 5xx, 529 and lost connections
    api_key: str = field(default="", repr=False)  # empty: $ANTHROPIC_API_KEY; never logged
    base_url: str = ""  # empty: $ANTHROPIC_BASE_URL, else the SDK's default
    max_model_calls: int = 30
    max_total_tokens: int = 2_000_000
    max_dollars: float = 5.0
    input_price_per_mtok: float | None = None  # USD per million input tokens; None: the price table's
    output_price_per_mtok: float | None = None  # USD per million output tokens; None: the price table's
    max_wall_s: float = 1800.0
    max_evaluations: int = 40
    planning: bool = False  # a planning turn first: distinct strategies, one per branch
    objective: str = "speed"  # energy: the least energy per call among candidates of matched speed
    target: str = "auto"  # auto: the current candidate's language; cuda, triton, cute (C++), cute-dsl
    sanitize: bool = True  # compute-sanitizer on each verified candidate on a GPU: errors score zero
    trajectory_dir: str = ""  # empty: trajectories/ in the worker's cache folder


@dataclass(frozen=True)
class WorkspaceSettings:
    """The workspace's closed files: scanning, watching, caching."""

    watch: str = "auto"  # auto: the client's workspace/didChangeWatchedFiles where offered, else watchdog
    check: bool = True  # compile-check closed kernel files of the workspace in the background
    exclude: tuple[str, ...] = ()  # gitignore-style patterns never scanned, watched or checked
    persistent_cache: bool = True  # keep compile results on disk, so a restart republishes without compiling
    max_queued_checks: int = 10_000  # background checks waiting at once; more are dropped, with a warning

# each setting's wire name (camelCase of the key, snake_case here) -> its section and field: what users write stays
# one flat list, the code reads it grouped
WHERE: dict[str, tuple[str, str]] = {
    "nvcc_path": ("compile", "nvcc_path"), "arch": ("compile", "arch"), "extra_flags": ("compile", "extra_flags"),
    "include_dirs": ("compile", "include_dirs"), "host_compiler": ("compile", "host_compiler"),
    "clangd": ("compile", "clangd"), "python_path": ("compile", "python_path"),
    "torch_include_dirs": ("compile", "torch_include_dirs"), "cutlass_include": ("compile", "cutlass_include"),
    "debounce_ms": ("compile", "debounce_ms"), "compile_on_change": ("compile", "on_change"),
    "compile_timeout_s": ("compile", "timeout_s"), "max_parallel_compiles": ("compile", "max_parallel"),
    "resource_usage": ("compile", "resource_usage"), "checks": ("compile", "checks"),
    "ignore": ("diagnostics", "ignore"), "max_diagnostics_per_file": ("diagnostics", "max_per_file"),
    "worker": ("worker", "address"), "worker_token_file": ("worker", "token_file"),
    "job_timeout_s": ("worker", "job_timeout_s"), "max_frame_mib": ("worker", "max_frame_mib"),
    "backend": ("worker", "backend"), "ray_address": ("worker", "ray_address"),
    "ray_actors": ("worker", "ray_actors"),
    "references": ("verify", "references"), "kernelbench_roots": ("verify", "kernelbench_roots"),
    "verify_on_save": ("verify", "on_save"), "verify_device": ("verify", "device"), "trials": ("verify", "trials"),
    "timed_calls": ("verify", "timed_calls"), "warmup_calls": ("verify", "warmup_calls"),
    "tolerances": ("verify", "tolerances"), "baselines": ("verify", "baselines"),
    "allowed_kernels": ("verify", "allowed_kernels"), "verify_allow_network": ("verify", "allow_network"),
    "require_isolation": ("verify", "require_isolation"), "hang_timeout_s": ("verify", "hang_timeout_s"),
    "verify_closed_files": ("verify", "closed_files"),
    "sanitize_after_verify": ("sanitize", "after_verify"), "sanitize_tools": ("sanitize", "tools"),
    "sanitize_timeout_s": ("sanitize", "timeout_s"),
    "agent_model": ("agent", "model"), "agent_max_tokens": ("agent", "max_tokens"),
    "agent_temperature": ("agent", "temperature"), "agent_thinking_budget": ("agent", "thinking_budget"),
    "agent_prompt_caching": ("agent", "prompt_caching"), "agent_context_tokens": ("agent", "context_tokens"),
    "agent_timeout_s": ("agent", "timeout_s"), "agent_max_retries": ("agent", "max_retries"),
    "anthropic_api_key": ("agent", "api_key"), "anthropic_base_url": ("agent", "base_url"),
    "agent_max_model_calls": ("agent", "max_model_calls"), "agent_max_total_tokens": ("agent", "max_total_tokens"),
    "agent_max_dollars": ("agent", "max_dollars"), "agent_input_price_per_mtok": ("agent", "input_price_per_mtok"),
    "agent_output_price_per_mtok": ("agent", "output_price_per_mtok"), "agent_max_wall_s": ("agent", "max_wall_s"),
    "agent_max_evaluations": ("agent", "max_evaluations"), "agent_planning": ("agent", "planning"),
    "agent_objective": ("agent", "objective"), "agent_target": ("agent", "target"),
    "agent_sanitize": ("agent", "sanitize"), "trajectory_dir": ("agent", "trajectory_dir"),
    "watch": ("workspace", "watch"), "workspace_check": ("workspace", "check"),
    "workspace_exclude": ("workspace", "exclude"), "persistent_cache": ("workspace", "persistent_cache"),
    "max_queued_checks": ("workspace", "max_queued_checks"),
}


@dataclass(frozen=True)
class Settings:
    """Every setting, in sections (docs/ARCHITECTURE.md's glossary); users write them flat, by their wire names
    (`WHERE`: `agentModel` is `settings.agent.model`)."""

    compile: CompileSettings = field(default_factory=CompileSettings)
    diagnostics: DiagnosticsSettings = field(default_factory=DiagnosticsSettings)
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    verify: VerifySettings = field(default_factory=VerifySettings)
    sanitize: SanitizeSettings = field(default_factory=SanitizeSettings)
    agent: AgentSettings = field(default_factory=AgentSettings)
    workspace: WorkspaceSettings = field(default_factory=WorkspaceSettings)

    @classmethod
    def of(cls, **flat: Any) -> "Settings":
        """Defaults but `flat` (wire names in snake_case: `Settings.of(agent_model="m", trials=5)`), unchecked."""
        return cls().replaced(**flat)

    def replaced(self, **flat: Any) -> "Settings":
        """A copy with `flat` (wire names in snake_case) set, unchecked (with_updates checks what users write)."""
        grouped: dict[str, dict[str, Any]] = {}
        for name, value in flat.items():
            section, name_in_section = WHERE[name]
            grouped.setdefault(section, {})[name_in_section] = value
        return dataclasses.replace(self, **{section: dataclasses.replace(getattr(self, section), **values)
                                            for section, values in grouped.items()})

    def value(self, name: str) -> Any:
        """The setting of wire name `name` (snake_case)."""
        section, name_in_section = WHERE[name]
        return getattr(getattr(self, section), name_in_section)

    def check_enabled(self, name: str) -> bool:
        return self.compile.checks.get(name, True)

    def is_ignored(self, code: str) -> bool:
        return any(code == c or (c.endswith("*") and code.startswith(c[:-1])) for c in self.diagnostics.ignore)

    def with_updates(self, raw: dict[str, Any]) -> tuple["Settings", list[str]]:
        """A copy with the valid entries of `raw` applied; problems name each rejected key."""
        problems: list[str] = []
        updates: dict[str, Any] = {}
        for key, value in raw.items():
            name = snake(key)
            if name not in WHERE:
                problems.append(f"unknown setting '{key}'")
                continue
            try:
                updates[name] = _convert(name, setting_hint(name), value, self.value(name))
            except (TypeError, ValueError) as exc:
                kept = "the previous value" if name in SECRET_SETTINGS else repr(self.value(name))
                problems.append(f"setting '{camel(name)}': {exc}; using {kept}")
        return self.replaced(**updates), problems

    def kernelbench_paths(self, base: Path | None) -> list[Path]:
        """kernelbenchRoots as folders: relative ones under `base` (none: left relative), absolute ones as they are."""
        roots = [Path(root).expanduser() for root in self.verify.kernelbench_roots]
        return roots if base is None else [base / root for root in roots]  # base / an absolute root is that root

    def fingerprint(self) -> tuple:
        """What in the settings changes a compile's result (part of the cache key)."""
        c = self.compile
        return (c.arch, c.extra_flags, c.include_dirs, c.host_compiler, c.torch_include_dirs, c.cutlass_include,
                os.environ.get("CUTLASS_PATH", ""), tuple(sorted(c.checks.items())))


SECTION_CLASSES: dict[str, type] = {f.name: f.default_factory for f in dataclasses.fields(Settings)}  # type: ignore


def setting_hint(name: str) -> Any:
    """The type of the setting of wire name `name` (snake_case)."""
    section, name_in_section = WHERE[name]
    return get_type_hints(SECTION_CLASSES[section])[name_in_section]


_CHOICES = {"resource_usage": RESOURCE_USAGE_MODES, "verify_device": VERIFY_DEVICES, "watch": WATCH_MODES,
            "backend": BACKENDS, "agent_objective": AGENT_OBJECTIVES, "agent_target": AGENT_TARGETS}


def _structure_bool(value: Any, _: type) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {value!r}")
    return value


def _structure_number(value: Any, kind: type) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number, got {value!r}")
    if value < 0:
        raise ValueError(f"must not be negative, got {value!r}")
    return kind(value)


def _structure_str(value: Any, _: type) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _structure_strings(value: Any, _: type) -> tuple[str, ...]:
    """A list of strings, or one string."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
        raise TypeError(f"expected a list of strings, got {value!r}")
    return tuple(items)


def _structure_checks(value: Any, _: type) -> dict[str, bool]:
    if not isinstance(value, dict):
        raise TypeError(f"expected an object of check names to true/false, got {value!r}")
    for key, on in value.items():
        if key not in CHECK_NAMES:
            raise ValueError(f"unknown check '{key}' (known: {', '.join(CHECK_NAMES)})")
        if not isinstance(on, bool):
            raise TypeError(f"check '{key}' expects true or false, got {on!r}")
    return dict(value)


def _structure_references(value: Any, _: type) -> dict[str, str]:
    if not isinstance(value, dict):
        raise TypeError(f"expected an object of candidate paths to reference paths, got {value!r}")
    bad = {key: path for key, path in value.items() if not isinstance(key, str) or not isinstance(path, str)}
    if bad:
        raise TypeError(f"expected candidate and reference paths as strings, got {bad!r}")
    return dict(value)


def _structure_tolerances(value: Any, _: type) -> dict[str, dict[str, float]]:
    if not isinstance(value, dict):
        raise TypeError(f"expected an object of dtype names to {{\"atol\": ..., \"rtol\": ...}}, got {value!r}")
    tolerances = {}
    for dtype, tolerance in value.items():
        if not isinstance(tolerance, dict) or set(tolerance) != {"atol", "rtol"}:
            raise TypeError(f"tolerance for '{dtype}' needs exactly the keys atol and rtol, got {tolerance!r}")
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in tolerance.values()):
            raise ValueError(f"tolerance for '{dtype}' needs non-negative numbers, got {tolerance!r}")
        tolerances[dtype] = {"atol": float(tolerance["atol"]), "rtol": float(tolerance["rtol"])}
    return tolerances


def _settings_converter() -> cattrs.Converter:
    """Structures one setting's JSON value into its field's type: strict (no "1" for 1, no 0 for false), or a
    TypeError / ValueError whose message the user reads."""
    converter = cattrs.Converter()
    converter.register_structure_hook(bool, _structure_bool)
    converter.register_structure_hook(int, _structure_number)
    converter.register_structure_hook(float, _structure_number)
    converter.register_structure_hook(str, _structure_str)
    for generic, hook in ((tuple[str, ...], _structure_strings), (dict[str, bool], _structure_checks),
                          (dict[str, str], _structure_references),
                          (dict[str, dict[str, float]], _structure_tolerances)):
        converter.register_structure_hook_func(lambda hint, generic=generic: hint == generic, hook)
    return converter


_CONVERTER = _settings_converter()
_MERGED = frozenset({"checks", "references", "tolerances"})  # an object setting adds to what the layers below set


def _convert(name: str, hint: Any, value: Any, current: Any) -> Any:
    """One setting's value, structured by the converter, then the checks of that one setting."""
    converted = _CONVERTER.structure(value, hint)
    choices = _CHOICES.get(name)
    if choices is not None and converted not in choices:
        raise ValueError(f"expected one of {', '.join(choices)}, got {value!r}")
    if name == "baselines" and not set(converted) <= set(BASELINE_KINDS):
        raise ValueError(f"expected a list of {', '.join(BASELINE_KINDS)}, got {value!r}")
    if name == "arch" and (not converted or not all(_ARCH_RE.match(a) for a in converted)):
        raise ValueError(f"expected architectures like 'sm_90', got {value!r}")
    if name in ("hang_timeout_s", "sanitize_timeout_s") and not converted > 0:
        raise ValueError(f"must be more than 0, got {value!r}")
    if name == "sanitize_tools" and (not converted or not set(converted) <= set(SANITIZER_TOOLS)):
        raise ValueError(f"expected a list of {', '.join(SANITIZER_TOOLS)}, got {value!r}")
    return {**current, **converted} if name in _MERGED else converted


def unwrap_section(raw: Any) -> dict[str, Any]:
    """Clients send settings either flat or under a 'kernelLsp' / 'kernel-lsp' key."""
    if not isinstance(raw, dict):
        return {}
    for key in ("kernelLsp", "kernel-lsp", "kernel_lsp"):
        if isinstance(raw.get(key), dict):
            return raw[key]
    return raw


def pyproject_settings(folder: Path) -> tuple[dict[str, Any], list[str]]:
    """[tool.kernel-lsp] of folder/pyproject.toml, and a problem if the file cannot be read."""
    path = folder / "pyproject.toml"
    if not path.is_file():
        return {}, []
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        return {}, [f"{path}: cannot read [tool.kernel-lsp]: {exc}"]
    section = data.get("tool", {}).get("kernel-lsp", {})
    if not isinstance(section, dict):
        return {}, [f"{path}: [tool.kernel-lsp] must be a table"]
    return section, []


def resolve_settings(*layers: dict[str, Any]) -> tuple[Settings, list[str]]:
    """Defaults, then each layer in order (later layers win)."""
    settings, problems = Settings(), []
    for layer in layers:
        settings, layer_problems = settings.with_updates(layer)
        problems.extend(layer_problems)
    return settings, problems


def cache_dir() -> Path:
    """Where the worker keeps builds: $KERNEL_LSP_CACHE_DIR, else $XDG_CACHE_HOME/kernel-lsp, else ~/.cache."""
    explicit = os.environ.get("KERNEL_LSP_CACHE_DIR")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kernel-lsp"
