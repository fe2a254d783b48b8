"""The shared ``fake_world`` of tests/conftest.py: the world it opens is the one asked for, and it
is gone afterwards, also when the body raises (so one failing test cannot poison the next)."""

from __future__ import annotations

import pytest

from tests.conftest import MESHFAKE, fake_world

dist = pytest.importorskip("torch.distributed")


@pytest.mark.parametrize("backend", ["fake", MESHFAKE])
def test_opens_the_world_asked_for_and_closes_it(backend):
    with fake_world(16, 5, backend) as default:
        assert dist.is_initialized()
        assert default is dist.distributed_c10d._get_default_group()
        assert (dist.get_rank(), dist.get_world_size(), dist.get_backend()) == (5, 16, backend)
    assert not dist.is_initialized()


def test_closes_the_world_when_the_body_raises():
    with pytest.raises(RuntimeError, match="boom"):
        with fake_world(8, 3):
            raise RuntimeError("boom")
    assert not dist.is_initialized()
    with fake_world(8, 7):  # and the next world opens cleanly
        assert dist.get_rank() == 7


def test_a_body_that_destroys_the_world_itself_is_fine():
    with fake_world(4, 0):
        dist.destroy_process_group()
    assert not dist.is_initialized()
