"""One optimization pass: the model proposes candidates through the tools, the worker judges them, the search tree
decides where to go next, and the pass stops at the first spent budget, when the model has finished every branch,
or when cancelled.

A pass is a sequence of expansions. Each expansion starts a fresh conversation from the node SearchTree.select()
picks among all nodes, given the tree's memory (what was tried and how it went) and that node's verdict, the
verifier's objections, its last profile and its source. Within it, each verify of a changed candidate adds a child
node (to the expansion's latest live node, so a fix hangs under what it fixes) with its rubric score. An expansion
ends after VERIFIES_PER_EXPANSION verifies (enough to act on the verifier's answer while the context is fresh) or
when the model ends its turn without a tool call; two such idle expansions in a row end the pass. `finish` ends
its expansion's branch (the start and the nodes it added are closed); the pass ends once no open node is left.

When the worker runs several jobs at once (a Ray pool: one per actor), that many expansions run at once, each from
a start SearchTree.select_many() picks (each counted start lowers its node's priority) with its own Workbench fork; a round
of them counts as idle when none of them verified anything, and the trajectory's events carry their `expansion`.

The original candidate (node 0) is verified first: an improvement is a verified candidate faster than it by more
than IMPROVEMENT_MARGIN of its time; when the original does not verify (or the file has no ModelNew), an improvement
is a verified candidate faster than PyTorch eager.
"""

from __future__ import annotations

import asyncio
import json
import logging
import platform
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kernel_lsp import __version__
from kernel_lsp.agent import rubric
from kernel_lsp.agent.evaluation import candidate_timing, device_of, eager_speedup, report_of
from kernel_lsp.agent.budget import Budget, Spend
from kernel_lsp.agent.compaction import compact, prompt_tokens
from kernel_lsp.agent.memory import KernelMemory
from kernel_lsp.agent.model import ModelClient, ModelError
from kernel_lsp.agent.safety import sanitizer_errors
from kernel_lsp.agent.search import Node, SearchTree, source_hash
from kernel_lsp.agent.tools import WORKER_TOOLS, ToolResult, Workbench, candidate_ms, numbered_source
from kernel_lsp.agent.trajectory import TrajectoryWriter
from kernel_lsp.compile.toolchain import cutlass_headers
from kernel_lsp.findings import scrub
from kernel_lsp.contracts.options import to_config
from kernel_lsp.contracts.verify_report import Timing, VerifyReport
from kernel_lsp.verify.verdict import CPU_TIMINGS, best_so_far, readable_ms
from kernel_lsp.worker.client import WorkerUnavailable

log = logging.getLogger(__name__)

VERIFIES_PER_EXPANSION = 3
IDLE_EXPANSIONS_LIMIT = 2
MAX_PARALLEL_EXPANSIONS = 8
IMPROVEMENT_MARGIN = 0.03  # a time within 3% of the original's is timing noise, not an improvement
MEMORY_LINES = 20
PROFILE_CHARS = 1500  # of a profile's answer, carried into the prompts of later expansions from the same source
SIDE_FILE_SUFFIX = ".kernel-lsp-best.py"

SYSTEM_PROMPT = """You optimize a GPU kernel. The user's file defines ModelNew, which must compute the same function \
as the reference's Model (same outputs, within floating-point tolerance, for the inputs get_inputs() makes) and \
should be faster. You work only through the tools: read the reference and the current candidate, write a new \
candidate (the whole file or line edits), compile it, verify it, and, once its structure has settled, profile it.

Rules:
- Only a candidate the verifier accepts counts, and only its measured speedup. The verifier checks correctness \
on several input sets and checks integrity: mutating or aliasing the inputs, reusing outputs, caching by pointer, \
calling PyTorch instead of your kernel, hiding work on other streams or threads, patching timers. Any of these is \
rejected and scores zero.
- Keep the file self-contained: the same imports, ModelNew with the same constructor arguments as Model, and \
{language_rule}
- Compile before you verify; read the verifier's problems and fix them. Do not repeat an attempt the memory \
lists as failed.
- Call finish when you have no better idea; the best verified candidate is what the user gets.

{device_note}"""

LANGUAGE_RULES = {
    "auto": "the kernels written in the same language as the current candidate (Triton or CUDA through "
            "load_inline).",
    "cuda": "the kernels written in CUDA C++, built with torch.utils.cpp_extension.load_inline.",
    "triton": "the kernels written in Triton (@triton.jit functions launched from forward).",
    "cute": "the kernels written in CuTe (CUTLASS's C++ layout algebra: #include <cute/tensor.hpp>; make_tensor, "
            "make_layout, local_tile and local_partition; copy and gemm through TiledCopy and TiledMMA; on Hopper, "
            "SM90 GMMA atoms (WGMMA) and TMA copies), built with torch.utils.cpp_extension.load_inline with "
            "extra_include_paths=[{include}] and extra_cuda_cflags=['-std=c++17', '--expt-relaxed-constexpr'] "
            "(add '-gencode=arch=compute_90a,code=sm_90a' for WGMMA and TMA). Use search_cutlass to see how the "
            "headers and examples do it.",
    "cute-dsl": "the kernels written in the CuTe Python DSL (import cutlass; import cutlass.cute as cute; "
                "@cute.kernel for the kernel, @cute.jit for its launcher, tensors passed through "
                "cutlass.cute.runtime.from_dlpack). Use search_cutlass to see how CuTe's layouts and atoms work.",
}
NO_CUTLASS = "(the CUTLASS headers were not found on this machine: pip install 'kernel-lsp[cutlass]')"

