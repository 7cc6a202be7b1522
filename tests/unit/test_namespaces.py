"""The candidate's sandbox command line (kernel_lsp/process/namespaces.py) and what doctor says where it cannot
start. The sandbox itself is run by tests/pipeline/test_hostile_candidate.py and the GPU tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_lsp.commands.doctor import sandbox_check
from kernel_lsp.process import namespaces
from kernel_lsp.process.namespaces import SANDBOX_UID, SandboxPlan, isolation_status, prepare_writable, sandbox_command


@pytest.fixture
def fresh_status():
    isolation_status.cache_clear()
    yield
    isolation_status.cache_clear()


def pairs(argv: list[str], option: str) -> list[str]:
    return [argv[index + 1] for index, word in enumerate(argv) if word == option]


def test_the_command_binds_what_the_plan_names_and_hides_the_rest(tmp_path: Path):
    own, task = tmp_path / "home", tmp_path / "task"
    own.mkdir()
    task.mkdir()
    argv = sandbox_command(["python", "-c", "pass"], SandboxPlan(writable=(str(own),), readable=(str(task),)),
                           bwrap="/usr/bin/bwrap")
    assert argv[0] == "/usr/bin/bwrap" and argv[-3:] == ["python", "-c", "pass"]
    for option in ("--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--die-with-parent",
                   "--new-session"):
        assert option in argv
    assert str(own) in pairs(argv, "--bind") and str(task) in pairs(argv, "--ro-bind")
    assert "/proc/sys" in pairs(argv, "--ro-bind") and pairs(argv, "--remount-ro") == ["/dev"]
    assert str(Path.home()) not in pairs(argv, "--ro-bind") + pairs(argv, "--bind")
    assert not any(path.startswith(("/run", "/var", "/home")) for path in pairs(argv, "--ro-bind"))
    nproc = next(word for word in argv if word.startswith("--nproc="))
    assert 0 < int(nproc.split("=")[1]) <= max(namespaces.DEFAULT_PIDS, 1)
    if os.geteuid() == 0:  # root's sandbox drops to nobody before the program runs
        setpriv = argv.index(next(word for word in argv if word.endswith("setpriv")))
        assert f"--reuid={SANDBOX_UID}" in argv[setpriv:] and "--unshare-user" not in argv
    else:
        assert "--unshare-user" in argv and "--cap-drop" in argv


def test_the_first_entry_of_sys_path_is_not_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The script's folder (sys.path[0]) may be the user's workspace or home: never bound."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    monkeypatch.setattr(sys, "path", [str(workspace), *sys.path])
    assert str(workspace) not in pairs(sandbox_command(["true"], SandboxPlan(), bwrap="bwrap"), "--ro-bind")


def test_the_network_is_kept_only_when_allowed(tmp_path: Path):
    assert "--unshare-net" not in sandbox_command(["true"], SandboxPlan(network=True), bwrap="bwrap")


@pytest.mark.skipif(os.geteuid() != 0, reason="only root gives folders to the sandbox's user")
def test_root_gives_the_writable_folders_to_the_sandboxs_user(tmp_path: Path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "file").write_text("x")
    prepare_writable([str(tmp_path)])
    assert {path.stat().st_uid for path in (tmp_path, tmp_path / "sub", tmp_path / "sub" / "file")} == {SANDBOX_UID}


def test_doctor_says_what_is_missing_without_bubblewrap(fresh_status, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(namespaces.BWRAP_ENV, "/nonexistent/bwrap")
    check = sandbox_check()
    assert check.level == "missing" and "bubblewrap (bwrap) is not installed" in check.detail
    assert "apt-get install bubblewrap" in check.detail


def test_a_bubblewrap_that_fails_is_said_with_its_error(fresh_status, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch):
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv(namespaces.BWRAP_ENV, str(fake))
    status = isolation_status()
    assert status.startswith("not isolated: bubblewrap failed (bwrap: No permissions to create new namespace)")


def test_the_sandbox_runs_a_program_as_an_unprivileged_user_when_it_can(fresh_status, tmp_path: Path):
    if not isolation_status().startswith("isolated"):
        pytest.skip(f"no sandbox here: {isolation_status()}")
    ran = subprocess.run(sandbox_command(["/bin/sh", "-c", "id -u; ls /proc | grep -c '^[0-9]'"],
                                         SandboxPlan(gpu=False)), capture_output=True, text=True, timeout=30)
    uid, processes = ran.stdout.split()
    assert ran.returncode == 0 and (uid == str(SANDBOX_UID) if os.geteuid() == 0 else uid == str(os.geteuid()))
    assert int(processes) < 10  # its own PID namespace: bwrap's init, the shell and its children


def test_require_isolation_refuses_before_any_candidate_code_runs(fresh_status, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch):
    from kernel_lsp.config import Settings
    from kernel_lsp.contracts.options import to_config
    from kernel_lsp.kinds.verify import verify_options
    from kernel_lsp.verify.run import verify_candidate

    monkeypatch.setenv(namespaces.BWRAP_ENV, "/nonexistent/bwrap")
    settings = Settings()
    assert verify_options(settings, unattended=True).require_isolation  # the agent, bench and campaign
    assert not verify_options(settings).require_isolation  # a person's own verify: run, and warn
    marker = tmp_path / "ran"
    (tmp_path / "cand.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    options = to_config(verify_options(settings, unattended=True, device="cpu"))
    report = verify_candidate("ref.py", "cand.py", options, files={"cand.py": ""})
    assert report["verdict"] == "unavailable" and "requireIsolation is on" in report["reason"]
    assert "bubblewrap (bwrap) is not installed" in report["reason"] and not marker.exists()


def test_a_plan_never_covers_the_sandboxs_own_tmp_or_root():
    """A task file straight in /tmp (or a current folder of /) must not bind the host's /tmp over the private one,
    where torch's and Triton's caches would then be the host's and not writable."""
    argv = sandbox_command(["true"], SandboxPlan(readable=("/tmp", "/"), writable=("/tmp",)), bwrap="bwrap")
    binds = pairs(argv, "--ro-bind") + pairs(argv, "--bind")
    assert "/tmp" not in binds and "/" not in binds
