"""Finding: the one result type every checker returns (compiler, verifier, profiler, agent).

Positions are 0-based (line, character), as in LSP; the CLI adds 1 when it prints.
Checkers never import pygls: the server alone turns findings into LSP objects.

A finding's message (and its related messages) is `scrub`bed when the finding is made: candidates are untrusted
code, and what they raise or print becomes messages the editor shows and the model reads, so anything shaped like a
credential, and the exact values of the credentials this process knows, are replaced with `[redacted]`, and the
text is bounded. The credentials a command uses (the Anthropic API key, the worker's token) are taken out of
os.environ for the command's lifetime (`secrets_held`, `secret_variable`), so no child it starts inherits them.
"""

from __future__ import annotations

import contextlib
import enum
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlparse

SOURCE = "kernel-lsp"  # a finding's source, as the editor shows it beside the message


class Severity(enum.IntEnum):
    """Same numbers as LSP's DiagnosticSeverity."""

    ERROR = 1
    WARNING = 2
    INFORMATION = 3
    HINT = 4

    @property
    def label(self) -> str:
        return {1: "error", 2: "warning", 3: "info", 4: "hint"}[int(self)]


@dataclass(frozen=True, order=True)
class Position:
    line: int
    character: int


@dataclass(frozen=True, order=True)
class Range:
    start: Position
    end: Position

    @classmethod
    def of(cls, line: int, col: int, end_line: int | None = None, end_col: int | None = None) -> "Range":
        end_line = line if end_line is None else end_line
        end_col = col if end_col is None else end_col
        return cls(Position(line, col), Position(end_line, end_col))

    @classmethod
    def line(cls, line: int, length: int = 0) -> "Range":
        """A whole line (or its first `length` characters)."""
        return cls(Position(line, 0), Position(line, length))


@dataclass(frozen=True)
class Related:
    """A secondary location (a note, an instantiation context, the other end of a redefinition)."""

    uri: str
    range: Range
    message: str

    def __post_init__(self) -> None:
        if isinstance(self.message, str):
            object.__setattr__(self, "message", scrub(self.message))


@dataclass(frozen=True)
class Finding:
    uri: str
    range: Range
    severity: Severity
    source: str
    code: str
    message: str
    related: tuple[Related, ...] = ()
    data: dict[str, Any] | None = field(default=None, compare=False, hash=False)

    def __post_init__(self) -> None:
        # a candidate's exception text or output ends up here: no credential in it, and a bounded length
        if isinstance(self.message, str):
            object.__setattr__(self, "message", scrub(self.message))

    def to_dict(self) -> dict[str, Any]:
        return {
            "uri": self.uri,
            "range": _range_to_list(self.range),
            "severity": int(self.severity),
            "source": self.source,
            "code": self.code,
            "message": self.message,
            "related": [
                {"uri": r.uri, "range": _range_to_list(r.range), "message": r.message} for r in self.related
            ],
            "data": self.data,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Finding":
        return cls(
            uri=d["uri"],
            range=_range_from_list(d["range"]),
            severity=Severity(d["severity"]),
            source=d["source"],
            code=d["code"],
            message=d["message"],
            related=tuple(Related(r["uri"], _range_from_list(r["range"]), r["message"]) for r in d.get("related", ())),
            data=d.get("data"),
        )


def _range_to_list(r: Range) -> list[int]:
    return [r.start.line, r.start.character, r.end.line, r.end.character]


def _range_from_list(v: list[int]) -> Range:
    return Range(Position(v[0], v[1]), Position(v[2], v[3]))


def path_to_uri(path: str | Path) -> str:
    return "file://" + quote(str(Path(path).absolute()))


def uri_to_path(uri: str) -> Path:
    parsed = urlparse(uri)
    if parsed.scheme not in ("file", ""):
        raise ValueError(f"not a file URI: {uri}")
    return Path(unquote(parsed.path))


# --- secrets: kept out of children's environments, and out of every message -----------------------------------------

REDACTED = "[redacted]"
MESSAGE_LIMIT = 8000  # characters a finding's message keeps (a candidate may raise or print megabytes)
# the credentials kernel-lsp itself reads; a command holds them in this module, never in os.environ
SECRET_VARIABLES = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "KERNEL_LSP_TOKEN")
_WORDS = ("key", "token", "secret", "passw", "credential", "auth", "cookie")
CREDENTIAL_WORDS = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|COOKIE", re.IGNORECASE)
_MIN_REGISTERED = 6  # a registered secret shorter than this is not searched for (it would hit ordinary words)
_MIN_ENVIRONMENT = 8  # nor a credential-named variable's value shorter than this (flags such as "1" or "true")

