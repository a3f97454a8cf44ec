"""The link's resume rules (core/link_state.plan_resume) fed as a pair: two ends exchange
their resume info as a handshake would, and each plan is checked. No sockets, no clock."""

from dataclasses import dataclass, field

from hypothesis import given
from hypothesis import strategies as st

from aionet.core.link_state import LinkState, ResumePlan, plan_resume


@dataclass
class End:
    """One side of a link: its stream ids, the node id it knows for the peer, its state."""

    node_id: str
    tx_id: str
    rx_id: str = ""
    peer_node_id: str = ""
    state: LinkState = field(default_factory=lambda: LinkState(1 << 20))

    def info(self) -> dict:
        return {"tx": self.tx_id, "rx": self.rx_id, "recv": self.state.recv_seq}

    def plan(self, other: "End") -> ResumePlan:
        return plan_resume(
            other.info(),
            other.node_id,
            known_node_id=self.peer_node_id,
            tx_id=self.tx_id,
            rx_id=self.rx_id,
            acked=self.state.acked,
            next_seq=self.state.next_seq,
        )


def connected_pair(sent: int, received: int) -> tuple[End, End]:
    """a sent ``sent`` messages to b; b received the first ``received`` of them."""
    a, b = End("A", "ta", "tb", "B"), End("B", "tb", "ta", "A")
    for i in range(sent):
        seq, _ = a.state.stamp()
        a.state.record(seq, [b"m%d" % i], 2)
        if i < received:
            assert b.state.on_receive(seq)
    return a, b


def test_a_cut_connection_trims_what_arrived_and_replays_the_rest():
    a, b = connected_pair(sent=10, received=7)
    plan = a.plan(b)
    assert plan == ResumePlan(ack=7, peer_node_id="B")
    a.state.on_ack(plan.ack)
    assert [s for s, _f, _n in a.state.replay()] == [8, 9, 10]  # replayed in order, once
    assert b.plan(a) == ResumePlan(peer_node_id="A")  # b sent nothing: nothing to do


def test_everything_acknowledged_already_needs_no_trim():
    a, b = connected_pair(sent=5, received=5)
    a.state.on_ack(5)
    assert a.plan(b).ack is None and not a.plan(b).restart_tx


def test_a_restarted_peer_restarts_both_streams():
    a, _b = connected_pair(sent=4, received=2)
    b2 = End("B-new", "tb2")  # same name, new process: knows nothing of our stream
    plan = a.plan(b2)
    assert plan.restart_tx.startswith("peer restarted") and plan.reset_rx and plan.rx_id == "tb2"
    assert plan.ack is None and plan.peer_node_id == "B-new"
    assert "peer restarted" in plan.notes[0]


def test_a_peer_that_lost_our_stream_makes_ours_restart():
    a, _b = connected_pair(sent=3, received=3)
    b_forgot = End("B", "tb", rx_id="other")  # same process, but it follows another stream of ours
    plan = a.plan(b_forgot)
    assert plan.restart_tx.startswith("link reset by peer") and not plan.reset_rx


def test_a_new_stream_from_the_peer_resets_what_we_received():
    a, b = connected_pair(sent=0, received=0)
    b.tx_id = "tb-2"
    plan = a.plan(b)
    assert plan.reset_rx and plan.rx_id == "tb-2" and plan.notes == ("peer started a new stream",)
    assert not plan.restart_tx  # we had sent nothing


def test_a_fresh_link_takes_the_peers_stream_id_silently():
    a = End("A", "ta")  # first handshake: follows nothing yet, knows no node id
    b = End("B", "tb")
    plan = a.plan(b)
    assert plan.rx_id == "tb" and plan.notes == () and not plan.restart_tx


@given(st.one_of(st.none(), st.integers(), st.text(), st.dictionaries(st.text(max_size=4), st.integers() | st.text())))
def test_garbage_resume_info_never_acks_beyond_what_was_sent(info):
    a, _b = connected_pair(sent=4, received=1)
    plan = plan_resume(info, "B", known_node_id="B", tx_id="ta", rx_id="tb", acked=0, next_seq=a.state.next_seq)
    assert plan.ack is None or 0 < plan.ack < a.state.next_seq
