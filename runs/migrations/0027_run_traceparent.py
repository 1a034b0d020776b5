from importlib import import_module

from django.db import migrations, models

# SQLite adds a column with a default by copying the table, which drops the table's
# triggers: the metric triggers of 0017 are taken off first and put back (with the totals
# counted anew) once the table is in its new shape.
_totals = import_module("runs.migrations.0017_metric_totals")


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0026_webhooks'),
    ]

    operations = [
        migrations.RunPython(_totals.uninstall, _totals.install),
        migrations.AddField(
            model_name='run',
            name='traceparent',
            field=models.CharField(blank=True, default='', help_text="The W3C trace context of the request that created the run, when traces are on: its attempts' spans are its children.", max_length=55),
        ),
        migrations.RunPython(_totals.install, _totals.uninstall),
    ]
