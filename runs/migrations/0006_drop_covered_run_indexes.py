"""Drop the indexes of Attempt.run and Event.run: the unique (run, generation) and
(run, version) indexes lead with the same column and serve every lookup by run, so the
extra indexes only cost a write on every attempt and event.

Only the two indexes are dropped. Django's own AlterField would rebuild the foreign keys
and drop every index on the column, the partial unique ones that hold "one live attempt"
and "one ended event" per run included.
"""

import django.db.models.deletion
from django.db import migrations, models

DROP = ["DROP INDEX IF EXISTS runs_attempt_run_id_651e9d12",
        "DROP INDEX IF EXISTS runs_event_run_id_9278d2f7"]
CREATE = ["CREATE INDEX runs_attempt_run_id_651e9d12 ON runs_attempt (run_id)",
          "CREATE INDEX runs_event_run_id_9278d2f7 ON runs_event (run_id)"]


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0005_list_indexes"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(DROP, reverse_sql=CREATE)],
            state_operations=[
                migrations.AlterField(
                    model_name="attempt",
                    name="run",
                    field=models.ForeignKey(db_index=False,
                                            on_delete=django.db.models.deletion.CASCADE,
                                            related_name="attempts", to="runs.run"),
                ),
                migrations.AlterField(
                    model_name="event",
                    name="run",
                    field=models.ForeignKey(db_index=False,
                                            on_delete=django.db.models.deletion.CASCADE,
                                            related_name="events", to="runs.run"),
                ),
            ],
        ),
    ]
