"""Domain errors raised by the domain; the API maps each to one status and code."""


class ServiceError(Exception):
    """Base class: a request the committed state does not allow. Nothing was changed."""

    code = "conflict"
    status = 409

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field


class InvalidRequest(ServiceError):
    """The request names something that does not exist or breaks a rule (unknown agent...)."""

    code = "invalid"
    status = 400


class RunNotFound(ServiceError):
    code = "not_found"
    status = 404


class WorkerNotFound(ServiceError):
    code = "not_found"
    status = 404


class IdempotencyConflict(ServiceError):
    """The Idempotency-Key was used before with a different request."""

    code = "idempotency_conflict"


class NotAwaiting(ServiceError):
    """Resume of a run that is not awaiting (including an ended one): fail closed."""

    code = "not_awaiting"


class TicketMismatch(ServiceError):
    """Resume with a ticket that is not the run's open ticket."""

    code = "ticket_mismatch"


class NotActive(ServiceError):
    """A live command for a run with no live attempt of that generation."""

    code = "not_active"


class Busy(ServiceError):
    """The control plane could not even try (its delivery capacity is full, or the database
    pool is exhausted): nothing was sent or changed, and the caller may try again after
    ``retry_after`` seconds. Never a NotActive: that answer is final."""

    code = "busy"
    status = 503
    retry_after = 1


class WorkerDraining(ServiceError):
    """The worker process asked to claim runs is drained by an operator: it claimed none."""

    code = "draining"


class Fenced(ServiceError):
    """An attempt whose generation or lease is no longer current; it may commit nothing."""

    code = "fenced"


class TooManyFailures(ServiceError):
    """Too many failed key checks lately from this address."""

    code = "throttled"
    status = 429

    def __init__(self, retry_after: int):
        super().__init__(f"Too many failed key checks; try again in {retry_after} seconds.")
        self.retry_after = retry_after


class KeyRevoked(ServiceError):
    """A key that was right once: replaced, revoked, or its user deactivated."""

    code = "authentication_failed"
    status = 401


class LinkNotFound(ServiceError):
    """No review link with that token (or id, for that run)."""

    code = "not_found"
    status = 404


class LinkGone(ServiceError):
    """A review link that can no longer be used: expired, used or revoked."""

    code = "link_gone"
    status = 410


class LinkExpired(LinkGone):
    code = "link_expired"


class LinkUsed(LinkGone):
    code = "link_used"


class LinkRevoked(LinkGone):
    code = "link_revoked"


class LinkStale(LinkGone):
    """The link's ticket is no longer open: its run moved on (resumed another way, or
    ended), so the question it asked is not asked any more."""

    code = "link_stale"


class BulkJobNotFound(ServiceError):
    code = "not_found"
    status = 404