_registered: set[str] = set()
_held: dict[str, str] | None = None  # while a command holds its secrets (secrets_held): name -> value
_credential_names: dict[str, bool] = {}
_raw_names: dict[bytes | str, bool] = {}

# credential shapes, each with the text it cannot be without (the pattern runs only where that is found); a match
# is replaced whole with REDACTED
_SHAPES = [(needles, re.compile(pattern)) for needles, pattern in (
    # a PEM private key, to its END line (or, cut short, over what is left of its base64)
    (("PRIVATE KEY-----",),
     r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY-----(?s:.*?-----END[A-Z0-9 ]*PRIVATE KEY-----|(?:[A-Za-z0-9+/=\s]|\\[nr])*)"),
    (("sk-",), r"(?<![A-Za-z0-9_-])sk-ant-[A-Za-z0-9_-]{8,}"),  # Anthropic
    (("sk-",), r"(?<![A-Za-z0-9_-])sk-[A-Za-z0-9_-]{20,}"),  # OpenAI and the like
    (("gh", "github_pat_"), r"(?<![A-Za-z0-9_])(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})"),  # GitHub
    (("AKIA", "ASIA"), r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[0-9A-Z]{16}(?![0-9A-Z])"),  # AWS access key id
    (("xox",), r"(?<![A-Za-z0-9])xox[abprs]-[A-Za-z0-9-]{10,}"),  # Slack
    (("AIza",), r"(?<![A-Za-z0-9_])AIza[0-9A-Za-z_-]{35}"),  # Google API key
    (("hf_",), r"(?<![A-Za-z0-9_])hf_[A-Za-z0-9]{30,}"),  # Hugging Face
    (("eyJ",), r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}"),  # a JWT
)]
_BEARER = re.compile(r"(?i:\b(bearer)\s+)[A-Za-z0-9._~+/=-]{8,}")
_URL_PASSWORD = re.compile(r"(?<=://)([^/\s:@\"']+):[^/\s@\"']+(?=@)")  # scheme://user:password@host
# NAME=value, name: value, "name": "value", 'name' = 'value', --name=value: the value of a credential-named field
_ASSIGNMENT = re.compile(
    r"""(?<![\w.])(?P<name>\\?["']?[A-Za-z_][\w.-]*\\?["']?)(?P<sep>\s*[:=]\s*)"""
    r"""(?P<scheme>(?:Bearer|Basic|Token)\s+)?"""
    r"""(?P<value>\\?"[^"\\\n]*\\?"|\\?'[^'\\\n]*\\?'|[^\s"'\\,;&|<>(){}\[\]]+(?=$|[\s"'\\,;&|<>)}\]]))""")
_NOT_CREDENTIAL = re.compile(r"(?:error|exception|warning|interrupt|exit)$|keyboard|keyword|monkey|author|tokeniz",
                             re.IGNORECASE)


def register_secret(value: str | None) -> None:
    """A value `scrub` always redacts (the API key and the worker's token, where they are read), whatever its
    shape."""
    if value and len(value) >= _MIN_REGISTERED:
        _registered.add(value)


def credential_name(name: str) -> bool:
    """Whether a variable or field of this name holds a credential (API_KEY, x-auth-token, db_password...)."""
    known = _credential_names.get(name)
    if known is None:
        bare = name.strip("\\\"'")
        known = _credential_names[name] = bool(CREDENTIAL_WORDS.search(bare)) and not _NOT_CREDENTIAL.search(bare)
    return known


def _known_values() -> list[str]:
    """The values to redact wherever they appear: registered ones, held ones and those of credential-named
    variables in os.environ now; longest first, so a value holding another is redacted whole."""
    values = set(_registered)
    if _held:
        values.update(v for v in _held.values() if len(v) >= _MIN_REGISTERED)
    values.update(_environment_credentials())
    return sorted(values, key=len, reverse=True)


def _environment_credentials() -> list[str]:
    """The values of os.environ's credential-named variables, read from its raw mapping where it has one (every
    finding is scrubbed: decoding the whole environment each time costs ten times as much)."""
    raw = getattr(os.environ, "_data", None)
    if not isinstance(raw, dict):
        return [value for name, value in os.environ.items()
                if len(value) >= _MIN_ENVIRONMENT and credential_name(name)]
    found = []
    for name, value in raw.items():
        if len(value) < _MIN_ENVIRONMENT:
            continue
        known = _raw_names.get(name)
        if known is None:
            known = _raw_names[name] = credential_name(os.fsdecode(name) if isinstance(name, bytes) else name)
        if known:
            found.append(os.fsdecode(value) if isinstance(value, bytes) else value)
    return found


def _assignment(match: re.Match[str]) -> str:
    name, value = match["name"], match["value"]
    if not credential_name(name):
        return match[0]
    quote_open = re.match(r"\\?[\"']", value)
    if quote_open:  # a quoted value: redacted unless too short to be a secret, or words ("the key is missing")
        inner = value[len(quote_open[0]):-len(quote_open[0])]
        if len(inner) < 6 or re.search(r"\s", inner):
            return match[0]
        return f"{name}{match['sep']}{match['scheme'] or ''}{quote_open[0]}{REDACTED}{quote_open[0]}"
    environment_style = re.fullmatch(r"[A-Z][A-Z0-9_]*", name) is not None and match["sep"] == "="
    looks_random = len(value) >= 8 and re.search(r"\d", value) and re.search(r"[A-Za-z]", value)
    if not (match["scheme"] or (environment_style and len(value) >= 6) or looks_random):
        return match[0]  # `key_len = 64`, `token: none`, `KEY=1`: ordinary text
    return f"{name}{match['sep']}{match['scheme'] or ''}{REDACTED}"


def scrub(text: str, limit: int | None = MESSAGE_LIMIT) -> str:
    """`text` with every credential redacted (the exact values this process knows, then credential shapes: API keys
    and tokens, PEM private keys, `Bearer ...`, a URL's password, the value of a credential-named assignment) and,
    past `limit` characters, cut to its head with a note of how much went (at most `limit` characters in all; None:
    no bound). Scrubbing scrubbed text changes nothing."""
    original = len(text)
    if limit is not None and original > 2 * limit + 4096:
        text = text[:2 * limit + 4096]  # what the final cut drops anyway: the patterns never read megabytes
    dropped = original - len(text)
    for value in _known_values():
        if value in text:
            text = text.replace(value, REDACTED)
    for needles, shape in _SHAPES:
        for needle in needles:
            if needle in text:
                text = shape.sub(REDACTED, text)
                break
    if "://" in text:
        text = _URL_PASSWORD.sub(lambda m: f"{m[1]}:{REDACTED}", text)
    lower = text.lower()
    if "bearer" in lower:
        text = _BEARER.sub(lambda m: f"{m[1]} {REDACTED}", text)
    if any(word in lower for word in _WORDS):  # most messages name no credential at all
        text = _ASSIGNMENT.sub(_assignment, text)
    if limit is not None and len(text) > limit:
        keep = max(limit - len(f" [... {original + len(text)} characters cut]"), 0)  # the note's longest
        text = text[:keep] + f" [... {len(text) - keep + dropped} characters cut]"
    return text


@contextlib.contextmanager
def secrets_held(names: Iterable[str] = SECRET_VARIABLES) -> Iterator[None]:
    """For a command's lifetime (kernel_lsp.cli.main): the credentials it may use taken out of os.environ into this
    module, so no process it starts (a worker, a compiler, a Ray instance, and through them a candidate) inherits
    them, and registered for `scrub`. `secret_variable` reads them. At the end they go back into os.environ (where
    nothing set them since), so a caller in the same process (a test) finds its environment as it was."""
    global _held
    outer, taken = _held, {}
    _held = {} if outer is None else dict(outer)
    for name in names:
        value = os.environ.pop(name, None)
        if value is not None:
            taken[name] = value
            if value:
                _held[name] = value
                register_secret(value)
    try:
        yield
    finally:
        _held = outer
        for name, value in taken.items():
            os.environ.setdefault(name, value)


def secret_variable(name: str) -> str | None:
    """The credential in environment variable `name` (empty: None). While a command holds its secrets the value is
    kept here and never left in os.environ (one set since is taken out too); outside a command (a library caller)
    os.environ is read as it is."""
    value = os.environ.get(name)
    if _held is not None:
        if value is not None:
            os.environ.pop(name, None)
            if value:
                _held[name] = value
        value = _held.get(name)
    register_secret(value)
    return value or None


def held_secret_names() -> list[str]:
    """The names of the credentials taken out of os.environ for this command (kernel-lsp doctor lists them among
    those a candidate never gets)."""
    return sorted(_held or ())


@dataclass(frozen=True)
class CodeDoc:
    """What a finding code means and what to do about it (docs/reference/findings.md is generated from CODES)."""

    severity: str
    meaning: str
    action: str


# Every finding code kernel-lsp reports. A code ending in '*' is a family named at run time (ncu's rule names).
# tests/unit/test_docs_reference.py fails when a code the source reports is missing here.
CODES: dict[str, CodeDoc] = {
    "nvcc-error": CodeDoc("error", "nvcc's front end (EDG) or nvcc itself; the EDG number (e.g. `#177-D`) ends the message",
                          "fix the source at the marked position"),
    "clang-error": CodeDoc("error", "clangd's error on a plain `.cu`, shown (marked preliminary) while nvcc runs, once "
                                    "clang and nvcc agreed on an earlier version of the file; nvcc's result replaces it",
                           "fix the source, or set `clangd` to `off` if clang's wording or strictness gets in the way"),
    "nvcc-warning": CodeDoc("warning", "a warning of nvcc's front end or of nvcc", "fix it, or add the code to `ignore`"),
    "nvcc-remark": CodeDoc("information", "a remark of nvcc's front end", "none needed; `ignore` hides it"),
    "host-error": CodeDoc("error", "the host C++ compiler on `load_inline`'s `main.cpp`", "fix the `cpp_sources` text"),
    "torch-cpu-build": CodeDoc("information", "a CUDA header of torch's (or of a CUDA library torch includes) that this "
                                              "CPU build of torch does not ship: the machine's limit, not an error of "
                                              "the file (the compiler's own code is in the finding's data)",
                               "check the file where torch is a CUDA build (a GPU machine, or a remote worker)"),
    "host-warning": CodeDoc("warning", "a host compiler warning on `load_inline`'s `main.cpp`", "fix it or `ignore` it"),
    "host-note": CodeDoc("information", "a host compiler note (context of another message)", "read it with the message it belongs to"),
    "ptxas-error": CodeDoc("error", "ptxas failed (e.g. too much shared memory), placed on the kernel",
                           "lower the kernel's resource use, or target an architecture that has them"),
    "ptxas-warning": CodeDoc("warning", "a ptxas warning, placed on the kernel", "read ptxas's text; fix or `ignore` it"),
    "ptxas-resources": CodeDoc("information", "registers, stack, spills, shared memory and barriers of a kernel, per architecture",
                               "nothing; shown as a lens by default (`resourceUsage`)"),
    "ptxas-spill": CodeDoc("warning", "the kernel spills registers to local memory (bytes stored and loaded)",
                           "keep fewer values live, or allow more registers (`__launch_bounds__`, `-maxrregcount`)"),
    "python-syntax": CodeDoc("error", "the `.py` file does not parse (what can be found is still checked)",
                             "fix the syntax error"),
    "extension-unresolved": CodeDoc("information", "a `load_inline` argument kernel-lsp cannot read statically (e.g. an f-string)",
                                    "use a literal or a module-level string constant if you want it checked"),
    "extension-source-missing": CodeDoc("warning", "a `cpp_extension.load(sources=[...])` file does not exist",
                                        "fix the path (relative to the `.py` file's folder)"),
    "nvcc-missing": CodeDoc("error", "nvcc is missing or broken", "install the CUDA toolkit or set `nvccPath`"),
    "host-compiler-missing": CodeDoc("error", "the host C++ compiler is missing or broken",
                                     "install g++ or set `hostCompiler`"),
    "torch-missing": CodeDoc("error", "torch's headers were not found for a `load_inline` source",
                             "set `pythonPath` to an interpreter with torch, or `torchIncludeDirs`"),
    "compile-timeout": CodeDoc("error", "the compiler ran past `compileTimeoutS` and was killed",
                               "raise `compileTimeoutS`, or simplify the translation unit"),
    "compile-failed": CodeDoc("error", "the compiler failed without a message kernel-lsp could place",
                              "run the command from the server log by hand"),
    "diagnostics-left-out": CodeDoc("warning", "one file has more diagnostics than `maxDiagnosticsPerFile`: the "
                                    "most severe are shown, this one counts the rest (as severe as the worst of them)",
                                    "`kernel-lsp check FILE` prints every compile diagnostic; or raise the setting"),
    "internal-error": CodeDoc("error", "kernel-lsp itself failed on this file", "see the server log; report it as a bug"),
    "run-timeout": CodeDoc("error", "the candidate hangs: a call did not return within `hangTimeoutS` plus, per forward, "
                                    "100 times the reference's slowest call (10 times its own slowest forward if "
                                    "longer), or its sandboxed run passed its wall time (90% of `jobTimeoutS`); its "
                                    "processes were killed",
                           "look for a hang or an endless loop; raise `hangTimeoutS` for a long first compile or "
                           "autotuning, `jobTimeoutS` if the whole work is large"),
    "run-signal": CodeDoc("error", "the candidate's process died from a signal (e.g. a segfault)",
                          "look for out-of-bounds accesses in host code or the extension"),
    "run-out-of-memory": CodeDoc("error", "the run exceeded its host or GPU memory limit", "use less memory"),
    "run-cuda-error": CodeDoc("error", "a CUDA error (illegal address, launch failure, ...) in the candidate",
                              "check indices and launch configuration; run with `compute-sanitizer`"),
    "run-python-exception": CodeDoc("error", "the candidate raised a Python exception, placed on the deepest line of your file",
                                    "fix the exception"),
    "run-not-isolated": CodeDoc("warning", "a run-python job or an extension's build ran its code without the "
                                           "candidate's full sandbox: no namespaces (bubblewrap missing, user "
                                           "namespaces disabled), no Landlock or no seccomp",
                                "install bubblewrap (`kernel-lsp doctor` says what is missing) or run on a kernel "
                                "with Landlock and seccomp"),
    "run-compile-error": CodeDoc("error", "building the candidate's extension or Triton kernel failed at run time",
                                 "read the compiler output in the message"),
    "run-disk-limit": CodeDoc("error", "the run's files (its folders, and files its processes hold open after deleting "
                                       "them) or one file grew past the disk limit; its processes were killed and its "
                                       "files removed",
                              "write less; raise the job's `limits.diskBytes` (4 GiB by default) if the files are "
                              "needed"),
    "run-sandbox-error": CodeDoc("error", "the sandbox itself failed to run the candidate", "see the worker log"),
    "verify-mismatch": CodeDoc("error", "trials failed: values outside the tolerance (worst error, element, expected and actual value)",
                               "fix the kernel; if the difference is expected precision loss, set `tolerances`"),
    "verify-nan": CodeDoc("error", "NaN or Inf in the output",
                          "fix the kernel; when the reference produces them too, change the inputs"),
    "verify-output": CodeDoc("error", "the output is not a plain dense `torch.Tensor`, or its shape, dtype, device or count differ",
                             "return the same outputs as the reference"),
    "verify-reference-error": CodeDoc("error", "the reference that a header line or `references` names does not exist",
                                      "fix the `# kernel-lsp: reference=` line or the `references` setting"),
    "verify-not-isolated": CodeDoc("warning", "the candidate's process could not be confined in part: no sandbox "
                                                  "(bubblewrap missing, user namespaces disabled), no Landlock, no "
                                                  "seccomp, or `verifyAllowNetwork`",
                                   "install bubblewrap (`kernel-lsp doctor` says what is missing), run on a kernel "
                                   "with Landlock and seccomp, or accept the risk; `requireIsolation` refuses such "
                                   "runs for the agent, bench and campaign"),
    "verify-output-copied": CodeDoc("information", "the candidate returns one output buffer on every call, so each "
                                    "timed call's output was copied as it returned (a later call overwrites it), and "
                                    "those copies are in its time",
                                    "return a new tensor per call for a figure without them (or accept the copy)"),
    "verify-judge-disturbed": CodeDoc("warning", "the judge's own process was not scheduled as it started (reniced, "
                                                 "pinned to fewer CPUs, its CPU-time limits lowered) while it measured "
                                                 "a baseline or the device's peaks, or the measured bandwidth was far "
                                                 "under the datasheet's: those figures were used for this run only, "
                                                 "not cached",
                                      "verify again on a quiet machine; if it repeats, look for processes of the "
                                      "worker's user that outlive a candidate"),
    "verify-shared-unpoisoned": CodeDoc("warning", "(CUDA) shared memory could not be filled with the poison before "
                                                   "the runs (no libcuda, the fill's PTX did not load), so the rerun "
                                                   "over other bytes cannot catch a read of shared memory never written",
                                        "read the message; the sanitize job's shared-init check needs the same fill"),
    "verify-poison-short": CodeDoc("warning", "(CUDA) the free device memory could not be poisoned for the whole "
                                              "output (the device too full beside the judge's copies), so an output "
                                              "never written may read zeros instead of NaN",
                                   "verify on a GPU with more memory, or trust a mismatch of unwritten elements less"),
    "verify-unavailable": CodeDoc("information", "no verdict: no worker, a job timed out or was lost, no GPU for device "
                                                 "`cuda`, a package the candidate imports missing where the worker runs "
                                                 "(the message gives its install command), a broken reference; the "
                                                 "machine's or the setup's limit, not an error of the file",
                                  "read the message; `kernel-lsp doctor` shows what is missing"),
    "integrity-input-mutated": CodeDoc("error", "the candidate changed an input tensor (bytes, shape, stride or offset)",
                                       "write outputs to new tensors"),
    "integrity-uninitialized-output": CodeDoc("error", "(CUDA) reruns over differently poisoned memory (the free device memory and every SM's shared memory) differ: it read memory it never wrote",
                                              "initialise every output element, and shared memory before it is read (clear a tile's padding, or mask it with a select, not `* 0`)"),
    "integrity-nondeterministic": CodeDoc("error", "(CPU) two runs on the same inputs gave different outputs",
                                          "remove races and uninitialised reads"),
    "integrity-no-custom-kernel": CodeDoc("error", "no kernel of the candidate's own ran (all stock or allowed ones, or none)",
                                          "compute the result in your own kernel; list library kernels in `allowedKernels`"),
    "integrity-other-stream": CodeDoc("error", "the candidate's own kernels ran on a stream other than the current one",
                                      "launch on `torch.cuda.current_stream()`"),
    "integrity-pending-work": CodeDoc("error", "the output still changed after `forward` returned and the stream was done",
                                      "finish all work on the current stream before returning"),
    "integrity-thread": CodeDoc("error", "a thread the candidate started is still alive", "do not start threads"),
    "integrity-process-left": CodeDoc("error", "a process the candidate started still ran after the candidate's own "
                                               "process ended (a daemon, a new session, a double fork); it was killed",
                                      "wait for every process you start, and start none that outlives the call"),
    "integrity-timer-patched": CodeDoc("error", "a timing or synchronisation function was replaced", "do not patch timers"),
    "integrity-torch-patched": CodeDoc("error", "the candidate replaced a public torch callable or changed a global numerics flag",
                                       "leave torch and its global flags as they are"),
    "integrity-timed-output": CodeDoc("error", "the output of a timed call differs from the reference's for its inputs",
                                      "compute the result in every call"),
    "integrity-stale-output": CodeDoc("error", "forward returned an earlier answer when called with new values",
                                      "do not cache outputs across calls"),
    "integrity-output-not-from-kernel": CodeDoc("error", "the output does not depend on what the candidate's own kernels wrote",
                                                "make your kernels produce the output"),
    "integrity-library-work": CodeDoc("warning", "the candidate's own kernels took under 5% of its time while library "
                                      "code (cuBLAS, cuDNN, ATen) ran the reference's main operation; a warning in "
                                      "the editor, a rejection for the agent's reward, `bench` and `campaign`",
                                      "do the main operation in your own kernels"),
    "integrity-below-floor": CodeDoc("error", "the median time is under the physical floor (bytes or FLOPs bound) by more than its margin",
                                     "do all the work inside the timed call"),
    "cute-dsl-error": CodeDoc("error", "a CuTe DSL kernel failed to compile (on save)", "fix the DSL code at the marked line"),
    "cute-dsl-resources": CodeDoc("information", "resources of a compiled CuTe DSL kernel, or why they could not be read",
                                  "nothing"),
    "cute-dsl-unavailable": CodeDoc("information", "the CuTe DSL check could not run (no worker, no `nvidia-cutlass-dsl`)",
                                    "install the `cute-dsl` extra where the worker runs"),
    "cute-dsl-not-reached": CodeDoc("information", "the file's code did not reach a `@cute.jit` function, so nothing was compiled",
                                    "call the kernel from module-level code or from the `Model` the checker builds"),
    "cute-dsl-contract": CodeDoc("information", "the CuTe DSL check's report broke its contract (the process that "
                                 "built it ran the file: a file that rewrites the checker is told so)",
                                 "nothing in the kernel: report it if the file does not touch kernel-lsp"),
    "hint-memory-bound": CodeDoc("information", "the kernel is memory bound (percentages, DRAM GB/s against the ceiling)",
                                 "move fewer bytes: coalesce, reuse from shared memory or registers, fuse kernels"),
    "hint-compute-bound": CodeDoc("information", "the kernel is compute bound",
                                  "cheaper arithmetic: tensor cores, lower precision, fewer instructions per element"),
    "hint-latency-bound": CodeDoc("information", "the kernel is latency bound",
                                  "more blocks or warps in flight, more independent work per thread"),
    "sanitizer-memcheck": CodeDoc("error", "compute-sanitizer's memcheck: an out-of-bounds or misaligned access in the "
                                  "candidate's kernel, on the line of the access, with the thread, block and the "
                                  "address's place relative to the nearest allocation",
                                  "fix the index or the bound check; the kernel may pass its trials and still read "
                                  "past its input on another size, GPU or driver"),
    "sanitizer-racecheck": CodeDoc("error", "compute-sanitizer's racecheck: two threads access the same shared memory "
                                   "without a barrier between them (a warning for hazards racecheck rates lower); "
                                   "the other access is the related location",
                                   "add the missing `__syncthreads()` (or `__syncwarp()`) between the write and the "
                                   "read"),
    "sanitizer-initcheck": CodeDoc("error", "compute-sanitizer's initcheck: the kernel reads global memory nothing "
                                   "wrote (e.g. a `torch.empty` buffer)",
                                   "write the memory first, or allocate it with `torch.zeros`"),
    "sanitizer-synccheck": CodeDoc("error", "compute-sanitizer's synccheck: a barrier reached by only part of a "
                                   "block or warp (a `__syncthreads()` in divergent code)",
                                   "move the barrier out of the condition, so every thread reaches it"),
    "sanitizer-shared-init": CodeDoc("error", "kernel-lsp's shared-memory check (initcheck does not check shared "
                                     "memory): output elements changed with what every SM's shared memory held "
                                     "before the forward call, so a kernel reads shared memory no thread of its "
                                     "block wrote; on the `__shared__` declaration (it sees the output, not the read), "
                                     "with the arrays' reads as related information",
                                     "write every element of the shared array a thread will read before the "
                                     "`__syncthreads()` that precedes the read, or read only what was written"),
    "program-error": CodeDoc("error", "a standalone `.cu` program (its own `main()`) run by the worker failed: a "
                             "non-zero exit, a signal, a timeout or a CUDA error it printed; on the `FILE:LINE` it "
                             "printed, else on `main`",
                             "read the message; `kernel-lsp sanitize FILE.cu` finds the access that failed"),
    "sanitizer-library": CodeDoc("information", "compute-sanitizer errors in kernels that are not the candidate's "
                                 "(PyTorch's or a library's), listed apart and never placed on the user's lines",
                                 "check what the candidate passes to those operations (e.g. an uninitialised "
                                 "buffer)"),
    "hint-small-grid": CodeDoc("information", "fewer blocks than SMs; gain: the share of idle SMs",
                               "at least one block per SM: smaller blocks, or a grid-stride loop"),
    "hint-block-size-not-multiple-of-32": CodeDoc("information", "threads per block not a multiple of 32",
                                                  "use a multiple of 32 threads"),
    "hint-launch-bound": CodeDoc("information", "the launch lasts under 5 µs, about what launching it costs",
                                 "fuse with neighbours, more work per launch, or a CUDA graph"),
    "hint-clocks-throttled": CodeDoc("warning", "the SM clock was under 85% of the maximum, or NVML names a slowdown reason",
                                     "check cooling, power limits and other work on the GPU, then measure again"),
    "hint-spills": CodeDoc("warning", "ptxas reports spill stores or loads (static profile), with the LDL/STL lines",
                           "keep fewer values live or allow more registers"),
    "hint-local-memory": CodeDoc("warning", "local loads or stores (a per-thread array indexed at run time, or spills); information from ncu",
                                 "constant indices (fully unrolled loops), or the array in shared memory"),
    "hint-narrow-global-access": CodeDoc("information", "every global load and store is 32 bits or narrower (hint when the bound is unknown)",
                                         "128-bit accesses per thread (`float4`, `int4`, 8 x `__half`)"),
    "hint-no-tensor-cores": CodeDoc("information", "a matmul-like kernel with no tensor-core instruction",
                                    "wmma / `mma.sync` or WGMMA (sm_90), or CUTLASS / cuBLAS"),
    "ncu-*": CodeDoc("information", "an Nsight Compute rule result (`ncu-<RuleName>`) with ncu's text and estimated gain; "
                     "OPT: information, WRN: warning, INF and others: hint", "what ncu's text says"),
}
