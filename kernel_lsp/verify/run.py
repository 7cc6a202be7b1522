"""verify_candidate: the verdict on one candidate, computed inside a sandboxed child (a SandboxTask entry).

This process is the judge: it never imports the candidate. The candidate lives in a process of its own
(candidate/side.py, started first so its imports overlap the reference's set-up), confined to its scratch folder
and the build caches, without the network. The judge imports the reference, draws every input set by seed,
computes the reference's outputs here, where no candidate code ever ran, and sends the candidate a copy of the
inputs in shared memory (candidate/exchange.py). Each correctness trial runs forward there over freshly poisoned
memory, and the judge looks itself: at the output as it was when forward returned and once everything the
candidate started has finished (pending work), at its copy of the inputs (mutation), and compares. The first
trial, and any failing one, are run again over differently poisoned memory: an output that changes read
memory it never wrote. What only the candidate's process can see (the kernels it launched, torch patched, timers
replaced, threads left) it reports, and the judge records it as reported. Only a candidate that passed
everything is timed, by the judge's clock alone: whole batches of its calls, in rounds interleaved with the
baselines' batches (run by the reference's Model in a process of the candidate's kind, candidate/handle.py
BaselineProcess, which no candidate code enters), on input values the judge changes between rounds; nothing the
candidate's process says of its own time is used (`measure`).

Every request after the candidate's load (its import and build, bounded by the sandbox's wall time) has a time
limit derived from the reference's own slowest call (HangLimits): a candidate that hangs is a `timeout`
(run-timeout) within seconds, not when the sandbox or the client gives up. When the candidate's process has ended, anything it started and left running was killed by its
keeper and is integrity-process-left.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from kernel_lsp.candidate.exchange import Exchange
from kernel_lsp.candidate.handle import BaselineProcess, baseline_process, candidate_process, decoded_reply
from kernel_lsp.candidate.integrity import POISON_BYTE
from kernel_lsp.candidate.kernels import Window, classify, own_kernel_names, work_share
from kernel_lsp.contracts.candidate_replies import LoadReply, ProcessReport, Recording
from kernel_lsp.contracts.options import VerifyOptions, from_config
from kernel_lsp.contracts.codec import Wire, decode, encode
from kernel_lsp.contracts.verify_report import Comparison, Correctness, Isolation, Kernels, Unavailable, VerifyReport
from kernel_lsp.process.isolation import use_judge_build_caches
from kernel_lsp.process.namespaces import isolation_status
from kernel_lsp.sources import parse_python
from kernel_lsp.verify.checks import (
    STALE_SEED,
    check_earlier_answer,
    check_library_work,
    check_output_from_kernel,
    check_rerun,
    check_stale,
    compare_candidate,
    note_process_changes,
    note_processes_left,
    note_run_integrity,
    reported_window,
    stale_checks,
    work_report,
    worse,
)
from kernel_lsp.verify.compare import Tolerance
from kernel_lsp.verify.judge import (
    PHASES,
    CandidateRun,
    Footprint,
    HangLimits,
    Judge,
    ReferenceFailed,
    Integrity,
    clone_inputs,
    note_candidate_phases,
    release,
    run_candidate,
    size_in_bytes,
)
from kernel_lsp.verify.reference import (
    accepted_distributions,
    build_reference,
    choose_device,
    device_facts,
    draw_inputs,
    load_in,
    run_reference,
)
from kernel_lsp.verify.rounds import measure


def verify_candidate(reference: str, candidate: str, options: dict[str, object] | None = None,
                     cache_dir: str | None = None, files: dict[str, str] | None = None) -> Wire:
    """The sandbox entry: `judged_report`'s report in its wire form (contracts.codec; the worker decodes it).
    `options`: the "verify" job's options as its config has them (contracts.options.VerifyOptions; camelCase keys,
    defaults for those missing)."""
    return encode(judged_report(reference, candidate, from_config(VerifyOptions, options or {}), cache_dir,
                                files or {}))


def judged_report(reference: str, candidate: str, opts: VerifyOptions, cache_dir: str | None,
                  files: dict[str, str]) -> VerifyReport | Unavailable:
    """The judge's report on one candidate (docs/ARCHITECTURE.md), built typed part by part; the worker decodes
    what arrives strictly, so a field the judge filled with the wrong type fails there, naming it."""
    use_judge_build_caches()  # before the reference's torch.compile builds anything
    started = time.perf_counter()
    target = choose_device(opts.device)
    if isinstance(target, str):
        return Unavailable(target)
    needs_a_gpu = gpu_only_reason(files.get(candidate, "")) if target.type == "cpu" else None
    if needs_a_gpu is not None:
        return Unavailable(needs_a_gpu)
    sandbox = isolation_status()
    if opts.require_isolation and not sandbox.startswith("isolated"):
        return Unavailable(f"the candidate was not run: its sandbox cannot start here "
                           f"({sandbox.removeprefix('not isolated: ')}), and requireIsolation "
                           f"is on (kernel-lsp doctor says what is missing)")
    PHASES.seconds.clear()
    with candidate_process(opts.allow_network, target.type, (candidate, reference)) as process:
        judge = Judge(process, Exchange(process.exchange_folder, "judge", process.channel), target, Integrity(device=target.type),
                      HangLimits(opts.hang_timeout_s))
        report = judge_candidate(judge, reference, candidate, opts, cache_dir, files)
        closing = time.perf_counter()
    PHASES.seconds["closing the candidate's process"] = time.perf_counter() - closing
    if isinstance(report, Unavailable):
        return report
    left = note_processes_left(process.kept, judge.integrity)
    return replace(report, verdict="rejected" if left else report.verdict, integrity=list(judge.integrity.problems),
                   duration_s=time.perf_counter() - started,
                   phases_s={name: round(seconds, 3) for name, seconds in PHASES.seconds.items()})


CUTE_DSL_NEEDS_A_GPU = ("CuTe DSL kernels run only on an NVIDIA GPU, and this verification runs on the CPU: "
                        "verify on a GPU worker; without one, kernel-lsp's CuTe DSL compile check still compiles them")


CUDA_EXTENSION_NEEDS_A_GPU = ("this candidate builds CUDA (load_inline's cuda_sources, or .cu sources), which needs a "
                              "GPU and a CUDA build of torch, and this verification runs on the CPU: verify on a GPU "
                              "worker; without one, kernel-lsp check and profile still compile it and read its "
                              "kernels' figures")


def gpu_only_reason(text: str) -> str | None:
    """Why a candidate cannot be verified on the CPU (CuTe DSL kernels, CUDA sources); None if it can."""
    if not text:
        return None
    model = parse_python(text)
    if model.cute_kernels:
        return CUTE_DSL_NEEDS_A_GPU
    # a cpp_extension call with CUDA sources: a CPU build of torch cannot build it, nor a CPU run its kernels
    builds_cuda = any(ext.cuda_sources or any(str(s).endswith((".cu", ".cuh")) for s in ext.source_files)
                      for ext in model.extensions)
    return CUDA_EXTENSION_NEEDS_A_GPU if builds_cuda else None


def judge_candidate(judge: Judge, reference: str, candidate: str, opts: VerifyOptions, cache_dir: str | None,
                    files: dict[str, str]) -> VerifyReport | Unavailable:
    """The report of one candidate judged against its reference, with the job's options as decoded once."""
    target, seed = judge.target, opts.seed
    overrides = {name: Tolerance(**t) for name, t in opts.tolerances.items()}
    judge.overrides, judge.own, judge.allowed = overrides, own_kernel_names(files), opts.allowed_kernels
    try:
        with PHASES("reference set-up"):
            reference_module, ref_model = build_reference(reference, target)
            distributions, judge.hang.reference_s = accepted_distributions(reference_module.get_inputs, ref_model,
                                                                           target, seed)
    except ReferenceFailed as exc:
        return Unavailable(str(exc))
    gc.freeze()  # torch, the reference and the judge live until this process ends: collections skip them
    with PHASES("waiting for the candidate's process"):
        isolation = decode(Isolation, judge.process.ready())
    with PHASES("candidate import and build"):
        loaded = load_in(judge, candidate, reference_module, ref_model)
    note_candidate_phases(loaded.seconds)
    # the baselines' process starts now, its imports overlapping the trials (a candidate that does not build
    # never costs one); it is killed at once if the candidate is not timed
    with (baseline_process(target.type, (reference,)) if timed_baselines(opts, target) else nullcontext()) as base:
        return trials_and_timing(judge, reference, reference_module, ref_model, distributions, loaded, isolation, opts,
                                 cache_dir, base)


