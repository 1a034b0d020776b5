from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0028_live_samples'),
    ]

    operations = [
        migrations.AddField(
            model_name='attempt',
            name='renewed_at',
            field=models.DateTimeField(blank=True, help_text="When its lease was last given or renewed (the database's clock): an attempt lost is charged running time up to then.", null=True),
        ),
    ]
