"""The VS Code extension (editor_clients/vscode): installs, lints, passes its Node unit tests, builds and packages.

The packaged manifest is then compared with kernel_lsp.config.Settings, so the contributed settings cannot drift
from what the server reads: every setting but the secret ones, under the server's section, with the server's
defaults, which the server itself must accept. Runs on a copy of the extension's sources in a temporary folder
(tests/editors/vscode_helpers.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from kernel_lsp.config import (
    BASELINE_KINDS,
    CHECK_NAMES,
    RESOURCE_USAGE_MODES,
    SANITIZER_TOOLS,
    SECRET_SETTINGS,
    VERIFY_DEVICES,
    WHERE,
    Settings,
    setting_hint,
)
from kernel_lsp.contracts.options import camel as _camel
from kernel_lsp.contracts.options import snake as _snake
from kernel_lsp.server.optimize_feature import OPTIMIZE_COMMAND
from kernel_lsp.server.profile_feature import IMPORT_COMMAND, PROFILE_COMMAND
from kernel_lsp.server.settings import SECTION
from kernel_lsp.server.verify_feature import VERIFY_COMMAND
from kernel_lsp.server.worker_feature import STATUS_COMMAND, STATUS_NOTIFICATION
from kernel_lsp.server.workspace_feature import SUMMARY_REQUEST, VISIBLE_NOTIFICATION
from tests.editors.vscode_helpers import built_extension

pytestmark = pytest.mark.timeout(900)

EXTENSION_COMMANDS = {"kernelLsp.verify", "kernelLsp.profile", "kernelLsp.optimize", "kernelLsp.importProfile",
                      "kernelLsp.restartServer", "kernelLsp.showWorkerLog", "kernelLsp.connectRemoteWorker",
                      "kernelLsp.workspaceSummary"}
SECRET_COMMANDS = {"anthropic_api_key": "kernelLsp.setAnthropicApiKey"}
CLIENT_SETTINGS = {"kernelLsp.server.pythonPath", "kernelLsp.server.logLevel", "kernelLsp.trace.server"}
JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string"}


@pytest.fixture(scope="module")
def built() -> dict[str, Any]:
    """npm ci, lint, test, build and vsce package on a fresh copy: the outputs of each step and the .vsix."""
    extension = built_extension()
    print("vscode extension steps (s): " + ", ".join(f"{k} {v:.1f}" for k, v in extension.timings.items()))
    return {"outputs": extension.outputs, "vsix": extension.vsix, "names": extension.names,
            "manifest": extension.manifest, "bundle": extension.bundle}


def test_unit_tests_ran_and_passed(built: dict[str, Any]) -> None:
    output = built["outputs"]["test"]
    assert "# fail 0" in output and "# pass " in output, output[-3000:]
    assert "# pass 0\n" not in output


def test_vsix_holds_the_bundle_and_manifest_only(built: dict[str, Any]) -> None:
    assert {"extension/package.json", "extension/dist/extension.js"} <= built["names"]
    assert not any("node_modules" in name or name.startswith("extension/src/") for name in built["names"])
    assert built["manifest"]["main"] == "./dist/extension.js"


def test_manifest_lists_the_commands(built: dict[str, Any]) -> None:
    contributed = {c["command"] for c in built["manifest"]["contributes"]["commands"]}
    assert EXTENSION_COMMANDS | set(SECRET_COMMANDS.values()) <= contributed
    assert all(c.get("title") for c in built["manifest"]["contributes"]["commands"])


def test_bundle_speaks_the_servers_names(built: dict[str, Any]) -> None:
    """The command ids, the custom requests and notifications and the settings section as the server defines them."""
    for name in (VERIFY_COMMAND, PROFILE_COMMAND, IMPORT_COMMAND, OPTIMIZE_COMMAND, STATUS_COMMAND,
                 STATUS_NOTIFICATION, SUMMARY_REQUEST, VISIBLE_NOTIFICATION):
        assert f'"{name}"' in built["bundle"], name
    assert f'"{SECTION}"' in built["bundle"]


def _server_settings(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    properties = manifest["contributes"]["configuration"]["properties"]
    assert set(properties) - CLIENT_SETTINGS == {k for k in properties if k.count(".") == 1}, \
        "settings with a dot after the section must be the extension's own (CLIENT_SETTINGS)"
    return {key.split(".", 1)[1]: schema for key, schema in properties.items() if key not in CLIENT_SETTINGS}


def test_settings_are_every_server_setting_but_the_secrets(built: dict[str, Any]) -> None:
    expected = {_camel(name) for name in WHERE if name not in SECRET_SETTINGS}
    contributed = _server_settings(built["manifest"])
    assert set(contributed) == expected, (f"missing: {sorted(expected - set(contributed))}, "
                                          f"unknown to the server: {sorted(set(contributed) - expected)}")
    for name in SECRET_SETTINGS:  # secrets go through VS Code's secret storage, by a command
        assert _camel(name) not in contributed
        assert SECRET_COMMANDS[name] in {c["command"] for c in built["manifest"]["contributes"]["commands"]}


def _json_type(hint: Any) -> str | list[str]:
    if hint == (float | None):
        return ["number", "null"]
    if hint in JSON_TYPES:
        return JSON_TYPES[hint]
    return "array" if getattr(hint, "__origin__", None) is tuple else "object"


def test_settings_defaults_and_types_are_the_servers(built: dict[str, Any]) -> None:
    defaults = Settings()
    contributed = _server_settings(built["manifest"])
    for key, schema in contributed.items():
        name = _snake(key)
        assert _camel(name) == key, f"{key}: the server reads it as '{name}'"
        assert schema.get("markdownDescription") or schema.get("description"), f"{key} has no description"
        default = defaults.value(name)
        assert schema["default"] == (list(default) if isinstance(default, tuple) else default), key
        assert schema["type"] == _json_type(setting_hint(name)), f"{key}: {schema['type']} for {setting_hint(name)}"
    assert contributed["resourceUsage"]["enum"] == list(RESOURCE_USAGE_MODES)
    assert contributed["verifyDevice"]["enum"] == list(VERIFY_DEVICES)
    assert contributed["baselines"]["items"]["enum"] == list(BASELINE_KINDS)
    assert contributed["sanitizeTools"]["items"]["enum"] == list(SANITIZER_TOOLS)
    assert set(contributed["checks"]["properties"]) == set(CHECK_NAMES)


def test_server_accepts_every_contributed_default(built: dict[str, Any]) -> None:
    raw = {key: schema["default"] for key, schema in _server_settings(built["manifest"]).items()}
    settings, problems = Settings().with_updates(raw)
    assert problems == []
    assert settings == Settings()
