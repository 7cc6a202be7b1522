"""The judge's checks of a candidate's runs: comparison with the reference, a second run over other poison (and a
third that says which memory was read), the answer to earlier inputs, stale outputs, the output-from-kernel
ablation, library work, and what the candidate's process reported of itself (kernels, threads, torch patched,
processes left)."""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

import torch

from kernel_lsp.candidate.handle import CandidateFailed, decoded_reply
from kernel_lsp.candidate.integrity import POISON_BYTE, SECOND_POISON_BYTE, tensor_leaves
from kernel_lsp.candidate.kernels import KernelLaunch, Window, WorkShare, launches_off_stream, operation_family
from kernel_lsp.candidate.shared_fill import FILLED
from kernel_lsp.contracts.candidate_replies import AblationReply, AgainReply, Launch, ProcessReport, TimedLaunch
from kernel_lsp.contracts.keeper_report import KeeperEnd
from kernel_lsp.contracts.verify_report import Comparison, Work
from kernel_lsp.verify.compare import (
    COMPARE_CHUNK,
    Tolerance,
    chunks,
    compare_outputs,
    refused,
    tolerance_for,
)
from kernel_lsp.verify.judge import (
    PHASES,
    CandidateRun,
    Footprint,
    Judge,
    Integrity,
    clone_inputs,
    release,
    run_candidate,
)
from kernel_lsp.verify.reference import draw_inputs, run_reference

STALE_SEED = 20_000  # and so are the new values of the stale-output checks
SCATTERED_FRACTION = 0.001  # of the elements the "scattered" stale-output check changes
ABLATION_SEED = 30_000  # and the inputs of the output-from-kernel check
STOCK_OPS_LISTED = 5  # stock kernels and operators named in integrity-output-not-from-kernel
TORCH_PATCHES_LISTED = 5  # names in the integrity-torch-patched message
PROCESSES_LISTED = 3  # named in integrity-process-left


@PHASES("comparing outputs")
def compare_candidate(expected: Any, actual: Any, plain: bool, overrides: dict[str, Tolerance]) -> Comparison:
    """The reference's output against the candidate's; an output with a torch.Tensor subclass in it (its process
    said so) is refused before any value is compared."""
    if not plain:
        return refused("type", "the candidate returned a torch.Tensor subclass (it can change how it compares); "
                               "return plain tensors")
    return compare_outputs(expected, actual, overrides)


@PHASES("comparing outputs")
def outputs_agree(first: Any, second: Any, overrides: dict[str, Tolerance]) -> bool:
    """Two runs of the candidate on the same inputs give the same output: within tolerance, NaN where NaN."""
    a_leaves, b_leaves = list(tensor_leaves(first)), list(tensor_leaves(second))
    if len(a_leaves) != len(b_leaves):
        return False
    return all(a.shape == b.shape and a.dtype == b.dtype and same_within(a, b, overrides)
               for a, b in zip(a_leaves, b_leaves))


def same_within(a: torch.Tensor, b: torch.Tensor, overrides: dict[str, Tolerance]) -> bool:
    if not a.is_floating_point():
        return torch.equal(a, b)
    rule = tolerance_for(a.dtype, overrides)
    # chunk by chunk: two whole float64 copies of a 6.4 GB output ran an 80 GB H100 out of memory
    return all(bool(torch.isclose(x.double(), y.double(), atol=rule.atol, rtol=rule.rtol, equal_nan=True).all())
               for _, x, y in chunks(a.reshape(-1), b.reshape(-1)))


