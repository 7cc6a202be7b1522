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
