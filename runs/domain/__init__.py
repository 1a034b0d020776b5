"""The domain core: the transitions of a run, the finish boundary, and the reads.

Every write to run state goes through the functions exported here, and nothing else writes
it. Views, sockets, the admin, commands, tasks and the worker runtime call them; this
package imports none of those, nor Celery, Channels or the REST framework (what it needs
from them goes through ``runs.domain.outside``).
"""

from runs.domain.attempts import (
    Renewal,
    attempt_expire,
    attempt_finish,
    attempt_interrupted,
    attempt_parent_gone,
    attempt_pause,
    attempt_renew,
    attempt_start,
    attempt_step,
    attempt_stop_by_policy,
    attempts_start,
    runs_redispatch,
    sweep,
    worker_report,
)
from runs.domain.bulk import (
    bulk_create,
    bulk_job_abort,
    bulk_job_get,
    bulk_job_run,
    bulk_jobs,
    bulk_preview,
)
from runs.domain.core import Ending, finish, locked_run
from runs.domain.errors import (
    Fenced,
    IdempotencyConflict,
    InvalidRequest,
    NotActive,
    NotAwaiting,
    RunNotFound,
    ServiceError,
    TicketMismatch,
)
from runs.domain.runs import (
    ControlResult,
    run_cancel,
    run_create,
    run_live_command,
    run_pause,
    run_rerun,
    run_resume,
    run_stop,
    runs_create,
    runs_import,
    ticket_revoke,
)

__all__ = [
    "bulk_create",
    "bulk_job_abort",
    "bulk_job_get",
    "bulk_job_run",
    "bulk_jobs",
    "bulk_preview",
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
    "attempt_parent_gone",
    "attempt_pause",
    "attempt_renew",
    "attempt_start",
    "attempts_start",
    "attempt_step",
    "attempt_stop_by_policy",
    "runs_redispatch",
    "sweep",
    "worker_report",
    "finish",
    "locked_run",
    "run_cancel",
    "run_create",
    "run_live_command",
    "run_pause",
    "run_rerun",
    "run_resume",
    "run_stop",
    "runs_create",
    "runs_import",
    "ticket_revoke",
]
