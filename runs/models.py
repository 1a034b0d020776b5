"""Runs, their attempts, resume tickets, control intents and the event log; API keys and the
counts of failed key checks.

Every invariant that can be stated over one row (or one table) is a named database
constraint; the transitions that keep the cross-table ones true live in
``runs.domain`` and nowhere else.
"""

import uuid

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.utils import timezone


class RunState(models.TextChoices):
    QUEUED = "queued", "Queued"  # waiting for a worker to claim it
    RUNNING = "running", "Running"  # one live attempt holds the claim
    AWAITING = "awaiting", "Awaiting"  # paused, holding an open resume ticket
    ENDED = "ended", "Ended"  # absorbing; end_cause says why


class EndCause(models.TextChoices):
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"  # an external request to end the work
    STOPPED = "stopped", "Stopped"  # a host decision: operator halt or a budget


class StopCode(models.TextChoices):
    OPERATOR = "operator", "Operator"
    MAX_STEPS = "max_steps", "Step budget"
    MAX_SECONDS = "max_seconds", "Time budget"
    MAX_TOKENS = "max_tokens", "Token budget"
    MAX_COST = "max_cost", "Cost budget"
    MAX_REPEATS = "max_repeats", "Repeat budget"  # the loop guard
    POLICY = "policy", "Policy"


class OnExhausted(models.TextChoices):
    """What reaching a budget does to a run (``budget.on_exhausted``)."""

    STOP = "stop", "Stop"  # the run ends stopped with the budget's stop code
    PAUSE = "pause", "Pause"  # the run awaits a resume that raises the budget


class Source(models.TextChoices):
    UI = "ui", "Browser"
    API = "api", "REST API"
    ADMIN = "admin", "Admin"
    CLI = "cli", "Command line"
    POLICY = "policy", "Policy"
    WORKER = "worker", "Worker"
    LINK = "link", "Review link"  # a reviewer without an account, through a review link


LIVE_STATES = (RunState.QUEUED, RunState.RUNNING, RunState.AWAITING)


class Action(models.TextChoices):
    """What an operator may ask of a run; which ones a state allows is ``ALLOWED_ACTIONS``."""

    PAUSE = "pause", "Pause"
    RESUME = "resume", "Resume"
    CANCEL = "cancel", "Cancel"
    STOP = "stop", "Stop"


# The one statement of which actions each state allows (SPEC §2). The run JSON carries it
# as ``actions``, and the pages show exactly those buttons.
ALLOWED_ACTIONS = {
    RunState.QUEUED: (Action.CANCEL, Action.STOP),
    RunState.RUNNING: (Action.PAUSE, Action.CANCEL, Action.STOP),
    RunState.AWAITING: (Action.RESUME, Action.CANCEL, Action.STOP),
    RunState.ENDED: (),
}


