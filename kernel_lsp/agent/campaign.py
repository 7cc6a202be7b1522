"""A campaign: one agent pass per problem of a folder (a KernelBench level), measured the way the papers measure an
agent: fast_p for p in {0, 1, 1.5, 2} against eager and torch.compile, geometric-mean speedups, and the cost in
model calls, tokens and dollars.

Everything lives under the campaign's folder OUT:

    OUT/campaign.json            the state (written after every change) and, at the end, the report
    OUT/campaign.md, .svg        the papers' table per level (kernel_lsp/bench/papers.py) and its plot
    OUT/problems/<rel>.py        each problem's copy: the pass's file and reference (its side file lands beside it)
    OUT/best/<rel>.py            the fastest verified candidate of all the problem's passes
    OUT/trajectories/            every pass's trajectory, and the memory of earlier passes on each problem

Budgets: each pass has the per-problem limits; the campaign's totals (a SharedBudget over a ledger of every pass's
spend, earlier runs of the campaign included) stop a pass in flight and keep the next ones from starting.

Resuming: run the same campaign again. A problem whose pass ended ("done") is not run again. A pass that was
stopped (by the campaign's total budget, a model API error, a lost worker) or killed (status "running" in the
state) is run again, with the memory of what it tried; a killed pass's spend and its fastest verified candidate
are read back from its trajectory, which is flushed event by event. An invalid API key or a worker that cannot
start ends the campaign at once (every further pass would fail the same way).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kernel_lsp import __version__
from kernel_lsp.agent.budget import Budget, SharedBudget, Spend, Totals
from kernel_lsp.agent.evaluation import report_of
from kernel_lsp.agent.setup import build_optimizer
from kernel_lsp.agent.tools import candidate_ms
from kernel_lsp.agent.trajectory import read_trajectory
from kernel_lsp.bench.candidates import find_problems, name_of
from kernel_lsp.bench.metrics import BenchMetrics, ProblemResult, bench_metrics
from kernel_lsp.bench.papers import LevelFigures, level_table, papers_markdown, papers_svg
from kernel_lsp.config import Settings
from kernel_lsp.contracts.options import VerifyOptions, to_config
from kernel_lsp.contracts.verify_report import not_comparable_on
from kernel_lsp.verify.verdict import best_so_far

log = logging.getLogger(__name__)

STATE_FILE = "campaign.json"
TABLE_FILE, PLOT_FILE = "campaign.md", "campaign.svg"
FORMAT = 1
COUNTERS = ("model_calls", "input_tokens", "output_tokens", "dollars", "evaluations", "wall_s")
FATAL_ERRORS = {"missing-key": "the API key is missing", "auth": "the model API refused the API key",
                "worker": "the worker is unavailable"}  # every further pass would fail the same way
STATUSES = ("pending", "running", "stopped", "done")  # stopped and running (killed) are run again on resume


class CampaignError(Exception):
    """The campaign cannot start: no problems, or OUT holds a campaign over another folder."""


@dataclass(frozen=True)
class PassSettings:
    """What every pass of the campaign shares."""

    settings: Settings
    options: VerifyOptions
    budget: Budget  # per problem
    total: Budget  # the campaign's
    model: str | None = None
    planning: bool | None = None
    objective: str | None = None
    target: str | None = None


class CampaignLedger:
    """Every pass's spend summed: the finished passes' (this run's and earlier runs'), and the running passes'
    Spend objects read live; wall seconds are the campaign's own (earlier runs' plus this run's)."""

    def __init__(self, earlier: dict[str, float], earlier_wall_s: float) -> None:
        self.earlier = {name: earlier.get(name, 0) for name in COUNTERS}
        self.earlier_wall_s = earlier_wall_s
        self.running: list[Spend] = []
        self.started = time.monotonic()

    @property
    def wall_s(self) -> float:
        return self.earlier_wall_s + time.monotonic() - self.started

    def totals(self) -> Totals:
        def summed(name: str) -> float:
            return self.earlier[name] + sum(getattr(spend, name) for spend in self.running)
        return Totals(model_calls=int(summed("model_calls")),
                      tokens=int(summed("input_tokens") + summed("output_tokens")), dollars=summed("dollars"),
                      wall_s=self.wall_s, evaluations=int(summed("evaluations")))

    def finished(self, spend: Spend) -> None:
        self.running.remove(spend)
        add_spend(self.earlier, spend.to_dict())


