"""`cut_lease`: a dropped streamed append cuts its producer's lease (both backends)."""

from __future__ import annotations

import time
from uuid import uuid4

import anyio
import pytest

from tests.conftest import BridgeFactory

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


async def test_only_the_current_stream_cuts_and_any_write_renews(
    make_bridge: BridgeFactory,
) -> None:
    async with make_bridge(lease_seconds=30) as bridge:
        with anyio.fail_after(10):
            run_id = f"run-{uuid4().hex[:10]}"
            claim = await bridge.claim(run_id)
            token = claim.token
            await bridge.renew_lease(run_id, producer_token=token, stream="s1")
            # not this stream's, not this token's: nothing is cut
            assert (
                await bridge.cut_lease(run_id, producer_token=token, stream="s0", grace=1) is None
            )
            assert await bridge.cut_lease(run_id, producer_token="x", stream="s1", grace=1) is None
            info = await bridge.get_run(run_id)
            assert info is not None and info.lease_expires_at > time.time() + 20
            # a reconnect renewed under a new mark: the old stream's late cut is ignored
            await bridge.renew_lease(run_id, producer_token=token, stream="s2")
            assert (
                await bridge.cut_lease(run_id, producer_token=token, stream="s1", grace=1) is None
            )
            ends = await bridge.cut_lease(run_id, producer_token=token, stream="s2", grace=2)
            assert ends is not None and abs(ends - (time.time() + 2)) < 0.5
            # never lengthened
            again = await bridge.cut_lease(run_id, producer_token=token, stream="s2", grace=9)
            assert again == pytest.approx(ends, abs=0.05)  # (Redis: each from what is left)
            info = await bridge.get_run(run_id)
            assert info is not None and info.lease_expires_at == pytest.approx(ends, abs=0.05)
            # any write renews the whole lease
            await bridge.publish(run_id, "token", {"n": 1}, producer_token=token)
            info = await bridge.get_run(run_id)
            assert info is not None and info.lease_expires_at > time.time() + 20
            await bridge.publish_end(run_id, "success", producer_token=token)
            assert (
                await bridge.cut_lease(run_id, producer_token=token, stream="s2", grace=1) is None
            )


async def test_a_producer_already_back_keeps_its_lease(make_bridge: BridgeFactory) -> None:
    """A drop noticed late: the producer appended (a batch) since the stream's last
    append, or renewed its lease from elsewhere since the drop. The late cut changes
    nothing; a renewal before the drop does not save the run."""
    async with make_bridge(lease_seconds=30) as bridge:
        with anyio.fail_after(10):
            run_id = f"run-{uuid4().hex[:10]}"
            token = (await bridge.claim(run_id)).token
            await bridge.renew_lease(run_id, producer_token=token, stream="s1")
            last = (await bridge.publish(run_id, "t", 1, producer_token=token)).ids[-1]
            await bridge.publish(run_id, "t", 2, producer_token=token)  # a batch, since
            cut = bridge.cut_lease(run_id, producer_token=token, stream="s1", grace=1, last_id=last)
            assert await cut is None
            await bridge.renew_lease(run_id, producer_token=token, stream="s2")
            last = (await bridge.publish(run_id, "t", 3, producer_token=token)).ids[-1]
            await bridge.renew_lease(run_id, producer_token=token)  # POST …/lease
            cut = bridge.cut_lease(  # the drop was seen a second ago: the renewal came after
                run_id, producer_token=token, stream="s2", grace=1, last_id=last, dropped_ago=1.0
            )
            assert await cut is None
            info = await bridge.get_run(run_id)
            assert info is not None and info.lease_expires_at > time.time() + 20
            # nothing since the drop (a renewal while the stream was open is before it): cut
            await bridge.renew_lease(run_id, producer_token=token, stream="s3")
            last = (await bridge.publish(run_id, "t", 4, producer_token=token)).ids[-1]
            await bridge.renew_lease(run_id, producer_token=token)
            cut = bridge.cut_lease(run_id, producer_token=token, stream="s3", grace=1, last_id=last)
            ends = await cut
            assert ends is not None and ends < time.time() + 2