CPU_NOTE = ("This pass runs on the CPU: Triton kernels run under TRITON_INTERPRET=1, where every program instance is "
            "interpreted, so fewer, larger blocks are faster. CUDA cannot run here.")
GPU_NOTE = "This pass runs on the worker's GPU."
SANITIZE_NOTE = ("Each candidate that verifies is also run under compute-sanitizer (out-of-bounds and misaligned "
                 "accesses, shared-memory races, uninitialized reads, barrier errors): an error in your kernels "
                 "rejects it, however fast it is.")
PLANNING_TURNS = 4  # the planner's turns at most; it ends at its first propose_strategies
MAX_STRATEGIES = 4
PLANNING_PROMPT = (
    "Plan this pass before anyone writes code. Read the reference and the current candidate (and, for CUDA, its "
    "static facts) as you need, then call propose_strategies with 2 to 4 distinct strategies to try, each a short "
    "name and one sentence saying what to change (tiling, fusion of operations, vectorized loads and stores, tensor "
    "cores, fewer launches, a different work split, ...). Each strategy gets its own branch of the search.\n\n"
    "What was tried so far (newest first):\n{memory}\n\nWhat earlier passes on this file tried:\n{earlier}")
PROPOSE_TOOL = {
    "name": "propose_strategies",
    "description": "Propose the pass's strategies: 2 to 4 distinct ways to make the kernel faster, each tried in "
                   "its own branch.",
    "input_schema": {"type": "object", "required": ["strategies"], "properties": {"strategies": {
        "type": "array", "items": {"type": "object", "required": ["name", "idea"], "properties": {
            "name": {"type": "string"}, "idea": {"type": "string"}}}}}},
}
PLANNER_TOOLS = ("read_reference", "read_candidate", "static_facts")
UNKNOWN_DEVICE_NOTE = "The worker picks the device: its GPU when it has one, else the CPU (Triton's interpreter)."


@dataclass(frozen=True)
class Strategy:
    name: str
    idea: str


