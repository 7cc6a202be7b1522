"""No secret within a candidate's reach: a command holds the API key and the worker's token out of os.environ (its
children never inherit them, while it reads them as often as it likes), and the local worker starts with an
allow-listed environment."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_lsp.agent.credentials import api_key
from kernel_lsp.commands import doctor
from kernel_lsp.findings import held_secret_names, secret_variable, secrets_held
from kernel_lsp.worker.client import WorkerClient, worker_environment

KEY = "sk-ant-api03-" + "k" * 40


def child_sees(name: str) -> bool:
    """Whether a child started now, inheriting this process's environment, has `name`."""
    shown = subprocess.run([sys.executable, "-c", f"import os; print({name!r} in os.environ)"], capture_output=True,
                           text=True, check=True)
    return shown.stdout.strip() == "True"


def test_a_command_holds_the_key_out_of_its_environment_and_reads_it_again(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.setenv("KERNEL_LSP_TOKEN", "worker-token-1234")
    with secrets_held():
        assert "ANTHROPIC_API_KEY" not in os.environ and "KERNEL_LSP_TOKEN" not in os.environ
        assert api_key() == KEY and api_key() == KEY  # read once, kept: a second read still works
        assert secret_variable("KERNEL_LSP_TOKEN") == "worker-token-1234"
        assert held_secret_names() == ["ANTHROPIC_API_KEY", "KERNEL_LSP_TOKEN"]
        assert not child_sees("ANTHROPIC_API_KEY") and not child_sees("KERNEL_LSP_TOKEN")
        os.environ["ANTHROPIC_API_KEY"] = KEY + "2"  # one set since is taken too
        assert api_key() == KEY + "2" and "ANTHROPIC_API_KEY" not in os.environ
    assert os.environ["ANTHROPIC_API_KEY"] == KEY  # given back at the command's end (a test's own environment)
    assert held_secret_names() == []


def test_outside_a_command_the_environment_is_read_as_it_is(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    assert api_key() is None
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    assert api_key() == KEY and os.environ["ANTHROPIC_API_KEY"] == KEY
    with secrets_held():
        pass
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    assert api_key() is None  # nothing held over from an earlier command


def test_the_cli_runs_every_command_without_the_key_in_its_environment(monkeypatch):
    """kernel_lsp.cli.main: the command reads the key, its children never see it."""
    from kernel_lsp.cli import main

    seen: dict[str, object] = {}

    def probe(args: argparse.Namespace) -> int:
        seen.update(key=api_key(), again=api_key(), environ="ANTHROPIC_API_KEY" in os.environ,
                    child=child_sees("ANTHROPIC_API_KEY"), worker_env="ANTHROPIC_API_KEY" in worker_environment())
        return 0

    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.setattr(doctor, "run", probe)  # add_parser sets the module's `run` as the command's
    assert main(["doctor"]) == 0
    assert seen == {"key": KEY, "again": KEY, "environ": False, "child": False, "worker_env": False}
    assert os.environ["ANTHROPIC_API_KEY"] == KEY


def test_the_worker_environment_is_allow_listed(monkeypatch, tmp_path: Path):
    environ = {"ANTHROPIC_API_KEY": KEY, "KERNEL_LSP_TOKEN": "t0ken-value", "AWS_SECRET_ACCESS_KEY": "aws-secret",
               "GITHUB_TOKEN": "ghp_x", "TORCH_HUB_TOKEN": "hub", "KERNEL_LSP_API_KEY": "no", "SSH_AUTH_SOCK": "/s",
               "HTTPS_PROXY": "http://user:pw@proxy:3128", "HOME": "/home/user", "PATH": "/usr/bin",
               "PYTHONPATH": "/src", "KERNEL_LSP_CACHE_DIR": str(tmp_path), "XDG_CACHE_HOME": "/home/user/.cache",
               "CUDA_VISIBLE_DEVICES": "0", "TRITON_INTERPRET": "1", "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
               "VIRTUAL_ENV": "/venv", "KERNEL_LSP_BWRAP": "/usr/bin/bwrap", "PYTHONHOME": "/py"}
    kept = worker_environment(environ)
    assert set(kept) == {"HOME", "PATH", "PYTHONPATH", "KERNEL_LSP_CACHE_DIR", "XDG_CACHE_HOME",
                         "CUDA_VISIBLE_DEVICES", "TRITON_INTERPRET", "LD_LIBRARY_PATH", "VIRTUAL_ENV",
                         "KERNEL_LSP_BWRAP", "PYTHONHOME"}
    assert kept["HOME"] == "/home/user"  # the real HOME: the worker's cache and site packages are under it


@pytest.mark.slow
async def test_the_local_worker_started_after_the_key_was_read_lacks_it(monkeypatch):
    """The worker a client starts (the CLI's, the server's, the agent's) has neither the key nor the token in its
    /proc/PID/environ, even started from a process that still had them in os.environ."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.setenv("KERNEL_LSP_TOKEN", "worker-token-1234")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_" + "g" * 36)
    for held in (False, True):
        client = WorkerClient()
        try:
            if held:
                with secrets_held():
                    assert api_key() == KEY
                    await client.ping()
            else:
                await client.ping()
            environ = Path(f"/proc/{client._connection.process.pid}/environ").read_bytes().split(b"\0")
        finally:
            await client.close()
        names = {entry.split(b"=", 1)[0].decode() for entry in environ if entry}
        assert not names & {"ANTHROPIC_API_KEY", "KERNEL_LSP_TOKEN", "GITHUB_TOKEN"}, names
        assert KEY.encode() not in b"\0".join(environ)
        assert "HOME" in names and "PATH" in names
