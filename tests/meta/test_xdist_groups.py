"""``make test`` runs on two pytest-xdist workers with ``--dist loadgroup``: the tests of an
``xdist_group`` (the Spark session's, the Dask cluster's) must all go to one worker, or each
worker starts its own session and cluster."""

import pytest


@pytest.mark.xdist_group("one-worker")
def test_a_grouped_test_carries_its_group_in_its_id(request):
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not run by pytest-xdist with --dist loadgroup")
    assert request.node.nodeid.endswith("@one-worker"), (
        request.node.nodeid
    )  # what loadgroup schedules by