def reported_seconds(value: Any) -> float | None:
    """A duration the candidate's process reported: a finite number of seconds from 0 to a day, else None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and 0 <= value < 86400:
        return float(value)
    return None


def reported_window(launches: Sequence[Launch | TimedLaunch], current_stream: int | None,
                    seconds: float | None = None) -> Window:
    """A recorded window as the candidate's process reported it (op_record's windows, op_record_call's), decoded:
    its durations kept only where they are plausible (reported_seconds)."""
    return Window([KernelLaunch(name, stream, source, reported_seconds(said[0] if said else None))
                   for name, stream, source, *said in launches], current_stream, reported_seconds(seconds))


LIBRARY_WORK_SHARE = 0.05  # own kernels under this share of the time, with a library running the main operation
LIBRARY_LISTED = 3


def work_report(share: WorkShare | None) -> Work | None:
    """The report's kernels.work: the own kernels' share of the recorded runs' time (the candidate's word)."""
    if share is None:
        return None
    library = sorted(share.library, key=share.library.__getitem__, reverse=True)[:LIBRARY_LISTED]
    return Work(share.own_share, share.own_s * 1e3, share.total_s * 1e3, share.how, library, None, None)


def check_library_work(judge: Judge, work: Work | None, ref_model: torch.nn.Module, inputs: tuple) -> Work | None:
    """integrity-library-work (a warning for a person; the agent's reward, bench and campaign reject it): the
    candidate's own kernels took under LIBRARY_WORK_SHARE of its time while library code of the same family as the
    reference's main operation (the reference's costliest kernel or ATen operator, profiled here, in the judge's
    process) ran: `torch.addmm(own_zero_bias, A, B)`. A cuDNN convolution with its own fused epilogue is well over
    the share and stays verified. Only a candidate under the share pays for the reference's profile. `work` with
    the reference's main operation and the warning's message where they were found."""
    if work is None or work.own_share >= LIBRARY_WORK_SHARE:
        return work
    with PHASES("library-work check"):
        main = reference_main_operation(ref_model, inputs, judge.target)
    if main is None:
        return work
    family = operation_family(main)
    # on CUDA the library kernels the profiler timed; on the CPU the ATen operators the ablation's run called
    ran = [name for name in [*work.library, *judge.ablation_stock] if operation_family(name) == family]
    message = (f"the candidate's own kernels took {work.own_share:.1%} of its time ({work.how}) while library code "
               f"ran the reference's main operation ({family}: {ran[0]}, where the reference spends most on {main})"
               if ran else None)
    return replace(work, reference_main=main, library_work=message)


def reference_main_operation(ref_model: torch.nn.Module, inputs: tuple, target: torch.device) -> str | None:
    """The reference's costliest kernel (CUDA, by device time) or ATen operator (CPU, by self time) over one call,
    after a warm-up call; None when the profiler saw none."""
    from torch.profiler import ProfilerActivity, profile

    run_reference(ref_model, inputs)
    cuda = target.type == "cuda"
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as profiled:
        run_reference(ref_model, inputs)
        if cuda:
            torch.cuda.synchronize(target)
    totals: dict[str, float] = {}
    for event in profiled.key_averages():
        if cuda:
            spent = getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0)
            if event.key.startswith(("Memcpy", "Memset")) or not spent:
                continue
        else:
            spent = event.self_cpu_time_total
            if not event.key.startswith("aten::") or not spent:
                continue
        totals[event.key] = totals.get(event.key, 0.0) + spent
    return max(totals, key=totals.__getitem__, default=None)


def note_run_integrity(run: CandidateRun, window: Window, use: Any, index: int, integrity: Integrity, how: str,
                       reason: str | None) -> None:
    trial = f"trial {index + 1}"
    if run.mutated:
        integrity.reject("integrity-input-mutated",
                       f"the candidate changed input tensor(s) {run.mutated} in place ({trial})")
    detail = "" if how != "none" else f" (kernel launches cannot be observed here: {reason})"
    note_kernel_use(integrity, use, window, trial, detail)
    if run.pending:
        integrity.reject("integrity-pending-work", "the output was still being written after forward returned "
                                                 f"and the current stream was done ({trial})")
    if run.threads:
        integrity.reject("integrity-thread", f"forward started thread(s) {', '.join(run.threads)} ({trial})")


def note_kernel_use(integrity: Integrity, use: Any, window: Window, where: str, detail: str = "") -> None:
    """What one recorded run launched: none of the candidate's own kernels (integrity-no-custom-kernel), or its own
    or allowed kernels on a stream other than the current one (integrity-other-stream); `where` names the run."""
    problem = use.problem()
    if problem is not None:
        integrity.reject("integrity-no-custom-kernel", f"{problem}{detail} ({where})")
    # the candidate's own kernels and the allowed ones: PyTorch's own set-up on a side stream is not its work (a
    # CUDA graph's capture fills the generator's state on the capture stream); the judge's clock waits for the
    # whole device, and the pending-work check for what a side stream still writes after forward returned
    others = [launch.name for launch in launches_off_stream(window.launches, window.current_stream,
                                                            [*use.custom, *use.allowed])]
    if others:
        integrity.reject("integrity-other-stream", f"kernels ran on a stream other than the current one: "
                                                 f"{', '.join(sorted(set(others))[:3])} ({where})")


def check_rerun(judge: Judge, inputs: tuple, first: CandidateRun, overrides: dict[str, Tolerance],
                comparison: Comparison, footprint: Footprint) -> None:
    """Run again on the same inputs over memory poisoned with other bytes: a changed output read garbage.
    The outputs stay held by the candidate's process until the trial's release, so they cannot move. When shared
    memory was filled too, a third run says which memory was read (rejected candidates only pay for it)."""
    second = run_candidate(judge, inputs, SECOND_POISON_BYTE, record=False, footprint=footprint)
    if outputs_agree(first.output, second.output, overrides):
        return
    if judge.target.type == "cuda":
        message = "the output depends on memory the candidate never wrote: two runs on the same inputs differ"
        if judge.shared_fill == FILLED:
            message += " after the free memory and every SM's shared memory were filled with different bytes; "
            message += which_memory(judge, inputs, first, second, overrides, footprint)
        else:
            message += " after the free memory was filled with different bytes"
        if comparison.reason == "nan":
            message += " (the first run read NaN poison)"
        judge.integrity.reject("integrity-uninitialized-output", message)
    else:
        judge.integrity.reject("integrity-nondeterministic", "two runs on the same inputs gave different outputs")


WHICH_MEMORY_SAMPLE = 1 << 20  # elements where the first two runs differ, kept (both runs' values) for the third


class Differences(NamedTuple):
    """Where two runs' outputs differ (flat positions in one output leaf) and what each run had there."""
    leaf: int
    positions: torch.Tensor  # int64, on the host
    first: torch.Tensor
    second: torch.Tensor


