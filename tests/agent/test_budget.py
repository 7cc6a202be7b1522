"""Budgets: limits spent in a fixed order, checks before a model call or an evaluation, wall time from monotonic."""

from __future__ import annotations

import time

import pytest

from kernel_lsp.agent.budget import LIMIT_ORDER, Budget, Spend


def test_nothing_is_exceeded_while_every_limit_has_room() -> None:
    spend = Spend()
    spend.add_model_call(input_tokens=100, output_tokens=50, dollars=0.01)
    spend.add_evaluation()
    assert Budget(model_calls=2, tokens=1000, dollars=1.0, wall_s=60, evaluations=2).exceeded(spend) is None
    assert Budget().exceeded(spend) is None  # None is unlimited


def test_a_limit_is_spent_when_the_counter_reaches_it() -> None:
    spend = Spend()
    budget = Budget(model_calls=2)
    spend.add_model_call(10, 10, 0.0)
    assert budget.exceeded(spend) is None
    spend.add_model_call(10, 10, 0.0)
    assert budget.exceeded(spend) == "the budget of 2 model calls is spent"


def test_tokens_count_input_and_output_together() -> None:
    spend = Spend()
    spend.add_model_call(input_tokens=600, output_tokens=500, dollars=0.0)
    assert spend.tokens == 1100
    assert Budget(tokens=1000).exceeded(spend) == "the budget of 1000 tokens is spent (1100 used)"


def test_when_several_limits_are_spent_the_first_in_the_documented_order_is_named() -> None:
    assert LIMIT_ORDER == ("model_calls", "tokens", "dollars", "wall_s", "evaluations")
    spend = Spend(started=time.monotonic() - 100)
    spend.add_model_call(input_tokens=5000, output_tokens=0, dollars=3.0)
    spend.add_evaluation()
    everything = {"model_calls": 1, "tokens": 1000, "dollars": 2.0, "wall_s": 50, "evaluations": 1}
    expected = ["1 model call ", "1000 tokens", "$2.00", "wall-time", "1 evaluation "]
    for name, words in zip(LIMIT_ORDER, expected):
        message = Budget(**everything).exceeded(spend)
        assert message is not None and words in message, (name, message)
        del everything[name]  # lift the first limit: the next one in the order is named
    assert Budget().exceeded(spend) is None


def test_wall_time_runs_from_the_monotonic_start() -> None:
    spend = Spend(started=time.monotonic() - 30)
    assert 30 <= spend.wall_s < 40
    assert Budget(wall_s=20).exceeded(spend) == "the wall-time budget of 20 s is spent (30 s elapsed)"
    assert Budget(wall_s=60).exceeded(spend) is None


def test_a_model_call_is_refused_before_it_starts_once_dollars_or_wall_time_are_spent() -> None:
    spend = Spend()
    spend.add_model_call(10, 10, dollars=1.5)
    assert Budget(dollars=1.0).refuses_model_call(spend) == "the budget of $1.00 is spent ($1.50 used)"
    assert Budget(wall_s=10).refuses_model_call(Spend(started=time.monotonic() - 11)) is not None
    assert Budget(dollars=2.0, wall_s=10).refuses_model_call(spend) is None


def test_spent_evaluations_refuse_an_evaluation_but_not_a_model_call() -> None:
    spend = Spend()
    spend.add_evaluation()
    budget = Budget(evaluations=1)
    assert budget.refuses_evaluation(spend) == "the budget of 1 evaluation is spent"
    assert budget.refuses_model_call(spend) is None  # the model may still finish, or answer in words
    assert Budget(model_calls=0).refuses_evaluation(spend) is None


