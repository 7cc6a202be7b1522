"""Which kernels a candidate ran, and whether any of them is its own (integrity-no-custom-kernel, -other-stream).

`own_kernel_names` reads the candidate's sources (torch-free). `RecordingSession` runs in the sandbox child next to
the candidate and watches what its runs launch, each run a window: on CUDA through torch's profiler (kineto/CUPTI),
on the CPU through Triton's interpreter (TRITON_INTERPRET=1), the only way kernels run there. `classify` sorts the launches
into the candidate's own kernels, kernels the problem allows, and stock (PyTorch, cuBLAS, cuDNN, inductor) ones.

Stream ids are the profiler's (CUPTI stream ids, not `torch.cuda.Stream.cuda_stream` pointers): each window opens
with a marker kernel on the current stream, and the stream the profiler reports for it is taken as current.
"""

from __future__ import annotations

import ast
import re
import contextlib
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from operator import methodcaller

from kernel_lsp.sources import find_kernels, parse_python
from profilers.ptxas import base_name_of

CUDA_SUFFIXES = (".cu", ".cuh")
PYTORCH_NAMESPACES = ("at::", "c10::", "torch::")
CUTE_DSL_PREFIX = "kernel_cutlass_"  # the CuTe DSL names a @cute.kernel f's kernels kernel_cutlass_f_<arguments>_<n>
STOCK_LISTED = 3  # stock kernels named in the no-custom-kernel message
_SCOPE = "\x1f"  # stands in for '::' so that base_name_of keeps a kernel's namespaces


@dataclass(frozen=True)
class KernelLaunch:
    name: str  # as the observer reports it: demangled C++ from the profiler, the function name from Triton
    stream: int | None  # the profiler's stream id; None where the observer has no streams
    source: str  # 'profiler' | 'triton-launcher'
    seconds: float | None = None  # the profiler's device time; the interpreted launch's wall time on the CPU


@dataclass
class KernelUse:
    custom: list[str] = field(default_factory=list)  # kernel names without return type, templates or parameters
    stock: list[str] = field(default_factory=list)
    allowed: list[str] = field(default_factory=list)

    def problem(self) -> str | None:
        """The message of integrity-no-custom-kernel; None when one of the candidate's own kernels ran.

        Allowed kernels are what a problem may call besides its own: they do not stand in for a custom one.
        """
        if self.custom:
            return None
        called = self.stock + self.allowed
        if not called:
            return "no custom kernel ran: no kernel launch was seen"
        listed = ", ".join(called[:STOCK_LISTED]) + (", ..." if len(called) > STOCK_LISTED else "")
        return f"no custom kernel ran: the candidate's work was all stock kernels ({listed})"


def own_kernel_names(files: dict[str, str]) -> set[str]:
    """Names (with namespaces, 'ns::relu_kernel') of the kernels the candidate defines: __global__ functions of
    .cu/.cuh files and of CUDA strings in .py files, and @triton.jit functions. Pass the candidate's files only."""
    names: set[str] = set()
    for name, text in files.items():
        if name.endswith(CUDA_SUFFIXES):
            names |= cuda_kernel_names(text)
        elif name.endswith(".py"):
            names |= python_kernel_names(text)
    # a decoy definition in PyTorch's namespaces would pass PyTorch's own kernels off as the candidate's
    return {name for name in names if not name.startswith(PYTORCH_NAMESPACES)}


def cuda_kernel_names(text: str) -> set[str]:
    """The __global__ functions defined (with a body) in CUDA text."""
    return {f"{k.namespace}::{k.name}" if k.namespace else k.name for k in find_kernels(text) if k.has_body}


