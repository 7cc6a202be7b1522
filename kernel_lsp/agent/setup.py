"""An agent pass as the command and the editor build it: the model client, the workbench, the budget and the
trajectory, from the settings (kernel-lsp optimize and the server's "Optimize this kernel" share this)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernel_lsp.agent.budget import Budget
from kernel_lsp.agent.credentials import BASE_URL_ENV, api_key
from kernel_lsp.config import Settings
from kernel_lsp.contracts.options import VerifyOptions

if TYPE_CHECKING:  # the anthropic SDK takes ~2 s to import: only a pass itself pays for it
    from kernel_lsp.agent.loop import Optimizer

class UnpricedModel(ValueError):
    """A dollar budget for a model whose price is known neither from the price table nor from the settings."""


def settings_prices(settings: Settings) -> tuple[float, float] | None:
    """agentInputPricePerMtok and agentOutputPricePerMtok, when both are set."""
    prices = (settings.agent.input_price_per_mtok, settings.agent.output_price_per_mtok)
    if (prices[0] is None) != (prices[1] is None):
        raise UnpricedModel("set both agentInputPricePerMtok and agentOutputPricePerMtok, or neither")
    return None if prices[0] is None else (float(prices[0]), float(prices[1]))


def settings_budget(settings: Settings, model_calls: int | None = None, tokens: int | None = None,
                    dollars: float | None = None, wall_s: float | None = None,
                    evaluations: int | None = None) -> Budget:
    """The agent budgets of the settings, each replaced by its option where one is given; 0 means unlimited. A
    negative option is a ValueError."""
    def limit(option: Any, setting: Any) -> Any:
        if option is not None and option < 0:
            raise ValueError(f"budget options take 0 (unlimited) or more, got {option}")
        chosen = setting if option is None else option
        return chosen or None

    return Budget(model_calls=limit(model_calls, settings.agent.max_model_calls),
                  tokens=limit(tokens, settings.agent.max_total_tokens),
                  dollars=limit(dollars, settings.agent.max_dollars),
                  wall_s=limit(wall_s, settings.agent.max_wall_s),
                  evaluations=limit(evaluations, settings.agent.max_evaluations))


def check_priced(settings: Settings, model: str | None, dollars: float | None) -> tuple[float, float] | None:
    """The prices of the settings (None: the price table's); UnpricedModel when a dollar budget is set for a model
    whose price neither knows."""
    from kernel_lsp.agent.model import price_per_mtok

    chosen = model or settings.agent.model
    prices = settings_prices(settings)
    if dollars and prices is None and price_per_mtok(chosen) is None:
        raise UnpricedModel(f"no price is known for the model {chosen}, so the dollar budget of {dollars:g} "
                            "cannot be kept: set agentInputPricePerMtok and agentOutputPricePerMtok (USD per "
                            "million tokens), or a dollar budget of 0 (unlimited)")
    return prices


def trajectory_directory(settings: Settings, workspace: Path | None, file: Path) -> Path:
    """trajectoryDir (workspace-relative, else relative to FILE's folder), else trajectories/ in the worker's cache."""
    from kernel_lsp.config import cache_dir

    if not settings.agent.trajectory_dir:
        return cache_dir() / "trajectories"
    return (workspace or file.resolve().parent) / Path(settings.agent.trajectory_dir).expanduser()


def build_optimizer(file: Path, reference: Path, start_text: str, workspace: Path | None, settings: Settings,
                    worker: Any, options: VerifyOptions | Mapping[str, Any], budget: Budget, model: str | None = None,
                    on_event: Any = None, planning: bool | None = None, objective: str | None = None,
                    parallel: int | None = None, trajectories: Path | None = None,
                    target: str | None = None) -> Optimizer:
    """One pass over `file` (its text `start_text`, '' to let the model write the first ModelNew), as the command and
    the editor run it. `parallel`: expansions at once (default: the worker's capacity); `trajectories`: the folder
    of the trajectory and the memory (default: trajectory_directory's)."""
    from kernel_lsp.agent.loop import Optimizer
    from kernel_lsp.agent.memory import KernelMemory
    from kernel_lsp.agent.model import ModelClient
    from kernel_lsp.agent.tools import Workbench
    from kernel_lsp.agent.trajectory import TrajectoryWriter, new_pass_id

    chosen = model or settings.agent.model
    prices = check_priced(settings, chosen, budget.dollars)
    client = ModelClient(settings.agent.api_key or api_key(),
                         settings.agent.base_url or os.environ.get(BASE_URL_ENV) or None,
                         chosen, settings.agent.max_tokens, settings.agent.temperature,
                         max_retries=settings.agent.max_retries, timeout_s=settings.agent.timeout_s,
                         prices=prices, thinking_budget=settings.agent.thinking_budget,
                         prompt_caching=settings.agent.prompt_caching)
    pass_id = new_pass_id()
    folder = trajectories or trajectory_directory(settings, workspace, file)
    trajectory = TrajectoryWriter(folder, pass_id)
    workbench = Workbench(file.resolve(), reference.resolve(), start_text, settings, worker, options, pass_id)
    workbench.target = target or settings.agent.target
    return Optimizer(client, workbench, budget, trajectory, workbench.verify_options.device, on_event=on_event,
                     memory=KernelMemory(folder / "memory", file),
                     planning=settings.agent.planning if planning is None else planning,
                     objective=objective or settings.agent.objective, parallel=parallel)
