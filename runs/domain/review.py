"""Review links: a single-use, expiring link that answers one awaiting run's ticket.

An operator makes one (``review_link_create``) and sends it to a reviewer who has no
account. The link is bound to the run's open ticket at that moment, and so to the one tool
call an approval ticket is bound to: opening it shows that run's agent, the ticket's
prompt and its action, nothing else; using it resumes the run through ``run_resume`` with
the reviewer's name as the actor and source ``link``, and the link is consumed in the same
transaction. An expired, used or revoked link, or one whose ticket is no longer open (the
run moved on: resumed some other way, or ended), changes nothing: it fails closed, and
the run stays as it is (an expired link decides nothing; the run stays ``awaiting``).

The token is 256 random bits, shown once; only its SHA-256 is stored.
"""

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from runs.domain.core import locked_run
from runs.domain.errors import (
    InvalidRequest,
    LinkExpired,
    LinkNotFound,
    LinkRevoked,
    LinkStale,
    LinkUsed,
    NotAwaiting,
)
from runs.domain.roles import is_operator
from runs.domain.runs import run_resume
from runs.domain.selectors import parse_run_id, parse_uuid, run_get
from runs.domain.text import plain_name
from runs.models import LinkState, ReviewLink, Run, RunState, Source

MIN_SECONDS, MAX_SECONDS = 60, 7 * 86400
MAX_NAME_LENGTH = 150


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def review_link_create(*, run_id, actor: str, seconds: float) -> tuple[ReviewLink, str]:
    """A new open link for the run's open ticket, valid for ``seconds``; returns the link
    and its token (which is not kept). NotAwaiting when the run has no open ticket."""
    if not MIN_SECONDS <= seconds <= MAX_SECONDS:
        raise InvalidRequest(f"A link lasts {MIN_SECONDS} to {MAX_SECONDS} seconds.",
                             field="expires_in")
    token = secrets.token_urlsafe(32)
    with transaction.atomic():
        run = locked_run(run_id)  # the ticket stays open until this commits
        if run.state != RunState.AWAITING:
            raise NotAwaiting(f"Run {run.id} is {run.status_label}, not awaiting.")
        link = ReviewLink.objects.create(
            run=run, ticket_id=run.ticket_id, token_hash=token_hash(token), created_by=actor,
            expires_at=timezone.now() + timedelta(seconds=seconds))
    return link, token


@dataclass(frozen=True)
class Review:
    """What a link shows: its run's agent and its ticket's question."""

    agent: str
    reason: str
    prompt: object
    schema: dict | None
    expires_at: object
    action: dict | None = None  # the one tool call an approval ticket is bound to


def review_link_open(*, token: str) -> Review:
    """What the link shows; refused (and nothing shown) unless it can still be used."""
    link = _usable(_find(ReviewLink.objects.select_related("run", "ticket"), token))
    return Review(agent=link.run.agent, reason=link.ticket.reason, prompt=link.ticket.prompt,
                  schema=link.ticket.schema, expires_at=link.expires_at,
                  action=link.ticket.action)


def review_link_known(*, token: str) -> None:
    """LinkNotFound unless ``token`` is some link's, usable or not: an answer to a wrong
    token says nothing else, whatever it sent."""
    _find(ReviewLink.objects.all(), token)


def review_link_use(*, token: str, name: str, input=None) -> Run:
    """Answer the link's ticket: resume its run with ``input`` in the reviewer's ``name``
    and consume the link, in one transaction. Refused, with nothing changed, when the link
    cannot be used, the ticket is no longer open, or the input does not satisfy the
    ticket's schema (or, for a ticket bound to an action, is not a decision on it)."""
    name = _clean_name(name)
    with transaction.atomic():
        # The link's row lock, then the run's (in run_resume): a revoke, or a second use of
        # the same link, waits for this one and then finds it used.
        link = _usable(_find(ReviewLink.objects.select_for_update(), token))
        run = locked_run(link.run_id)
        if run.state != RunState.AWAITING or str(run.ticket_id) != str(link.ticket_id):
            raise LinkStale("The ticket of this link is no longer open: the run moved on.")
        # A decision that names another action than the ticket's is a TicketMismatch.
        run = run_resume(run_id=link.run_id, ticket_id=link.ticket_id, input=input,
                         actor=name, source=Source.LINK)
        link.state = LinkState.USED
        link.closed_at = timezone.now()
        link.closed_by = name
        link.save(update_fields=["state", "closed_at", "closed_by"])
    return run


def review_link_revoke(*, run_id, link_id, actor: str) -> ReviewLink:
    """Withdraw an open link (expired or not); a revoked one is returned as it is. A used
    link cannot be withdrawn (LinkUsed)."""
    with transaction.atomic():
        link = ReviewLink.objects.select_for_update().filter(
            pk=_link_pk(link_id), run_id=parse_run_id(run_id)).first()
        if link is None:
            raise LinkNotFound(f"Run {run_id} has no review link {link_id}.")
        if link.state == LinkState.USED:
            raise LinkUsed("This link was already used.")
        if link.state == LinkState.OPEN:
            link.state = LinkState.REVOKED
            link.closed_at = timezone.now()
            link.closed_by = actor
            link.save(update_fields=["state", "closed_at", "closed_by"])
    return link


def review_links(*, run_id) -> list[ReviewLink]:
    """The links made for a run, newest first."""
    run = run_get(run_id)
    return list(ReviewLink.objects.filter(run_id=run.pk).order_by("-created_at"))


def _link_pk(link_id):
    try:
        return parse_uuid(link_id, "link")
    except InvalidRequest:
        raise LinkNotFound(f"No review link {link_id}.") from None


def _find(queryset, token: str) -> ReviewLink:
    link = queryset.filter(token_hash=token_hash(token or "")).first()
    if link is None:
        raise LinkNotFound("No such review link.")
    return link


def _usable(link: ReviewLink) -> ReviewLink:
    """The link, if it can still be used: open, not expired, its ticket still the run's
    open ticket."""
    if link.state == LinkState.USED:
        raise LinkUsed("This link was already used.")
    if link.state == LinkState.REVOKED:
        raise LinkRevoked("This link was revoked.")
    if link.expires_at <= timezone.now():
        raise LinkExpired("This link has expired.")
    if not _maker_may_resume(link.created_by):
        raise LinkRevoked("The operator who made this link can no longer resume runs: the "
                          "link works no more.")
    if not Run.objects.filter(pk=link.run_id, state=RunState.AWAITING,
                              ticket_id=link.ticket_id).exists():
        raise LinkStale("The ticket of this link is no longer open: the run moved on.")
    return link


def _maker_may_resume(username: str) -> bool:
    """Whether the link's maker is still an active operator: a link acts in their stead,
    so it never outlives their access."""
    maker = get_user_model().objects.filter(username=username, is_active=True).first()
    return maker is not None and is_operator(maker)


def _clean_name(name) -> str:
    """The reviewer's name as it is recorded: without control or bidi characters, which
    would act on the text shown after it (a timeline line, a log)."""
    name = plain_name(name) if isinstance(name, str) else ""
    if not name:
        raise InvalidRequest("Give your name.", field="name")
    if len(name) > MAX_NAME_LENGTH or "\x00" in name:
        raise InvalidRequest(f"The name must be at most {MAX_NAME_LENGTH} characters.",
                             field="name")
    return name