def python_kernel_names(text: str) -> set[str]:
    model = parse_python(text)
    names = {kernel.name for kernel in model.triton_kernels}
    names |= {kernel.name for kernel in model.cute_kernels if kernel.role == "kernel"}
    for ext in model.extensions:
        if ext.kind == "load_inline" and ext.cuda_sources:
            # joined as load_inline joins them, so a namespace opened in one string covers the next
            names |= cuda_kernel_names("\n".join(source.text for source in ext.cuda_sources))
    # a literal piece read alone misses a namespace opened in another piece: the resolved name wins
    resolved = {_last_part(name) for name in names}
    return names | {name for name in _kernels_in_string_constants(text) if _last_part(name) not in resolved}


def _kernels_in_string_constants(text: str) -> set[str]:
    """Kernels in any string literal: sources that static reading cannot resolve (f-strings, strings built at run
    time, RawKernel-style loaders) still name their kernels in literal pieces."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes in CUDA strings
            tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set()  # parse_python already recovered what a broken file holds
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "__global__" in node.value:
            names |= cuda_kernel_names(node.value)
    return names


def kernel_name_of(launched: str) -> str:
    """A launched kernel's name with its namespaces, without return type, template arguments or parameters:
    'void ns::relu_kernel<float>(float const*, float*, int)' -> 'ns::relu_kernel'."""
    return base_name_of(launched.replace("::", _SCOPE)).replace(_SCOPE, "::")


def is_own_kernel(name: str, own_names: set[str]) -> bool:
    """`name` as kernel_name_of gives it. An unqualified launch also matches a namespaced definition by its last
    part: extern "C" kernels keep their plain name whatever namespace they are declared in."""
    if name in own_names:
        return True
    if "::" in name:
        return False
    return any(_last_part(own) == name for own in own_names) or cute_kernel_function(name, own_names) is not None


def cute_kernel_function(name: str, functions: Iterable[str]) -> str | None:
    """The @cute.kernel function among `functions` that the CuTe DSL generated kernel `name` from
    ('kernel_cutlass_add_tensorptrf32..._0' -> 'add'; the longest of 'add' and 'add_one' that fits); None for any
    other kernel. A kernel renamed with the DSL's set_name_prefix is not recognised."""
    if not name.startswith(CUTE_DSL_PREFIX):
        return None
    rest = name[len(CUTE_DSL_PREFIX):]
    fitting = [f for f in functions if "::" not in f and (rest == f or rest.startswith(f + "_"))]
    return max(fitting, key=len, default=None)


def _last_part(name: str) -> str:
    return name.rsplit("::", 1)[-1]


def classify(launches: Iterable[KernelLaunch], own_names: set[str], allowed: tuple[str, ...] = ()) -> KernelUse:
    """Each distinct kernel once, in launch order. `allowed` holds fnmatch patterns, matched against the short
    name ('cutlass::Kernel') and the name as launched."""
    use = KernelUse()
    for launch in launches:
        name = kernel_name_of(launch.name)
        if is_own_kernel(name, own_names):
            kind = use.custom
        elif any(fnmatchcase(name, pattern) or fnmatchcase(launch.name, pattern) for pattern in allowed):
            kind = use.allowed
        else:
            kind = use.stock
        if name not in kind:
            kind.append(name)
    return use


def launches_off_stream(launches: Iterable[KernelLaunch], current_stream: int | None,
                        names: Iterable[str] | None = None) -> list[KernelLaunch]:
    """Launches on a stream other than `current_stream` (KernelRecorder.current_stream, a profiler stream id),
    of the kernels `names` (short names, as classify gives them) where given; none when the current stream is
    unknown."""
    if current_stream is None:
        return []
    counted = None if names is None else set(names)
    return [launch for launch in launches if launch.stream is not None and launch.stream != current_stream
            and (counted is None or kernel_name_of(launch.name) in counted)]


class Unobservable(Exception):
    """Nothing here can see kernel launches; the message says why."""


MARKER_CYCLES = 1000  # torch.cuda._sleep's spin_kernel for ~1 µs: the window marker on CUDA
MARKER_KERNEL = "spin_kernel"


