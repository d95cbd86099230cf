"""`judge_port_ownership`: who may hold the service's port, decided from kernel facts."""

from __future__ import annotations

from opsarena.hosts import Proc
from opsarena.referee.ownership import judge_port_ownership

UNIT = "builder-app.service"
INIT = Proc(100, 5, 1)
OLD = Proc(200, 10, 20)
NEW = Proc(300, 90, 30)
DECOY = Proc(400, 50, 40)
SINCE = 60
"""The instant the fault began (OLD started before it, NEW after)."""


def judge(owners: list[Proc], members: list[Proc], **kw: object) -> str | None:
    return judge_port_ownership(8080, UNIT, owners, members, init=INIT, **kw)  # type: ignore[arg-type]


def test_the_units_own_process_holds_the_port() -> None:
    assert judge([NEW], [NEW]) is None
    assert judge([NEW], [NEW], since=SINCE) is None


def test_socket_activation_by_init_is_allowed_alongside_the_unit() -> None:
    assert judge([INIT, NEW], [NEW]) is None
    assert judge([INIT], [NEW]) == (
        "port 8080 is held only by the host's init, no process of builder-app.service holds it"
    )


def test_a_decoy_outside_the_unit_is_named() -> None:
    problem = judge([DECOY], [NEW])
    assert (
        problem == "port 8080 is held by PID 40, which is not in builder-app.service "
        "(the unit's processes: 30)"
    )
    # Sharing the socket with the unit does not help the decoy.
    assert judge([NEW, DECOY], [NEW]) is not None


def test_a_process_from_before_the_restart_is_not_accepted() -> None:
    problem = judge([OLD], [OLD, NEW], since=SINCE)
    assert problem is not None and "from before the restart" in problem
    # Without a restart to compare with, the same process is fine.
    assert judge([OLD], [OLD]) is None


def test_a_reused_pid_is_another_process() -> None:
    reused = Proc(OLD.pid, SINCE + 1, OLD.inner)
    assert judge([reused], [reused], since=SINCE) is None


def test_a_process_kept_outside_the_unit_over_the_restart_is_not_new() -> None:
    """Moved out of the unit's cgroup before the restart (so not in `before`, and not
    killed), moved back in after it: it started before the restart."""
    hidden = Proc(500, 55, 50)
    problem = judge([hidden], [hidden, NEW], since=SINCE)
    assert problem is not None and "from before the restart" in problem
    crashed = judge([hidden], [hidden, NEW], since=SINCE, fault="crash")
    assert crashed is not None and "from before the crash of builder-app.service" in crashed


def test_nothing_listening_is_reported() -> None:
    assert judge([], [NEW]) == "no process of the host holds a socket listening on port 8080"