class Run(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    agent = models.CharField(max_length=100, help_text="Name of the agent in the catalogue.")
    input = models.JSONField(default=dict, blank=True)
    thread_id = models.CharField(max_length=200, help_text="Groups related runs.")
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children"
    )
    # No index of its own: runs_run_reruns below covers the few rows that set it.
    rerun_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="reruns",
        db_index=False, help_text="The run this one was started again from (Run again).",
    )

    state = models.CharField(max_length=16, choices=RunState.choices, default=RunState.QUEUED)
    end_cause = models.CharField(max_length=16, choices=EndCause.choices, null=True, blank=True)
    stop_code = models.CharField(max_length=16, choices=StopCode.choices, null=True, blank=True)
    stop_reason = models.TextField(null=True, blank=True)
    error = models.TextField(null=True, blank=True)
    output = models.JSONField(null=True, blank=True)

    generation = models.PositiveIntegerField(
        default=0, help_text="Generation of the newest attempt; 0 until the first one starts."
    )
    owner = models.CharField(
        max_length=255, null=True, blank=True,
        help_text="The claim: worker node and pid of the live attempt; set exactly while running.",
    )
    claimed_at = models.DateTimeField(
        null=True, blank=True, help_text="When the live attempt claimed the run."
    )
    # A plain foreign key, not one-to-one: on PostgreSQL a column under a unique index is a
    # key, and an update of a key takes a lock that waits for every row referring to the
    # run (a child's intent naming its parent): ending an awaiting parent deadlocked with
    # it. A ticket belongs to one run anyway (ResumeTicket.run, one open per run).
    ticket = models.ForeignKey(
        "ResumeTicket",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="The open resume ticket; set exactly while the run is awaiting.",
    )
    control = models.ForeignKey(
        "ControlIntent",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="The newest cancel or stop request, pending or applied.",
    )

    max_steps = models.PositiveIntegerField(null=True, blank=True)
    max_seconds = models.FloatField(null=True, blank=True)
    max_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    max_cost_usd = models.FloatField(null=True, blank=True)
    max_repeats = models.PositiveIntegerField(
        null=True, blank=True, help_text="Calls of one tool with the same arguments allowed.")
    on_exhausted = models.CharField(max_length=8, choices=OnExhausted.choices,
                                    default=OnExhausted.STOP)
    steps = models.PositiveIntegerField(default=0, help_text="Committed steps, all attempts.")
    tokens = models.PositiveBigIntegerField(default=0, help_text="Tokens used, all attempts.")
    cost_usd = models.FloatField(
        null=True, blank=True, default=0.0,
        help_text="Cost of the committed steps' model calls; null once a model had no price.")
    repeats = models.JSONField(
        default=dict, blank=True,
        help_text="Committed tool calls by action digest, counted while max_repeats is set.")
    seconds_used = models.FloatField(
        default=0, help_text="Running time of closed attempts; awaiting time does not count."
    )
    agent_state = models.JSONField(
        null=True, blank=True, help_text="The agent's state as of its last committed step."
    )
    crash_retries = models.PositiveSmallIntegerField(
        default=0, help_text="Attempts lost with their worker and requeued."
    )

    version = models.PositiveIntegerField(default=0, help_text="Equals the run's event count.")
    # The activity log's numbering and caps (runs.domain.activity), on the run's row: its
    # writers hold the run's row lock and read them with it, so no write counts the log.
    activity_last = models.PositiveIntegerField(
        default=0, help_text="The number of the run's last activity entry.")
    activity_agent = models.PositiveIntegerField(
        default=0, help_text="Activity entries of the agent kept, and one more once cut.")
    activity_apart = models.PositiveIntegerField(
        default=0, help_text="Error and control entries kept in the activity log.")
    start_after = models.DateTimeField(null=True, blank=True)
    dispatched_at = models.DateTimeField(
        null=True, blank=True, help_text="When a worker was last asked to take the queued run."
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)
    request_fingerprint = models.CharField(
        max_length=64, blank=True, help_text="Hash of the create request, for key replays."
    )
    traceparent = models.CharField(
        max_length=55, blank=True, default="",
        help_text="The W3C trace context of the request that created the run, when traces "
                  "are on: its attempts' spans are its children.")

    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=RunState.values), name="runs_run_state_valid"
            ),
            models.CheckConstraint(
                condition=(
                    Q(state=RunState.ENDED, end_cause__in=EndCause.values, ended_at__isnull=False)
                    | (
                        ~Q(state=RunState.ENDED)
                        & Q(end_cause__isnull=True, ended_at__isnull=True)
                    )
                ),
                name="runs_run_end_cause_iff_ended",
            ),
            models.CheckConstraint(
                condition=(
                    Q(
                        end_cause=EndCause.STOPPED,
                        stop_code__in=StopCode.values,
                        stop_reason__isnull=False,
                    )
                    | (
                        ~Q(end_cause=EndCause.STOPPED)
                        & Q(stop_code__isnull=True, stop_reason__isnull=True)
                    )
                ),
                name="runs_run_stop_iff_stopped",
            ),
            # The open ticket pointer is what makes "a ticket only on an awaiting run" a
            # database fact (runs.domain.runs.run_pause / run_resume keep it in step).
            models.CheckConstraint(
                condition=(
                    Q(state=RunState.AWAITING, ticket__isnull=False)
                    | (~Q(state=RunState.AWAITING) & Q(ticket__isnull=True))
                ),
                name="runs_run_ticket_iff_awaiting",
            ),
            models.CheckConstraint(
                condition=Q(on_exhausted__in=OnExhausted.values),
                name="runs_run_on_exhausted_valid",
            ),
            models.CheckConstraint(
                condition=Q(error__isnull=True) | Q(end_cause=EndCause.FAILED),
                name="runs_run_error_only_if_failed",
            ),
            # No run is running without a named owner (live delivery addresses it).
            models.CheckConstraint(
                condition=(
                    Q(state=RunState.RUNNING, owner__isnull=False, claimed_at__isnull=False)
                    | (~Q(state=RunState.RUNNING) & Q(owner__isnull=True, claimed_at__isnull=True))
                ),
                name="runs_run_claim_iff_running",
            ),
            # Create with Idempotency-Key looks the key up per user (runs.domain.runs.run_create).
            models.UniqueConstraint(
                fields=["created_by", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="runs_run_idempotency_key_unique",
            ),
        ]
        indexes = [
            # The run list: newest first, optionally by state (runs.domain.selectors.run_list).
            models.Index(fields=["-created_at", "-id"], name="runs_run_newest"),
            # The same order for each filter, to the last key, so no page needs a sort.
            models.Index(fields=["state", "-created_at", "-id"], name="runs_run_state_newest"),
            models.Index(fields=["agent", "-created_at", "-id"], name="runs_run_agent_newest"),
            models.Index(fields=["thread_id", "-created_at", "-id"],
                         name="runs_run_thread_newest"),
            # And by end cause, which also lets several statuses at once (status=running,
            # failed) read only the runs that match (runs.domain.selectors.matching).
            models.Index(fields=["end_cause", "-created_at", "-id"],
                         name="runs_run_cause_newest"),
            # The sweeper re-dispatches queued runs whose broker message may be lost.
            models.Index(
                fields=["dispatched_at"],
                condition=Q(state=RunState.QUEUED),
                name="runs_run_queued_dispatch",
            ),
            # The run list sorted by start, end or running time, either way
            # (runs.domain.selectors.run_list: one index range per page, its NULLs read as a
            # group of their own), and the overview's counts of runs started and ended in
            # its window.
            models.Index(fields=["started_at", "id"], name="runs_run_started"),
            models.Index(fields=["ended_at", "id"], name="runs_run_ended"),
            models.Index(fields=["seconds_used", "id"], name="runs_run_seconds_used"),
            # The reruns of a run, for its page.
            models.Index(fields=["rerun_of"], condition=Q(rerun_of__isnull=False),
                         name="runs_run_reruns"),
        ]

    def __str__(self) -> str:
        return f"{self.agent} {self.id} ({self.status_label})"

    @property
    def is_ended(self) -> bool:
        return self.state == RunState.ENDED

    @property
    def status_label(self) -> str:
        """One word for people: the end cause once ended, otherwise the state."""
        return self.end_cause if self.is_ended else self.state

    @property
    def allowed_actions(self) -> tuple[str, ...]:
        return tuple(str(action) for action in ALLOWED_ACTIONS[self.state])

    @property
    def duration(self) -> float:
        """Seconds of running time: closed attempts, plus the live attempt so far."""
        if self.state == RunState.RUNNING and self.claimed_at is not None:
            return self.seconds_used + max(0.0, (timezone.now() - self.claimed_at)
                                           .total_seconds())
        return self.seconds_used


