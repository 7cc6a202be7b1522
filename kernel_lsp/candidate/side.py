"""The candidate's process: it imports the candidate, builds its model and runs it when the judge asks.

`python -m kernel_lsp.candidate.side` is started by the judge (kernel_lsp.verify.run) and confines itself before
it imports anything else (process/confine.py: writes only to its scratch folder, the build caches, /dev and
/proc; no network unless allowed; no signal to the judge). It never decides anything: it runs `forward` on
the inputs the judge sends and sends back its outputs (candidate/exchange.py), records what kernels each run
launched, times itself when asked, and says what it saw of its own process (torch patched, timers replaced,
threads left running). The judge treats each of those answers as the candidate's word: outputs are compared
against the judge's own reference, timings are cross-checked against the judge's clock.

Requests and replies are msgpack frames on two pipes (stdout and stderr belong to the candidate). The replies the
judge decides on are contracts/candidate_replies.py's, each written once by `main` (`frame`) and decoded where it
arrives in the judge. A request that fails replies {"error": ...} (ErrorReply: the exception's status, message
and frames), which the judge reports as the candidate's own failure.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib
import os
import resource
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from kernel_lsp.contracts.candidate_replies import (
    AblationReply,
    AgainReply,
    ErrorReply,
    ForwardReply,
    KeptOutput,
    LoadReply,
    ProcessReport,
    RecordedCall,
    RecordedWindow,
    Recording,
    SettleReply,
    TimedReport,
    frame,
)
from kernel_lsp.process.failures import failure_parts
from kernel_lsp.process.frames import read_frame, write_frame
from kernel_lsp.process.confine import confine


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kernel_lsp.candidate.side")
    parser.add_argument("--requests-fd", type=int, required=True)
    parser.add_argument("--replies-fd", type=int, required=True)
    parser.add_argument("--exchange", required=True)
    parser.add_argument("--writable", action="append", default=[])
    parser.add_argument("--channel-fd", type=int)  # device memory descriptors (candidate/exchange.py), in a sandbox
    parser.add_argument("--allow-network", action="store_true")
    parser.add_argument("--baselines", action="store_true")  # the baselines' process (candidate/handle.py)
    options = parser.parse_args(argv)
    for fd in (options.requests_fd, options.replies_fd, options.channel_fd):
        if fd is not None:
            os.set_inheritable(fd, False)
    confinement = confine(options.writable, options.allow_network)  # before torch: no thread may exist yet
    channel = socket.socket(fileno=options.channel_fd) if options.channel_fd is not None else None
    side = CandidateSide(options.exchange, channel, options.baselines)
    write_frame(options.replies_fd, {"ready": os.getpid(), "confinement": confinement.to_dict()})
    while (request := read_frame(options.requests_fd)) is not None:
        op = request.get("op")
        if op == "exit":
            break
        try:
            reply = getattr(side, f"op_{op}")(request)
        except BaseException as error:  # noqa: BLE001 - the candidate's failure, whatever it is, goes to the judge
            reply = ErrorReply(failure_parts(error))
        # a typed reply as its map; the untyped ones (call's entry value, the empty acknowledgements) as they are
        write_frame(options.replies_fd, frame(reply) if dataclasses.is_dataclass(reply) else reply)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def lowest(a: int, b: int) -> int:
    """The lower of two resource limits (RLIM_INFINITY, -1, is the highest)."""
    return b if a == resource.RLIM_INFINITY else a if b == resource.RLIM_INFINITY else min(a, b)


class TimedCalls:
    """What the judge's timing protocol (verify/rounds.py measure) keeps of the timed calls in the candidate's process:
    the outputs the judge asked to keep (one per input set, chosen by the judge once each batch was over), and the
    kernel recordings of the extra calls it asked for between batches (candidate/kernels.py). Both are this process's
    word: the judge compares the outputs with its own reference and judges the launches like a trial's."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.kept: dict[int, tuple[int, Any]] = {}  # input set -> (call index, output)
        # the model returned one buffer on successive calls (seen in a batch): from then on each batch copies every
        # output as it returns, since a later call overwrites it (the copies are in the candidate's time)
        self.reused_output = False
        self.sessions: list[tuple[int, Any]] = []  # (call index, RecordingSession of that call)

    @contextmanager
    def record(self, index: int) -> Iterator[None]:
        from kernel_lsp.candidate.kernels import RecordingSession

        session = RecordingSession(self.device)
        try:
            with session, session.window():
                yield
        finally:
            self.sessions.append((index, session))

    def keep(self, index: int, set_index: int, output: Any, copy: bool = True) -> None:
        from kernel_lsp.candidate.integrity import copied

        # a copy: what the caller saw when the call returned, even from a candidate that returns the same buffer
        # every call (CUDA graphs do); `copy` False where the batch already copied each output as it returned
        self.kept[set_index] = (index, copied(output) if copy else output)


