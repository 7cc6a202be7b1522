"""The search tree of one pass: candidates as nodes, which one to improve next, dead ends, and a memory for the model.

Node 0 is the user's kernel. The loop asks select() for the node to improve, has the model write new candidates
from it (add_child), evaluates each and record()s the result, which also adds one visit and the node's reward to
the node and every ancestor (kept for the trajectory; the selection reads each node's own reward).

The reward steers the search; the rubric's score (agent/rubric.py, against the baselines) ranks the results. The
reward is relative to the pass's own starting point: the original's speed when it was verified and timed, else the
first verified candidate's. A verified candidate `relative` times as fast as that point (its energy term included)
gets log2(1 + relative): 1 at the same speed, ~log2(relative) when much faster, towards 0 when much slower; a
verified candidate that was not timed UNTIMED_REWARD; anything else 0. So a 46x gain counts ~5.5 however slow the
path is against eager (on a CPU every interpreted Triton kernel is ~1000x slower than eager, and the rubric scores
them all ~0.001), and the exploration term no longer swamps it.

select() picks among all nodes (select_many(): several starts for expansions run at once), each expansion
started from a node counted in its `expansions`, the live, open node of highest
    reward + UCT_C * sqrt(ln(1 + expansions of the whole tree) / (1 + expansions started from the node)),
the better reward on a tie. UCT_C = 1.0 suits the rewards, where one doubling of speed adds about 1: the best node
is refined again and again while it stays ahead, and another one gets its turn once the best has been expanded
often without a better child. (Walking down from the root with UCT and progressive widening, as before, chose the
root in 11 of 12 expansions: every verify visits it, so it kept qualifying for a new child.)

An expansion that ends with `finish` closes its branch: the node it started from and the nodes it added are not
selected again (open is False); the pass ends when no open live node is left.

Pruning marks a node dead, and dead nodes are never selected nor expanded: an integrity reject (a cheat is not a
place to start from), a compile failure that is the COMPILE_FAILURE_LIMIT-th in a row along its branch, or a failure
(compile error, reject, compute-sanitizer errors) that is the FAILURE_LIMIT-th in a row. The root is never dead:
the user's kernel is always a place to start again.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

from kernel_lsp.agent.evaluation import eager_speedup
from kernel_lsp.agent.rubric import RubricScore, measured

UCT_C = 1.0
COMPILE_FAILURE_LIMIT = 3
FAILURE_LIMIT = 4  # compile errors and rejects in a row along a branch: a dead end
UNTIMED_REWARD = 0.5
FAILURES = ("compile-error", "rejected", "integrity", "unsafe")
MEMORY_LINE_CHARS = 200  # one line per attempt keeps the memory cheap in tokens


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


@dataclass
class Node:
    """One candidate. value: the sum of the rewards backed up through it; rubric: None until evaluated."""

    id: int
    parent_id: int | None
    source: str
    evaluation: dict[str, Any] | None = None
    rubric: RubricScore | None = None
    feedback: str = ""
    reward: float = 0.0  # what the search backs up for this node (module docstring)
    strategy: str = ""  # the planned strategy its branch follows ("" without a plan)
    visits: int = 0
    value: float = 0.0
    dead: bool = False
    dead_reason: str = ""
    expansions: int = 0  # expansions started from this node
    closed: bool = False  # its branch ended with the model's finish: never selected again
    children: list[int] = field(default_factory=list)

    @property
    def score(self) -> float:
        return self.rubric.score if self.rubric else 0.0

    @property
    def mean_value(self) -> float:
        return self.value / self.visits if self.visits else 0.0

    @property
    def outcome(self) -> str:
        """The rubric's one-line reason ('verified 1.4× eager', 'rejected: ...'), or 'not evaluated'."""
        return self.rubric.reason if self.rubric else "not evaluated"

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "parent_id": self.parent_id, "source": self.source,
                "source_sha256": source_hash(self.source), "evaluation": self.evaluation,
                "rubric": self.rubric.to_dict() if self.rubric else None, "feedback": self.feedback,
                "reward": self.reward, "strategy": self.strategy, "visits": self.visits, "value": self.value,
                "dead": self.dead, "dead_reason": self.dead_reason, "expansions": self.expansions,
                "closed": self.closed, "children": list(self.children)}