class AttemptState(models.TextChoices):
    LIVE = "live", "Live"  # holds the run's claim and renews its lease
    CLOSED = "closed", "Closed"  # released; close_reason says how


class CloseReason(models.TextChoices):
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    STOPPED = "stopped", "Stopped"
    PAUSED = "paused", "Paused"
    LOST = "lost", "Lease lost"


class Attempt(models.Model):
    # No index of its own: (run, generation) below leads with it.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="attempts",
                            db_index=False)
    generation = models.PositiveIntegerField()
    state = models.CharField(max_length=16, choices=AttemptState.choices, default=AttemptState.LIVE)
    close_reason = models.CharField(
        max_length=16, choices=CloseReason.choices, null=True, blank=True
    )
    owner = models.CharField(max_length=255, help_text="Worker hostname and pid.")
    lease_expires_at = models.DateTimeField()
    renewed_at = models.DateTimeField(
        null=True, blank=True,
        help_text="When its lease was last given or renewed (the database's clock): an "
                  "attempt lost is charged running time up to then.")
    started_at = models.DateTimeField(auto_now_add=True)
    closed_at = models.DateTimeField(null=True, blank=True)

    @property
    def ran_until(self):
        """When it last ran, as far as anyone knows: closed, or for one lost its last
        renewal (the outage after it is not its running time)."""
        if self.close_reason == CloseReason.LOST and self.renewed_at is not None:
            return min(self.renewed_at, self.closed_at)
        return self.closed_at

    class Meta:
        ordering = ["run", "generation"]
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=AttemptState.values), name="runs_attempt_state_valid"
            ),
            models.UniqueConstraint(
                fields=["run", "generation"], name="runs_attempt_generation_unique"
            ),
            # At most one attempt of a run is live (runs.domain.attempts.attempt_start).
            models.UniqueConstraint(
                fields=["run"],
                condition=Q(state=AttemptState.LIVE),
                name="runs_attempt_one_live_per_run",
            ),
            models.CheckConstraint(
                condition=(
                    Q(state=AttemptState.CLOSED, closed_at__isnull=False,
                      close_reason__isnull=False)
                    | Q(state=AttemptState.LIVE, closed_at__isnull=True, close_reason__isnull=True)
                ),
                name="runs_attempt_closed_iff_reason",
            ),
        ]
        # No index holds the lease (``lease_expires_at``, ``renewed_at``): a renewal, every
        # live attempt's update each interval, then changes no indexed column, and
        # PostgreSQL makes it in place on the row's page (a heap-only update) instead of
        # adding a new entry to every index of the table and leaving a dead row behind.
        # The sweeper's query of expired leases reads the live attempts instead, through
        # the partial index of one live attempt a run: one pass a sweep interval, against
        # a renewal of every live attempt in about the same time.
        indexes = [
            # Each worker renews its own live attempts, a chunk of run ids at a time: each
            # chunk is read by owner and run, not from every worker's attempts nor from all
            # of its own, however many workers and ended runs there are. "owner is not
            # null" keeps the sweeper's query (which names no owner) off it.
            models.Index(
                fields=["owner", "run"],
                condition=Q(state=AttemptState.LIVE, owner__isnull=False),
                name="runs_attempt_live_owner_run",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.run_id} gen {self.generation} ({self.state})"


class TicketState(models.TextChoices):
    OPEN = "open", "Open"  # the run is awaiting; this ticket can wake it
    CONSUMED = "consumed", "Consumed"  # a resume used it
    REVOKED = "revoked", "Revoked"  # a terminal transition or an operator withdrew it


class TicketReason(models.TextChoices):
    MANUAL_PAUSE = "manual_pause", "Manual pause"
    APPROVAL = "approval", "Approval"
    INPUT = "input", "Input"
    BUDGET = "budget", "Budget reached"  # budget.on_exhausted "pause"
    PROVIDER = "provider", "Provider failing"  # AWAKEN_ON_PROVIDER_ERROR "pause"
    LOOP = "loop", "Loop guard"  # budget.max_repeats


# Tickets a bulk job may resume: their resume needs no input of its own.
BULK_RESUMABLE = (TicketReason.PROVIDER, TicketReason.LOOP, TicketReason.MANUAL_PAUSE)


class ResumeTicket(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="tickets")
    generation = models.PositiveIntegerField(help_text="The attempt that paused.")
    reason = models.CharField(max_length=16, choices=TicketReason.choices)
    prompt = models.JSONField(null=True, blank=True, help_text="What the agent asked for.")
    schema = models.JSONField(
        null=True, blank=True, help_text="JSON Schema the resume input must satisfy, if any.")
    state = models.CharField(max_length=16, choices=TicketState.choices, default=TicketState.OPEN)
    resume_input = models.JSONField(null=True, blank=True)
    action = models.JSONField(
        null=True, blank=True,
        help_text="The one tool call an approval is asked for: tool, arguments, digest, "
                  "rationale (runs.domain.approvals).")
    created_at = models.DateTimeField(auto_now_add=True)
    closed_at = models.DateTimeField(null=True, blank=True)
    closed_by = models.CharField(max_length=150, null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=TicketState.values), name="runs_ticket_state_valid"
            ),
            # Only an approval is bound to an action.
            models.CheckConstraint(
                condition=Q(action__isnull=True) | Q(reason=TicketReason.APPROVAL),
                name="runs_ticket_action_only_for_approval",
            ),
            # At most one open ticket per run.
            models.UniqueConstraint(
                fields=["run"],
                condition=Q(state=TicketState.OPEN),
                name="runs_ticket_one_open_per_run",
            ),
            models.CheckConstraint(
                condition=(
                    Q(state=TicketState.OPEN, closed_at__isnull=True)
                    | (~Q(state=TicketState.OPEN) & Q(closed_at__isnull=False))
                ),
                name="runs_ticket_closed_at_iff_closed",
            ),
            models.CheckConstraint(
                condition=Q(resume_input__isnull=True) | Q(state=TicketState.CONSUMED),
                name="runs_ticket_input_only_if_consumed",
            ),
        ]

    def __str__(self) -> str:
        return f"ticket {self.id} ({self.state})"


