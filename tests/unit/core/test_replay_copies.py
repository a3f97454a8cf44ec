"""The link's copies of big outgoing buffers: independent of the caller, recycled only when
nobody references them, bounded in memory and in how much may wait for acks."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from aionet.codecs.framing import OwnedFrame
from aionet.core.replay_copies import COPY_BUDGET, POOL_BYTES, ReplayCopies

MiB = 2**20


def test_copies_do_not_change_when_the_caller_reuses_its_buffer():
    rc = ReplayCopies()
    arr = np.arange(MiB // 8, dtype=np.float64)
    header = b"hdr"
    frames = rc.copy([header, memoryview(arr), bytearray(b"y" * 100)])
    arr[:] = -1.0  # the caller reuses its buffers once send returned
    assert frames[0] is header  # immutable frames are kept, not copied
    assert all(type(f) is OwnedFrame for f in frames[1:])
    assert np.array_equal(np.frombuffer(frames[1], dtype=np.float64), np.arange(MiB // 8, dtype=np.float64))
    assert bytes(frames[2]) == b"y" * 100


def test_a_buffer_is_reused_only_once_nothing_references_it():
    rc = ReplayCopies()
    src = np.ones(MiB, np.uint8)
    held = rc.copy([b"h", src])[1]  # as the replay buffer (or a transport) holds it
    other = rc.copy([b"h", src])[1]
    assert other is not held
    other_id = id(other)
    view = memoryview(held)  # a view (a transport writing it) counts as a reference too
    del held, other
    third = rc.copy([b"h", src])[1]
    assert id(third) == other_id  # the dropped one came back, not the one a view still holds
    fourth = rc.copy([b"h", src])[1]
    assert fourth is not third and fourth is not view.obj
    view.release()


def test_the_pool_stays_within_its_bound_when_sizes_change():
    rc = ReplayCopies()
    for i in range(40):
        n = MiB + i * 4096  # every size new: nothing to reuse
        rc.copy([b"h", np.zeros(n, np.uint8)])
        assert rc.pool_bytes <= POOL_BYTES


def test_held_buffers_beyond_the_bound_are_not_remembered():
    rc = ReplayCopies()
    held = [rc.copy([b"h", np.zeros(4 * MiB, np.uint8)])[1] for _ in range(8)]  # 32 MiB, all in use
    assert rc.pool_bytes <= POOL_BYTES
    assert all(len(b) == 4 * MiB for b in held)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4 * MiB), st.booleans()), min_size=1, max_size=60))
def test_waiting_for_the_returned_seq_brings_the_copies_within_the_budget(msgs):
    """``sent`` returns the seq whose ack brings the unacknowledged copies (other than the
    newest message) within COPY_BUDGET, and no later seq than needed; 0 when within already."""
    rc = ReplayCopies()
    for seq, (nbytes, ack_now) in enumerate(msgs, start=1):
        wait = rc.sent(seq, nbytes)
        held = list(rc.inflight)
        older = [(s, nb) for s, nb in held if s != seq]
        if wait == 0:
            assert sum(nb for _, nb in older) <= COPY_BUDGET
        else:
            assert wait < seq
            assert sum(nb for s, nb in older if s > wait) <= COPY_BUDGET
            assert sum(nb for s, nb in older if s >= wait) > COPY_BUDGET  # one ack less would not do
            rc.acked(wait)
        if ack_now:
            rc.acked(seq)
            assert rc.inflight_bytes == 0
    rc.reset()
    assert rc.inflight_bytes == 0 and not rc.inflight


def test_a_successor_takes_over_the_account_and_the_old_one_forgets_it():
    old, new = ReplayCopies(), ReplayCopies()
    old.sent(1, MiB)
    old.sent(2, MiB)
    new.take_over(old)
    assert list(new.inflight) == [(1, MiB), (2, MiB)] and new.inflight_bytes == 2 * MiB
    assert not old.inflight and old.inflight_bytes == 0
    old.reset()  # the old link's reset must not touch what the successor now holds
    assert new.inflight_bytes == 2 * MiB
    new.acked(2)
    assert new.inflight_bytes == 0


def test_freeze_copies_only_what_the_caller_could_still_change() -> None:
    import numpy as np

    from aionet.core.replay_copies import POOLED_MIN, ReplayCopies

    rc = ReplayCopies()
    small = np.full(1000, 1, np.uint8)
    big = np.full(POOLED_MIN * 2, 2, np.uint8)
    ro = np.full(POOLED_MIN * 2, 3, np.uint8)
    ro.flags.writeable = False
    header = b"hdr"
    frames = [header, memoryview(small), memoryview(big), memoryview(ro), b"x" * 10]
    out = rc.freeze(frames)
    assert out[0] is header and out[4] is frames[4]  # bytes: already immutable
    assert out[3] is frames[3]  # read-only: zero-copy
    small[:] = 9
    big[:] = 9
    assert bytes(out[1]) == b"\x01" * 1000 and bytes(out[2]) == b"\x02" * (POOLED_MIN * 2)
    assert rc.frozen_bytes == 1000 + POOLED_MIN * 2
    assert frames[1] is not out[1]  # the caller's list is left alone


def test_freeze_recycles_a_pooled_copy_once_nothing_references_it() -> None:
    import numpy as np

    from aionet.core.replay_copies import POOLED_MIN, ReplayCopies

    rc = ReplayCopies()
    arr = np.zeros(POOLED_MIN, np.uint8)
    first = rc.freeze([b"h", memoryview(arr)])
    held = first[1]
    second = rc.freeze([b"h", memoryview(arr)])
    assert second[1] is not held  # still referenced (by the replay buffer, say): a new one
    del first, held, second
    again = rc.freeze([b"h", memoryview(arr)])
    assert again[1] in rc._bufs  # a remembered buffer, reused
    assert rc.pool_bytes == 2 * POOLED_MIN
