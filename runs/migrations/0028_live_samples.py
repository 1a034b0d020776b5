from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0027_run_traceparent'),
    ]

    operations = [
        migrations.CreateModel(
            name='LiveSample',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('at', models.DateTimeField(help_text='The minute sampled (its start, UTC).', unique=True)),
                ('queued', models.PositiveIntegerField()),
                ('running', models.PositiveIntegerField()),
                ('awaiting', models.PositiveIntegerField()),
            ],
            options={
                'ordering': ['at'],
            },
        ),
    ]