class SearchTree:
    """The candidates of one pass, rooted at the user's kernel (node 0)."""

    def __init__(self, root_source: str, uct_c: float = UCT_C,
                 compile_failure_limit: int = COMPILE_FAILURE_LIMIT) -> None:
        self.uct_c = uct_c
        self.compile_failure_limit = compile_failure_limit
        self.nodes: list[Node] = [Node(0, None, root_source)]
        self.reference_speedup: float | None = None  # the eager speedup rewards are relative to, once known

    @property
    def root(self) -> Node:
        return self.nodes[0]

    def add_child(self, parent: Node, source: str) -> Node:
        """A new, unevaluated candidate written from `parent`."""
        if parent.dead:
            raise ValueError(f"node {parent.id} is a dead end ({parent.dead_reason}); it takes no children")
        child = Node(len(self.nodes), parent.id, source)
        self.nodes.append(child)
        parent.children.append(child.id)
        return child

    def record(self, node: Node, evaluation: dict[str, Any], rubric: RubricScore, feedback: str) -> None:
        """Store a candidate's evaluation and score, apply the prune rules, and back the score up to the root."""
        node.evaluation, node.rubric, node.feedback = evaluation, rubric, feedback
        node.reward = self.reward_of(node)
        node.dead_reason = self.dead_end_reason(node)
        node.dead = bool(node.dead_reason)
        for ancestor in self.path_to_root(node):
            ancestor.visits += 1
            ancestor.value += node.reward

    def rescore(self, node: Node, rubric: RubricScore) -> None:
        """A new score for an evaluated node (its evaluation gained a measurement): the difference is backed up to
        the root, so every ancestor's value stays the sum of its subtree's scores."""
        node.rubric = rubric
        reward = self.reward_of(node)
        delta, node.reward = reward - node.reward, reward
        for ancestor in self.path_to_root(node):
            ancestor.value += delta

    def reward_of(self, node: Node) -> float:
        """The node's reward (module docstring); the first timed verified node sets the pass's reference speed."""
        rubric = node.rubric
        if rubric is None or not rubric.verified:
            return 0.0
        eager = measured(eager_speedup(node.evaluation))
        if eager is None:
            return UNTIMED_REWARD
        if self.reference_speedup is None:
            self.reference_speedup = eager
        relative = eager / self.reference_speedup * 2 ** rubric.parts.get("energy", 0.0)
        return math.log2(1 + relative)

    def dead_end_reason(self, node: Node) -> str:
        """Why a just-evaluated node is pruned, or '' when it is not."""
        if node.parent_id is None:
            return ""
        if node.rubric is not None and node.rubric.outcome == "integrity":
            return "integrity reject"
        failures = self.compile_failures_in_a_row(node)
        if failures >= self.compile_failure_limit:
            return f"{failures} compile failures in a row"
        failures = self.failures_in_a_row(node)
        if failures >= FAILURE_LIMIT:
            return f"{failures} failures in a row (compile errors and rejects)"
        return ""

    def failures_in_a_row(self, node: Node) -> int:
        count = 0
        for step in self.path_to_root(node):
            if step.rubric is None or step.rubric.outcome not in FAILURES:
                break
            count += 1
        return count

    def compile_failures_in_a_row(self, node: Node) -> int:
        count = 0
        for step in self.path_to_root(node):
            if step.rubric is None or step.rubric.outcome != "compile-error":
                break
            count += 1
        return count

    def path_to_root(self, node: Node) -> list[Node]:
        path = [node]
        while path[-1].parent_id is not None:
            path.append(self.nodes[path[-1].parent_id])
        return path

    def open_nodes(self) -> list[Node]:
        """The nodes an expansion may start from: neither dead nor closed."""
        return [node for node in self.nodes if not node.dead and not node.closed]

    def select(self) -> Node | None:
        """The node the next expansion starts from (module docstring), its expansions counted; None when every
        node is dead or closed."""
        candidates = self.open_nodes()
        if not candidates:
            return None
        total = sum(node.expansions for node in self.nodes)
        node = max(candidates, key=lambda n: (self.priority(n, total), n.reward, -n.id))
        node.expansions += 1
        return node

    def select_many(self, count: int) -> list[Node]:
        """Where `count` expansions run at once start: select() each time, so each counted start lowers the
        priority of its node for the next (a node comes twice only while it stays well ahead)."""
        chosen = [self.select() for _ in range(max(1, count))]
        return [node for node in chosen if node is not None]

    def priority(self, node: Node, total_expansions: int) -> float:
        exploration = math.sqrt(math.log(1 + total_expansions) / (1 + node.expansions))
        return node.reward + self.uct_c * exploration

    def close(self, nodes: list[Node]) -> None:
        """A branch the model finished: these nodes start no more expansions."""
        for node in nodes:
            node.closed = True

    def best_verified(self) -> Node | None:
        """The verified node of highest score (the earlier one on a tie), None when nothing verified."""
        verified = [n for n in self.nodes if n.rubric is not None and n.rubric.verified]
        return max(verified, key=lambda n: (n.score, -n.id), default=None)

    def memory(self, limit: int = 20) -> str:
        """What was tried and how it went, newest first, one line per distinct source, at most `limit` lines."""
        lines: list[str] = []
        seen: set[str] = set()
        for node in reversed(self.nodes):
            digest = source_hash(node.source)
            if node.rubric is None or digest in seen:
                continue
            seen.add(digest)
            lines.append(memory_line(node))
            if len(lines) == limit:
                break
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        best = self.best_verified()
        return {"constants": {"uct_c": self.uct_c, "reference_speedup": self.reference_speedup,
                              "failure_limit": FAILURE_LIMIT, "compile_failure_limit": self.compile_failure_limit},
                "best_verified": best.id if best else None,
                "nodes": [node.to_dict() for node in self.nodes]}


def memory_line(node: Node) -> str:
    """'#4 from #1: verified 1.4× eager · fused the loads' (plus 'dead end: ...' when pruned), on one line."""
    origin = f" from #{node.parent_id}" if node.parent_id is not None else " (the original)"
    strategy = f" [{node.strategy}]" if node.strategy else ""
    text = f"#{node.id}{origin}{strategy}: {node.outcome}"
    feedback = node.feedback.strip().splitlines()
    if feedback:
        text += f" · {feedback[0]}"
    if node.dead:
        text += f" · dead end: {node.dead_reason}"
    return text if len(text) <= MEMORY_LINE_CHARS else text[:MEMORY_LINE_CHARS - 1] + "…"
