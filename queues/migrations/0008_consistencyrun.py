import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("queues", "0007_alerts"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="ConsistencyRun",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("via", models.CharField(default="web", max_length=10)),
                ("state", models.CharField(default="running", max_length=10)),
                ("slot", models.CharField(default="tree", editable=False, max_length=10)),
                ("owner", models.CharField(blank=True, default="", max_length=200)),
                ("phase", models.CharField(blank=True, default="", max_length=200)),
                ("done", models.BigIntegerField(default=0)),
                ("total", models.BigIntegerField(default=0)),
                ("jobs", models.BigIntegerField(default=0)),
                ("batches", models.BigIntegerField(default=0)),
                ("index_entries", models.BigIntegerField(default=0)),
                ("findings", models.IntegerField(default=0)),
                ("repairable", models.IntegerField(default=0)),
                ("kinds", models.JSONField(default=dict)),
                ("error", models.TextField(blank=True)),
                ("started", models.DateTimeField(default=django.utils.timezone.now)),
                ("heartbeat", models.DateTimeField(default=django.utils.timezone.now)),
                ("finished", models.DateTimeField(blank=True, null=True)),
                ("repaired", models.DateTimeField(blank=True, null=True)),
                (
                    "user",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={
                "ordering": ["-started", "-id"],
                "constraints": [
                    models.UniqueConstraint(
                        condition=models.Q(("state", "running")),
                        fields=("slot",),
                        name="one_running_check",
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="ConsistencyFinding",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("kind", models.CharField(max_length=40)),
                ("path", models.TextField()),
                ("detail", models.TextField()),
                ("repairable", models.BooleanField(default=False)),
                ("session", models.BigIntegerField(default=0)),
                ("czxid", models.BigIntegerField(default=0)),
                ("owner", models.CharField(blank=True, default="", max_length=10)),
                ("advice", models.TextField(blank=True)),
                ("seen", models.JSONField(default=list)),
                ("repair", models.TextField(blank=True)),
                (
                    "run",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="rows",
                        to="queues.consistencyrun",
                    ),
                ),
            ],
            options={
                "ordering": ["id"],
                "indexes": [
                    models.Index(fields=["run", "kind", "id"], name="consistencyfinding_kind")
                ],
            },
        ),
    ]
