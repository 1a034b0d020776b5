"""The two roles: viewers read, operators also control. Superusers are operators."""

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db.models import Exists, OuterRef, Q

VIEWER = "viewer"
OPERATOR = "operator"
ROLES = (VIEWER, OPERATOR)


def _groups(user) -> set[str]:
    # Cached on the user object: one query per request at most.
    if not hasattr(user, "_awaken_groups"):
        user._awaken_groups = set(user.groups.values_list("name", flat=True))
    return user._awaken_groups


def role_annotations(user_field: str) -> dict:
    """Annotations that read, with a row naming a user in ``user_field``, whether that user
    has each role: ``remember_roles`` puts them on the user, so the checks of the request
    need no query of their own."""
    return {f"_awaken_has_{role}": Exists(Group.objects.filter(
        user=OuterRef(user_field), name=role)) for role in ROLES}


def remember_roles(user, row) -> None:
    user._awaken_groups = {role for role in ROLES if getattr(row, f"_awaken_has_{role}")}


def is_operator(user) -> bool:
    if not (user and user.is_authenticated and user.is_active):
        return False
    return user.is_superuser or OPERATOR in _groups(user)


def is_viewer(user) -> bool:
    """Anyone who may read runs: viewers and operators."""
    if not (user and user.is_authenticated and user.is_active):
        return False
    return user.is_superuser or bool(_groups(user) & set(ROLES))


def viewers(user_ids) -> set:
    """Which of ``user_ids`` may read runs now (active viewers and operators), in one query."""
    return set(get_user_model()._default_manager.filter(
        Q(is_superuser=True) | Q(groups__name__in=ROLES), pk__in=user_ids, is_active=True,
    ).values_list("pk", flat=True).distinct())