def add_spend(into: dict[str, float], spend: dict[str, Any]) -> None:
    for name in COUNTERS:
        into[name] = into.get(name, 0) + (spend.get(name) or 0)


# --- the state ---------------------------------------------------------------------------------------------------

class CampaignState:
    """OUT/campaign.json: the folder, each problem's entry (status, passes, best) and the wall seconds spent; each
    save replaces the file whole (written beside it, then renamed), so a kill never leaves half of it."""

    def __init__(self, out: Path, document: dict[str, Any]) -> None:
        self.out = out
        self.document = document

    @property
    def path(self) -> Path:
        return self.out / STATE_FILE

    @property
    def problems(self) -> dict[str, dict[str, Any]]:
        return self.document["problems"]

    @classmethod
    def open(cls, folder: Path, out: Path, fresh: bool = False) -> CampaignState:
        path = out / STATE_FILE
        if fresh or not path.is_file():
            return cls(out, {"format": FORMAT, "folder": str(folder.resolve()), "problems": {}, "wall_s": 0.0,
                             "runs": []})
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise CampaignError(f"cannot read {path} ({exc}): pass --fresh to start the campaign over") from None
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            raise CampaignError(f"{path} is not a campaign state this version reads: pass --fresh to start over")
        if document.get("folder") != str(folder.resolve()):
            raise CampaignError(f"{out} holds a campaign over {document.get('folder')}, not {folder.resolve()}: "
                                "pass another --out, or --fresh to start over")
        return cls(out, document)

    def add_problems(self, folder: Path, files: list[Path]) -> None:
        """Copy each problem under OUT/problems (kept when already there: a resumed pass runs on the same file)."""
        for source in files:
            relative = source.resolve().relative_to(folder.resolve())
            key = problem_key(folder, source)
            if key in self.problems:
                continue
            copy = self.out / "problems" / relative
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, copy)
            named = name_of(source)
            self.problems[key] = {"key": key, "source": str(source), "file": str(copy), "level": named.level,
                                  "problem_id": named.problem_id, "name": named.name, "status": "pending",
                                  "passes": [], "best": None}

    def recover_killed(self) -> list[str]:
        """Entries left "running" by a killed run: their last pass's spend and fastest verified candidate read
        from its trajectory; the entry becomes "stopped" (run again). Returns their keys."""
        recovered = []
        for key, entry in self.problems.items():
            if entry["status"] != "running":
                continue
            recovered.append(key)
            entry["status"] = "stopped"
            last = entry["passes"][-1] if entry["passes"] else None
            if last is None or last.get("stop_reason") is not None:
                continue
            spend, best, ended = read_killed_pass(Path(last["trajectory"]))
            last.update(spend=spend, stop_reason=ended or "killed (the campaign was stopped during this pass)",
                        error_kind=None, improved=None, best=None)
            if best is not None:
                self.offer_best(entry, last, best["source"], best)
        return recovered

    def offer_best(self, entry: dict[str, Any], record: dict[str, Any], source: str, best: dict[str, Any]) -> None:
        """A pass's fastest verified candidate: kept as the problem's best when it is faster than the best so far
        (by its time per call; without times, by its speedup over eager). Its speedups are marked as a
        VerifyReport's (`speedup_comparable`), for the tools that read the state."""
        reason = not_comparable_on(best.get("device"))
        best = {**best, "speedup_comparable": reason is None, "not_comparable_reason": reason}
        record["best"] = best
        if not _faster(best, entry.get("best")):
            return
        file = self.out / "best" / Path(entry["key"] + ".py")
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(source, encoding="utf-8")
        entry["best"] = {**best, "file": str(file)}

    def spent(self) -> dict[str, float]:
        total: dict[str, float] = {}
        for entry in self.problems.values():
            for record in entry["passes"]:
                add_spend(total, record.get("spend") or {})
        return total

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{STATE_FILE}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(self.document, indent=2, default=str) + "\n", encoding="utf-8")
        os.replace(temporary, self.path)


def problem_key(folder: Path, problem: Path) -> str:
    """A problem's name in the state: its path under the campaign's folder, without '.py' ('level1/19_ReLU')."""
    return problem.resolve().relative_to(folder.resolve()).with_suffix("").as_posix()


