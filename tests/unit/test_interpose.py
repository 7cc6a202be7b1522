"""candidate/interpose.py: a hooked attribute is the same object watched or not, and wrappers nest and unwind."""

from __future__ import annotations

from kernel_lsp.candidate.interpose import handled, hook


class Launcher:
    def run(self, value: int) -> int:
        return value + 1


def test_the_attribute_stays_the_same_object_while_a_wrapper_is_pushed_and_after():
    hook(Launcher, "run")
    installed = Launcher.__dict__["run"]
    seen: list[str] = []

    def outer(next_):
        def run(self, value):
            seen.append("outer")
            return next_(self, value) * 10
        return run

    def inner(next_):
        def run(self, value):
            seen.append("inner")
            return next_(self, value) * 2
        return run
    assert Launcher().run(1) == 2
    with handled(Launcher, "run", outer):
        assert Launcher.__dict__["run"] is installed
        assert Launcher().run(1) == 20
        with handled(Launcher, "run", inner):
            seen.clear()
            assert Launcher().run(1) == (1 + 1) * 10 * 2 and seen == ["inner", "outer"]
        assert Launcher().run(1) == 20
    assert Launcher().run(1) == 2 and Launcher.__dict__["run"] is installed
    assert hook(Launcher, "run").original(Launcher(), 1) == 2