class LinkState(models.TextChoices):
    OPEN = "open", "Open"  # can be opened and used until it expires
    USED = "used", "Used"  # a reviewer resumed the run with it
    REVOKED = "revoked", "Revoked"  # an operator withdrew it


class ReviewLink(models.Model):
    """A single-use, expiring link that lets someone without an account answer one ticket.

    The link's token is shown once, when it is made; only its SHA-256 is kept.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="review_links")
    ticket = models.ForeignKey(ResumeTicket, on_delete=models.CASCADE, related_name="+",
                               db_index=False, help_text="The one ticket it answers.")
    token_hash = models.CharField(max_length=64, unique=True,
                                  help_text="SHA-256 of the token, in hex.")
    state = models.CharField(max_length=16, choices=LinkState.choices, default=LinkState.OPEN)
    created_by = models.CharField(max_length=150, help_text="The operator who made it.")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    closed_at = models.DateTimeField(null=True, blank=True)
    closed_by = models.CharField(
        max_length=150, null=True, blank=True,
        help_text="The reviewer's name (used) or the operator's (revoked).")

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=LinkState.values), name="runs_link_state_valid"
            ),
            models.CheckConstraint(
                condition=(
                    Q(state=LinkState.OPEN, closed_at__isnull=True, closed_by__isnull=True)
                    | (~Q(state=LinkState.OPEN) & Q(closed_at__isnull=False,
                                                    closed_by__isnull=False))
                ),
                name="runs_link_closed_iff_not_open",
            ),
        ]

    def __str__(self) -> str:
        return f"review link {self.id} ({self.state})"

    @property
    def status(self) -> str:
        """The state as a reader sees it: an open link past its time is ``expired``."""
        if self.state == LinkState.OPEN and self.expires_at <= timezone.now():
            return "expired"
        return self.state


class ControlAction(models.TextChoices):
    CANCEL = "cancel", "Cancel"
    STOP = "stop", "Stop"


class BulkAction(models.TextChoices):
    """What a bulk job asks of each run: a cancel or stop, or a resume of awaiting runs."""

    CANCEL = "cancel", "Cancel"
    STOP = "stop", "Stop"
    RESUME = "resume", "Resume"


class AppliedVia(models.TextChoices):
    LIVE = "live", "Live attempt"  # the attempt ended the run (signal, renewal or its own end)
    DURABLE = "durable", "Durable path"  # queued or awaiting: ended with the request
    SWEEPER = "sweeper", "Sweeper"  # the attempt's lease expired


class ControlIntent(models.Model):
    """A durable "cancel" or "stop(reason)" request, written before any signal is sent."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="intents")
    action = models.CharField(max_length=16, choices=ControlAction.choices)
    reason = models.TextField(null=True, blank=True)
    stop_code = models.CharField(max_length=16, choices=StopCode.choices, null=True, blank=True)
    requested_by = models.CharField(max_length=150, help_text="Username, or the policy's name.")
    source = models.CharField(max_length=16, choices=Source.choices)
    requested_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(
        null=True, blank=True, help_text="When the owning attempt accepted the live signal."
    )
    applied_at = models.DateTimeField(
        null=True, blank=True, help_text="When the run's terminal state was committed."
    )
    applied_via = models.CharField(
        max_length=16, choices=AppliedVia.choices, null=True, blank=True,
        help_text="Which path committed the terminal state.",
    )
    caused_by = models.ForeignKey(
        Run, null=True, blank=True, on_delete=models.PROTECT, related_name="+",
        db_index=False, help_text="The parent run whose end or lost attempt asked for this.",
    )
    receipt = models.JSONField(
        null=True, blank=True,
        help_text="The stop receipt, written when the attempt it stopped ended: when the "
                  "provider connection closed, tokens that arrived after the request, the "
                  "tool calls in flight and those refused.",
    )

    class Meta:
        ordering = ["-requested_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(action__in=ControlAction.values), name="runs_intent_action_valid"
            ),
            models.CheckConstraint(
                condition=(
                    Q(action=ControlAction.STOP, stop_code__in=StopCode.values,
                      reason__isnull=False)
                    | Q(action=ControlAction.CANCEL, stop_code__isnull=True)
                ),
                name="runs_intent_stop_has_code_and_reason",
            ),
            models.CheckConstraint(
                condition=(Q(applied_at__isnull=True, applied_via__isnull=True)
                           | Q(applied_at__isnull=False, applied_via__in=AppliedVia.values)),
                name="runs_intent_applied_via_iff_applied",
            ),
            # One pending request per run: a second cancel or stop joins the first. Its index
            # also serves the lookups of pending intents (attempt_renew, the sweeper).
            models.UniqueConstraint(
                fields=["run"],
                condition=Q(applied_at__isnull=True),
                name="runs_intent_one_pending_per_run",
            ),
        ]
        indexes = [
            # Time to stop over the overview's window (runs.domain.overview.time_to_stop).
            models.Index(fields=["applied_at"], condition=Q(applied_at__isnull=False),
                         name="runs_intent_applied"),
        ]

    def __str__(self) -> str:
        return f"{self.action} {self.run_id} by {self.requested_by}"