def read_killed_pass(trajectory: Path) -> tuple[dict[str, Any], dict[str, Any] | None, str | None]:
    """A pass the campaign did not see end (killed, or interrupted by Ctrl-C): its last recorded spend, its fastest
    verified candidate (with `source`) and, when its trajectory got that far, its `end` event's stop reason ("killed"
    otherwise); an unreadable trajectory gives nothing."""
    try:
        events = read_trajectory(trajectory)
    except (OSError, ValueError) as exc:
        log.warning("campaign: the trajectory %s of a killed pass cannot be read (%s)", trajectory, exc)
        return {}, None, None
    counters = [e["spend"] if e.get("kind") == "end" else e for e in events if e.get("kind") in ("spend", "end")]
    last = counters[-1] if counters else {}
    spend = {name: last.get(name, 0) for name in COUNTERS}
    end = next((e for e in reversed(events) if e.get("kind") == "end"), None)
    ended = f"interrupted: {end.get('stop_reason')}" if end is not None else None
    verified = [e for e in events if e.get("kind") == "evaluation" and e.get("node") != 0
                and candidate_ms(e.get("evaluation") or {}) is not None]
    if not verified:
        return spend, None, ended
    fastest = min(verified, key=lambda e: candidate_ms(e["evaluation"]))
    report = report_of(fastest["evaluation"])
    return spend, {"source": fastest["source"], "ms": candidate_ms(fastest["evaluation"]),
                   "speedup": dict(report.speedup) if report else {},
                   "interval": {kind: list(pair) for kind, pair in report.interval.items()} if report else {},
                   "summary": fastest.get("summary"), "energy_mj": None,
                   "device": report.device if report else None}, ended


def _faster(new: dict[str, Any], old: dict[str, Any] | None) -> bool:
    if old is None:
        return True
    if new.get("ms") is not None and old.get("ms") is not None:
        return new["ms"] < old["ms"]
    return ((new.get("speedup") or {}).get("eager") or 0) > ((old.get("speedup") or {}).get("eager") or 0)


# --- running it --------------------------------------------------------------------------------------------------

@dataclass
class CampaignReport:
    results: list[ProblemResult]
    metrics: BenchMetrics
    rows: list[dict[str, Any]]  # per problem: the result's fields and the cost of its passes
    totals: dict[str, Any]  # the cost of every pass, this run's and earlier runs'
    aborted: str | None  # why the campaign ended before every problem had its pass
    ran: int  # passes run in this run
    resumed: int  # problems done before this run
    levels: list[LevelFigures] = field(default_factory=list)  # the papers' table, per level (bench/papers.py)


