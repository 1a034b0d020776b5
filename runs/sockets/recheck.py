"""Rechecks of open sockets: each answers to the same checks as a new handshake, again and
again.

A socket is let in once, at its handshake; its user may log out, be deactivated, lose their
role or have their token deleted afterwards, in this process or in any other. So every
``AWAKEN_SOCKET_RECHECK_SECONDS`` each web process checks the admissions of all its open
sockets at once (what let each in: its user, and the session or token that proved it),
against the database (a few queries whatever their number), and closes those that no
longer hold (code 4003). A check that does not answer within its deadline keeps the
sockets open until the next one: the database is where logouts are recorded.
"""

import asyncio
import logging
from importlib import import_module
from typing import NamedTuple

from channels.db import database_sync_to_async
from django.conf import settings
from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.utils import timezone
from django.utils.crypto import constant_time_compare

from runs.domain.roles import viewers
from runs.sockets.auth import token_users

log = logging.getLogger(__name__)

REVOKED = 4003  # the close code of a socket whose admission no longer holds


class Admission(NamedTuple):
    """What let a socket in: its user, and the session or the token that proved it."""

    user_id: int
    session_key: str | None = None
    token_id: str | None = None


def session_users(keys) -> dict:
    """The sessions of ``keys`` that still log a user in, with that user's id: the session
    exists, has not expired, and carries the user's current session hash (as Django's
    ``get_user`` checks on each request)."""
    store = import_module(settings.SESSION_ENGINE).SessionStore
    if hasattr(store, "get_model_class"):  # the database backends: one query
        rows = store.get_model_class().objects.filter(
            session_key__in=keys, expire_date__gt=timezone.now()
        ).values_list("session_key", "session_data")
        data = {key: store().decode(text) for key, text in rows}
    else:
        data = {key: store(key).load() for key in keys}
    claims = {key: (fields[SESSION_KEY], fields.get(HASH_SESSION_KEY))
              for key, fields in data.items() if SESSION_KEY in fields}
    model = get_user_model()
    users = model._default_manager.in_bulk(
        {model._meta.pk.to_python(user_id) for user_id, _ in claims.values()})
    alive = {}
    for key, (user_id, session_hash) in claims.items():
        user = users.get(model._meta.pk.to_python(user_id))
        if user is not None and session_hash and any(
                constant_time_compare(session_hash, candidate) for candidate in
                (user.get_session_auth_hash(), *user.get_session_auth_fallback_hash())):
            alive[key] = user.pk
    return alive


def revoked(admissions: set[Admission]) -> set[Admission]:
    """The ones of ``admissions`` that no longer let anyone in."""
    readers = viewers({p.user_id for p in admissions})
    sessions = session_users({p.session_key for p in admissions if p.session_key is not None})
    tokens = token_users({p.token_id for p in admissions if p.token_id is not None})
    return {p for p in admissions if p.user_id not in readers or not (
        (p.session_key is not None and sessions.get(p.session_key) == p.user_id)
        or (p.token_id is not None and tokens.get(p.token_id) == p.user_id))}


class SocketRechecks:
    """The open sockets of this process, by event loop (daphne has one), each with its admission
    and a ``revoke()`` coroutine that closes it."""

    def __init__(self):
        self._sockets: dict[asyncio.AbstractEventLoop, dict] = {}
        self._tasks: dict[asyncio.AbstractEventLoop, asyncio.Task] = {}

    def add(self, socket, admission: Admission) -> None:
        loop = asyncio.get_running_loop()
        self._sockets.setdefault(loop, {})[socket] = admission
        task = self._tasks.get(loop)
        if task is None or task.done():
            self._tasks[loop] = loop.create_task(self._recheck(loop))

    def discard(self, socket) -> None:
        members = self._sockets.get(asyncio.get_running_loop())
        if members is not None:
            members.pop(socket, None)

    def members(self) -> list:
        """The open sockets and streams of this process on the running loop."""
        return list(self._sockets.get(asyncio.get_running_loop(), ()))

    def checked(self) -> int:
        """How many open sockets of this process are checked."""
        return sum(len(members) for members in self._sockets.values())

    async def _recheck(self, loop) -> None:
        members = self._sockets[loop]
        check = None
        try:
            while members:
                await asyncio.sleep(settings.AWAKEN_SOCKET_RECHECK_SECONDS)
                if check is not None and not check.done():
                    continue  # the last check is still waiting for the database
                current = dict(members)
                check = asyncio.ensure_future(database_sync_to_async(
                    revoked, thread_sensitive=False)(set(current.values())))
                done, _ = await asyncio.wait({check}, timeout=max(
                    5.0, settings.AWAKEN_SOCKET_RECHECK_SECONDS))
                if not done or check.exception() is not None:
                    log.warning("checking the admissions of open sockets failed or timed out",
                                exc_info=check.exception() if done else None)
                    continue
                for socket, admission in current.items():
                    if admission in check.result() and members.pop(socket, None) is not None:
                        await socket.revoke()
        finally:
            if self._tasks.get(loop) is asyncio.current_task():
                del self._tasks[loop]
            if not members:
                self._sockets.pop(loop, None)


rechecks = SocketRechecks()
