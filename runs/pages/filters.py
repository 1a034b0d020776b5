"""The operator list's filters, read from its query string: the URL holds the whole filter.

The names are the API's (``status``, ``q``, ``error``, ``sort``) but for the agent
(``by_agent``: the new-run form already has an ``agent`` field) and the time range, which a
browser's date-time field gives without a zone: ``from`` and ``to`` in the zone whose offset
``tz`` names (minutes east of UTC; UTC without it). A value the page cannot use is left out
and named in ``problems``, so a hand-edited URL still shows a page and says what was ignored.
The filter applies on the server only (``selectors.matching``): the page asks it.
"""

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone

from django.core.exceptions import BadRequest

from runs.domain import catalogue, limits
from runs.domain.selectors import SORT_CHOICES
from runs.models import EndCause, RunState, TicketReason

STATUSES = [*(s for s in RunState.values if s != RunState.ENDED), *EndCause.values]
SORTABLE = ("created", "started", "ended", "duration")
MAX_TEXT = 200


@dataclass
class ListFilter:
    statuses: list[str] = field(default_factory=list)
    agent: str = ""
    q: str = ""
    error: str = ""
    ticket_reason: str = ""  # awaiting runs whose open ticket has this reason
    since: datetime | None = None  # created at or after
    until: datetime | None = None  # created before
    sort: str = "-created"
    problems: list[str] = field(default_factory=list)
    raw: dict = field(default_factory=dict)  # the form's values, as given

    @property
    def active(self) -> bool:
        return bool(self.statuses or self.agent or self.q or self.error or self.since
                    or self.until or self.ticket_reason)

    def matching(self) -> dict:
        """The arguments of ``selectors.matching`` (the search goes in ``q``)."""
        criteria = {}
        if self.statuses:
            criteria["status"] = self.statuses
        if self.agent:
            criteria["agent"] = self.agent
        if self.error:
            criteria["error"] = self.error
        if self.ticket_reason:
            criteria["ticket_reason"] = self.ticket_reason
        if self.since:
            criteria["created_after"] = self.since
        if self.until:
            criteria["created_before"] = self.until
        return criteria

    def api(self) -> dict:
        """The same selection as the API's run filter (a bulk job's ``filter``)."""
        data = {key: value for key, value in self.matching().items()
                if key not in ("created_after", "created_before")}
        if self.q:
            data["q"] = self.q
        if self.since:
            data["created_after"] = self.since.isoformat()
        if self.until:
            data["created_before"] = self.until.isoformat()
        return data

    def query(self, **change) -> str:
        """This filter's query string, with ``change`` applied (e.g. another sort)."""
        from django.http import QueryDict

        params = QueryDict(mutable=True)
        values = {**self.raw, **change}
        for key, value in values.items():
            if key == "status":
                for status in value or ():
                    params.appendlist("status", status)
            elif value and not (key == "sort" and value == "-created"):
                params[key] = value
        return params.urlencode()


def _zone(text: str):
    digits = limits.plain_integer(text.removeprefix("-"))
    if digits is None:
        return None
    minutes = -digits if text.startswith("-") else digits
    if not -16 * 60 <= minutes <= 16 * 60:
        return None
    return timezone(timedelta(minutes=minutes))


def _local_time(text: str, zone) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed.replace(tzinfo=zone) if parsed.tzinfo is None else parsed


def read(params) -> ListFilter:
    """The filter of a query string (a ``QueryDict``)."""
    result = ListFilter()
    problems = result.problems
    statuses = []
    for value in params.getlist("status"):
        for part in value.split(","):
            part = part.strip()
            if not part:
                continue
            if part in STATUSES:
                statuses.append(part)
            else:
                problems.append(f"Unknown state {part[:40]!r} ignored.")
    result.statuses = list(dict.fromkeys(statuses))
    agent = params.get("by_agent", "")
    if agent and agent not in catalogue.CATALOGUE:
        problems.append(f"No agent {agent[:60]!r}: the agent filter is ignored.")
        agent = ""
    result.agent = agent
    for name in ("q", "error"):
        text = params.get(name, "").strip()
        if "\x00" in text:  # no id, thread or error holds one, and PostgreSQL cannot take it
            raise BadRequest("The search holds a NUL character.")
        if len(text) > MAX_TEXT:
            problems.append(f"The {'search' if name == 'q' else 'error text'} is longer than "
                            f"{MAX_TEXT} characters: ignored.")
            text = ""
        setattr(result, name, text)
    reason = params.get("ticket_reason", "").strip()
    if reason and reason not in TicketReason.values:
        problems.append(f"Unknown ticket reason {reason[:40]!r}: ignored.")
        reason = ""
    result.ticket_reason = reason
    zone = UTC
    if params.get("tz"):
        zone = _zone(params["tz"]) or UTC
    for name, attribute in (("from", "since"), ("to", "until")):
        text = params.get(name, "").strip()
        if not text:
            continue
        when = _local_time(text, zone)
        if when is None:
            problems.append(f"{text[:40]!r} is not a date and time: ignored.")
        else:
            setattr(result, attribute, when)
    if result.since and result.until and result.since >= result.until:
        problems.append("The time range ends before it starts: ignored.")
        result.since = result.until = None
    sort = params.get("sort", "-created")
    if sort not in SORT_CHOICES:
        problems.append(f"Unknown order {sort[:40]!r}: newest first instead.")
        sort = "-created"
    result.sort = sort
    result.raw = {"status": result.statuses, "by_agent": result.agent, "q": result.q,
                  "error": result.error, "ticket_reason": reason,
                  "from": params.get("from", "") if result.since else "",
                  "to": params.get("to", "") if result.until else "",
                  "tz": params.get("tz", "") if (result.since or result.until) else "",
                  "sort": sort}
    return result