class Campaign:
    """Runs the passes of a campaign (module docstring), `parallel` at once on one shared worker (or Ray pool)."""

    def __init__(self, folder: Path, out: Path, passes: PassSettings, worker: Any, parallel: int | None = None,
                 fresh: bool = False, only: list[str] | None = None, limit: int | None = None,
                 on_line: Callable[[str], None] | None = None) -> None:
        self.folder = folder
        self.out = out
        self.passes = passes
        self.worker = worker
        self._parallel = parallel
        self.on_line = on_line or (lambda line: None)
        files = [f for f in find_problems(folder) if not (f.resolve().is_relative_to(out.resolve()))]
        if only:
            files = [f for f in files if any(part in f.relative_to(folder).as_posix() for part in only)]
        files = files[:limit] if limit else files
        if not files:
            raise CampaignError(f"no problems in {folder}" + (f" matching {', '.join(only)}" if only else "")
                                + " (a problem is a .py defining Model and not ModelNew)")
        if fresh and out.is_dir():  # the trajectories stay; the memory goes, so no pass learns from the old ones
            for stale in ("problems", "best", STATE_FILE, "trajectories/memory"):
                path = out / stale
                shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        self.state = CampaignState.open(folder, out, fresh)
        self.state.add_problems(folder, files)
        self.keys = [problem_key(folder, f) for f in files]
        self.recovered = self.state.recover_killed()
        self.ledger = CampaignLedger(self.state.spent(), float(self.state.document.get("wall_s") or 0.0))
        self.aborted: str | None = None
        self._ran = 0
        self._lock = asyncio.Lock()

    @property
    def trajectories(self) -> Path:
        return self.out / "trajectories"

    async def run(self) -> CampaignReport:
        done_before = sum(self.state.problems[k]["status"] == "done" for k in self.keys)
        todo = [k for k in self.keys if self.state.problems[k]["status"] != "done"]
        self.state.document["runs"].append({"started_at": datetime.now(UTC).isoformat(timespec="seconds"),
                                            "kernel_lsp": __version__, "model": self.passes.model
                                            or self.passes.settings.agent.model,
                                            "verify_options": to_config(self.passes.options),
                                            "budget": self.passes.budget.to_dict(),
                                            "total": self.passes.total.to_dict(), "problems": len(self.keys)})
        self.state.save()
        if done_before:
            self.on_line(f"resuming: {done_before} of {len(self.keys)} problems were done before"
                         + (f"; {len(self.recovered)} killed pass(es) read back" if self.recovered else ""))
        await self.worker.ping()  # the worker, or the Ray actors, started: their capacity known
        capacity = max(1, getattr(self.worker, "capacity", 1))
        parallel = max(1, self._parallel or capacity)
        slots = asyncio.Semaphore(parallel)
        self.on_line(f"{len(todo)} problem(s) to run, {parallel} at once")

        async def one(key: str) -> None:
            async with slots:
                await self._one(key, expansions=1 if parallel > 1 else None)

        await asyncio.gather(*(one(key) for key in todo))
        self.state.document["wall_s"] = round(self.ledger.wall_s, 3)
        report = self.report(done_before)
        self.state.document["report"] = {"metrics": report.metrics.to_dict(), "problems": report.rows,
                                         "levels": [row.to_dict() for row in report.levels],
                                         "totals": report.totals, "aborted": report.aborted}
        self.state.save()
        baselines = list(self.passes.options.baselines)
        (self.out / TABLE_FILE).write_text(papers_markdown(report.levels, baselines), encoding="utf-8")
        (self.out / PLOT_FILE).write_text(papers_svg(report.levels, baselines), encoding="utf-8")
        return report

    def _refusal(self) -> str | None:
        """Why the next pass may not start: the campaign was aborted, or one of its totals is spent."""
        return self.aborted or SharedBudget(total=self.passes.total, ledger=self.ledger).exceeded(Spend())

    async def _one(self, key: str, expansions: int | None) -> None:
        entry = self.state.problems[key]
        refusal = self._refusal()
        if refusal:
            entry.setdefault("not_run", refusal)
            return
        entry.pop("not_run", None)
        file = Path(entry["file"])
        budget = SharedBudget(**self.passes.budget.to_dict(), total=self.passes.total, ledger=self.ledger)
        optimizer = build_optimizer(file, file, "", None, self.passes.settings, self.worker, self.passes.options,
                                    budget, self.passes.model, self._progress(key), planning=self.passes.planning,
                                    objective=self.passes.objective, parallel=expansions,
                                    trajectories=self.trajectories, target=self.passes.target)
        record: dict[str, Any] = {"trajectory": str(optimizer.trajectory.path),
                                  "started_at": datetime.now(UTC).isoformat(timespec="seconds"), "stop_reason": None}
        async with self._lock:
            entry["status"] = "running"
            entry["passes"].append(record)
            self.state.save()
        self.ledger.running.append(optimizer.spend)
        self.on_line(f"[{key}] pass started (trajectory {optimizer.trajectory.path})")
        try:
            outcome = await optimizer.run()
        finally:
            self.ledger.finished(optimizer.spend)
        self._ran += 1
        record.update(stop_reason=outcome.stop_reason, error_kind=outcome.error_kind, spend=outcome.spend,
                      improved=outcome.improved, nodes=outcome.nodes, best=None,
                      rejections=rejection_counts(outcome.attempts))
        if outcome.best_source is not None:
            self.state.offer_best(entry, record, outcome.best_source, {
                "ms": outcome.best_ms, "speedup": outcome.best_speedup or {}, "interval": outcome.best_interval or {},
                "summary": outcome.best_summary,
                "energy_mj": outcome.best_energy_mj,
                "device": outcome.best_device or self.passes.options.device})
        stopped = outcome.error_kind is not None or outcome.stop_reason.startswith("the campaign's")
        if outcome.error_kind in FATAL_ERRORS and self.aborted is None:
            self.aborted = f"{FATAL_ERRORS[outcome.error_kind]}: {outcome.stop_reason}"
        async with self._lock:
            entry["status"] = "stopped" if stopped else "done"
            self.state.document["wall_s"] = round(self.ledger.wall_s, 3)
            self.state.save()
        best = entry.get("best")
        cpu = bool(best) and best.get("device") == "cpu"
        shown = (best_so_far(best["speedup"].get("eager"), max(outcome.verified, 1), cpu) if best
                 else None) or ("best verified" if best else "nothing verified")
        self.on_line(f"[{key}] {entry['status']}: {outcome.stop_reason}; {shown}; "
                     f"{outcome.spend['model_calls']} calls, ${outcome.spend['dollars']:.2f}")

    def _progress(self, key: str) -> Callable[[Any], None]:
        def show(event: Any) -> None:
            log.info("campaign: [%s] %s: %s", key, event.stage, event.message)
        return show

    # --- the report --------------------------------------------------------------------------------------------

    def report(self, done_before: int = 0) -> CampaignReport:
        results, rows = [], []
        for key in self.keys:
            entry = self.state.problems[key]
            result = problem_result(entry)
            cost: dict[str, float] = {}
            for record in entry["passes"]:
                add_spend(cost, record.get("spend") or {})
            results.append(result)
            best = entry.get("best") or {}
            rows.append({"key": key, "level": entry["level"], "problem_id": entry["problem_id"],
                         "name": entry["name"], "status": entry["status"], "verdict": result.verdict,
                         "speedup": result.speedup, "ms": result.candidate_ms, "energy_mj": best.get("energy_mj"),
                         "best_file": best.get("file"), "passes": len(entry["passes"]),
                         "reason": result.reason, "device": result.device,
                         "speedup_comparable": result.speedup_comparable,
                         "not_comparable_reason": result.not_comparable_reason,
                         "stop_reason": entry["passes"][-1].get("stop_reason") if entry["passes"] else None,
                         "cost": _rounded(cost),
                         "trajectories": [r["trajectory"] for r in entry["passes"]]})
        baselines = list(self.passes.options.baselines)
        metrics = bench_metrics(results, baselines)
        totals = _rounded(self.state.spent())
        totals["campaign_wall_s"] = round(self.ledger.wall_s, 1)
        levels = level_table(results, [row["cost"] for row in rows], baselines)
        return CampaignReport(results, metrics, rows, totals, self.aborted, self._ran, done_before, levels)