def plain(output: Any) -> bool:
    """Every tensor of the output is a plain torch.Tensor (a subclass can change how it compares)."""
    import torch

    from kernel_lsp.candidate.integrity import tensor_leaves

    return all(type(t) is torch.Tensor for t in tensor_leaves(output))


@contextmanager
def stopwatch(seconds: dict[str, float], name: str) -> Iterator[None]:
    """Adds the block's wall time to seconds[name]: the judge reports it among its phases (the candidate's word,
    shown only to say where a slow verification spent its time)."""
    started = time.perf_counter()
    try:
        yield
    finally:
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - started


class CandidateSide:
    """The candidate's side of one verification; each op_* answers one request."""

    def __init__(self, exchange_folder: str, channel: socket.socket | None = None, baselines: bool = False) -> None:
        import torch

        from kernel_lsp.candidate.exchange import Exchange

        # torch_snapshot needs torch._dynamo at load, and the compile baseline (timed on a GPU only) uses it: imported
        # while waiting, except in a baselines' process without a GPU, which needs neither (~1 s of CPU)
        self.baselines = baselines
        if not baselines or torch.cuda.is_available():
            import torch._dynamo  # noqa: F401

        if torch.cuda.is_available():
            torch.empty(1, device="cuda")  # the CUDA context, made while waiting (about half a second)
        self.torch = torch
        self.exchange = Exchange(exchange_folder, "candidate", channel)
        self.model: Any = None
        self.target = None
        self.session: Any = None
        self.output: Any = None
        self.inputs: Any = None  # the last run's inputs, as forward got them
        self.module: Any = None  # the candidate's module, once loaded
        self.started_threads: list[str] = []
        self.shared_poison: Any = None  # verify/shared_fill.SharedPoison on CUDA, made before the candidate's import
        self.watch: TimedCalls | None = None  # while the judge times this process (op_timing_sets .. op_timed_report)
        self.compiled: Any = None  # the baselines' process: torch.compile of its model (op_compile)
        self.compiled_reused = False  # and whether it returned one buffer on successive calls (as TimedCalls has it)

    def op_limit(self, request: dict[str, Any]) -> dict[str, Any]:
        """The task's file size and memory limits, for a process started ahead of it (asked before the candidate's
        import); only ever lowered."""
        for name in ("RLIMIT_FSIZE", "RLIMIT_DATA", "RLIMIT_AS"):
            if name in request["limits"]:
                which = getattr(resource, name)
                soft, hard = (int(value) for value in request["limits"][name])
                hard = lowest(hard, resource.getrlimit(which)[1])
                resource.setrlimit(which, (lowest(soft, hard), hard))
        return {}

    def op_load(self, request: dict[str, Any]) -> LoadReply:
        from kernel_lsp.candidate.integrity import thread_idents, timer_snapshot, torch_snapshot
        from kernel_lsp.candidate.models import WEIGHTS_SEED, load_module, load_weights
        from kernel_lsp.candidate.timing import resolve_device

        torch = self.torch
        self.enter(request["task_dir"])
        self.target = resolve_device(request["device"])
        seconds: dict[str, float] = {}
        if self.target.type == "cuda" and not self.baselines:  # the baselines' process runs no trial
            from kernel_lsp.candidate.shared_fill import SharedPoison

            with stopwatch(seconds, "candidate: shared-memory fill loaded"):
                index = self.target.index if self.target.index is not None else torch.cuda.current_device()
                self.shared_poison = SharedPoison(index)
        with stopwatch(seconds, "candidate: launch hooks installed"):
            from kernel_lsp.candidate.interpose import install_triton

            install_triton()  # before the candidate's import: what watches its launches is in place from the start
        # what the candidate changes in this process (op_report); the baselines' process runs no candidate
        self.before = None if self.baselines else (timer_snapshot(), thread_idents(), torch_snapshot())
        with stopwatch(seconds, "candidate: import"):
            module = self.module = load_module(request["candidate"], "kernel_lsp_candidate")
        with stopwatch(seconds, "candidate: model built"):
            torch.manual_seed(WEIGHTS_SEED)
            # the candidate's ModelNew; the baselines' process (candidate/handle.py BaselineProcess) loads the
            # reference's Model the same way
            model = getattr(module, request.get("model_class", "ModelNew"))(*self.exchange.receive(request["init"]))
        with stopwatch(seconds, "candidate: weights loaded"):
            state = dict(zip(request["weight_names"], self.exchange.receive(request["weights"])))
            weights = load_weights(state, model)
            self.model = model.to(self.target).eval()
        gc.freeze()  # what exists now lives as long as this process: each run's collection skips it
        return LoadReply(weights, seconds)

    def op_compile(self, request: dict[str, Any]) -> dict[str, Any]:
        """The baselines' process: torch.compile of the loaded model, compiled here on the first timing input set
        (not in its first batch); op_batch runs it for model="compile"."""
        compiled = self.torch.compile(self.model)
        with self.torch.no_grad():
            compiled(*self.timing_sets[0])
        self.settle_device()
        self.compiled = compiled
        return {}

    def op_call(self, request: dict[str, Any]) -> dict[str, Any]:
        """Another job's work in this process, named by its entry ("kernel_lsp.module:function"; the profile job's
        measurements are kernel_lsp.profile.measure:candidate_side), so that this module imports nothing of the
        jobs it serves: entry(**arguments, inputs=..., init=...), with the judge's inputs received here."""
        module_name, _, function = str(request.get("entry", "")).partition(":")
        if not module_name.startswith("kernel_lsp.") or not function:
            raise ValueError(f"op call: an entry names a kernel_lsp function, got {request.get('entry')!r}")
        entry = getattr(importlib.import_module(module_name), function)
        self.enter(request["task_dir"])
        inputs = tuple(self.exchange.receive(request["inputs"])) if request.get("inputs") is not None else None
        init = self.exchange.receive(request["init"]) if request.get("init") is not None else None
        return entry(**request.get("arguments", {}), inputs=inputs, init=init)

    def enter(self, task_dir: str) -> None:
        """The task's folder becomes this process's: a process started ahead of time began elsewhere, and the
        candidate's own helper modules lie beside it. (Triton's interpreter, for the CPU, was chosen when this
        process started: candidate/handle.py.)"""
        os.chdir(task_dir)
        sys.path.insert(0, task_dir)

    def op_record(self, request: dict[str, Any]) -> Recording | dict[str, Any]:
        """Starts (on=True) or ends the recording session of the trials; at its end, what each run launched."""
        from kernel_lsp.candidate.kernels import RecordingSession

        if request["on"]:
            self.session = RecordingSession(str(self.target)).__enter__()
            return {}
        session, self.session = self.session, None
        session.__exit__(None, None, None)
        return Recording(session.how, session.reason,
                         [RecordedWindow([(k.name, k.stream, k.source, k.seconds) for k in w.launches],
                                         w.current_stream, w.seconds) for w in session.windows])

    def op_forward(self, request: dict[str, Any]) -> ForwardReply:
        """One run of forward on the judge's inputs (over freshly poisoned memory: the free device memory with the
        request's poison byte, then every SM's shared memory with its shared_poison byte, by default the same); its
        output, as returned. With own_copy, forward gets copies made in this process's memory (op_again then frees
        and reuses it). `shared_fill`: "filled", or why shared memory was not (None off CUDA); `poisoned_bytes`: the
        size of the large block poisoned, which any output up to that size is split from (0 off CUDA)."""
        from kernel_lsp.candidate.integrity import poison_free_memory, thread_idents, threads_started

        torch, target = self.torch, self.target
        seconds: dict[str, float] = {}
        with stopwatch(seconds, "candidate: receiving inputs"):
            inputs = self.exchange.receive(request["inputs"])
        with stopwatch(seconds, "candidate: poisoning free memory"):
            gc.collect()  # the last run's dead tensors go first (poison_free_memory then empties the cache)
            poisoned = poison_free_memory(target, request["poison"], request.get("poison_bytes"),
                                          request.get("reserve", 0), request.get("poison_floor", 0))
        if request.get("own_copy"):
            inputs = tuple(v.clone() if isinstance(v, torch.Tensor) else v for v in inputs)
        self.inputs = inputs
        shared_fill = None
        if self.shared_poison is not None:  # last before forward: what ran after the fill could overwrite it
            with stopwatch(seconds, "candidate: poisoning shared memory"):
                shared_fill = self.shared_poison.fill(request.get("shared_poison", request["poison"]))
        threads = thread_idents()
        recording = self.session.window() if request.get("record") and self.session is not None else nullcontext()
        with stopwatch(seconds, "candidate: forward"), torch.no_grad(), recording:
            output = self.model(*inputs)
            if target.type == "cuda":
                torch.cuda.current_stream(target).synchronize()  # what a caller may rely on, and no more
        with stopwatch(seconds, "candidate: returning memory"):
            if target.type == "cuda":
                torch.cuda.empty_cache()  # the poison's blocks go back to the driver: the judge needs the room
        self.output = output
        self.started_threads = threads_started(threads, thread_idents())
        with stopwatch(seconds, "candidate: sending output"):
            sent = self.exchange.send(output)
        return ForwardReply(sent, plain(output), self.started_threads, seconds, shared_fill, poisoned)

    def op_again(self, request: dict[str, Any]) -> AgainReply:
        """forward once more on new values in old places (integrity-stale-output): in the same tensor objects as
        the last run (how="objects": the judge already wrote the new values into its shared memory), or in the
        storage of the last run's own copies, freed and taken again by new tensors (how="storage")."""
        from kernel_lsp.candidate.integrity import tensor_leaves

        torch, target = self.torch, self.target
        self.output = None
        if request["how"] == "objects":
            inputs, reused = self.inputs, True
        else:
            values = self.exchange.receive(request["inputs"])
            before = {t.data_ptr() for t in tensor_leaves(self.inputs)}
            self.inputs = None  # the last copies' storage is free now: the new tensors take it
            inputs = tuple(torch.empty_like(v).copy_(v) if isinstance(v, torch.Tensor) else v for v in values)
            reused = all(t.data_ptr() in before for t in tensor_leaves(inputs))
        with torch.no_grad():
            output = self.model(*inputs)
        if target.type == "cuda":
            torch.cuda.current_stream(target).synchronize()
        self.inputs, self.output = inputs, output
        return AgainReply(self.exchange.send(output), plain(output), reused)

    def op_ablate(self, request: dict[str, Any]) -> AblationReply:
        """forward as it is, then with every result of the candidate's own code destroyed as made
        (candidate/ablation.py): whether the output changed, and what made it."""
        from kernel_lsp.candidate.ablation import ablate

        inputs, others = self.exchange.receive(request["inputs"]), self.exchange.receive(request["others"])
        return ablate(self.model, [self.module, self.model], set(request["own"]), inputs, others)

    def op_settle(self, request: dict[str, Any]) -> SettleReply:
        """Everything this process started has finished: the device synchronized, the run's threads joined
        (a while). On the CPU, and across the sandbox on CUDA, the output is sent again (the judge compares it
        with the first)."""
        if self.target.type == "cuda":
            self.torch.cuda.synchronize(self.target)
        for thread in threading.enumerate():
            if thread.name in self.started_threads:
                thread.join(request.get("join_s", 1.0))
        if self.target.type == "cuda":
            self.torch.cuda.synchronize(self.target)
            if self.exchange.channel is None:  # the judge maps this process's memory: it sees what changed
                return SettleReply()
        return SettleReply(self.exchange.send(self.output))  # a copy crossed: what the output holds now

    def op_release(self, request: dict[str, Any]) -> dict[str, Any]:
        """The last run's inputs and outputs are dropped; with return_memory, this process's cached memory (what
        the stale-output and output-from-kernel runs left) goes back to the driver too (the timing's input sets
        are sized from what is free)."""
        self.output = self.inputs = None
        self.exchange.forget()
        if self.target is not None and self.target.type == "cuda":
            self.torch.cuda.ipc_collect()
            if request.get("return_memory"):
                gc.collect()
                self.torch.cuda.empty_cache()
        return {}

    def op_timing_sets(self, request: dict[str, Any]) -> dict[str, Any]:
        """More of the timing's input sets, held for the batches that follow (verify/rounds.py measure): the judge's
        shared memory (one packed block a request), whose values it changes between rounds."""
        if self.watch is None:
            self.timing_sets: list[tuple] = []
            self.watch = TimedCalls(str(self.target))
            self.batch_outputs: list[Any] = []
            self.batch_copied = False
        self.timing_sets += [tuple(values) for values in self.exchange.receive(request["input_sets"])]
        return {}

    def timing_call(self, *inputs: Any) -> Any:
        with self.torch.no_grad():
            return self.model(*inputs)

    def compiled_call(self, *inputs: Any) -> Any:
        with self.torch.no_grad():
            return self.compiled(*inputs)

    def settle_device(self) -> None:
        if self.target.type == "cuda":
            self.torch.cuda.synchronize()  # the whole device, not only the current stream

    def op_ping(self, request: dict[str, Any]) -> dict[str, Any]:
        """Nothing: the judge's clock around it is a request's round trip."""
        return {}

    def op_batch(self, request: dict[str, Any]) -> dict[str, Any]:
        """One batch, timed by the judge's clock around this request: forward on each named input set, back to
        back, then the device synchronized. The outputs stay alive until op_after_batch. In the baselines' process,
        model="compile" runs the compiled model (op_compile)."""
        from kernel_lsp.candidate.integrity import copied, outputs_share_memory
        from kernel_lsp.candidate.timing import time_batch

        watch, compiled = self.watch, request.get("model") == "compile"
        self.batch_copied = self.compiled_reused if compiled else watch.reused_output
        self.batch_outputs = time_batch(self.compiled_call if compiled else self.timing_call, self.timing_sets,
                                        request["sets"], self.settle_device, copied if self.batch_copied else None)
        if not self.batch_copied and outputs_share_memory(self.batch_outputs):
            # the judge's first batch (a warm-up, of 2 calls or more) finds it
            if compiled:
                self.compiled_reused = True
            else:
                watch.reused_output = True
        return {}

    def op_after_batch(self, request: dict[str, Any]) -> dict[str, Any]:
        """After a batch, still on the judge's clock: the outputs of the calls the judge chose (`keep`, their offsets
        in the batch) are kept, a copy each; the others are let go. `first` is the batch's first call's index."""
        for offset, (set_index, output) in enumerate(zip(request["sets"], self.batch_outputs)):
            if offset in request["keep"]:
                self.watch.keep(request["first"] + offset, set_index, output, copy=not self.batch_copied)
        self.batch_outputs = []
        self.settle_device()
        return {}

    def op_record_call(self, request: dict[str, Any]) -> dict[str, Any]:
        """One extra call on input set `set`, under a kernel recording (the judge asks between batches)."""
        with self.watch.record(request["call"]):
            self.timing_call(*self.timing_sets[request["set"]])
            self.settle_device()
        return {}

    def op_timed_report(self, request: dict[str, Any]) -> TimedReport:
        """The timed calls' kept outputs (one per input set) and the recorded calls' launches."""
        watch = self.watch
        self.output = [output for _, output in watch.kept.values()]  # held until release, as forward's output
        self.timing_sets, self.batch_outputs, self.watch = [], [], None  # the timing is over
        return TimedReport([KeptOutput(set_index, index, self.exchange.send(output), plain(output))
                            for set_index, (index, output) in sorted(watch.kept.items())],
                           [RecordedCall(index, session.how, session.reason,
                                         [(k.name, k.stream, k.source) for k in session.windows[0].launches],
                                         session.windows[0].current_stream)
                            for index, session in watch.sessions],
                           watch.reused_output)

    def op_report(self, request: dict[str, Any]) -> ProcessReport:
        """What the candidate changed in this process since before its import."""
        from kernel_lsp.candidate.integrity import patched_timers, thread_idents, threads_started, timer_snapshot
        from kernel_lsp.candidate.integrity import torch_patches

        timers, threads, torch_state = self.before
        return ProcessReport(patched_timers(timers, timer_snapshot()), torch_patches(torch_state),
                             threads_started(threads, thread_idents()))


if __name__ == "__main__":
    main()
