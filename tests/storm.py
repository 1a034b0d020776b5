"""What a storm of control requests leaves behind, checked against SPEC §7 once every run
has ended: the checks of the chaos storm (test_chaos.py), kept apart from its machinery."""

from collections import Counter

from runs.models import Attempt, AttemptState, ControlIntent, Event, EventKind, Run, RunState


def histories() -> dict[str, list[Event]]:
    """Every run's events in seq order, by run id."""
    events: dict[str, list[Event]] = {}
    for event in Event.objects.order_by("seq"):
        events.setdefault(str(event.run_id), []).append(event)
    return events


def check_every_run_ended_once(resumed_run_ids) -> tuple[dict[str, Run], dict[str, list]]:
    """SPEC §7 on what committed, with every run ended:

    1. each run's versions are contiguous, with exactly one ``ended`` event, its last;
    2. the run's end cause is its ``ended`` event's;
    3. each run of ``resumed_run_ids`` (resumes answered 200) has its ``resumed`` event
       before its end;
    4. no control intent is left pending, no attempt live;
    5. a run stopped carries a reason.

    Returns the runs and their histories, by run id.
    """
    assert not Run.objects.exclude(state=RunState.ENDED).exists()
    runs = {str(run.id): run for run in Run.objects.all()}
    events = histories()
    for run_id, run in runs.items():
        history = events[run_id]
        assert [e.version for e in history] == list(range(1, run.version + 1)), run_id
        ended = [e for e in history if e.kind == EventKind.ENDED]
        assert len(ended) == 1 and history[-1].kind == EventKind.ENDED, run_id
        assert ended[0].end_cause == run.end_cause, run_id
    for run_id in resumed_run_ids:
        kinds = [e.kind for e in events[run_id]]
        assert "resumed" in kinds and kinds.index("resumed") < kinds.index("ended"), run_id
    assert not ControlIntent.objects.filter(applied_at__isnull=True).exists()
    assert not Attempt.objects.filter(state=AttemptState.LIVE).exists()
    for intent in ControlIntent.objects.select_related("run"):
        assert intent.run.end_cause in ("cancelled", "stopped", "completed", "failed")
        if intent.run.end_cause == "stopped":
            assert intent.run.stop_reason, intent.run_id
    return runs, events


def ends(runs: dict[str, Run]) -> dict[str, int]:
    """How many runs ended by each cause."""
    return dict(Counter(run.end_cause for run in runs.values()))