def differing_elements(first: Any, second: Any, overrides: dict[str, Tolerance],
                       limit: int = WHICH_MEMORY_SAMPLE) -> list[Differences]:
    """Up to `limit` elements at which `first` and `second` disagree (outside tolerance, or NaN against a number),
    spread evenly over each chunk that has any, with both values: on the host, a few MiB whatever the outputs'
    size (a copy of two 6.4 GB outputs ran into the sandbox's 16 GiB host limit)."""
    pairs = list(zip(tensor_leaves(first), tensor_leaves(second)))
    chunk_count = sum(math.ceil(a.numel() / COMPARE_CHUNK) for a, _ in pairs) or 1
    per_chunk = max(1024, limit // chunk_count)
    found: list[Differences] = []
    for leaf, (a, b) in enumerate(pairs):
        if a.shape != b.shape or a.dtype != b.dtype:
            continue
        rule = tolerance_for(a.dtype, overrides) if a.is_floating_point() else None
        for start, x, y in chunks(a.reshape(-1), b.reshape(-1)):
            if rule is None:
                differ = x != y
            else:
                differ = ~torch.isclose(x.double(), y.double(), atol=rule.atol, rtol=rule.rtol, equal_nan=True)
            where = differ.nonzero().flatten()
            if where.numel() == 0:
                continue
            where = where[::max(1, math.ceil(where.numel() / per_chunk))]
            found.append(Differences(leaf, (where + start).cpu(), x[where].cpu(), y[where].cpu()))
    return found


def agrees_at(output: Any, differences: list[Differences], pick: str, overrides: dict[str, Tolerance]) -> bool:
    """`output` has, at every sampled position, the value the run named by `pick` ("first" or "second") had."""
    leaves = list(tensor_leaves(output))
    for sample in differences:
        if sample.leaf >= len(leaves):
            return False
        flat = leaves[sample.leaf].reshape(-1)
        if flat.numel() <= int(sample.positions.max()):
            return False
        values = flat[sample.positions.to(flat.device)].cpu()
        wanted = getattr(sample, pick)
        if values.dtype != wanted.dtype or not same_within(values, wanted, overrides):
            return False
    return True


def which_memory(judge: Judge, inputs: tuple, first: CandidateRun, second: CandidateRun,
                 overrides: dict[str, Tolerance], footprint: Footprint) -> str:
    """A third run with the second run's free memory (0x3C) and the first run's shared memory (NaN): an output unlike
    the second's followed shared memory (only it changed between them; NaN shows through `0 *` and fmaxf, where
    another finite fill would not), one unlike the first's followed the free memory. Where the same elements read
    both, the NaN from shared memory hides the free memory's part. Only a sample of the elements where the first
    two runs differ is kept meanwhile, on the host: three device copies of 19_ReLU's 6.4 GB output ran an 80 GB H100
    out of memory, and two host copies the sandbox's 16 GiB host limit."""
    differences = differing_elements(first.output, second.output, overrides)
    first.output = second.output = None
    second.shared = ()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the judge's cached blocks go back to the driver: the third run needs the room
    try:
        third = run_candidate(judge, inputs, SECOND_POISON_BYTE, record=False, footprint=footprint,
                              shared_poison=POISON_BYTE)
    except CandidateFailed as exc:
        if exc.sandbox_failure.status == "timeout":
            raise  # its process was killed: nothing more can be asked of it (a hang, as in any other run)
        why = (str(exc.sandbox_failure.message or exc).strip().splitlines() or ["no message"])[0][:300]
        return f"a third run, to tell which memory was read, failed ({why})"  # e.g. out of memory, three outputs held
    if judge.shared_fill != FILLED:
        return f"a third run, to tell which memory was read, could not fill shared memory ({judge.shared_fill})"
    shared = not agrees_at(third.output, differences, "second", overrides)
    free = not agrees_at(third.output, differences, "first", overrides)
    third.output = None
    third_run = "a third run, with the second run's free memory and the first run's shared memory,"
    if shared and free:
        return (f"{third_run} differs from both: it read shared memory that no thread of its block wrote and device "
                f"memory it never wrote")
    if shared:
        return (f"{third_run} gives the first run's output: a kernel read shared memory that no thread of its block "
                f"wrote")
    if free:
        return (f"{third_run} gives the second run's output: it read device memory it never wrote (an output or a "
                f"temporary not fully written), not shared memory")
    return f"{third_run} gives the output of both: its output changes from run to run"


def check_earlier_answer(judge: Judge, run: CandidateRun, index: int, get_inputs: Callable[[], list],
                         ref_model: torch.nn.Module, seed: int, distributions: list[str]) -> None:
    """A trial that failed: did it return the answer to an earlier trial's inputs (a cache keyed by an address
    that the new inputs happened to reuse)? Only failed trials pay for this: the earlier references run again."""
    for earlier in range(index):
        expected = run_reference(ref_model, draw_inputs(get_inputs, seed + earlier, judge.target,
                                                        distributions[earlier]))
        if compare_outputs(expected, run.output, judge.overrides).ok:
            judge.integrity.reject("integrity-stale-output", f"trial {index + 1} returned the answer to the inputs of "
                                                           f"trial {earlier + 1} (an answer kept from an earlier "
                                                           f"call, found by where or what its input was)")
            return


ABLATION_PASSES = {  # the values the ablation overwrites own results with (candidate/ablation.py), and what each tells
    "nan": "NaN",
    "finite": "a finite value (it reached the output only where NaN shows through, as `0 * k` or a clamp bound does)",
    "+inf": "+Inf (it bounds the output from above only, as `torch.minimum(x, k)` with k over every value does)",
    "-inf": "-Inf (it bounds the output from below only, as `torch.maximum(x, k)` with k under every value does)",
}


def check_output_from_kernel(judge: Judge, get_inputs: Callable[[], list], seed: int, stock: list[str]) -> bool | None:
    """Does the output depend on what the candidate's own kernels wrote? The candidate's process runs forward
    plainly and with every result of its own code destroyed, with NaN, a finite value, +Inf and -Inf
    (candidate/ablation.py); an output unchanged by any of them, or own code that ran but wrote nothing, is
    integrity-output-not-from-kernel. None when its own code could not be intercepted (no verdict then)."""
    inputs, others = (draw_inputs(get_inputs, seed + ABLATION_SEED + k, judge.target, "own") for k in (0, 1))
    with PHASES("output-from-kernel check"):
        # the plain run, then two a pass (other inputs, then the ablated run)
        reply = decoded_reply(AblationReply, "ablate", judge.ask(
            "ablate", runs=1 + 2 * len(ABLATION_PASSES), inputs=judge.exchange.send(inputs),
            others=judge.exchange.send(others), own=sorted(judge.own)))
        release(judge)
    ran = ", ".join(reply.names[:3])
    judge.ablation_stock = reply.stock[:100]
    if not reply.launches:
        return None
    made_by = ", ".join([*stock, *reply.stock][:STOCK_OPS_LISTED]) or "none seen"
    if not reply.destroyed:
        judge.integrity.reject("integrity-output-not-from-kernel",
                             f"the candidate's own code ran ({ran}: {reply.launches} launches or calls) but "
                             f"wrote nothing: stock operators made the output ({made_by})")
        return False
    if reply.changed:
        return True
    unchanged = [name for name in ABLATION_PASSES if reply.changed_by.get(name) is False]
    how = "overwritten"
    if unchanged and len(unchanged) < len(ABLATION_PASSES):  # only some values did not reach the output: say which
        how += " with " + "; or with ".join(ABLATION_PASSES[name] for name in unchanged)
    judge.integrity.reject("integrity-output-not-from-kernel",
                         f"the output does not depend on what the candidate's own code wrote: {ran} ran, but with "
                         f"everything it wrote {how}, forward returned the same output; stock operators made it "
                         f"({made_by})")
    return False


def stale_checks(trials: int) -> dict[int, str]:
    """Which trials are followed by a stale-output check, and how: the second in the same tensor objects, the
    third in storage freed and reused, the fourth with a few scattered elements changed in the same objects (the
    first is followed by the rerun over other poison)."""
    return {index: how for index, how in ((1, "objects"), (2, "storage"), (3, "scattered")) if index < trials}


def scattered(inputs: tuple, fresh: tuple, seed: int) -> tuple:
    """`inputs` with SCATTERED_FRACTION of each tensor's elements (at least one, at random places drawn by seed)
    taken from `fresh` (another draw of the problem's inputs, so every value stays one the problem can have): a
    cache keyed by a sample of the values, which most likely misses every changed place, answers for the old
    values."""
    changed = []
    generator = torch.Generator().manual_seed(seed)
    for old, new in zip(inputs, fresh):
        if isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor) and old.shape == new.shape and old.numel():
            count = max(1, int(old.numel() * SCATTERED_FRACTION))
            # drawn with replacement: a permutation of all the places took seconds and 8 bytes an element on the
            # host (13 GB for level1/19_ReLU's 1.6 G elements); a repeated place only changes one fewer element
            places = torch.randint(old.numel(), (count,), generator=generator).to(old.device)
            value = old.clone()
            value.view(-1)[places] = new.reshape(-1)[places].to(old.dtype)
            changed.append(value)
        else:
            changed.append(old)
    return tuple(changed)