@dataclass
class Window:
    """What one recorded stretch launched; filled in when its session ends."""

    launches: list[KernelLaunch] = field(default_factory=list)
    current_stream: int | None = None  # profiler stream id of the harness's current stream
    seconds: float | None = None  # the window's wall time (the CPU's share of work is measured against it)


class RecordingSession:
    """One recording over several windows: `with RecordingSession(device) as session:` then, per run,
    `with session.window() as seen: model(*inputs)`; `seen.launches` is filled when the session ends.

    Starting and stopping torch's profiler costs about a second on an H200, so the runs of one verification share a
    session. On CUDA each window is bracketed by marker kernels (torch.cuda._sleep's spin_kernel, launched on the
    current stream between device-wide synchronizations): the kernels between a pair belong to that window, and the
    opening marker's stream is the current stream. On the CPU, Triton's interpreter reports each launch as it happens.
    """

    def __init__(self, device: str) -> None:
        self.device = device
        self.windows: list[Window] = []
        self.how = "none"  # 'profiler' | 'triton-launcher' | 'none'
        self.reason: str | None = None  # why nothing could observe launches, when how == 'none'
        self._watch: _ProfilerWatch | _InterpreterWatch | None = None

    def __enter__(self) -> RecordingSession:
        watch = _ProfilerWatch(self.device) if self.device.startswith("cuda") else _InterpreterWatch()
        try:
            watch.start()
        except Unobservable as reason:
            self.reason = str(reason)
            return self
        self._watch, self.how = watch, watch.how
        return self

    @contextlib.contextmanager
    def window(self) -> Iterator[Window]:
        window = Window()
        self.windows.append(window)
        watch = self._watch
        if watch is None:
            yield window
            return
        watch.open_window(len(self.windows) - 1)
        started = time.perf_counter()
        try:
            yield window
        finally:
            watch.close_window()
            window.seconds = time.perf_counter() - started

    def __exit__(self, *exc_info: object) -> None:
        if self._watch is None:
            return
        watch, self._watch = self._watch, None
        try:
            seen = watch.stop(len(self.windows))
        except Unobservable as reason:
            self.how, self.reason = "none", str(reason)
            return
        for window, (launches, stream) in zip(self.windows, seen):
            window.launches, window.current_stream = launches, stream


class KernelRecorder:
    """A session of one window: `with KernelRecorder(device) as seen: model(*inputs)`, then `seen.launches`,
    `seen.how`, `seen.reason`, `seen.current_stream`. The CUDA path synchronizes the device around the block."""

    def __init__(self, device: str) -> None:
        self._session = RecordingSession(device)
        self._window: contextlib.AbstractContextManager[Window] | None = None
        self.launches: list[KernelLaunch] = []
        self.how, self.reason = "none", None
        self.current_stream: int | None = None
        self.seconds: float | None = None

    def __enter__(self) -> KernelRecorder:
        self._session.__enter__()
        self._window = self._session.window()
        self._window.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._window.__exit__(None, None, None)
        self._session.__exit__(None, None, None)
        window = self._session.windows[0]
        self.launches, self.current_stream, self.seconds = window.launches, window.current_stream, window.seconds
        self.how, self.reason = self._session.how, self._session.reason