def timed_baselines(opts: VerifyOptions, target: torch.device) -> bool:
    """Whether a baseline will be timed if the candidate passes (compile is not timed on the CPU)."""
    return opts.timing and any(kind != "compile" or target.type != "cpu" for kind in opts.baselines)


def trials_and_timing(judge: Judge, reference: str, reference_module: Any, ref_model: torch.nn.Module,
                      distributions: list[str], loaded: LoadReply, isolation: Isolation, opts: VerifyOptions,
                      cache_dir: str | None, baselines_process: BaselineProcess | None) -> VerifyReport:
    """The trials, the checks that follow them and, for a candidate that passed them all, the timing."""
    target, integrity, trials, seed = judge.target, judge.integrity, opts.trials, opts.seed
    overrides = judge.overrides
    correctness, kernels = run_trials(judge, reference_module.get_inputs, ref_model, trials, seed, distributions,
                                      overrides, judge.own, opts.allowed_kernels)
    # the candidate's process's word, shown as said
    correctness = replace(correctness, weights=loaded.weights)
    if correctness.passed == trials and kernels.custom:
        kernels = replace(kernels, output_from_kernel=check_output_from_kernel(judge, reference_module.get_inputs,
                                                                               seed, kernels.stock),
                          work=check_library_work(judge, kernels.work, ref_model, draw_inputs(
                              reference_module.get_inputs, seed, target, distributions[0])))
    with PHASES("the candidate's process report"):
        note_process_changes(decoded_reply(ProcessReport, "report", judge.ask("report")), integrity)
    correct = correctness.passed == correctness.trials and not integrity.problems
    measured = None
    if correct and opts.timing:
        measured = measure(judge, reference_module, ref_model, opts.timed_calls, opts.warmup, seed, opts.baselines,
                           Path(cache_dir) if cache_dir else None, reference, baselines_process)
    return VerifyReport(
        verdict="verified" if correct and not integrity.problems else "rejected", device=target.type,
        correctness=correctness, integrity=list(integrity.problems), kernels=kernels,
        timing=measured.timing if measured else None,
        speedup={"eager": None, "compile": None, **(measured.speedup if measured else {})},
        interval=measured.interval if measured else {}, significant=measured.significant if measured else {},
        gpu=measured.gpu if measured else None, floor=measured.floor if measured else None,
        device_facts=device_facts(target), isolation=isolation, shared_memory_poison=judge.shared_fill,
        free_memory_poison=judge.free_poison)


