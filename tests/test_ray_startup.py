"""Starting the Ray backend quickly: Ray started in the background and joined once, hosts started
side by side. A stand-in for Ray records what the driver does, so no Ray instance is started here."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from fedgl.comm import Party, rpc
from fedgl import ray_start
from fedgl.comm import ray_cluster
from fedgl.errors import ConfigError


class Counter(Party):
    def __init__(self, name: str, seed: int):
        super().__init__(name, seed)
        self.count = 0

    @rpc(returns="control")
    def bump(self):
        self.count += 1
        return self.count


def stand_in_ray(log: list) -> SimpleNamespace:
    """What the driver uses of Ray: each actor an object here, each call a future run by ``get``."""
    state = SimpleNamespace(up=False)

    class Actor:
        def __init__(self, cls, args):
            self.obj = cls(*args)

        def __getattr__(self, method):
            def remote(*args):
                log.append(("send", method))
                return lambda: getattr(self.obj, method)(*args)
            return SimpleNamespace(remote=remote)

    def get(future):
        log.append(("get", None))
        return [f() for f in future] if isinstance(future, list) else future()

    def actor_class(cls):
        def remote(*args):
            log.append(("host", cls.__name__))
            return Actor(cls, args)
        return SimpleNamespace(options=lambda **options: SimpleNamespace(remote=remote))

    errors = SimpleNamespace(RayActorError=type("RayActorError", (Exception,), {}),
                             RayTaskError=type("RayTaskError", (Exception,), {}))
    return SimpleNamespace(state=state, is_initialized=lambda: state.up, shutdown=lambda: setattr(state, "up", False),
                           get=get, remote=actor_class, kill=lambda actor: log.append(("kill", None)),
                           exceptions=errors, cluster_resources=dict,
                           get_runtime_context=lambda: SimpleNamespace(gcs_address="127.0.0.1:6379"))


@pytest.fixture
def slow_start(monkeypatch):
    """``start_local`` replaced by a start that takes a while; the starts it made are counted."""
    starts = []

    def start(ray, auth):
        time.sleep(0.3)
        starts.append(auth)
        ray.state.up = True
    monkeypatch.setattr(ray_start, "start_local", start)
    monkeypatch.setattr(ray_start, "_BACKGROUND", [])
    return starts


def test_a_background_start_returns_at_once_and_init_ray_joins_it_instead_of_starting_again(slow_start):
    ray = stand_in_ray([])
    began = time.perf_counter()
    ray_start.start_in_background("none", ray)
    assert time.perf_counter() - began < 0.2 and not slow_start  # still starting
    assert ray_cluster.init_ray(ray, None, 5.0, "none") is True  # the instance this process started
    assert slow_start == ["none"] and ray.state.up
    ray_start.start_in_background("none", ray)  # already up: nothing more starts
    assert not ray_start._BACKGROUND and slow_start == ["none"]


def test_a_background_start_for_other_settings_is_stopped_and_started_again_as_asked(slow_start):
    ray = stand_in_ray([])
    ray_start.start_in_background("token", ray)
    assert ray_cluster.init_ray(ray, None, 5.0, "none") is True
    assert slow_start == ["token", "none"] and ray.state.up


def test_a_failed_background_start_fails_the_run_with_its_own_line(monkeypatch):
    def refuse(ray, auth):
        raise RuntimeError("the raylet did not come up")
    monkeypatch.setattr(ray_start, "start_local", refuse)
    monkeypatch.setattr(ray_start, "_BACKGROUND", [])
    ray = stand_in_ray([])
    ray_start.start_in_background("none", ray)
    with pytest.raises(ConfigError) as failed:
        ray_cluster.init_ray(ray, None, 5.0, "none")
    assert str(failed.value) == "cannot start or reach Ray at a local instance: the raylet did not come up"


def test_the_start_thread_outlives_the_start(slow_start):
    """Linux stops a process's children when the thread that started them ends, so it must not end."""
    ray_start.start_in_background("none", stand_in_ray([]))
    ray_start._BACKGROUND[0][0].wait(5.0)
    time.sleep(0.05)
    assert any(t.name == "fedgl-ray-start" and t.is_alive() for t in threading.enumerate())


def test_hosts_start_side_by_side_and_the_driver_waits_once(monkeypatch):
    """The first host starts with the transport; every party is sent before the driver waits for any."""
    log: list = []
    monkeypatch.setitem(__import__("sys").modules, "ray", stand_in_ray(log))
    from fedgl.comm import ray_transport

    monkeypatch.setattr(ray_transport, "init_ray", lambda *args: False)
    transport = ray_transport.RayTransport(actors=2)
    assert log == [("host", "PartyHost")]
    names = transport.spawn(Counter, [dict(name=f"c{i}", seed=i) for i in range(4)])
    steps = [kind for kind, _ in log]
    assert steps.count("host") == 2 and steps.count("send") == 4
    assert steps.index("get") > max(i for i, kind in enumerate(steps) if kind == "send")  # all sent, then waited
    assert transport.call_many(names, "bump") == [1, 1, 1, 1]


def test_a_runs_hosts_are_emptied_and_the_next_run_starts_none(monkeypatch):
    """On a local Ray a finished run's hosts are emptied (its parties gone) and the process's next run places
    its parties on them instead of starting new ones; on a cluster they are stopped."""
    log: list = []
    monkeypatch.setitem(__import__("sys").modules, "ray", stand_in_ray(log))
    from fedgl.comm import ray_transport

    monkeypatch.setattr(ray_transport, "init_ray", lambda *args: False)
    monkeypatch.setattr(ray_transport, "_IDLE", {})
    first = ray_transport.RayTransport(actors=2)
    first.spawn(Counter, [dict(name=f"c{i}", seed=i) for i in range(4)])
    assert first.call_many(["c0", "c1"], "bump") == [1, 1]
    hosts = list(first._hosts)
    first.close()
    assert ("send", "clear") in log and ("kill", None) not in log
    log.clear()
    second = ray_transport.RayTransport(actors=2)
    second.spawn(Counter, [dict(name=f"c{i}", seed=i) for i in range(4)])
    assert [kind for kind, _ in log].count("host") == 0 and sorted(map(id, second._hosts)) == sorted(map(id, hosts))
    assert second.call_many(["c0", "c1"], "bump") == [1, 1]  # new parties: the old counts are gone
    second._keeps_hosts = False  # as on a cluster (backend.address set)
    second.close()
    assert log.count(("kill", None)) == 2 and not any(ray_transport._IDLE.values())


def test_a_guess_the_config_overrules_does_not_fail_the_run(monkeypatch):
    """``--backend ray`` starts Ray before the config is read; if it then opts out of token authentication
    (say, because RAY_AUTH_MODE=disabled refuses a token start), the failed guess is not this run's."""
    def start(ray, auth):
        if auth == "token":
            raise ConfigError("RAY_AUTH_MODE=disabled turns Ray's token authentication off")
        ray.state.up = True
    monkeypatch.setattr(ray_start, "start_local", start)
    monkeypatch.setattr(ray_start, "_BACKGROUND", [])
    ray = stand_in_ray([])
    ray_start.start_in_background("token", ray)
    assert ray_cluster.init_ray(ray, None, 5.0, "none") is True and ray.state.up