class EventKind(models.TextChoices):
    CREATED = "created", "Created"
    STARTED = "started", "Started"
    STEP = "step", "Step"
    PAUSED = "paused", "Paused"
    RESUMED = "resumed", "Resumed"
    CANCEL_REQUESTED = "cancel_requested", "Cancel requested"
    STOP_REQUESTED = "stop_requested", "Stop requested"
    REQUEUED = "requeued", "Requeued"
    ENDED = "ended", "Ended"


class Event(models.Model):
    """One committed transition, written in the transaction of the change it records."""

    seq = models.BigAutoField(primary_key=True)
    # No index of its own: (run, version) below leads with it.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events",
                            db_index=False)
    version = models.PositiveIntegerField(help_text="The run's version after this event.")
    kind = models.CharField(max_length=24, choices=EventKind.choices)
    state = models.CharField(max_length=16, choices=RunState.choices)
    end_cause = models.CharField(max_length=16, choices=EndCause.choices, null=True, blank=True)
    generation = models.PositiveIntegerField()
    actor = models.CharField(max_length=150, null=True, blank=True)
    source = models.CharField(max_length=16, choices=Source.choices, null=True, blank=True)
    data = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["seq"]
        constraints = [
            models.CheckConstraint(
                condition=Q(kind__in=EventKind.values), name="runs_event_kind_valid"
            ),
            # Versions of a run are contiguous and never reused.
            models.UniqueConstraint(fields=["run", "version"],
                                    name="runs_event_run_version_unique"),
            # Exactly one terminal event per run.
            models.UniqueConstraint(
                fields=["run"], condition=Q(kind=EventKind.ENDED),
                name="runs_event_one_ended_per_run",
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.seq} {self.kind} {self.run_id}"


# Upper bounds (seconds) of the time-to-stop histogram, as /metrics exposes it: the one
# definition, read by runs.domain.overview and runs.domain.totals and by the triggers that
# keep the totals (migration 0017_metric_totals builds their SQL from it). A change to it
# needs a new migration that installs the triggers again and counts the "stop" rows anew.
STOP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class MetricDelta(models.Model):
    """One change to a whole-system total of /metrics, written by the database's own
    triggers in the transaction that changed the rows counted (migration
    ``0017_metric_totals``): runs by state and end cause, attempts lost, and cancel or
    stop requests applied by path and time to stop. The scrape folds the rows into one
    per total (``runs.domain.totals``), so it reads a few dozen rows however many runs,
    attempts and requests the database holds.

    ``name`` and ``key``: ``runs`` / ``state|end_cause``, ``lost`` / ``""``, ``stop`` /
    ``path|bucket`` (the index of the first bound of ``STOP_BUCKETS`` the time is within,
    their count if none) and ``stop_sum`` / ``path`` (seconds); and, written by the finish
    boundary with each stop receipt, ``receipts``, ``late_tokens``, ``tools_in_flight`` and
    ``tools_refused`` / ``""``; and, with each failed webhook attempt,
    ``webhook_failures`` / ``retry`` or ``gave_up``."""

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=16)
    key = models.CharField(max_length=64)
    value = models.FloatField()

    def __str__(self) -> str:
        return f"{self.name} {self.key} {self.value:+g}"


