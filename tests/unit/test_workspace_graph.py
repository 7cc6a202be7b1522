"""Dependency graph: includes (quoted, angle, not yet existing), load sources, references, dependents, updates."""

from __future__ import annotations

from pathlib import Path

from kernel_lsp.workspace.graph import DependencyGraph, Edge


def write(path: Path, text: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path.resolve()


def add(graph: DependencyGraph, path: Path) -> set[Path]:
    return graph.update(path, path.read_text())


def test_quoted_include_resolves_in_the_folder_before_include_dirs(tmp_path):
    local = write(tmp_path / "src" / "common.cuh")
    shared = write(tmp_path / "include" / "common.cuh")
    only_shared = write(tmp_path / "include" / "only.cuh")
    kernel = write(tmp_path / "src" / "k.cu", '#include "common.cuh"\n#include "only.cuh"\n')
    graph = DependencyGraph(include_dirs=[tmp_path / "include"])
    assert add(graph, kernel) == {local, only_shared}
    assert graph.dependents(local) == {kernel}
    assert graph.dependents(shared) == set()
    assert graph.edges() == sorted([Edge(kernel, local, "include"), Edge(kernel, only_shared, "include")])


def test_angle_include_only_through_include_dirs(tmp_path):
    write(tmp_path / "src" / "near.h")  # next to the includer: not where <near.h> is looked for
    far = write(tmp_path / "inc" / "far.h")
    kernel = write(tmp_path / "src" / "k.cu", "#include <near.h>\n#include <far.h>\n#include <cuda_runtime.h>\n")
    assert add(DependencyGraph(include_dirs=[tmp_path / "inc"]), kernel) == {far}
    assert add(DependencyGraph(), kernel) == set()  # no include dirs: system headers, skipped


def test_includes_in_comments_and_strings_are_not_edges(tmp_path):
    write(tmp_path / "a.h")
    kernel = write(tmp_path / "k.cu", '// #include "a.h"\n/* #include "a.h" */\nconst char* s = "#include \\"a.h\\"";\n')
    assert add(DependencyGraph(), kernel) == set()


def test_missing_quoted_header_is_recorded_where_it_would_be(tmp_path):
    kernel = write(tmp_path / "k.cu", '#include "later.cuh"\n#include "sub/nested.h"\n')
    graph = DependencyGraph()
    assert add(graph, kernel) == {(tmp_path / "later.cuh").resolve(), (tmp_path / "sub" / "nested.h").resolve()}
    later = write(tmp_path / "later.cuh")  # created afterwards: the includer is its dependent already
    assert graph.dependents(later) == {kernel}


def test_transitive_dependents(tmp_path):
    c = write(tmp_path / "c.h")
    b = write(tmp_path / "b.cuh", '#include "c.h"\n')
    a = write(tmp_path / "a.cu", '#include "b.cuh"\n')
    other = write(tmp_path / "other.cu", '#include "b.cuh"\n')
    unrelated = write(tmp_path / "u.cu", "")
    graph = DependencyGraph()
    for path in (a, b, c, other, unrelated):
        add(graph, path)
    assert graph.dependents(c) == {a, b, other}
    assert graph.dependents(b) == {a, other}
    assert graph.dependents(a) == set()
    assert graph.dependencies(a) == {b}
    assert len(graph) == 3  # a, b and other have outgoing edges


def test_cycles_terminate_and_exclude_the_file_itself(tmp_path):
    x = write(tmp_path / "x.cuh", '#include "y.cuh"\n')
    y = write(tmp_path / "y.cuh", '#include "z.cuh"\n')
    z = write(tmp_path / "z.cuh", '#include "x.cuh"\n')
    selfish = write(tmp_path / "s.cuh", '#include "s.cuh"\n')
    graph = DependencyGraph()
    for path in (x, y, z, selfish):
        add(graph, path)
    assert graph.dependents(x) == {y, z}
    assert graph.dependents(z) == {x, y}
    assert graph.dependents(selfish) == set()


def test_update_replaces_old_edges(tmp_path):
    old = write(tmp_path / "old.h")
    new = write(tmp_path / "new.h")
    kernel = write(tmp_path / "k.cu", '#include "old.h"\n')
    graph = DependencyGraph()
    add(graph, kernel)
    assert graph.dependents(old) == {kernel}
    assert graph.update(kernel, '#include "new.h"\n') == {new}
    assert graph.dependents(old) == set()
    assert graph.dependents(new) == {kernel}
    assert graph.update(kernel, "int x;\n") == set()
    assert graph.dependents(new) == set()
    assert len(graph) == 0 and graph.edges() == []


def test_remove_drops_outgoing_edges_only(tmp_path):
    c = write(tmp_path / "c.h")
    b = write(tmp_path / "b.cuh", '#include "c.h"\n')
    a = write(tmp_path / "a.cu", '#include "b.cuh"\n')
    graph = DependencyGraph()
    for path in (a, b):
        add(graph, path)
    graph.remove(b)
    assert graph.dependencies(b) == set()
    assert graph.dependents(c) == set()
    assert graph.dependents(b) == {a}  # a still names b: re-creating b re-checks a
    graph.remove(tmp_path / "never-added.cu")  # no error
    assert len(graph) == 1


def test_paths_are_resolved(tmp_path):
    header = write(tmp_path / "inc" / "h.cuh")
    kernel = write(tmp_path / "src" / "k.cu", '#include "../inc/h.cuh"\n')
    graph = DependencyGraph()
    graph.update(tmp_path / "src" / ".." / "src" / "k.cu", kernel.read_text())
    assert graph.dependents(tmp_path / "inc" / "." / "h.cuh") == {kernel}
    assert graph.dependencies(kernel) == {header}


def test_load_sources_of_a_python_candidate(tmp_path):
    kernel = write(tmp_path / "k.cu")
    helper = write(tmp_path / "csrc" / "bind.cpp")
    candidate = write(tmp_path / "model_new.py", (
        "import torch\nfrom torch.utils.cpp_extension import load\n"
        "ext = load(name='k', sources=['k.cu', 'csrc/bind.cpp'])\n"
        "class ModelNew(torch.nn.Module):\n    pass\n"))
    positional = write(tmp_path / "other" / "positional.py", (
        "import torch.utils.cpp_extension as ce\next = ce.load('k', ['../k.cu'])\n"))
    graph = DependencyGraph()
    assert add(graph, candidate) == {kernel, helper}
    assert add(graph, positional) == {kernel}  # relative to the candidate's own folder
    assert graph.dependents(kernel) == {candidate, positional}
    assert {edge.kind for edge in graph.edges()} == {"load-source"}


def test_load_inline_and_plain_python_have_no_edges(tmp_path):
    inline = write(tmp_path / "inline.py", (
        "from torch.utils.cpp_extension import load_inline\n"
        "ext = load_inline(name='k', cpp_sources='#include \"k.h\"', functions=['f'])\n"))
    plain = write(tmp_path / "plain.py", "import os\n")
    graph = DependencyGraph()
    assert add(graph, inline) == set()
    assert add(graph, plain) == set()


def test_a_header_of_a_kernel_loaded_by_python_reaches_the_candidate(tmp_path):
    header = write(tmp_path / "k.cuh")
    kernel = write(tmp_path / "k.cu", '#include "k.cuh"\n')
    candidate = write(tmp_path / "new.py", "from torch.utils.cpp_extension import load\nload('k', sources=['k.cu'])\n")
    graph = DependencyGraph()
    for path in (header, kernel, candidate):
        add(graph, path)
    assert graph.dependents(header) == {kernel, candidate}


def test_reference_edges_through_the_callable(tmp_path):
    reference = write(tmp_path / "ref.py", "class Model:\n    pass\n")
    candidate = write(tmp_path / "new.py", "# kernel-lsp: reference=ref.py\nclass ModelNew:\n    pass\n")
    same = write(tmp_path / "same.py", "class Model:\n    pass\nclass ModelNew:\n    pass\n")
    calls: list[Path] = []

    def reference_of(path: Path, text: str) -> Path | None:
        calls.append(path)
        if "reference=ref.py" in text:
            return path.parent / "ref.py"
        return path if "ModelNew" in text else None  # same-file pairing: no edge to itself

    graph = DependencyGraph(reference_of=reference_of)
    for path in (reference, candidate, same):
        add(graph, path)
    assert graph.dependents(reference) == {candidate}
    assert graph.edges() == [Edge(candidate, reference, "reference")]
    assert set(calls) == {reference, candidate, same}
    kernel = write(tmp_path / "k.cu")
    assert add(graph, kernel) == set()
    assert kernel not in calls  # only .py files are paired


def test_no_reference_edges_without_the_callable(tmp_path):
    write(tmp_path / "ref.py", "class Model:\n    pass\n")
    candidate = write(tmp_path / "new.py", "# kernel-lsp: reference=ref.py\nclass ModelNew:\n    pass\n")
    assert add(DependencyGraph(), candidate) == set()
