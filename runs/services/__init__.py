"""Every write to run state goes through these functions, and nothing else writes it."""

from runs.services.attempts import (
    Renewal,
    attempt_expire,
    attempt_finish,
    attempt_interrupted,
    attempt_pause,
    attempt_renew,
    attempt_start,
    attempt_step,
    attempt_stop_by_policy,
    runs_redispatch,
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
from runs.services.runs import (
    ControlResult,
    run_cancel,
    run_create,
    run_resume,
    run_stop,
    runs_import,
)

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
    "Renewal",
    "attempt_expire",
    "attempt_finish",
    "attempt_interrupted",
    "attempt_pause",
    "attempt_renew",
    "attempt_start",
    "attempt_step",
    "attempt_stop_by_policy",
    "runs_redispatch",
    "finish",
    "locked_run",
    "run_cancel",
    "run_create",
    "run_resume",
    "run_stop",
    "runs_import",
]
