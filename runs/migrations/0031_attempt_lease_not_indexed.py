from django.db import migrations

# A renewal changes only the lease: with no index on it, PostgreSQL updates each live
# attempt's row in place (runs/models.py, Attempt.Meta).


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0030_run_activity_counters'),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name='attempt',
            name='runs_attempt_live_lease',
        ),
    ]
