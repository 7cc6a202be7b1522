"""Typed settings: conversion, invalid values falling back, the three layers, pyproject reading."""

from __future__ import annotations

from pathlib import Path

from kernel_lsp.config import Settings, pyproject_settings, resolve_settings, unwrap_section


def test_camel_snake_and_kebab_keys_convert():
    settings, problems = resolve_settings({"nvcc-path": "/x/nvcc"}, {"debounce_ms": 10}, {"compileTimeoutS": 5})
    assert problems == []
    compile_ = settings.compile
    assert (compile_.nvcc_path, compile_.debounce_ms, compile_.timeout_s) == ("/x/nvcc", 10, 5.0)


def test_invalid_values_fall_back_with_one_problem_each():
    settings, problems = resolve_settings({"debounceMs": "fast", "arch": ["sm90"], "checks": {"nope": True},
                                           "resourceUsage": "loud", "compileOnChange": 1, "unknownKey": 3})
    assert settings == Settings()
    assert len(problems) == 6
    assert any("debounceMs" in p and "500" in p for p in problems)
    assert any("unknown setting 'unknownKey'" == p for p in problems)


def test_later_layers_win_and_checks_merge():
    settings, _ = resolve_settings({"arch": "sm_80", "checks": {"hostCompile": False}},
                                   {"arch": ["sm_90", "sm_100a"], "checks": {"pythonSyntax": False}})
    assert settings.compile.arch == ("sm_90", "sm_100a")
    assert not settings.check_enabled("hostCompile") and not settings.check_enabled("pythonSyntax")
    assert settings.check_enabled("compile")


def test_ignore_accepts_codes_and_prefixes():
    settings, _ = resolve_settings({"ignore": ["ptxas-*", "nvcc-warning"]})
    assert settings.is_ignored("ptxas-spill") and settings.is_ignored("nvcc-warning")
    assert not settings.is_ignored("nvcc-error")


def test_sections_are_unwrapped():
    assert unwrap_section({"kernelLsp": {"arch": "sm_90"}}) == {"arch": "sm_90"}
    assert unwrap_section({"arch": "sm_90"}) == {"arch": "sm_90"}
    assert unwrap_section(None) == {}


def test_pyproject_table_and_broken_file(tmp_path: Path):
    (tmp_path / "pyproject.toml").write_text('[tool.kernel-lsp]\narch = ["sm_80"]\n')
    assert pyproject_settings(tmp_path) == ({"arch": ["sm_80"]}, [])
    (tmp_path / "pyproject.toml").write_text('[tool.kernel-lsp\n')
    section, problems = pyproject_settings(tmp_path)
    assert section == {} and len(problems) == 1 and "cannot read" in problems[0]


def test_the_api_key_setting_is_never_echoed():
    from kernel_lsp.config import resolve_settings

    settings, _ = resolve_settings({"anthropicApiKey": "sk-ant-secret-1"})
    assert "sk-ant-secret-1" not in repr(settings)
    _, problems = resolve_settings({"anthropicApiKey": "sk-ant-secret-1"}, {"anthropicApiKey": 7})
    assert problems and not any("sk-ant-secret-1" in p for p in problems)


def test_optional_temperature_takes_none_or_a_number():
    from kernel_lsp.config import resolve_settings

    assert resolve_settings({"agentTemperature": 0.2})[0].agent.temperature == 0.2
    assert resolve_settings({"agentTemperature": 0.2}, {"agentTemperature": None})[0].agent.temperature is None
    settings, problems = resolve_settings({"agentTemperature": "warm"})
    assert settings.agent.temperature is None and "expected a number" in problems[0]


def test_the_model_client_takes_its_timeout_and_retries_from_the_settings(tmp_path):
    from kernel_lsp.agent.budget import Budget
    from kernel_lsp.agent.setup import build_optimizer
    from kernel_lsp.config import resolve_settings

    settings, _ = resolve_settings({"agentTimeoutS": 7.5, "agentMaxRetries": 1, "trajectoryDir": str(tmp_path),
                                    "anthropicApiKey": "sk-ant-test"})
    (tmp_path / "cand.py").write_text("class ModelNew: ...\n")
    optimizer = build_optimizer(tmp_path / "cand.py", tmp_path / "cand.py", "", tmp_path, settings, None,
                                {"device": "cpu"}, Budget())
    assert (optimizer.model.timeout_s, optimizer.model.max_retries) == (7.5, 1)


def test_every_setting_takes_its_own_default_back_through_the_converter():
    """The cattrs converter has a strict hook for every field's type: a setting of a new type without one fails
    here, not in a user's editor. Each default, written as JSON would carry it, comes back equal and unreported."""
    import json

    from kernel_lsp.config import WHERE
    from kernel_lsp.contracts.options import camel

    defaults = Settings()
    as_json = json.loads(json.dumps({camel(name): defaults.value(name) for name in WHERE}))
    settings, problems = resolve_settings(as_json)
    assert problems == [] and settings == defaults


def test_the_converter_is_strict_about_types():
    _, problems = resolve_settings({"trials": "5", "verifyOnSave": "true", "references": {"a.py": 3},
                                    "tolerances": {"float16": {"atol": True, "rtol": 0.1}}, "ignore": [1]})
    assert [p.split(":")[0] for p in problems] == ["setting 'trials'", "setting 'verifyOnSave'",
                                                   "setting 'references'", "setting 'tolerances'", "setting 'ignore'"]