class _ProfilerWatch:
    """CUDA kernels from torch's profiler, split into windows by marker kernels."""

    how = "profiler"

    def __init__(self, device: str) -> None:
        self.device = device
        self._profile = None

    def start(self) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile, supported_activities

        if not torch.cuda.is_available():
            raise Unobservable("CUDA is not available to this process")
        if ProfilerActivity.CUDA not in supported_activities():
            raise Unobservable("torch's profiler cannot see CUDA kernels here (built without kineto/CUPTI)")
        self._profile = profile(activities=[ProfilerActivity.CUDA])
        self._profile.__enter__()

    def open_window(self, index: int) -> None:
        self._marker()

    def close_window(self) -> None:
        self._marker()

    def _marker(self) -> None:
        import torch

        torch.cuda.synchronize(self.device)  # everything before the marker ends before it starts...
        torch.cuda._sleep(MARKER_CYCLES)
        torch.cuda.synchronize(self.device)  # ...and everything after it starts after it ends

    def stop(self, windows: int) -> list[tuple[list[KernelLaunch], int | None]]:
        import torch

        torch.cuda.synchronize(self.device)
        self._profile.__exit__(None, None, None)
        results = getattr(getattr(self._profile, "profiler", None), "kineto_results", None)
        if results is None:
            raise Unobservable("this torch's profiler does not expose its kineto events")
        kernels = sorted((event for event in results.events() if _is_kernel_event(event)), key=methodcaller("start_ns"))
        seen = split_at_markers([(event.name(), _stream_of(event), event.duration_ns() / 1e9) for event in kernels])
        if len(seen) != windows:
            raise Unobservable(f"the profiler saw {len(seen)} of {windows} marked windows, so launches cannot be "
                               "told apart")
        return seen


def split_at_markers(kernels: list[tuple[str, int | None, float | None]]) -> list[tuple[list[KernelLaunch], int | None]]:
    """(launches, current stream) per window, from (name, stream, device seconds) of kernels in start order where
    marker pairs open and close each window; kernels between windows (the reference's, the harness's) belong to
    none."""
    windows: list[tuple[list[KernelLaunch], int | None]] = []
    inside = False
    for name, stream, seconds in kernels:
        if MARKER_KERNEL in name:
            if not inside:
                windows.append(([], stream))
            inside = not inside
        elif inside:
            windows[-1][0].append(KernelLaunch(name, stream, "profiler", seconds))
    return windows


def _is_kernel_event(event) -> bool:
    """A kernel on the GPU: not a CPU op, runtime call, memcpy or memset."""
    from torch.autograd import DeviceType

    if event.device_type() != DeviceType.CUDA:
        return False
    activity = getattr(event, "activity_type", lambda: "kernel")()
    return activity not in ("gpu_memcpy", "gpu_memset") and not event.name().startswith(("Memcpy", "Memset"))


def _stream_of(event) -> int | None:
    """The CUPTI stream id (kineto's device resource id for a GPU event)."""
    resource = getattr(event, "device_resource_id", None)
    return resource() if resource is not None else None


class _InterpreterWatch:
    """@triton.jit launches under TRITON_INTERPRET=1, seen through the interpreter's GridExecutor for the session
    (its hook, candidate/interpose.py: the attribute stays the same object whether a session watches or not).
    A launch counts once at least one program of its grid ran: an empty grid does no work."""

    how = "triton-launcher"

    def __init__(self) -> None:
        self.launches: list[tuple[int, KernelLaunch]] = []  # (window, launch)
        self.programs = 0  # programs the interpreter started, all launches together
        self.window: int | None = None
        self._handled = contextlib.ExitStack()

    def start(self) -> None:
        try:
            import triton
        except ImportError as error:
            raise Unobservable(f"Triton is not importable here ({error}): no CPU kernel can be observed") from error
        if not triton.knobs.runtime.interpret:
            raise Unobservable("TRITON_INTERPRET=1 is not set: Triton kernels do not run on the CPU without it")
        from triton.runtime.interpreter import GridExecutor, InterpreterBuilder

        from kernel_lsp.candidate.interpose import handled

        self._handled.enter_context(handled(GridExecutor, "__call__", self._recorded_launch))
        self._handled.enter_context(handled(InterpreterBuilder, "set_grid_idx", self._counted_program))

    def open_window(self, index: int) -> None:
        self.window = index

    def close_window(self) -> None:
        self.window = None

    def stop(self, windows: int) -> list[tuple[list[KernelLaunch], int | None]]:
        self._handled.close()
        return [([launch for window, launch in self.launches if window == index], None) for index in range(windows)]

    def _recorded_launch(self, original: Callable) -> Callable:
        def launch(executor, *args, **kwargs):
            programs_before, started = self.programs, time.perf_counter()
            result = original(executor, *args, **kwargs)
            if self.programs > programs_before and self.window is not None:
                self.launches.append((self.window, KernelLaunch(executor.fn.__name__, None, "triton-launcher",
                                                                time.perf_counter() - started)))
            return result
        return launch

    def _counted_program(self, original: Callable) -> Callable:
        def set_grid_idx(builder, *args, **kwargs):
            self.programs += 1
            return original(builder, *args, **kwargs)
        return set_grid_idx