def check_stale(judge: Judge, run: CandidateRun, values: tuple, ref_model: torch.nn.Module, how: str) -> None:
    """forward again on new values in the old places: written into the very tensor objects of the run just
    checked (all of them, or a few scattered elements: `scattered`), or copied into tensors that took the storage
    of its inputs once freed. An answer computed for the old values (a cache keyed by identity, data pointer,
    version or a sample of the values) is integrity-stale-output."""
    if how == "scattered":
        values = scattered(tuple(run.shared), values, STALE_SEED)
    expected = run_reference(ref_model, clone_inputs(values))
    with PHASES("stale-output checks"):
        if how in ("objects", "scattered"):
            for given, value in zip(tensor_leaves(run.shared), tensor_leaves(values)):
                given.copy_(value)
            if judge.target.type == "cuda":
                torch.cuda.synchronize(judge.target)
            said = judge.ask("again", runs=1, how="objects")
        else:
            said = judge.ask("again", runs=1, how="storage", inputs=judge.exchange.send(values))
        reply = decoded_reply(AgainReply, "again", said)
        output = judge.exchange.receive(reply.output)
        comparison = compare_candidate(expected, output, reply.plain, judge.overrides)
        del output, expected
    if not comparison.ok:
        place = ("the same tensor objects, their values changed in place" if how == "objects" else
                 f"the same tensor objects, {SCATTERED_FRACTION:.1%} of their elements changed in place"
                 if how == "scattered" else
                 "new tensors in the storage of the last inputs, freed" +
                 ("" if reply.reused else " (the allocator gave other addresses this time)"))
        judge.integrity.reject("integrity-stale-output", f"called again on {place}, forward returned a wrong answer "
                                                       f"(an answer kept from the earlier call?): {comparison.message}")


