"""What a server feature is: the hooks the server calls, each a no-op unless the feature overrides it.

A feature module ends with `setup(server) -> Feature`, which builds its feature from what the server offers (the
settings, the diagnostic store, the features set up before it: `server.get_feature(VerifyFeature)`) and returns
it; the server adds it to its list (kernel_lsp/server/setup.py, FEATURE_MODULES). The server then calls each feature's
hooks in that order for every document event, and serves each feature's commands, custom LSP methods and code
action kinds: no hand wiring per feature. Features talk to each other through typed methods, never by reading each
other's UI text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from lsprotocol import types


class Feature:
    code_action_kinds: tuple[str, ...] = ()  # the kinds its code_actions offer (the server's capability lists them)

    # --- documents (in the order of the server's feature list; document_active before the others) ---------------

    def document_active(self, uri: str) -> None:
        """The user is at this document now (opened, edited or hovered)."""

    def document_open(self, uri: str, version: int | None, text: str) -> None:
        pass

    def document_change(self, uri: str, version: int | None, text: str) -> None:
        pass

    def document_save(self, uri: str, version: int | None, text: str) -> None:
        pass

    def document_close(self, uri: str) -> None:
        pass

    def settings_changed(self) -> None:
        """The settings were read again (workspace/configuration, or a change the client pushed)."""

    def lens_note(self, uri: str, text: str | None) -> str | None:
        """A few words another feature's lens shows after its result for this same text (the profile's energy per
        call after the verify result); None: nothing to add."""
        return None

    def priority(self, uri: str) -> int | None:
        """How soon this document's checks should run (jobs/scheduler.py Priority; lower first), where this feature
        knows (the workspace feature: where the user is); None: it does not say."""
        return None

    def shows_finding(self, finding: Any) -> bool:
        """Whether a finding shows as a diagnostic (all features must agree; CompileFeature keeps resource lines for
        code lenses only when the settings say so)."""
        return True

    # --- answers (each feature's are joined, in list order) --------------------------------------------------------

    def code_lenses(self, uri: str) -> list[types.CodeLens]:
        return []

    def code_actions(self, uri: str, span: types.Range, only: Sequence[str] | None,
                     disabled_shown: bool) -> list[types.CodeAction]:
        """The actions on `span` of the kinds in `only` (None: all); one that cannot run is listed disabled when
        `disabled_shown`, else enabled with its title saying why (convert.command_action)."""
        return []

    def hover(self, uri: str, position: types.Position) -> types.Hover | None:
        return None

    def commands(self) -> dict[str, Callable[[tuple[Any, ...]], Any]]:
        """workspace/executeCommand names -> handler(arguments), sync or async."""
        return {}

    def methods(self) -> dict[str, Callable[[Any], Any]]:
        """Custom LSP methods (kernelLsp/...) -> handler(params), for requests and notifications alike."""
        return {}

    # --- the server's life -----------------------------------------------------------------------------------------

    def initialize(self) -> None:
        """`initialize`: the settings' first layers and the workspace folders are known; no check has run yet."""

    async def started(self, client_can_watch: bool) -> None:
        """After `initialized` and the first settings: background work may begin."""

    async def shutdown(self) -> None:
        """`shutdown`: stop background work (called in the reverse order of the list)."""
