from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from runs.domain.keys import api_key_issue
from runs.domain.roles import ROLES


class Command(BaseCommand):
    help = ("Make a new API key for a user and print it alone on one line (with --create, make "
            "the user first). Keys are stored hashed and shown only when made, so every call "
            "makes a fresh key, and the user's previous key stops working.")

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--role", choices=ROLES, default=None,
                            help="Give the user this role (operator or viewer).")
        parser.add_argument("--create", action="store_true",
                            help="Create the user (with an unusable password) if missing.")

    @transaction.atomic
    def handle(self, username, role, create, **options):
        User = get_user_model()
        # As a login form reads it (NFKC): a full-width look-alike is the same name.
        username = User.normalize_username(username)
        user = User.objects.filter(username=username).first()
        if user is None:
            if not create:
                raise CommandError(f"No user {username!r}; pass --create to make one.")
            user = User(username=username)
            user.set_unusable_password()
            try:  # the validators of the username, as createsuperuser runs them
                user.full_clean(exclude=["password"])
            except ValidationError as error:
                raise CommandError("; ".join(error.messages)) from None
            user.save()
            role = role or "operator"
        if role:
            user.groups.remove(*Group.objects.filter(name__in=ROLES).exclude(name=role))
            user.groups.add(Group.objects.get(name=role))
        self.stdout.write(api_key_issue(user=user))