def worse(a: Comparison, b: Comparison) -> bool:
    """A failure is worse than a pass; between equals, the larger absolute error."""
    if a.ok != b.ok:
        return not a.ok
    return a.max_abs_error > b.max_abs_error


def note_processes_left(kept: KeeperEnd | None, integrity: Integrity) -> bool:
    """What the candidate's process left running when it ended (its keeper's report): processes that kept
    running, detached or not, are integrity-process-left, and so is a keeper killed before it could say. Whether
    the candidate is rejected for it."""
    if kept is None:
        integrity.reject("integrity-process-left", "the keeper of the candidate's process was killed before it could "
                                                 "report: what the candidate started could not be accounted for")
    elif kept.left_count:
        listed = "; ".join(kept.left[:PROCESSES_LISTED]) + ("; ..." if kept.left_count > PROCESSES_LISTED else "")
        integrity.reject("integrity-process-left", f"the candidate left {kept.left_count} process(es) running after "
                                                 f"its own process ended (now killed): {listed}")
    else:
        return False
    return True


def note_process_changes(seen: ProcessReport, integrity: Integrity) -> None:
    """What the candidate's process reports it changed in itself since before the candidate's import."""
    if seen.timers:
        integrity.reject("integrity-timer-patched",
                       f"the candidate replaced timing functions: {', '.join(seen.timers)}")
    patched = seen.torch
    if patched:
        listed = ", ".join(patched[:TORCH_PATCHES_LISTED]) + (", ..." if len(patched) > TORCH_PATCHES_LISTED else "")
        integrity.reject("integrity-torch-patched", f"the candidate changed torch itself: {listed}")
    if seen.threads:
        integrity.reject("integrity-thread", f"the candidate started thread(s) still alive: {', '.join(seen.threads)}")