class WorkerProcess(models.Model):
    """What each worker process last reported with its lease renewal (read by /metrics and
    the workers page), and whether an operator drained it."""

    owner = models.CharField(primary_key=True, max_length=255, help_text="Node and pid.")
    reported_at = models.DateTimeField()
    live_attempts = models.PositiveIntegerField(default=0)
    abandoned_tools = models.PositiveIntegerField(
        default=0, help_text="Blocking tool calls given up on whose threads still run.")
    capacity = models.PositiveIntegerField(default=0, help_text="Attempts it runs at once.")
    draining = models.BooleanField(
        default=False, help_text="Claims no new run; its live attempts go on.")
    drained_by = models.CharField(max_length=150, blank=True, default="",
                                  help_text="Who last drained or undrained it.")
    drained_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.owner


class ApiKey(models.Model):
    """A user's API key, kept as its SHA-256 digest: the key itself is shown once, when made.

    One per user; making a new one replaces it (``runs.domain.keys.api_key_issue``).
    """

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                                related_name="api_key")
    prefix = models.CharField(
        max_length=8, help_text="The key's first characters: tell keys apart, prove nothing.")
    digest = models.CharField(max_length=64, help_text="SHA-256 of the key, in hex.")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "API key"
        constraints = [
            # Every token check looks its key up by digest (keys.user_for_api_key).
            models.UniqueConstraint(fields=["digest"], name="runs_apikey_digest_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.prefix}… of {self.user}"


class RevokedApiKey(models.Model):
    """A key that worked once and was replaced or revoked, kept as its digest: a check of it
    is answered "revoked", not counted as a guess (``runs.domain.keys.user_for_api_key``)."""

    digest = models.CharField(max_length=64, help_text="SHA-256 of the key, in hex.")
    prefix = models.CharField(max_length=8)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="revoked_api_keys")
    revoked_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "revoked API key"
        constraints = [
            models.UniqueConstraint(fields=["digest"], name="runs_revokedapikey_digest_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.prefix}… of {self.user} (revoked)"


class AuthScope(models.TextChoices):
    ADDRESS = "address", "Client address"  # every failed key check from one address


class AuthFailure(models.Model):
    """Recent failed API-key checks of one client address: keys that no user has.

    A failure more than a lockout period after the one before starts the count again
    (``runs.domain.throttle``).
    """

    scope = models.CharField(max_length=16, choices=AuthScope.choices)
    ident = models.CharField(max_length=64, help_text="The client's address.")
    failures = models.PositiveIntegerField()
    last_failed_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(scope__in=AuthScope.values), name="runs_authfailure_scope_valid"
            ),
            # One count per address: two checks failing at once add to the same row
            # (throttle.failure_record).
            models.UniqueConstraint(fields=["scope", "ident"],
                                    name="runs_authfailure_one_per_ident"),
        ]
        indexes = [
            # Counts left idle for a lockout period are deleted (throttle.failure_record).
            models.Index(fields=["last_failed_at"], name="runs_authfailure_last_failed"),
        ]

    def __str__(self) -> str:
        return f"{self.failures} failure(s) of {self.get_scope_display().lower()} {self.ident}"


class BulkState(models.TextChoices):
    QUEUED = "queued", "Queued"  # made; its task is on its way to a worker
    RUNNING = "running", "Running"  # a worker goes through its runs
    DONE = "done", "Done"  # every selected run was handled
    ABORTED = "aborted", "Aborted"  # an operator stopped it; runs not reached are unchanged


LIVE_BULK_STATES = (BulkState.QUEUED, BulkState.RUNNING)


class BulkJob(models.Model):
    """One cancel, stop or resume asked of many runs at once, carried out by a worker run
    by run.

    The job and its selection (``BulkItem``) are rows: the job goes on whatever happens to
    the web process that made it or the worker that runs it.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    action = models.CharField(max_length=16, choices=BulkAction.choices)
    reason = models.TextField(null=True, blank=True)
    filter = models.JSONField(
        null=True, blank=True,
        help_text="The run-list filters that chose the runs; null when chosen by id.")
    state = models.CharField(max_length=16, choices=BulkState.choices, default=BulkState.QUEUED)
    total = models.PositiveIntegerField(help_text="Runs selected.")
    done = models.PositiveIntegerField(default=0, help_text="Runs handled so far.")
    applied = models.PositiveIntegerField(default=0, help_text="Handled: request recorded.")
    unchanged = models.PositiveIntegerField(default=0, help_text="Handled: already ended.")
    refused = models.PositiveIntegerField(default=0, help_text="Handled: the domain refused.")
    requested_by = models.CharField(max_length=150)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    source = models.CharField(max_length=16, choices=Source.choices)
    aborted_by = models.CharField(max_length=150, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(
        help_text="When it was last sent to a worker or a worker last handled one of its runs.")
    version = models.PositiveIntegerField(default=1, help_text="+1 per change.")

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=BulkState.values), name="runs_bulk_state_valid"
            ),
            models.CheckConstraint(
                condition=(Q(action__in=(BulkAction.CANCEL, BulkAction.RESUME))
                           | Q(action=BulkAction.STOP, reason__isnull=False)),
                name="runs_bulk_stop_has_reason",
            ),
            models.CheckConstraint(
                condition=(Q(state__in=LIVE_BULK_STATES, finished_at__isnull=True)
                           | (~Q(state__in=LIVE_BULK_STATES) & Q(finished_at__isnull=False))),
                name="runs_bulk_finished_iff_over",
            ),
            # Each handled run is counted once, under one outcome (runs.domain.bulk).
            models.CheckConstraint(
                condition=Q(done=F("applied") + F("unchanged") + F("refused"),
                            done__lte=F("total")),
                name="runs_bulk_counts_add_up",
            ),
        ]
        indexes = [
            # Past jobs, newest first (runs.domain.bulk.bulk_jobs).
            models.Index(fields=["-created_at", "-id"], name="runs_bulk_newest"),
            # The sweeper sends again the jobs nobody has moved on lately.
            models.Index(fields=["heartbeat_at"], condition=Q(state__in=LIVE_BULK_STATES),
                         name="runs_bulk_live_heartbeat"),
        ]

    def __str__(self) -> str:
        return f"bulk {self.action} {self.id} ({self.state}, {self.done}/{self.total})"


class ItemOutcome(models.TextChoices):
    PENDING = "pending", "Pending"  # not handled yet
    APPLIED = "applied", "Applied"  # the request was recorded (and the run ended, or told)
    UNCHANGED = "unchanged", "Unchanged"  # the run had already ended: nothing to do
    REFUSED = "refused", "Refused"  # the domain refused; ``detail`` says why


class BulkItem(models.Model):
    """One run of a bulk job's selection, and what the job did with it."""

    # No index of its own: (job, run) below leads with it.
    job = models.ForeignKey(BulkJob, on_delete=models.CASCADE, related_name="items",
                            db_index=False)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+", db_index=False)
    outcome = models.CharField(max_length=16, choices=ItemOutcome.choices,
                               default=ItemOutcome.PENDING)
    detail = models.TextField(null=True, blank=True)
    done_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["job", "id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(outcome__in=ItemOutcome.values), name="runs_bulkitem_outcome_valid"
            ),
            # A run is selected once per job, so it is handled (and counted) once.
            models.UniqueConstraint(fields=["job", "run"], name="runs_bulkitem_once_per_job"),
            models.CheckConstraint(
                condition=(Q(outcome=ItemOutcome.PENDING, done_at__isnull=True)
                           | (~Q(outcome=ItemOutcome.PENDING) & Q(done_at__isnull=False))),
                name="runs_bulkitem_done_at_iff_handled",
            ),
        ]
        indexes = [
            # The runs a job has yet to handle, in order (runs.domain.bulk.bulk_job_run).
            models.Index(fields=["job", "id"], condition=Q(outcome=ItemOutcome.PENDING),
                         name="runs_bulkitem_pending"),
        ]

    def __str__(self) -> str:
        return f"{self.job_id} {self.run_id} ({self.outcome})"