@dataclass
class WorkShare:
    """How the recorded runs' time split between the candidate's own kernels and the rest (library kernels: cuBLAS,
    cuDNN, ATen, inductor). The candidate's process measures it, so it is its word: shown, and used only to flag
    library work, which a candidate gains nothing by hiding (its own kernels would have to take the time)."""

    own_s: float
    total_s: float
    how: str  # what the seconds are
    library: dict[str, float] = field(default_factory=dict)  # stock kernel (short name) -> seconds; CUDA only

    @property
    def own_share(self) -> float:
        return self.own_s / self.total_s if self.total_s > 0 else 0.0


DEVICE_TIME = "device time of each kernel (torch's profiler in the candidate's process)"
WALL_TIME = "wall time inside its own interpreted launches, of forward's (the candidate's process)"


def work_share(windows: Iterable[Window], own_names: set[str], allowed: tuple[str, ...] = ()) -> WorkShare | None:
    """Own and total seconds over the recorded windows: on CUDA the profiler's device time of each kernel (allowed
    kernels count in the total, as neither own nor library); on the CPU the wall time of the candidate's own
    interpreted launches against forward's. The first window is left out where there are others: it pays for
    first calls (Triton's compile, the interpreter's parse, cuBLAS's handle). None where nothing was timed."""
    own_s = total_s = 0.0
    library: dict[str, float] = {}
    how = None
    windows = list(windows)
    for window in windows[1:] or windows:
        for launch in window.launches:
            if launch.seconds is None:
                continue
            name = kernel_name_of(launch.name)
            if is_own_kernel(name, own_names):
                own_s += launch.seconds
            elif launch.source == "profiler" and not any(fnmatchcase(name, p) or fnmatchcase(launch.name, p)
                                                         for p in allowed):
                library[name] = library.get(name, 0.0) + launch.seconds
            if launch.source == "profiler":
                total_s += launch.seconds
                how = DEVICE_TIME
        if window.launches and window.launches[0].source == "triton-launcher" and window.seconds:
            total_s += window.seconds
            how = WALL_TIME
    if how is None or total_s <= 0:
        return None
    return WorkShare(own_s, total_s, how, library)


# the families a library kernel or ATen operator belongs to, by name: the first that matches (a cuDNN convolution
# is often an implicit GEMM, so convolution comes first); anything else is its own family
OPERATION_FAMILIES = (
    ("convolution", re.compile(r"conv|fprop|dgrad|wgrad|winograd|implicit_gemm|cudnn", re.I)),
    ("matrix multiply", re.compile(r"gemm|xmma|matmul|cublas|cutlass|(^|[^a-z])(add|b|baddb)?mm([^a-z]|$)|"
                                   r"addmm|linear|(^|_)dot(_|$)", re.I)),
)


def operation_family(name: str) -> str:
    """'matrix multiply' for 'aten::mm', 'addmm' or 'sm90_xmma_gemm_f32f32...'; 'convolution' for a cuDNN fprop
    or 'aten::mkldnn_convolution'; else the name without 'aten::'."""
    for family, pattern in OPERATION_FAMILIES:
        if pattern.search(name):
            return family
    return name.removeprefix("aten::")
