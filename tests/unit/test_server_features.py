"""The server's features register themselves: each feature module's setup(server) builds it, and the server
serves what each declares (commands, custom methods, code action kinds) and calls its hooks in list order."""

from __future__ import annotations

import pytest
from lsprotocol import types

from kernel_lsp.server import setup as server_setup
from kernel_lsp.server.feature import Feature
from kernel_lsp.server.verify_feature import VERIFY_COMMAND, VerifyFeature
from kernel_lsp.server.workspace_feature import SUMMARY_REQUEST, VISIBLE_NOTIFICATION, WorkspaceFeature


def test_every_feature_module_sets_up_one_feature_and_what_it_declares_is_served():
    server = server_setup.create_server()
    assert len(server.features) == len(server_setup.FEATURE_MODULES)
    assert all(isinstance(f, Feature) for f in server.features)
    manager = server.protocol.fm
    declared = {name for f in server.features for name in f.commands()}
    assert VERIFY_COMMAND in declared and set(manager.commands) == declared
    assert {SUMMARY_REQUEST, VISIBLE_NOTIFICATION} <= set(manager.features)
    kinds = manager.feature_options[types.TEXT_DOCUMENT_CODE_ACTION].code_action_kinds
    assert kinds == [kind for f in server.features for kind in f.code_action_kinds] and len(kinds) == 3
    assert server.get_feature(VerifyFeature) is next(f for f in server.features if isinstance(f, VerifyFeature))


class Recorder(Feature):
    """A feature added by a module of its own, as a new one would be."""

    code_action_kinds = ("source.recorded",)

    def commands(self):
        return {"kernel-lsp.recorded": lambda args: {"args": list(args)}}


def test_a_new_feature_is_one_module_and_one_line(monkeypatch):
    module = type(server_setup)("tests_recorder_feature")
    module.setup = lambda server: Recorder()
    monkeypatch.setitem(__import__("sys").modules, "tests_recorder_feature", module)
    monkeypatch.setattr(server_setup, "FEATURE_MODULES", (*server_setup.FEATURE_MODULES, "tests_recorder_feature"))
    server = server_setup.create_server()
    assert isinstance(server.features[-1], Recorder)
    assert "kernel-lsp.recorded" in server.protocol.fm.commands
    kinds = server.protocol.fm.feature_options[types.TEXT_DOCUMENT_CODE_ACTION].code_action_kinds
    assert kinds[-1] == "source.recorded"


def test_a_feature_asking_for_one_set_up_after_it_is_told_which():
    server = server_setup.create_server()
    server.features = [f for f in server.features if not isinstance(f, WorkspaceFeature)]
    with pytest.raises(LookupError, match="WorkspaceFeature is not set up"):
        server.get_feature(WorkspaceFeature)


def test_an_event_reaches_every_subscriber_even_when_one_raises(caplog) -> None:
    from kernel_lsp.server.events import CANDIDATE_VERIFIED, Events

    events, heard = Events(), []

    def broken(*args):
        raise RuntimeError("a subscriber's bug")

    events.subscribe(CANDIDATE_VERIFIED, broken)
    events.subscribe(CANDIDATE_VERIFIED, lambda *args: heard.append(args))
    events.publish(CANDIDATE_VERIFIED, "file:///c.py", "pairing", "job")
    events.publish("nobody-listens", 1)
    assert heard == [("file:///c.py", "pairing", "job")]
    assert "a handler of 'candidate-verified' failed" in caplog.text and "a subscriber's bug" in caplog.text


def test_what_the_server_asks_of_every_feature_reaches_the_real_features() -> None:
    """Priority, visibility and lens notes are asked of each feature the server sets up (its real list): the
    workspace feature says how soon a document is checked, the compile feature whether a resource line shows."""
    from kernel_lsp.findings import SOURCE, Finding, Range, Severity
    from kernel_lsp.jobs.scheduler import Priority
    from kernel_lsp.server.setup import create_server

    from pygls.workspace import Workspace

    server = create_server()
    server.protocol._workspace = Workspace(None)  # as `initialize` leaves it: no document open
    assert len(server.features) >= 8
    assert server.priority_of("file:///w/not_open.cu") == Priority.CLOSED  # the workspace feature says
    resources = Finding("file:///w/k.cu", Range.line(0), Severity.INFORMATION, SOURCE, "ptxas-resources", "32 registers")
    error = Finding("file:///w/k.cu", Range.line(0), Severity.ERROR, SOURCE, "nvcc-error", "expected a ;")
    assert server._visible(error) is True
    assert server._visible(resources) is (server.settings.settings.compile.resource_usage in ("diagnostic", "both"))
    assert server.lens_notes("file:///w/k.py", "text") == []