class PlanningBench:
    """The planner's tools: the workbench's reading tools and static facts, and propose_strategies."""

    def __init__(self, workbench: Workbench, optimizer: Optimizer) -> None:
        self.workbench = workbench
        self.optimizer = optimizer

    def tool_definitions(self) -> list[dict[str, Any]]:
        return [t for t in self.workbench.tool_definitions() if t["name"] in PLANNER_TOOLS] + [PROPOSE_TOOL]

    async def execute(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        if name == "propose_strategies":
            return self.optimizer.propose(arguments if isinstance(arguments, dict) else {})
        if name not in PLANNER_TOOLS:
            return ToolResult(json.dumps({"error": f"the planner's tools are {', '.join(PLANNER_TOOLS)} and "
                                                   "propose_strategies"}), is_error=True)
        return await self.workbench.execute(name, arguments)


@dataclass(frozen=True)
class ProgressEvent:
    """What the editor's progress report and the CLI show: the stage, the best verified speedup, the spend."""

    stage: str
    message: str
    best_speedup_eager: float | None
    spend: dict[str, Any]
    verified: int = 0  # the verified candidates so far, the original not counted
    cpu: bool = False  # they ran on the CPU: best_speedup_eager is an interpreter's ratio, not shown

    @property
    def best(self) -> str | None:
        """The best so far in words (verdict.best_so_far), None when nothing verified."""
        return best_so_far(self.best_speedup_eager, self.verified, self.cpu)


@dataclass
class PassOutcome:
    best_source: str | None  # the best verified candidate that is not the original, None when none verified
    best_summary: str | None
    best_speedup: dict[str, Any] | None  # {"eager", "compile"} as the worker measured them
    improved: bool  # the module docstring's rule
    improvement: str  # one sentence: what the best was compared with, and how it came out
    stop_reason: str
    spend: dict[str, Any]
    trajectory_path: Path
    side_file: Path | None  # the best candidate, or the best attempt when none verified; None when nothing was tried
    original_verdict: str | None
    error_kind: str | None = None  # a ModelError's kind, or "worker", when the pass stopped on one
    nodes: int = 0
    finish_summary: str = ""
    attempts: list[dict[str, Any]] = field(default_factory=list)  # one per evaluated node: id, parent, outcome
    best_ms: float | None = None  # the best candidate's median time per call
    best_energy_mj: float | None = None  # its energy per call, where a profile read it (a GPU with NVML)
    best_interval: dict[str, Any] | None = None  # the 95% interval of each of best_speedup
    best_device: str | None = None  # where the best ran: "cuda", or "cpu" (its speedups say nothing of a GPU)
    verified: int = 0  # the verified candidates, the original not counted


class StopPass(Exception):
    """The pass ends here; the message is the stop reason."""


class Optimizer:
    """Runs one pass (module docstring). Cancelling the task running `run` stops it cleanly: the trajectory is
    closed with an "end" event, the side file written, `self.outcome` set, and the CancelledError re-raised."""

    def __init__(self, model: ModelClient, workbench: Workbench, budget: Budget, trajectory: TrajectoryWriter,
                 device: str, on_event: Callable[[ProgressEvent], None] | None = None,
                 verifies_per_expansion: int = VERIFIES_PER_EXPANSION, parallel: int | None = None,
                 memory: KernelMemory | None = None, planning: bool = False, objective: str = "speed") -> None:
        self.model = model
        self.workbench = workbench
        self.budget = budget
        self.trajectory = trajectory
        self.device = device
        self.on_event = on_event or (lambda event: None)
        self.verifies_per_expansion = verifies_per_expansion
        self._parallel_option = parallel
        self.parallel = 1  # expansions at once: set when the search starts (_search)
        self.tree = SearchTree(workbench.state.source)
        self.spend = Spend()
        self.outcome: PassOutcome | None = None
        self._error_kind: str | None = None
        self._environment_written = False
        self.memory = memory  # earlier passes on this file: read into the prompts, this pass added at its end
        self._earlier = memory.prompt() if memory is not None else ""
        self.planning = planning  # a planning turn first: distinct strategies, one per branch from the root
        self.objective = objective  # speed | energy (best_candidate: least energy at matched speed)
        self.strategies: list[Strategy] = []
        self._added: dict[int, list[Node]] = {}  # per workbench (id): the nodes its current expansion added
        self._profiles: dict[str, str] = {}  # source hash -> the last profile's answer for that source
        self._profile_gists: dict[str, str] = {}  # source hash -> its last profile's top hints, in a line
        self._prompt_tokens: dict[int, int] = {}  # a conversation in flight (its list's id) -> its last prompt's size
        self._machine = ""  # the GPU and the problem's speed of light, from the original's verification
        workbench.node_view = self.node_view
        workbench.on_stage = self._emit

    async def run(self) -> PassOutcome:
        self.trajectory.write("start", original=str(self.workbench.original), reference=str(self.workbench.reference),
                              model=self.model.model, device=self.device, target=self.workbench.target,
                              budget=self.budget.to_dict(),
                              verify_options=to_config(self.workbench.verify_options), system=self.system_prompt())
        try:
            reason = await self._search()
        except asyncio.CancelledError:
            self.outcome = self._finish("cancelled")
            raise
        except StopPass as stop:
            reason = str(stop)
        except ModelError as error:
            self._error_kind, reason = error.kind, f"model API error: {error.message}"
        except WorkerUnavailable as error:
            self._error_kind, reason = "worker", f"worker unavailable: {error}"
        except Exception as error:  # a bug of ours: the pass still ends with what it found, and says why
            log.exception("optimize: the pass failed")
            self._error_kind, reason = "internal", f"kernel-lsp failed ({type(error).__name__}: {error})"
        self.outcome = self._finish(reason)
        return self.outcome

    def _wall_left_s(self) -> float | None:
        """What the wall-time budget leaves for a model call in flight (None: no wall budget)."""
        return self.budget.wall_left_s(self.spend)

    def system_prompt(self) -> str:
        """The same for the whole pass once the original is verified (the prompt cache's prefix): the machine's
        facts come from that verification."""
        note = {"cpu": CPU_NOTE, "cuda": GPU_NOTE}.get(self.device, UNKNOWN_DEVICE_NOTE)
        if self.device != "cpu" and self.workbench.settings.agent.sanitize:
            note += " " + SANITIZE_NOTE
        if self._machine:
            note += "\n\n" + self._machine
        return SYSTEM_PROMPT.format(device_note=note, language_rule=self.language_rule())

    def language_rule(self) -> str:
        """What the kernels are written in: the agentTarget setting (--target); CuTe names the headers' folder."""
        rule = LANGUAGE_RULES.get(self.workbench.target, LANGUAGE_RULES["auto"])
        if self.workbench.target != "cute":
            return rule
        headers = cutlass_headers(self.workbench.settings.compile.cutlass_include)
        return rule.format(include=repr(headers.include) if headers else f"... {NO_CUTLASS}")

    # --- the search ----------------------------------------------------------------------------------

    async def _search(self) -> str:
        await self._evaluate_original()
        if self.planning:
            await self._plan()
        # as many expansions at once as the worker runs jobs at once (1 locally, one per Ray actor), read after
        # the original's verify has started the worker (a Ray pool knows its actors then)
        capacity = getattr(self.workbench.worker, "capacity", 1)
        option = self._parallel_option
        self.parallel = max(1, min(MAX_PARALLEL_EXPANSIONS, option if option is not None else capacity))
        if self.parallel > 1:
            self._emit("start", f"{self.parallel} expansions at once (the worker runs {capacity} jobs at once)")
        idle, finished = 0, None
        while True:
            self._check_budget(self.budget.exceeded(self.spend))
            starts = self.tree.select_many(self.parallel)
            if not starts:  # every branch was finished by the model (or is a dead end)
                self.workbench.state.finished = finished
                return f"the model finished: {finished or 'no summary'}"
            if self.parallel == 1:
                self.workbench.start_from(starts[0].source)
                benches = [self.workbench]
                verifies = await self._expand(starts[0], self.workbench)
            else:
                benches = [self.workbench.fork(start.source) for start in starts]
                verifies = await self._expand_together(starts, benches)
            for start, bench in zip(starts, benches):
                if bench.state.finished is not None:  # a finish ends its branch: the start and what it added
                    finished = bench.state.finished
                    self.tree.close([start, *self._added.get(id(bench), [])])
                    bench.state.finished = None
                self._added.pop(id(bench), None)
            idle = 0 if verifies else idle + 1
            if idle >= IDLE_EXPANSIONS_LIMIT:
                return "the model stopped proposing candidates"

    async def _expand_together(self, starts: list[Node], benches: list[Workbench]) -> int:
        """Expansions run at once, each with its own workbench (their evaluations go to the worker together); all
        are awaited, then the first error any of them raised (a spent budget, the model API, the worker) ends the
        pass as it would have ended a single expansion."""
        outcomes = await asyncio.gather(*(self._expand(start, bench, expansion=number)
                                          for number, (start, bench) in enumerate(zip(starts, benches), 1)),
                                        return_exceptions=True)
        errors = [o for o in outcomes if isinstance(o, BaseException)]
        if errors:
            raise errors[0]
        return sum(outcomes)

    async def _evaluate_original(self) -> None:
        root = self.tree.root
        if not root.source.strip():
            self._emit("start", "no ModelNew in the file: the model writes the first candidate")
            return
        self._check_budget(self.budget.refuses_evaluation(self.spend))
        self._emit("verify", "verifying the original candidate")
        result = await self.workbench.execute("verify", {})
        for _ in range(result.worker_jobs):
            self.spend.add_evaluation()
        report = report_of(result.evaluation)
        self._machine = machine_facts(report)  # before the environment event, which records it
        self._record(root, result)
        if self.device == "auto":  # the worker chose: the prompt says which
            self.device = report.device if report is not None else "auto"

    async def _expand(self, start: Node, bench: Workbench, expansion: int | None = None) -> int:
        """One conversation from `start` on `bench`; returns how many verifies added nodes. `expansion` numbers
        the expansions run at once (their trajectory events carry it)."""
        tag = {} if expansion is None else {"expansion": expansion}
        strategy = self._strategy_for(start)
        messages: list[dict[str, Any]] = [{"role": "user", "content": self._expansion_prompt(start, strategy)}]
        self.trajectory.write("message", role="user", node=start.id, content=messages[0]["content"], **tag)
        base, verifies = start, 0
        try:
            while verifies < self.verifies_per_expansion and bench.state.finished is None:
                self._check_budget(self.budget.refuses_model_call(self.spend))
                calls = await self._model_turn(messages, bench, tag)
                if not calls:
                    return verifies
                results = []
                for call in calls:
                    result = await self._run_tool(call, bench, tag)
                    if result.evaluation is not None:
                        base = self._add_node(base, start, result, bench, strategy)
                        verifies += 1
                    if result.energy is not None:
                        self._add_energy(result.energy, bench)
                    results.append(tool_result_block(call, result))
                messages.append({"role": "user", "content": results})
            return verifies
        finally:
            self._prompt_tokens.pop(id(messages), None)

    async def _model_turn(self, messages: list[dict[str, Any]], bench: Workbench,
                          tag: dict[str, Any]) -> list[dict[str, Any]]:
        """The tool calls of the model's next complete turn (none: the conversation ends). Stop reasons as the
        Messages API documents them: a turn cut at max_tokens runs none of its tool calls (each is answered as not
        run, and the model is told how long it may be), a paused turn is sent back to be continued, a refusal
        ends the conversation; at most MAX_INCOMPLETE_TURNS such turns in a row."""
        for _ in range(MAX_INCOMPLETE_TURNS + 1):
            turn = await self._one_model_turn(messages, bench, tag)
            calls = [block for block in turn.blocks if block["type"] == "tool_use"]
            if turn.stop_reason == "max_tokens":
                cut = cut_turn_message(calls, self.model.max_tokens)
                self.trajectory.write("message", role="user", content=cut["content"], cut=True, **tag)
                messages.append(cut)
                self._check_budget(self.budget.refuses_model_call(self.spend))
                continue
            if turn.stop_reason == "pause_turn":  # sent back as it is: the model goes on where it paused
                self._check_budget(self.budget.refuses_model_call(self.spend))
                continue
            if turn.stop_reason == "refusal":
                self._emit("model", "the model declined to go on with this conversation")  # its message says so
                return []
            return calls
        self._emit("model", f"{MAX_INCOMPLETE_TURNS + 1} incomplete answers in a row: this conversation ends")
        return []

    async def _one_model_turn(self, messages: list[dict[str, Any]], bench: Workbench, tag: dict[str, Any]) -> Any:
        self._compact(messages, tag)
        self._emit("model", f"asking {self.model.model}")
        tools = bench.tool_definitions()
        turn = await self.model.turn(self.system_prompt(), messages, tools, time_left_s=self._wall_left_s())
        usage = turn.usage
        self._prompt_tokens[id(messages)] = prompt_tokens(usage)
        self.spend.add_model_call(usage.input_tokens, usage.output_tokens, turn.cost_usd,
                                  usage.cache_creation_input_tokens, usage.cache_read_input_tokens)
        request = {"model": self.model.model, "max_tokens": self.model.turn_max_tokens,
                   "temperature": self.model.temperature, "thinking_budget": self.model.thinking_budget,
                   "prompt_caching": self.model.prompt_caching, "tools": [tool["name"] for tool in tools]}
        self.trajectory.write("message", role="assistant", content=turn.blocks, stop_reason=turn.stop_reason,
                              request=request, retries=turn.retries,
                              usage={"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
                                     "cache_creation_input_tokens": usage.cache_creation_input_tokens,
                                     "cache_read_input_tokens": usage.cache_read_input_tokens},
                              cost_usd=turn.cost_usd, **tag)
        self.trajectory.write("spend", **self.spend.to_dict())
        messages.append({"role": "assistant", "content": turn.blocks})
        return turn

    def _compact(self, messages: list[dict[str, Any]], tag: dict[str, Any]) -> None:
        """Compacts the conversation (agent/compaction.py) when its last turn's prompt passed agentContextTokens."""
        limit = self.workbench.settings.agent.context_tokens
        size = self._prompt_tokens.get(id(messages), 0)
        if limit <= 0 or size <= limit:
            return
        changed = compact(messages, limit)
        if changed["blocks"]:
            self.trajectory.write("compaction", prompt_tokens=size, limit=limit, **changed, **tag)
            self._emit("model", f"the conversation passed {limit:,} tokens ({size:,}): older tool results shortened")

    async def _run_tool(self, call: dict[str, Any], bench: Workbench, tag: dict[str, Any]) -> ToolResult:
        name, arguments = call["name"], call.get("input") or {}
        self.trajectory.write("tool_call", id=call["id"], name=name, input=arguments, **tag)
        refusal = self.budget.refuses_evaluation(self.spend) if name in WORKER_TOOLS else None
        if refusal:
            result = ToolResult(json.dumps({"error": f"not run: {refusal}"}), is_error=True)
        else:
            self._emit(name, f"{name}…")
            result = await bench.execute(name, arguments)
        # what a candidate raised or printed reaches the model here: never a credential (the tools bound its length)
        result = replace(result, content=scrub(result.content, limit=None))
        for _ in range(result.worker_jobs):
            self.spend.add_evaluation()
        if name == "profile" and not result.is_error:  # carried into later expansions from this source
            profiled = source_hash(bench.state.source)
            self._profiles[profiled] = result.content[:PROFILE_CHARS]
            gist = profile_gist(result.content)  # and, shorter, into the memory of later passes
            if gist:
                self._profile_gists[profiled] = gist
        self.trajectory.write("tool_result", id=call["id"], name=name, content=result.content,
                              is_error=result.is_error, **tag)
        return result

    def _add_node(self, base: Node, start: Node, result: ToolResult, bench: Workbench,
                  strategy: Strategy | None = None) -> Node:
        parent = base if not base.dead else start
        node = self.tree.add_child(parent, bench.state.source)
        node.strategy = strategy.name if strategy is not None else ""
        self._record(node, result)
        self._added.setdefault(id(bench), []).append(node)
        return node

    def _record(self, node: Node, result: ToolResult) -> None:
        evaluation = result.evaluation or {}
        score = rubric.score(evaluation)
        self.tree.record(node, evaluation, score, evaluation.get("summary") or "")
        if not self._environment_written:  # the worker has answered once: its GPU, driver and versions are known
            self._environment_written = True
            self.trajectory.write("environment", **environment(self.workbench.worker), machine=self._machine)
        codes = problem_codes(evaluation)
        self.trajectory.write("evaluation", node=node.id, parent=node.parent_id, source=node.source,
                              verdict=evaluation.get("verdict"), summary=evaluation.get("summary"), codes=codes,
                              evaluation=evaluation)
        self._score_event(node, score)

    def _score_event(self, node: Node, score: rubric.RubricScore, **more: Any) -> None:
        self.trajectory.write("score", node=node.id, **score.to_dict(), reward=node.reward, dead=node.dead,
                              dead_reason=node.dead_reason, **more)
        # the model reads the rubric's reason with its interpreter ratio; the user reads the code lens's words
        cpu = device_of(node.evaluation) == "cpu"
        shown = (node.evaluation or {}).get("summary") if score.verified and cpu else None
        self._emit(score.outcome, f"#{node.id}: {shown or score.reason}")

    def _add_energy(self, energy: dict[str, Any], bench: Workbench) -> None:
        """A profile read the energies of the current candidate, which verified before (profile is offered only
        then): its node's rubric gains the energy term."""
        source = bench.state.source
        node = next((n for n in reversed(self.tree.nodes) if n.source == source and n.rubric is not None
                     and n.rubric.verified), None)
        if node is None:
            return
        node.evaluation = {**node.evaluation, "energy": energy}
        score = rubric.score(node.evaluation)
        self.tree.rescore(node, score)
        self._score_event(node, score, energy=energy)

    async def _plan(self) -> None:
        """The planning role: one conversation that reads what it needs and proposes distinct strategies (the
        propose_strategies tool); none proposed leaves the search unplanned."""
        messages: list[dict[str, Any]] = [{"role": "user", "content": PLANNING_PROMPT.format(
            memory=self.tree.memory(MEMORY_LINES) or "nothing yet", earlier=self._earlier or "none")}]
        self.trajectory.write("message", role="user", node=0, content=messages[0]["content"], role_name="planner")
        planner = PlanningBench(self.workbench, self)
        for _ in range(PLANNING_TURNS):
            self._check_budget(self.budget.refuses_model_call(self.spend))
            calls = await self._model_turn(messages, planner, {"role_name": "planner"})
            if not calls:
                break
            results = []
            for call in calls:
                result = await self._run_tool(call, planner, {"role_name": "planner"})
                results.append(tool_result_block(call, result))
            messages.append({"role": "user", "content": results})
            if self.strategies:
                break
        self._prompt_tokens.pop(id(messages), None)
        self.trajectory.write("plan", strategies=[{"name": s.name, "idea": s.idea} for s in self.strategies])
        self._emit("plan", "; ".join(s.name for s in self.strategies) or "no strategies proposed")

    def _strategy_for(self, start: Node) -> Strategy | None:
        """A branch keeps its strategy; an expansion from the root takes the strategy with the fewest branches."""
        if not self.strategies:
            return None
        if start.parent_id is not None:
            return next((s for s in self.strategies if s.name == start.strategy), None)
        taken = [self.tree.nodes[i].strategy for i in self.tree.root.children]
        return min(self.strategies, key=lambda s: taken.count(s.name))

    def propose(self, arguments: dict[str, Any]) -> ToolResult:
        """The propose_strategies tool: 2 to MAX_STRATEGIES distinct strategies, each a name and an idea."""
        proposed = arguments.get("strategies")
        if not isinstance(proposed, list) or not proposed:
            return ToolResult(json.dumps({"error": "give `strategies`: a list of {name, idea}"}), is_error=True)
        kept: list[Strategy] = []
        for item in proposed[:MAX_STRATEGIES]:
            if not isinstance(item, dict) or not str(item.get("name") or "").strip():
                return ToolResult(json.dumps({"error": "each strategy needs a `name` and an `idea`"}), is_error=True)
            name = " ".join(str(item["name"]).split())[:60]
            if name not in {s.name for s in kept}:
                kept.append(Strategy(name, " ".join(str(item.get("idea") or "").split())[:400]))
        self.strategies = kept
        return ToolResult(json.dumps({"ok": True, "strategies": [s.name for s in kept]}))

    def _expansion_prompt(self, start: Node, strategy: Strategy | None = None) -> str:
        memory = self.tree.memory(MEMORY_LINES) or "nothing yet"
        if not start.source.strip():
            here = "There is no candidate yet: write the first ModelNew (read the reference first)."
        else:
            here = f"The current candidate is node #{start.id} ({start.outcome}). Improve it.{self._node_facts(start)}"
        best = self.tree.best_verified()
        if best is not None and best.id != start.id:
            here += f" The fastest verified so far is #{best.id}; read any earlier candidate with read_node."
        if strategy is not None:
            idea = f": {strategy.idea.rstrip('.')}." if strategy.idea else "."
            here += (f"\n\nThis branch follows the planned strategy '{strategy.name}'{idea} Implement it (other "
                     "branches try the other strategies).")
        prompt = f"{here}\n\nWhat was tried so far (newest first):\n{memory}"
        if self._earlier:
            prompt += f"\n\nWhat earlier passes on this file tried (newest first):\n{self._earlier}"
        return prompt

    def _node_facts(self, node: Node) -> str:
        """What the expansion prompt says of its start node: what the verifier objected to, its last profile
        (when one ran on this source), and its source with line numbers (as read_candidate shows it)."""
        facts = ""
        problems = [f"{p.get('code')}: {p.get('message')}" for p in (node.evaluation or {}).get("problems") or []
                    if isinstance(p, dict)][:3]
        if problems:
            facts += "\n\nWhat the verifier said of it:\n" + "\n".join(f"- {p}" for p in problems)
        profile = self._profiles.get(source_hash(node.source))
        if profile:
            facts += f"\n\nIts last profile:\n{profile}"
        return facts + f"\n\nIts source:\n{numbered_source(node.source)}"

    def node_view(self, number: int) -> dict[str, Any] | None:
        """The read_node tool's answer: an earlier candidate of this pass, with what the worker said of it."""
        if not 0 <= number < len(self.tree.nodes):
            return None
        node = self.tree.nodes[number]
        evaluation = node.evaluation or {}
        report = report_of(evaluation)
        codes = problem_codes(evaluation)
        return {"node": node.id, "parent": node.parent_id, "outcome": node.outcome,
                "summary": evaluation.get("summary"), "speedup": dict(report.speedup) if report else None,
                "codes": codes,
                "dead_end": node.dead_reason or None, "source": node.source}

    def _check_budget(self, refusal: str | None) -> None:
        if refusal:
            raise StopPass(refusal)

    # --- the end -------------------------------------------------------------------------------------

    def _finish(self, reason: str) -> PassOutcome:
        best = best_candidate(self.tree, self.objective)
        improved, sentence = improvement(self.tree.root, best)
        side = best or best_attempt(self.tree)
        side_file = write_side_file(self.workbench.original, side.source) if side is not None else None
        best_report = report_of(best.evaluation) if best else None
        outcome = PassOutcome(
            best_source=best.source if best else None, best_summary=best.evaluation.get("summary") if best else None,
            best_speedup=dict(best_report.speedup) if best_report else None,
            best_interval={kind: list(pair) for kind, pair in best_report.interval.items()} if best_report else None,
            improved=improved, improvement=sentence, stop_reason=reason, spend=self.spend.to_dict(),
            trajectory_path=self.trajectory.path, side_file=side_file,
            original_verdict=(self.tree.root.evaluation or {}).get("verdict"), error_kind=self._error_kind,
            nodes=len(self.tree.nodes), finish_summary=self.workbench.state.finished or "",
            attempts=[{"node": n.id, "parent": n.parent_id, "outcome": n.outcome, "score": n.score, "dead": n.dead,
                       "verdict": (n.evaluation or {}).get("verdict"), "codes": problem_codes(n.evaluation or {})}
                      for n in self.tree.nodes if n.rubric is not None],
            best_ms=candidate_ms(best.evaluation) if best else None, best_energy_mj=_energy(best) if best else None,
            best_device=best_report.device if best_report else None,
            verified=self._verified())
        if self.memory is not None:
            self.memory.add_pass(self.trajectory.pass_id, self.tree, self._profile_gists,
                                 self.workbench.state.finished or "")
        self.trajectory.write("end", stop_reason=reason, improved=improved, improvement=sentence,
                              best_node=best.id if best else None, side_file=str(side_file) if side_file else None,
                              spend=outcome.spend, tree=self.tree.to_dict())
        self.trajectory.close()
        self._emit("done", f"{reason}; {sentence}")
        return outcome

    def _emit(self, stage: str, message: str) -> None:
        best = best_candidate(self.tree)
        speedup = eager_speedup(best.evaluation) if best else None
        cpu = ((device_of(best.evaluation) if best else None) or self.device) == "cpu"
        log.info("optimize: %s: %s", stage, message)
        self.on_event(ProgressEvent(stage, message, speedup, self.spend.to_dict(), self._verified(), cpu))

    def _verified(self) -> int:
        return sum(1 for n in self.tree.nodes[1:] if n.rubric is not None and n.rubric.verified)


PROFILE_GIST_HINTS = 3


def profile_gist(answer: str) -> str:
    """A profile tool answer (JSON: kernels and their hints, costliest first) in a line: the kernels' bounds and
    their top hints' codes and first sentences; '' when it holds none."""
    try:
        shown = json.loads(answer)
    except ValueError:
        return ""
    parts: list[str] = []
    for kernel in (shown.get("kernels") or []) if isinstance(shown, dict) else []:
        if not isinstance(kernel, dict):
            continue
        bound = f" ({kernel['bound']}-bound)" if kernel.get("bound") else ""
        hints = [f"{h.get('code')}: {str(h.get('message') or '').split('. ')[0]}"
                 for h in kernel.get("hints") or [] if isinstance(h, dict)][:PROFILE_GIST_HINTS]
        parts.append(f"{kernel.get('name') or 'kernel'}{bound}" + (f": {'; '.join(hints)}" if hints else ""))
    return " | ".join(parts)


def problem_codes(evaluation: dict[str, Any]) -> list[str]:
    """The finding codes behind an evaluation's verdict (its problems: compile errors or the verifier's findings;
    compute-sanitizer's errors)."""
    problems = [*(evaluation.get("problems") or []), *sanitizer_errors(evaluation)]
    return [p["code"] for p in problems if isinstance(p, dict) and p.get("code")]


MAX_INCOMPLETE_TURNS = 2  # turns cut at max_tokens or paused, in a row, before a conversation is given up


def cut_turn_message(calls: list[dict[str, Any]], max_tokens: int) -> dict[str, Any]:
    """The user message after a turn cut at max_tokens: each of its tool calls answered as not run (its input is
    whatever part arrived), and what to do instead."""
    advice = (f"Your answer was cut: it reached the limit of {max_tokens} output tokens (agentMaxTokens). "
              f"Nothing of it was run. Answer again in fewer tokens: for write_candidate give `edits` (line ranges "
              f"and their new text) instead of the whole `source`, and keep any text before the call short.")
    if not calls:
        return {"role": "user", "content": advice}
    return {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": call["id"], "is_error": True,
         "content": json.dumps({"error": "not run: " + advice})} for call in calls]}