class ActivityKind(models.TextChoices):
    STEP = "step", "Step"  # a committed step: its duration and tokens
    MODEL = "model", "Model call"  # one call to a model: its model, duration and tokens
    TOOL = "tool", "Tool call"  # one tool call: its name, duration, and whether it raised
    LOG = "log", "Log"  # a line the agent wrote with ctx.log()
    PROGRESS = "progress", "Progress"  # ctx.progress(x, n): step x of n
    CONTROL = "control", "Control request"  # a live request taken by the attempt (a pause)
    ERROR = "error", "Error"  # the exception that failed the attempt, with its traceback
    WARNING = "warning", "Warning"  # the run was told something it should know (no price)
    TRUNCATED = "truncated", "Truncated"  # the run reached its cap: later entries are dropped


class Activity(models.Model):
    """One entry of a run's activity log: what the agent did and said, as it happened.

    Not state: nothing decides on it. Written by the worker as the attempt goes (a few
    entries per statement), pushed on the run's sockets, and capped per run
    (``runs.domain.activity.CAP``) with a last ``truncated`` entry saying so.
    """

    id = models.BigAutoField(primary_key=True)
    # No index of its own: (run, seq) below leads with it.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="activity",
                            db_index=False)
    seq = models.PositiveIntegerField(help_text="1, 2, 3... within the run.")
    generation = models.PositiveIntegerField(help_text="The attempt that wrote it.")
    kind = models.CharField(max_length=16, choices=ActivityKind.choices)
    text = models.CharField(max_length=500, blank=True, default="",
                            help_text="A log line, a model's or a tool's name.")
    ms = models.FloatField(null=True, blank=True, help_text="Duration in milliseconds.")
    tokens = models.PositiveIntegerField(null=True, blank=True)
    data = models.JSONField(null=True, blank=True, help_text="A few small fields.")
    at = models.DateTimeField(help_text="When it started (a span) or happened.")

    class Meta:
        ordering = ["run", "seq"]
        constraints = [
            models.CheckConstraint(condition=Q(kind__in=ActivityKind.values),
                                   name="runs_activity_kind_valid"),
            # One writer numbers a run's entries; the page and "after seq" reads use it.
            models.UniqueConstraint(fields=["run", "seq"], name="runs_activity_run_seq"),
        ]

    def __str__(self) -> str:
        return f"{self.run_id} #{self.seq} {self.kind} {self.text}"


