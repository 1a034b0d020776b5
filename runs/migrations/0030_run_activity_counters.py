from importlib import import_module

from django.db import migrations, models
from django.db.models import Count, Max, Q

# SQLite adds a column with a default by copying the table, which drops the table's
# triggers: the metric triggers of 0017 are taken off first and put back (with the totals
# counted anew) once the table is in its new shape.
_totals = import_module("runs.migrations.0017_metric_totals")

# The kinds the activity log keeps apart from the agent's (runs.domain.activity.APART_KINDS),
# as they were when the counters were added.
APART_KINDS = ("error", "control")


def count_activity(apps, schema_editor):
    """Each run's counters as its log stands: the last number, the entries kept apart and
    the others (the agent's, with its ``truncated`` note)."""
    Activity = apps.get_model("runs", "Activity")
    Run = apps.get_model("runs", "Run")
    counted = (Activity.objects.order_by().values("run_id")
               .annotate(last=Max("seq"), apart=Count("pk", filter=Q(kind__in=APART_KINDS)),
                         every=Count("pk")))
    batch = []
    for row in counted.iterator(chunk_size=2000):
        batch.append(Run(pk=row["run_id"], activity_last=row["last"],
                         activity_apart=row["apart"],
                         activity_agent=row["every"] - row["apart"]))
        if len(batch) == 2000:
            Run.objects.bulk_update(batch, ["activity_last", "activity_apart", "activity_agent"])
            batch = []
    Run.objects.bulk_update(batch, ["activity_last", "activity_apart", "activity_agent"])


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0029_attempt_renewed_at'),
    ]

    operations = [
        migrations.RunPython(_totals.uninstall, _totals.install),
        migrations.AddField(
            model_name='run',
            name='activity_last',
            field=models.PositiveIntegerField(default=0, help_text="The number of the run's last activity entry."),
        ),
        migrations.AddField(
            model_name='run',
            name='activity_agent',
            field=models.PositiveIntegerField(default=0, help_text='Activity entries of the agent kept, and one more once cut.'),
        ),
        migrations.AddField(
            model_name='run',
            name='activity_apart',
            field=models.PositiveIntegerField(default=0, help_text='Error and control entries kept in the activity log.'),
        ),
        migrations.RunPython(_totals.install, _totals.uninstall),
        migrations.RunPython(count_activity, migrations.RunPython.noop, elidable=True),
    ]
