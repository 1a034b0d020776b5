from django.contrib.auth.management import create_permissions
from django.db import migrations

MODELS = ("run", "attempt", "resumeticket", "controlintent", "event")


def create_roles(apps, schema_editor):
    """The viewer and operator groups, both allowed to view every run model in the admin."""
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    view = Permission.objects.filter(
        content_type__app_label="runs", codename__in=[f"view_{m}" for m in MODELS]
    )
    for name in ("viewer", "operator"):
        group, _ = Group.objects.get_or_create(name=name)
        group.permissions.add(*view)


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(create_roles, migrations.RunPython.noop)]