def problem_result(entry: dict[str, Any]) -> ProblemResult:
    """A problem as a row of KernelBench's metrics: verified when a pass found a verified candidate (its best);
    rejected when passes ran and none verified; unavailable when no pass ended (not run, stopped, killed)."""
    best = entry.get("best")
    passes = entry["passes"]
    if best is not None:
        verdict, reason = "verified", None
    elif entry["status"] == "done":
        verdict, reason = "rejected", rejection_reason(passes)
    else:
        verdict = "unavailable"
        reason = entry.get("not_run") or (passes[-1].get("stop_reason") if passes else "not run")
    return ProblemResult(candidate=(best or {}).get("file") or entry["file"], reference=entry["source"],
                         level=entry["level"], problem_id=entry["problem_id"], name=entry["name"], verdict=verdict,
                         device=(best or {}).get("device"), speedup=dict((best or {}).get("speedup") or {}),
                         interval=dict((best or {}).get("interval") or {}),
                         candidate_ms=(best or {}).get("ms"), reason=reason, summary=(best or {}).get("summary"))


def rejection_counts(attempts: list[dict[str, Any]]) -> dict[str, int]:
    """How often each finding code stood behind a candidate that was not verified (the user's original, node 0,
    left out: it is not the agent's kernel); a candidate that failed with no code counts under its outcome."""
    counts: dict[str, int] = {}
    for attempt in attempts:
        if attempt.get("node") == 0 or attempt.get("verdict") == "verified":
            continue
        for code in dict.fromkeys(attempt.get("codes") or [attempt.get("verdict") or "compile-error"]):
            counts[code] = counts.get(code, 0) + 1
    return counts


def rejection_reason(passes: list[dict[str, Any]]) -> str:
    """Why no kernel of the problem's passes was verified: the finding codes behind its rejected candidates, most
    frequent first; "no candidate was evaluated" (and why the pass stopped) when the agent evaluated none."""
    counts: dict[str, int] = {}
    for record in passes:
        for code, count in (record.get("rejections") or {}).items():
            counts[code] = counts.get(code, 0) + count
    if not counts:
        stopped = passes[-1].get("stop_reason") if passes else None
        return "no candidate was evaluated" + (f" (the pass: {stopped})" if stopped else "")
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return "rejected: " + ", ".join(f"{code} ×{count}" if count > 1 else code for code, count in ranked)


def _rounded(spend: dict[str, float]) -> dict[str, Any]:
    out: dict[str, Any] = {name: round(spend.get(name, 0), 6 if name == "dollars" else 3) for name in COUNTERS}
    for name in ("model_calls", "input_tokens", "output_tokens", "evaluations"):
        out[name] = int(out[name])
    out["tokens"] = out["input_tokens"] + out["output_tokens"]
    return out

