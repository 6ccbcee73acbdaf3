"""Experiment leases at a shared gateway, over HTTP: one client holds an experiment, another is
refused (409, naming the holder) both when it asks for the lease and when it registers one of
the experiment's rollouts; the holder registers and re-attaches as before."""

from __future__ import annotations

import time
import uuid

import httpx

from rollway.leases import LeaseHolder
from tests.conftest import Served


def holder_json(holder: LeaseHolder) -> dict:
    return holder.model_dump(mode="json")


def take(served: Served, exp_id: str, holder: LeaseHolder, ttl_s: float = 30.0) -> httpx.Response:
    return httpx.post(
        f"{served.url}/v1/experiments/{exp_id}/lease", headers=served.admin_headers,
        json={"holder": holder_json(holder), "ttl_s": ttl_s},
    )  # fmt: skip


def register(served: Served, rollout_id: str, **query: str) -> httpx.Response:
    return httpx.post(
        f"{served.url}/v1/rollouts/{rollout_id}/register", params=query, json={},
        headers=served.admin_headers,
    )  # fmt: skip


def test_a_held_experiment_refuses_other_clients_and_names_the_holder(sim_served: Served) -> None:
    exp = f"gw-lease-{uuid.uuid4().hex[:6]}"
    first, second = LeaseHolder.this_process(), LeaseHolder.this_process()
    assert take(sim_served, exp, first).status_code == 200
    assert take(sim_served, exp, first).status_code == 200  # a heartbeat

    refused = take(sim_served, exp, second)
    assert refused.status_code == 409
    error = refused.json()["error"]
    assert error["code"] == "ExperimentInUseError"
    assert (
        f"pid {first.pid} on {first.host}" in error["message"] and first.id[:8] in error["message"]
    )

    # Its rollouts open only for the holder (a restart of the holder re-attaches).
    for query in ({}, {"client": second.id}):
        answer = register(sim_served, f"{exp}.t.0.1", **query)
        assert answer.status_code == 409 and first.id[:8] in answer.json()["error"]["message"]
    opened = register(sim_served, f"{exp}.t.0.1", client=first.id).json()
    again = register(sim_served, f"{exp}.t.0.1", client=first.id, reuse="true").json()
    assert again["api_key"] == opened["api_key"]
    # Another experiment whose id starts the same is not held.
    assert register(sim_served, f"{exp}x.t.0.1").status_code == 200

    released = httpx.post(
        f"{sim_served.url}/v1/experiments/{exp}/release", headers=sim_served.admin_headers,
        json={"holder_id": first.id},
    )  # fmt: skip
    assert released.json() == {"released": True}
    assert take(sim_served, exp, second).status_code == 200
    for rollout_id in (f"{exp}.t.0.1", f"{exp}x.t.0.1"):
        sim_served.gateway._rollouts.pop(rollout_id)


def test_a_lease_without_heartbeats_lapses_after_its_ttl(sim_served: Served) -> None:
    exp = f"gw-lapse-{uuid.uuid4().hex[:6]}"
    elsewhere = LeaseHolder.this_process().model_copy(update={"machine": "other:1", "pid": 1})
    assert take(sim_served, exp, elsewhere).status_code == 200
    assert take(sim_served, exp, LeaseHolder.this_process()).status_code == 409
    assert register(sim_served, f"{exp}.t.0.1").status_code == 409
    # 31 s without a heartbeat from a client on another machine (its process cannot be seen).
    held = sim_served.gateway.leases._held
    held[exp] = held[exp].model_copy(update={"renewed_at": time.time() - 31.0})
    assert register(sim_served, f"{exp}.t.0.1").status_code == 200
    assert take(sim_served, exp, LeaseHolder.this_process()).status_code == 200
    sim_served.gateway._rollouts.pop(f"{exp}.t.0.1")


def test_lease_routes_refuse_bad_bodies_and_need_the_admin_key(sim_served: Served) -> None:
    url = f"{sim_served.url}/v1/experiments/gw-bad/lease"
    holder = holder_json(LeaseHolder.this_process())
    assert httpx.post(url, json={"holder": holder, "ttl_s": 30}).status_code == 401
    for body in ({"holder": holder}, {"holder": {**holder, "pid": "1"}, "ttl_s": 30},
                 {"holder": holder, "ttl_s": True}, {"holder": holder, "ttl_s": 0}):  # fmt: skip
        assert httpx.post(url, json=body, headers=sim_served.admin_headers).status_code == 422