def tool_result_block(call: dict[str, Any], result: ToolResult) -> dict[str, Any]:
    """A tool's answer as the next user message's content block (scrubbed of credentials: it goes to the model)."""
    return {"type": "tool_result", "tool_use_id": call["id"], "content": scrub(result.content, limit=None),
            **({"is_error": True} if result.is_error else {})}


def machine_facts(report: VerifyReport | None) -> str:
    """The GPU and the problem's speed of light, as the original's verification measured them (none on the CPU,
    where the interpreter's times say nothing of a GPU): 'The GPU: NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, ...).'"""
    if report is None or report.device != "cuda":
        return ""
    lines = []
    gpu = report.device_facts
    if gpu is not None and gpu.name:
        parts = [gpu.arch, f"{gpu.sms} SMs" if gpu.sms else ""]
        if gpu.shared_per_block_optin:
            parts.append(f"up to {gpu.shared_per_block_optin // 1024} KiB of shared memory per block")
        if gpu.registers_per_sm:
            parts.append(f"{gpu.registers_per_sm} registers per SM")
        if gpu.l2_bytes:
            parts.append(f"{gpu.l2_bytes / 2**20:.0f} MiB L2")
        if gpu.memory_bytes:
            parts.append(f"{gpu.memory_bytes / 2**30:.0f} GiB")
        lines.append(f"The GPU: {gpu.name} ({', '.join(p for p in parts if p)}).")
    floor = report.floor
    if floor is not None and floor.floor_ms:
        measured = (f"Measured on it: {floor.bandwidth_gbs:.0f} GB/s copy bandwidth and "
                    f"{floor.peak_tflops:.0f} TFLOP/s for the fastest matmul.")
        size = floor.bytes
        moved = f"{size / 1e9:.3g} GB" if size >= 1e9 else f"{size / 1e6:.3g} MB"
        work = (f"This problem moves {moved} and does {floor.flops / 1e9:.3g} GFLOP: at those ceilings "
                f"it takes at least {readable_ms(floor.floor_ms)} (its speed of light)")
        original = report.timing.candidate.median_ms if report.timing and report.timing.candidate else None
        if original:
            work += f"; the original takes {readable_ms(original)}"
        lines += [measured, work + "."]
    return " ".join(lines)