class WebhookEvent(models.TextChoices):
    RUN_ENDED = "run.ended", "A run ended"
    RUN_AWAITING = "run.awaiting", "A run awaits an approval or input"
    BULK_DONE = "bulk.done", "A bulk job is done"


class WebhookEndpoint(models.Model):
    """An operator's URL that is sent the events it names, signed with its secret
    (Standard Webhooks)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    url = models.URLField(max_length=2000)
    events = models.JSONField(help_text="The event types sent to it.")
    secret = models.CharField(max_length=100, editable=False,
                              help_text="whsec_ and the base64 key that signs deliveries.")
    active = models.BooleanField(default=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                                   related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at"]

    def __str__(self) -> str:
        return self.url


class DeliveryState(models.TextChoices):
    PENDING = "pending", "Pending"  # to be sent (again) at next_attempt_at
    DELIVERED = "delivered", "Delivered"
    FAILED = "failed", "Failed"  # retried for AWAKEN_WEBHOOK_RETRY_SECONDS without a 2xx


class WebhookDelivery(models.Model):
    """One event for one endpoint: written in the transaction of the change, sent at least
    once, with the same ``webhook-id`` on every attempt."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE,
                                 related_name="deliveries")
    type = models.CharField(max_length=32, choices=WebhookEvent.choices)
    body = models.TextField(help_text="The JSON sent, as signed.")
    state = models.CharField(max_length=16, choices=DeliveryState.choices,
                             default=DeliveryState.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    last_status = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["state", "next_attempt_at"],
                                name="runs_webhook_due")]

    def __str__(self) -> str:
        return f"{self.type} → {self.endpoint_id} ({self.state})"


class LiveSample(models.Model):
    """Live runs by state at one minute, written by the sweeper's first pass of the minute
    (``runs.domain.overview.record_live_sample``) and kept ``SAMPLES_KEPT``: the history of
    the overview's "live runs by state", which no other row records (a run's timestamps
    do not say when it waited in the queue or for input)."""

    at = models.DateTimeField(unique=True, help_text="The minute sampled (its start, UTC).")
    queued = models.PositiveIntegerField()
    running = models.PositiveIntegerField()
    awaiting = models.PositiveIntegerField()

    class Meta:
        ordering = ["at"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M} q{self.queued} r{self.running} a{self.awaiting}"