def run_trials(judge: Judge, get_inputs: Callable[[], list], ref_model: torch.nn.Module, trials: int, seed: int,
               distributions: list[str], overrides: dict[str, Tolerance], own: set[str],
               allowed: tuple[str, ...]) -> tuple[Correctness, Kernels]:
    """Correctness over `trials` fresh input sets, cycling through the distributions; integrity noted in the
    verdict. One recording session in the candidate's process covers the trials; what each run launched is
    judged once it ends."""
    target, integrity = judge.target, judge.integrity
    passed = 0
    worst: Comparison | None = None
    used: list[str] = []
    runs: list[CandidateRun] = []
    stale = stale_checks(trials)
    judge.ask("record", on=True)
    for index in range(trials):
        distribution = distributions[index % len(distributions)]
        used.append(distribution)
        inputs = draw_inputs(get_inputs, seed + index, target, distribution)
        expected = run_reference(ref_model, clone_inputs(inputs))
        footprint = Footprint(size_in_bytes(inputs), size_in_bytes(expected))
        run = run_candidate(judge, inputs, POISON_BYTE, record=True, own_copy=stale.get(index) == "storage",
                            footprint=footprint)
        comparison = compare_candidate(expected, run.output, run.plain, overrides)
        del expected
        if not comparison.ok and run.plain:
            check_earlier_answer(judge, run, index, get_inputs, ref_model, seed, used)
        passed += comparison.ok
        if worst is None or worse(comparison, worst):
            worst = comparison
        if index == 0 or not comparison.ok:
            check_rerun(judge, inputs, run, overrides, comparison, footprint)
        run.output = None
        if index in stale and comparison.ok:
            check_stale(judge, run, draw_inputs(get_inputs, seed + STALE_SEED + index, target, distribution),
                        ref_model, stale[index])
        run.shared = ()  # the inputs' shared copy may take GiBs: only the trial's facts are kept
        release(judge)
        runs.append(run)
    recorded = decoded_reply(Recording, "record", judge.ask("record", on=False))
    windows = [reported_window(w.launches, w.current_stream, w.seconds) for w in recorded.windows]
    how = recorded.how if len(windows) == len(runs) else "none"
    custom: set[str] = set()
    stock: set[str] = set()
    for index, (run, window) in enumerate(zip(runs, windows + [Window()] * (len(runs) - len(windows)))):
        use = classify(window.launches, own, allowed)
        custom.update(use.custom)
        stock.update(use.stock)
        note_run_integrity(run, window, use, index, integrity, how, recorded.reason)
    share = work_share(windows, own, allowed) if how != "none" else None
    return (Correctness(trials, passed, used, worst, weights=""),
            Kernels(sorted(custom), sorted(stock), how, work_report(share)))
