"""The member table's merge, fed updates and times: no sockets, no sleeps, no event loop."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aionet.membership.load import LoadReport
from aionet.membership.table import (
    ALIVE,
    DEAD,
    LEFT,
    STATES,
    SUSPECT,
    TRANSITIONS,
    Disseminate,
    Emit,
    InvalidTransition,
    KillLink,
    LearnAddresses,
    LinkLeft,
    MemberTable,
    Refuted,
    Restarted,
    StartVerify,
    TableFull,
    Update,
    check_transition,
    supersedes,
)

ADDR = ("tcp://10.0.0.2:7700",)


def merge(table, u, now=10.0, adj=8.0, **kw):
    return table.merge(u, now=now, adj_now=adj, **kw)


def kinds(effects):
    return [type(e) for e in effects]


def joined(table, state=ALIVE, inc=5, node_id="id-b"):
    changed, _ = merge(table, Update("b", node_id, inc, state, ADDR), now=1.0, adj=1.0)
    assert changed
    return table.get("b")


def test_a_new_member_is_learned_announced_and_spread():
    t = MemberTable()
    changed, effects = merge(t, Update("b", "id-b", 5, ALIVE, ADDR), source="c")
    assert changed
    assert kinds(effects) == [LearnAddresses, Emit, Disseminate]
    ev = effects[1]
    assert (ev.name, ev.kind, ev.state, ev.previous, ev.reason) == ("b", "joined", "alive", None, "via c")
    assert type(ev.state) is str  # events travel through msgpack with strict types
    assert effects[2] == Disseminate(Update("b", "id-b", 5, ALIVE, ADDR), "c")
    assert t.get("b").state is ALIVE


def test_a_seed_table_is_not_spread_again():
    _, effects = merge(MemberTable(), Update("b", "id-b", 5, ALIVE, ADDR), spread=False)
    assert Disseminate not in kinds(effects)


def test_a_member_first_heard_of_as_dead_is_not_dialed():
    _, effects = merge(MemberTable(), Update("b", "id-b", 5, DEAD, ADDR))
    assert kinds(effects) == [Emit, Disseminate]
    assert effects[0].kind == "dead"


def test_suspicion_at_the_same_incarnation_is_taken_and_timed():
    t = MemberTable()
    m = joined(t)
    changed, effects = merge(t, Update("b", "id-b", 5, SUSPECT, ADDR), now=20.0, adj=15.0, reason="rumour")
    assert changed and m.state is SUSPECT and m.since == 20.0 and m.suspect_at == 15.0
    emit = next(e for e in effects if isinstance(e, Emit))
    assert (emit.kind, emit.previous, emit.reason) == ("suspect", "alive", "rumour")


def test_death_kills_the_link_and_clears_a_local_suspicion():
    t = MemberTable()
    m = joined(t)
    m.suspected = "no heartbeat"
    _, effects = merge(t, Update("b", "id-b", 5, DEAD, ADDR), source="c")
    assert kinds(effects) == [KillLink, Emit, Disseminate]  # a dead member's address is not learned
    kill = next(e for e in effects if isinstance(e, KillLink))
    assert kill == KillLink("b", "id-b", "gossip from c")
    assert m.suspected == "" and m.state is DEAD


def test_a_leave_heard_by_gossip_ends_a_down_link_once_and_never_kills_it():
    """A member that left is not redialed: the service ends a link to it that is down (LinkLeft),
    so requests to it fail at once instead of after link.give_up_after; it is never a death."""
    t = MemberTable()
    m = joined(t)
    _, effects = merge(t, Update("b", "id-b", 5, LEFT, ADDR), source="c")
    assert kinds(effects) == [LinkLeft, Emit, Disseminate]
    assert effects[0] == LinkLeft("b", "id-b", "gossip from c") and m.state is LEFT
    assert KillLink not in kinds(effects)
    # the same news again (or a later incarnation of the goodbye) asks for nothing more
    _, again = merge(t, Update("b", "id-b", 6, LEFT, ADDR), source="d")
    assert LinkLeft not in kinds(again)


def test_only_a_higher_incarnation_lifts_a_suspicion():
    t = MemberTable()
    m = joined(t, SUSPECT)
    assert merge(t, Update("b", "id-b", 5, ALIVE, ADDR)) == (False, [])
    changed, effects = merge(t, Update("b", "id-b", 6, ALIVE, ADDR))
    assert changed and m.state is ALIVE and m.incarnation == 6
    assert Refuted("b") in effects
    assert next(e for e in effects if isinstance(e, Emit)).kind == "alive"


def test_stale_news_changes_nothing():
    t = MemberTable()
    joined(t, inc=7)
    for state in (ALIVE, SUSPECT, LEFT):
        assert merge(t, Update("b", "id-b", 6, state, ADDR), now=1e9) == (False, [])
    assert t.get("b").incarnation == 7 and t.get("b").state is ALIVE


def test_an_old_death_about_a_silent_member_is_verified_not_believed():
    t = MemberTable()
    m = joined(t, inc=7)
    m.last_seen = 9.5
    # heard from it 0.5 s ago: a stale rumour, ignored
    assert merge(t, Update("b", "id-b", 6, DEAD), now=10.0, verify_after=1.0) == (False, [])
    # silent for longer than a probe: check it ourselves
    changed, effects = merge(t, Update("b", "id-b", 6, DEAD), now=11.0, source="c", verify_after=1.0)
    assert not changed and effects == [StartVerify("b", "reported dead by c")]
    assert m.state is ALIVE


def test_a_peer_verdict_about_a_member_we_just_heard_from_is_still_believed():
    """A killed process must be dead everywhere at once: a peer's verdict is not second-guessed
    for fresh proof of life (only for who gives it, below)."""
    t = MemberTable()
    m = joined(t)
    m.last_seen = 9.99
    changed, effects = merge(t, Update("b", "id-b", 5, DEAD, ADDR), now=10.0, source="c", distrust_revived=5.0)
    assert changed and m.state is DEAD and kinds(effects) == [KillLink, Emit, Disseminate]


def test_verdicts_of_a_peer_that_just_came_back_from_dead_are_verified():
    """After a partition heals, the cut-off node gossips the deaths it declared while alone."""
    t = MemberTable()
    joined(t)  # b, healthy; never heard from directly (not a heartbeat neighbour)
    merge(t, Update("d", "id-d", 3, ALIVE, ADDR), now=1.0, adj=1.0)
    merge(t, Update("d", "id-d", 3, DEAD, ADDR), now=2.0, adj=2.0)  # d cut off: we declared it dead
    merge(t, Update("d", "id-d", 4, ALIVE, ADDR), now=6.0, adj=6.0)  # healed: d refuted
    assert t.get("d").revived_at == 6.0
    stale = Update("b", "id-b", 5, DEAD, ADDR)
    changed, effects = merge(t, stale, now=7.0, source="d", distrust_revived=5.0)
    assert not changed and t.get("b").state is ALIVE
    assert kinds(effects) == [StartVerify] and "d was itself dead 1.0 s ago" in effects[0].reason
    # a verdict from a peer we still count dead (its refutation not seen yet) is checked too
    merge(t, Update("e", "id-e", 1, ALIVE, ADDR), now=1.0, adj=1.0)
    merge(t, Update("e", "id-e", 1, DEAD, ADDR), now=2.0, adj=2.0)
    changed, effects = merge(t, stale, now=7.0, source="e", distrust_revived=5.0)
    assert not changed and kinds(effects) == [StartVerify] and "we count e itself dead" in effects[0].reason
    # once the window has passed, d's word counts like anyone's
    changed, _ = merge(t, stale, now=12.0, source="d", distrust_revived=5.0)
    assert changed and t.get("b").state is DEAD


def test_a_restarted_process_replaces_the_record():
    t = MemberTable()
    m = joined(t)
    m.load, m.load_time, m.last_seen, m.suspected = LoadReport.unknown(), 1.0, 1.0, "x"
    changed, effects = merge(t, Update("b", "id-new", 9, ALIVE, ADDR))
    assert changed and m.node_id == "id-new"
    assert Restarted("b") in effects and Refuted("b") not in effects
    assert next(e for e in effects if isinstance(e, Emit)).kind == "restarted"
    assert m.load is m.load_time is m.last_seen is None and m.suspected == ""


def test_equal_incarnation_of_another_process_keeps_the_old_record():
    t = MemberTable()
    joined(t)
    assert merge(t, Update("b", "id-other", 5, LEFT, ADDR)) == (False, [])


def test_the_table_is_bounded():
    t = MemberTable(max_members=2)
    for name in ("a", "b"):
        assert merge(t, Update(name, "id", 1, ALIVE))[0]
    assert merge(t, Update("c", "id", 1, ALIVE), source="evil") == (False, [TableFull("evil")])
    assert t.get("c") is None
    assert merge(t, Update("a", "id", 2, ALIVE))[0]  # known names still update


def test_illegal_transition_raises():
    """dead -> alive without a newer incarnation is a bug in whatever asks for it."""
    t = MemberTable()
    m = joined(t, DEAD)
    with pytest.raises(InvalidTransition):
        t._transition(m, Update("b", "id-b", 5, ALIVE), now=1.0, adj_now=1.0)
    assert m.state is DEAD
    with pytest.raises(InvalidTransition):
        check_transition(LEFT, SUSPECT, newer=False)
    check_transition(LEFT, ALIVE, newer=True)


@pytest.mark.parametrize("old,new", list(itertools.permutations(STATES, 2)))
def test_transition_table_matches_precedence(old, new):
    """Upward edges need no new incarnation; downward ones need one (the table and
    ``supersedes`` agree)."""
    upward = STATES.index(new) > STATES.index(old)
    assert (old, new) in TRANSITIONS
    assert TRANSITIONS[(old, new)] is not upward
    check_transition(old, new, newer=True)
    if upward:
        check_transition(old, new, newer=False)
    else:
        with pytest.raises(InvalidTransition):
            check_transition(old, new, newer=False)
    assert supersedes(Update("b", "i", 1, new), Update("b", "i", 1, old)) is upward


def test_plain_strings_are_accepted_as_states():
    assert Update("b", "i", 1, "suspect").state is SUSPECT
    with pytest.raises(ValueError):
        Update("b", "i", 1, "sleepy")


updates = st.builds(
    Update,
    st.just("b"),
    st.sampled_from(["p1", "p2"]),
    st.integers(0, 4),
    st.sampled_from(STATES),
    st.just(ADDR),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(updates, max_size=30))
def test_any_sequence_of_updates_merges_without_an_illegal_transition(seq):
    """The merge only ever asks for legal edges, and the record ends as the best update seen
    under ``supersedes``."""
    t = MemberTable()
    best = None
    for u in seq:
        changed, _ = merge(t, u)
        assert changed == supersedes(u, best)
        if changed:
            best = u
    if best is not None:
        assert t.get("b").update() == best
