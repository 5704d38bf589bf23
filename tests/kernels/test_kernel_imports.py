"""The kernel modules import one way: references and dispatchers above the Triton wrappers, both above what
they share (``dsakv.kernels.common``); no circle, and no name looked up by string."""

from __future__ import annotations

import grimp

KERNELS = "dsakv.kernels"


def test_no_kernel_module_imports_back_into_one_that_imports_it():
    graph = grimp.build_graph("dsakv")
    modules = sorted(m for m in graph.modules if m.startswith(KERNELS + "."))
    for a in modules:
        for b in modules:
            if a != b and graph.direct_import_exists(importer=a, imported=b):
                assert graph.find_shortest_chain(importer=b, imported=a) is None, f"{a} <-> {b}"


def test_triton_wrappers_import_only_the_shared_module_of_the_kernels():
    graph = grimp.build_graph("dsakv")
    imported = graph.find_modules_directly_imported_by(f"{KERNELS}.cache_ops_triton")
    assert {m for m in imported if m.startswith(KERNELS)} == {f"{KERNELS}.common"}
    assert graph.direct_import_exists(importer=f"{KERNELS}.cache_ops", imported=f"{KERNELS}.cache_ops_triton")
