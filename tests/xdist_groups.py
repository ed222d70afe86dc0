"""`--dist loadgroup` on pytest 9.2: the tests of one ``xdist_group`` run in one worker, one
after another.

pytest-xdist hands a test's group to its scheduler as a suffix of the test's id
(``tests/test_ray.py::test_x@ray``), written into ``item._nodeid``; pytest 9.2 keeps the id in
``item._id`` instead, so the suffix is lost and every grouped test is dealt out alone -- with no
word (pytest-xdist issue 1386). This plugin writes the suffix where pytest 9.2 reads the id,
in each worker, after collection; where pytest-xdist has already added it, it does nothing."""

import pytest


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not getattr(config.option, "loadgroup", False):  # set in the workers of a --dist loadgroup run
        return
    from _pytest.nodeid import NodeId

    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        suffix = f"@{'_'.join(names)}"
        if names and not item.nodeid.endswith(suffix) and hasattr(item, "_id"):
            item._id = NodeId.parse(item.nodeid + suffix)
