"""Every write to run state goes through these functions, and nothing else writes it."""

from runs.services.attempts import (
    attempt_finish,
    attempt_heartbeat,
    attempt_interrupted,
    attempt_pause,
    attempt_start,
    attempt_step,
)
from runs.services.core import Ending, finish, locked_run
from runs.services.errors import (
    Fenced,
    IdempotencyConflict,
    InvalidRequest,
    NotActive,
    NotAwaiting,
    RunNotFound,
    ServiceError,
    TicketMismatch,
)
from runs.services.runs import ControlResult, run_cancel, run_create, run_resume, run_stop

__all__ = [
    "ControlResult",
    "Ending",
    "Fenced",
    "IdempotencyConflict",
    "InvalidRequest",
    "NotActive",
    "NotAwaiting",
    "RunNotFound",
    "ServiceError",
    "TicketMismatch",
    "attempt_finish",
    "attempt_heartbeat",
    "attempt_interrupted",
    "attempt_pause",
    "attempt_start",
    "attempt_step",
    "finish",
    "locked_run",
    "run_cancel",
    "run_create",
    "run_resume",
    "run_stop",
]
