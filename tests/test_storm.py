"""A race storm: random concurrent cancel, stop, pause, resume and deliver through the REST
API while real worker processes execute the runs; then SPEC §7 is checked on what committed.

Small in CI; at full size, run it alone:
    STORM_RUNS=500 STORM_OPS=10000 DATABASE_URL=postgres://... REDIS_URL=redis://... \\
        .venv/bin/pytest tests/test_storm.py -s
"""

import os
import random
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connections
from django.utils import timezone

from harness.processes import wait_until
from runs import domain as services
from runs.models import Run, RunState
from tests.conftest import client_for, make_user
from tests.storm import check_every_run_ended_once, ends

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

RUNS = int(os.getenv("STORM_RUNS", "60"))
OPS = int(os.getenv("STORM_OPS", "400"))
WORKERS = int(os.getenv("STORM_WORKERS", "4"))
CALLERS = 8


@pytest.fixture
def workers(spare_worker):
    return [spare_worker(lease_seconds=2, concurrency=4) for _ in range(WORKERS)]


def new_runs(api, rng, count) -> list[str]:
    """``count`` runs of random agents, half created one by one and half in batches of up to
    50 (which reach the workers 50 to a message, claimed together)."""
    single = count // 2
    ids = [new_run(api, rng) for _ in range(single)]
    while len(ids) < count:
        specs = [random_spec(rng) for _ in range(min(50, count - len(ids)))]
        response = api.post("/api/runs/batch/", {"runs": specs}, format="json")
        assert response.status_code == 201
        ids += [run["id"] for run in response.json()["results"]]
    return ids


def new_run(api, rng) -> str:
    response = api.post("/api/runs/", random_spec(rng), format="json")
    assert response.status_code == 201
    return response.json()["id"]


def random_spec(rng) -> dict:
    agent, input = rng.choice([
        ("demo.steps", {"steps": rng.randint(1, 6),
                        "step_seconds": rng.choice([0.01, 0.05, 0.2])}),
        ("demo.approval", {"step_seconds": 0.02}),
        ("demo.hang", {}),
        ("demo.late", {"late_seconds": 0.3}),
    ])
    return {"agent": agent, "input": input}


def test_a_storm_of_controls_keeps_every_guarantee(workers, settings):
    settings.AWAKEN_LEASE_SECONDS = 2
    settings.AWAKEN_DELIVERY_TIMEOUT = 0.5
    operator = make_user("storm", "operator")
    rng = random.Random(int(os.getenv("STORM_SEED", "20261130")))
    setup = client_for(operator)
    run_ids = new_runs(setup, rng, RUNS)
    outcomes = Counter()
    accepted_resumes = []  # (run id, time the 200 came back)
    lock = threading.Lock()

    def operate(seed: int, count: int):
        local = random.Random(seed)
        api = client_for(operator)
        try:
            for _ in range(count):
                run_id = local.choice(run_ids)
                verb = local.choice(["cancel", "stop", "pause", "resume", "deliver", "look"])
                if verb == "cancel":
                    response = api.post(f"/api/runs/{run_id}/cancel/?wait=0", {}, format="json")
                elif verb == "stop":
                    response = api.post(f"/api/runs/{run_id}/stop/?wait=0",
                                        {"reason": "storm"}, format="json")
                elif verb == "pause":
                    response = api.post(f"/api/runs/{run_id}/pause/?wait=0", format="json")
                elif verb == "resume":
                    ticket = (api.get(f"/api/runs/{run_id}/").json()["ticket"] or {}).get("id")
                    response = api.post(f"/api/runs/{run_id}/resume/",
                                        {"ticket": ticket or "00000000-0000-0000-0000-000000000000",
                                         "input": {"approved": local.random() < 0.7}},
                                        format="json")
                    if response.status_code == 200:
                        with lock:
                            accepted_resumes.append((run_id, timezone.now()))
                elif verb == "deliver":
                    response = api.post(f"/api/runs/{run_id}/deliver/",
                                        {"command": local.choice(["cancel", "pause", "wake"])},
                                        format="json")
                else:
                    response = api.get(f"/api/runs/{run_id}/")
                assert response.status_code < 500, (verb, response.content)
                with lock:
                    outcomes[(verb, response.status_code)] += 1
        finally:
            connections.close_all()

    started = time.monotonic()
    with ThreadPoolExecutor(CALLERS) as pool:
        for future in [pool.submit(operate, seed, OPS // CALLERS) for seed in range(CALLERS)]:
            future.result(timeout=600)
    storm_seconds = time.monotonic() - started

    # Drain: end whatever is still live, then let every accepted request land.
    for run_id in Run.objects.exclude(state=RunState.ENDED).values_list("id", flat=True):
        services.run_stop(run_id=run_id, actor="storm", source="cli", reason="storm is over")
    wait_until(lambda: (services.sweep(),
                        not Run.objects.exclude(state=RunState.ENDED).exists())[1],
               60, "every run to end")

    # SPEC §7 on what committed.
    runs, events = check_every_run_ended_once(run_id for run_id, _ in accepted_resumes)

    print(f"\nstorm: {RUNS} runs, {sum(outcomes.values())} operations in {storm_seconds:.1f} s "
          f"by {CALLERS} callers on {WORKERS} workers")
    print("  answers:", dict(sorted(outcomes.items())))
    print("  ends:", ends(runs), f"resumes accepted: {len(accepted_resumes)}",
          f"events: {sum(len(h) for h in events.values())}")