def test_spend_as_a_dict_for_the_trajectory() -> None:
    spend = Spend()
    spend.add_model_call(3, 4, 0.25)
    data = spend.to_dict()
    assert {k: data[k] for k in ("model_calls", "input_tokens", "output_tokens", "dollars", "evaluations")} == {
        "model_calls": 1, "input_tokens": 3, "output_tokens": 4, "dollars": 0.25, "evaluations": 0}
    assert data["wall_s"] >= 0
    assert Budget(model_calls=5).to_dict() == {"model_calls": 5, "tokens": None, "dollars": None, "wall_s": None,
                                               "evaluations": None}


def test_an_unknown_model_with_a_dollar_budget_does_not_start_without_prices(tmp_path):
    """Never a silent $0: a dollar budget needs a price, from the table or from the settings."""
    from kernel_lsp.agent.setup import UnpricedModel, build_optimizer, settings_budget
    from kernel_lsp.config import resolve_settings

    (tmp_path / "ref.py").write_text("class Model: ...\n")
    file = tmp_path / "ref.py"

    def build(raw: dict, model: str = "claude-unreleased-9"):
        settings, problems = resolve_settings({"trajectoryDir": str(tmp_path / "t"), **raw})
        assert not problems
        return build_optimizer(file, file, "", tmp_path, settings, worker=None, options={},
                               budget=settings_budget(settings), model=model)

    with pytest.raises(UnpricedModel, match="no price is known for the model claude-unreleased-9.*agentInputPrice"):
        build({})
    assert build({"agentMaxDollars": 0}).model.prices is None  # no dollar budget: counted as $0, with a warning
    assert build({"agentInputPricePerMtok": 2, "agentOutputPricePerMtok": 10}).model.prices == (2.0, 10.0)
    assert build({}, model="claude-sonnet-4-5").model.prices is None  # the table knows it
    with pytest.raises(UnpricedModel, match="set both"):
        build({"agentInputPricePerMtok": 2})


def test_a_shared_budget_stops_at_its_own_limit_or_the_campaigns_total_whichever_comes_first() -> None:
    from kernel_lsp.agent.budget import SharedBudget
    from kernel_lsp.agent.campaign import CampaignLedger

    ledger = CampaignLedger({"model_calls": 3, "dollars": 0.5}, earlier_wall_s=0.0)  # finished passes' spend
    mine, other = Spend(), Spend()
    ledger.running += [mine, other]
    budget = SharedBudget(model_calls=4, total=Budget(model_calls=6, dollars=1.0), ledger=ledger)
    mine.add_model_call(10, 10, 0.1)
    assert budget.refuses_model_call(mine) is None  # 3 + 1 of 6 in all, 1 of 4 its own
    other.add_model_call(10, 10, 0.1)
    other.add_model_call(10, 10, 0.1)  # another pass spends: the total is reached, this pass's own limit is not
    assert budget.refuses_model_call(mine) == "the campaign's total budget of 6 model calls is spent"
    assert budget.refuses_evaluation(mine) is None  # model calls do not limit evaluations
    ledger.finished(other)
    assert ledger.totals().model_calls == 6 and ledger.running == [mine]
    own = SharedBudget(model_calls=1, total=Budget(model_calls=6), ledger=ledger)
    assert own.refuses_model_call(mine) == "the budget of 1 model call is spent"  # its own limit is named first


def test_a_shared_wall_budget_bounds_a_call_by_what_the_campaign_has_left() -> None:
    from kernel_lsp.agent.budget import SharedBudget
    from kernel_lsp.agent.campaign import CampaignLedger

    ledger = CampaignLedger({}, earlier_wall_s=95.0)  # earlier runs of the campaign took 95 s
    spend = Spend()
    assert SharedBudget(wall_s=60, total=Budget(wall_s=100), ledger=ledger).wall_left_s(spend) <= 5.0
    assert SharedBudget(wall_s=2, total=Budget(wall_s=100), ledger=ledger).wall_left_s(spend) <= 2.0
    assert SharedBudget(total=Budget(), ledger=ledger).wall_left_s(spend) is None
    assert "wall-time" in SharedBudget(total=Budget(wall_s=90), ledger=ledger).exceeded(spend)
