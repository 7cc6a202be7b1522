"""Settings layers for the server: [tool.kernel-lsp] < initializationOptions < workspace/configuration; and which
client the server talks to (its name, whether it shows disabled code actions), for remedies that fit it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

from lsprotocol import types

from kernel_lsp.config import Settings, pyproject_settings, resolve_settings, unwrap_section
from kernel_lsp.findings import uri_to_path
from kernel_lsp.verify.pairing import Pairing, ReferenceProblem, find_reference

log = logging.getLogger(__name__)
SECTION = "kernelLsp"


class SettingsManager:
    def __init__(self, warn: Callable[[str], None]) -> None:
        self._warn = warn
        self._warned: set[str] = set()
        self.init_options: dict[str, Any] = {}
        self.client_config: dict[str, Any] = {}
        self.folders: list[Path] = []
        self.settings = Settings()
        self.client = "other"  # vscode | neovim | other, from the initialize request's clientInfo
        self.disabled_actions = False  # the client shows a code action's `disabled.reason`

    def initialize(self, params: types.InitializeParams) -> None:
        self.client = client_family(params.client_info.name if params.client_info else "")
        code_action = params.capabilities.text_document.code_action if params.capabilities.text_document else None
        self.disabled_actions = bool(code_action and code_action.disabled_support)
        self.init_options = unwrap_section(params.initialization_options)
        uris = [f.uri for f in params.workspace_folders or []] or ([params.root_uri] if params.root_uri else [])
        self.folders = []
        for uri in uris:
            try:
                self.folders.append(uri_to_path(uri))
            except ValueError:
                log.warning("ignoring workspace folder that is not a file URI: %s", uri)
        self.recompute()

    def set_client_config(self, raw: Any) -> None:
        self.client_config = unwrap_section(raw) if raw is not None else {}
        self.recompute()

    def pairing_context(self) -> tuple[Path | None, dict[str, str], list[Path]]:
        """What find_reference needs besides the candidate: the workspace folder, the references setting and the
        kernelbenchRoots resolved against the workspace (an absolute root stays absolute). One place for every
        feature that pairs a candidate with its reference."""
        workspace = self.folders[0] if self.folders else None
        return workspace, self.settings.verify.references, self.settings.kernelbench_paths(workspace)

    def find_reference(self, path: Path, text: str) -> Pairing | ReferenceProblem | None:
        """The candidate's reference as every feature pairs it (verify/pairing.py find_reference with this
        workspace's context): a Pairing, a ReferenceProblem, or None when the file is no candidate."""
        return find_reference(path, text, *self.pairing_context())

    def recompute(self) -> Settings:
        layers: list[dict[str, Any]] = []
        problems: list[str] = []
        for folder in self.folders[:1]:  # one settings scope per server until multi-root settings are needed
            section, read_problems = pyproject_settings(folder)
            layers.append(section)
            problems += read_problems
        layers += [self.init_options, self.client_config]
        self.settings, resolve_problems = resolve_settings(*layers)
        for problem in problems + resolve_problems:
            if problem not in self._warned:  # each problem is said once, not on every refresh
                self._warned.add(problem)
                self._warn(f"kernel-lsp: {problem}")
        return self.settings


def client_family(name: str) -> str:
    """'vscode' for VS Code and its kin (code-server, VSCodium, Cursor), 'neovim', else 'other'."""
    lowered = name.lower()
    if any(word in lowered for word in ("visual studio code", "vscode", "code-server", "vscodium", "cursor")):
        return "vscode"
    return "neovim" if "neovim" in lowered or lowered == "nvim" else "other"


def api_key_remedy(client: str) -> str:
    """How a user of this client gives kernel-lsp the Anthropic API key."""
    if client == "vscode":
        return ('run "kernel-lsp: Set Anthropic API Key" from the Command Palette (the key is kept in VS Code\'s '
                "secret storage)")
    if client == "neovim":
        return "start Neovim with ANTHROPIC_API_KEY set in its environment (the server inherits it)"
    return ("set ANTHROPIC_API_KEY in the environment the editor starts kernel-lsp from, or the anthropicApiKey "
            "setting")


def diagnostics_place(client: str) -> str:
    """Where this client lists the diagnostics, for a message that points there."""
    if client == "vscode":
        return "the Problems panel"
    if client == "neovim":
        return "the diagnostics (:lua vim.diagnostic.setqflist() lists them)"
    return "the editor's diagnostics"
