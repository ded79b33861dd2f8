"""The three-member ensemble the fault tests run on: a killed leader is replaced, data survives."""

from __future__ import annotations

from queues.services.zkserver import LocalEnsemble, free_ports
from queues.zk import client as zkmod
from tests.ensemble import ensemble, ensemble_hosts  # noqa: F401


def test_killing_the_leader_elects_another_and_keeps_the_data(
    ensemble: LocalEnsemble,  # noqa: F811
    ensemble_hosts: str,  # noqa: F811
) -> None:
    zk = zkmod.connect(ensemble_hosts)
    try:
        zk.create("/written-before", b"kept")
        first = ensemble.wait_for_leader()
        modes = sorted(member.mode() or "" for member in ensemble.members.values())
        assert modes == ["follower", "follower", "leader"]

        ensemble.kill(first)
        second = ensemble.wait_for_leader(other_than=first)

        assert second != first
        assert ensemble.members[first].mode() is None
        assert zk.get("/written-before")[0] == b"kept"
        zk.create("/written-after", b"")

        ensemble.start_one(first)
        assert ensemble.members[first].mode() == "follower"
    finally:
        zk.stop()
        zk.close()


def test_a_stopped_member_rejoins_as_a_follower(
    ensemble: LocalEnsemble,  # noqa: F811
    ensemble_hosts: str,  # noqa: F811
) -> None:
    leader = ensemble.wait_for_leader()
    follower = next(n for n in ensemble.members if n != leader)
    ensemble.stop_one(follower)
    assert ensemble.members[follower].mode() is None
    assert ensemble.leader() == leader

    ensemble.start_one(follower)

    assert ensemble.members[follower].mode() == "follower"


def test_an_ensembles_members_are_given_different_ports(tmp_path) -> None:
    """Each member's client, quorum and election ports differ from every other's (one port
    given twice left a member unable to bind its quorum port, and after a leader kill no leader
    was elected: a chaos run on 44dfffb)."""
    members = list(LocalEnsemble(tmp_path, size=3).members.values())
    clients = {m.port for m in members}
    # "server.N=127.0.0.1:<quorum>:<election>", the same lines for every member
    peers = {int(p) for line in members[0].peers for p in line.split(":")[1:]}
    assert len(clients) == 3
    assert len(peers) == 6
    assert not peers & clients


def test_free_ports_are_all_different() -> None:
    ports = free_ports(500)
    assert len(set(ports)) == 500


def test_a_leader_kill_with_no_election_starts_the_killed_server_again(
    ensemble: LocalEnsemble,  # noqa: F811
    ensemble_hosts: str,  # noqa: F811
) -> None:
    """With one follower down, killing the leader leaves no quorum: the fault cannot be caused
    as meant and says so, and the killed server is started again (a quorum is back) rather than
    left down for the rest of a chaos run, which then could only wait out its stall."""
    import random

    import pytest

    from queues.chaos.faults import FaultLog, LeaderKill, Stage
    from queues.services.zkserver import LocalServerError

    leader = ensemble.wait_for_leader()
    follower = next(n for n in ensemble.members if n != leader)
    ensemble.stop_one(follower)
    lines: list[str] = []
    stage = Stage(
        consumers=[], rng=random.Random(1), log=FaultLog(lines.append), session_timeout=10.0
    )
    stage.ensemble = ensemble
    fault = LeaderKill(0.0)
    fault.elect_within = 3.0
    try:
        with pytest.raises(LocalServerError, match="no leader elected") as caught:
            fault.strike(stage)
        # The error says what each member was doing, for a run whose folders are gone.
        said = str(caught.value)
        assert f"server {leader}: not running" in said
        assert f"server {follower}: not running" in said
        others = [n for n in ensemble.members if n not in (leader, follower)]
        assert f"server {others[0]}: " in said and "its log ends:" in said
        assert ensemble.members[leader].mode() in ("leader", "follower")
        assert ensemble.wait_for_leader() is not None
        assert any(f"killed the ensemble's leader, server {leader}" in line for line in lines)
    finally:
        ensemble.start_one(follower)