def environment(worker: Any) -> dict[str, Any]:
    """Where the pass ran, for the trajectory: kernel-lsp and Python here; the worker's GPU, driver and package
    versions (torch, triton, CUDA) as its status says once it has answered."""
    status = getattr(worker, "status", None)
    facts = {name: getattr(status, name, None) for name in ("address", "gpu", "driver", "versions")}
    return {"kernel_lsp": __version__, "python": platform.python_version(), "platform": platform.platform(),
            "worker": facts if status is not None else None}


def best_candidate(tree: SearchTree, objective: str = "speed") -> Node | None:
    """The verified node of highest rubric score other than the original (the earlier one on a tie). With the
    "energy" objective: among the verified nodes as fast as the fastest within its timing spread, the one of least
    energy per call where energies were read (a profile on a GPU), else the fastest."""
    verified = [n for n in tree.nodes[1:] if n.rubric is not None and n.rubric.verified]
    best = max(verified, key=lambda n: (n.score, -n.id), default=None)
    timed = [n for n in verified if _timing(n) is not None]
    if objective != "energy" or not timed:
        return best
    fastest = min(timed, key=lambda n: (_timing(n).median_ms, n.id))  # by time alone, no energy term
    timing = _timing(fastest)
    bound = timing.median_ms * (1 + max(0.0, timing.spread))
    matched = [n for n in timed if _timing(n).median_ms <= bound and _energy(n) is not None]
    return min(matched, key=lambda n: (_energy(n), n.id), default=fastest)


