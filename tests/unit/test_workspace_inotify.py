"""The Linux watcher (kernel_lsp/workspace/inotify.py) on real folders: what it reports, and which folders hold a
watch as files and folders come, move and go."""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

import pytest

from kernel_lsp.workspace.inotify import InotifyWatcher, available
from kernel_lsp.workspace.scan import IgnoreRules
from kernel_lsp.workspace.watch import CHANGED, CREATED, DELETED

pytestmark = pytest.mark.skipif(not (sys.platform.startswith("linux") and available()), reason="inotify is Linux's")


class Watched:
    """A watcher over `root` with the workspace's ignore rules; events land in `events` on the test's loop."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.rules = IgnoreRules.for_folder(root)
        self.events: list[tuple[Path, str, bool]] = []
        self.arrived = asyncio.Event()
        self.watcher = InotifyWatcher([root], self.rules.ignored, self._on_event, asyncio.get_running_loop())

    def _on_event(self, path: Path, kind: str, is_dir: bool) -> None:
        self.events.append((path, kind, is_dir))
        self.arrived.set()

    async def until(self, event: tuple[Path, str, bool]) -> list[tuple[Path, str, bool]]:
        """The events up to and including `event` (which is sure to come), taken off the list."""
        while event not in self.events:
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), 30)
        upto = self.events.index(event) + 1
        taken, self.events[:] = self.events[:upto], self.events[upto:]
        return taken

    def folders(self) -> set[Path]:
        return set(self.watcher._folders.values())


@pytest.fixture
async def watched(tmp_path: Path):
    root = tmp_path.resolve()
    (root / "src").mkdir()
    (root / "node_modules" / "pkg").mkdir(parents=True)
    (root / ".gitignore").write_text("data/\n")
    (root / "data").mkdir()
    w = Watched(root)
    assert w.watcher.start() is None
    yield w
    w.watcher.stop()


async def test_kept_folders_are_watched_and_their_files_reported(watched: Watched):
    root = watched.root
    assert watched.folders() == {root, root / "src"}
    (root / "node_modules" / "pkg" / "x.cu").write_text("ignored\n")
    (root / "data" / "y.cu").write_text("ignored\n")
    kernel = root / "src" / "k.cu"
    kernel.write_text("// one\n")
    kernel.unlink()
    seen = await watched.until((kernel, DELETED, False))
    assert {path for path, _, _ in seen} == {kernel}  # nothing from the ignored folders
    kinds = [kind for _, kind, _ in seen]
    assert [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k] == [CREATED, CHANGED, DELETED]


async def test_a_folder_made_moved_or_removed_changes_the_watches_with_it(watched: Watched):
    root = watched.root
    (root / "src" / "new" / "deep").mkdir(parents=True)
    await watched.until((root / "src" / "new", CREATED, True))
    # `deep` is made just after `new`: found by the scan of `new`, or by its own event when it came later
    expected = {root, root / "src", root / "src" / "new", root / "src" / "new" / "deep"}
    for _ in range(100):
        if watched.folders() == expected:
            break
        await asyncio.sleep(0.05)
    assert watched.folders() == expected
    (root / "src" / "new").rename(root / "data" / "new")  # into an ignored folder: gone, as far as we see
    await watched.until((root / "src" / "new", DELETED, True))
    assert watched.folders() == {root, root / "src"}
    (root / "data" / "new").rename(root / "moved")  # out of it: a new folder, with what is below it
    await watched.until((root / "moved", CREATED, True))
    assert watched.folders() == {root, root / "src", root / "moved", root / "moved" / "deep"}
    shutil.rmtree(root / "moved")
    await watched.until((root / "moved", DELETED, True))
    (root / "src" / "last.cu").write_text("")  # the IN_IGNORED of the removed folders come before this
    await watched.until((root / "src" / "last.cu", CHANGED, False))
    assert watched.folders() == {root, root / "src"}


async def test_refresh_follows_the_rules(watched: Watched):
    root = watched.root
    (root / ".gitignore").write_text("")
    watched.rules.invalidate()
    watched.watcher.refresh()
    assert watched.folders() == {root, root / "src", root / "data"}
    (root / ".gitignore").write_text("src/\n")
    watched.rules.invalidate()
    watched.watcher.refresh()
    assert watched.folders() == {root, root / "data"}