def _timing(node: Node) -> Timing | None:
    return candidate_timing(node.evaluation)


def _energy(node: Node) -> float | None:
    return rubric.measured(((node.evaluation or {}).get("energy") or {}).get("candidate_mj_per_call"))


def best_attempt(tree: SearchTree) -> Node | None:
    """When nothing verified: the newest candidate that got furthest (compiled beats a compile error)."""
    attempts = [n for n in tree.nodes[1:] if n.evaluation is not None and n.rubric.outcome != "integrity"]
    compiled = [n for n in attempts if (n.evaluation.get("compile") or {}).get("compiled")]
    return (compiled or attempts or [None])[-1]


def improvement(root: Node, best: Node | None) -> tuple[bool, str]:
    """Whether `best` is a verified improvement (module docstring), and the sentence saying against what."""
    if best is None:
        return False, "no candidate verified"
    best_ms = candidate_ms(best.evaluation)
    original_ms = candidate_ms(root.evaluation) if root.evaluation else None
    cpu = device_of(best.evaluation) == "cpu"
    if original_ms is not None and best_ms is not None:
        faster = best_ms < original_ms * (1 - IMPROVEMENT_MARGIN)
        if cpu:  # the interpreter's times rank candidates under it, but as figures they say nothing of a GPU
            return faster, (f"#{best.id} verified and {'faster' if faster else 'no faster'} than the original under "
                            f"the CPU interpreter ({CPU_TIMINGS}: verify it on a GPU to measure)")
        return faster, (f"#{best.id} takes {best_ms:.4g} ms against the original's {original_ms:.4g} ms "
                        f"({original_ms / best_ms:.3g}× {'faster' if faster else 'no real gain'})")
    eager = eager_speedup(best.evaluation)
    if eager is None:
        return False, f"#{best.id} verified but was not timed against eager"
    faster = eager > 1.0
    if cpu:
        return faster, (f"#{best.id} verified, {'faster' if faster else 'no faster'} than PyTorch eager under the CPU "
                        f"interpreter ({CPU_TIMINGS}; there was no verified original to beat)")
    return faster, f"#{best.id} runs at {eager:.3g}× PyTorch eager (there was no verified original to beat)"


def side_file_path(original: Path) -> Path:
    return original.with_name(original.stem + SIDE_FILE_SUFFIX)


def write_side_file(original: Path, source: str) -> Path:
    path = side_file_path(original)
    path.write_text(source, encoding="utf-8")
    return path
