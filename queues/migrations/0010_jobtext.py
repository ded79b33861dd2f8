"""The searched texts of live jobs (``queues.models.JobText``) and their text index: an FTS5
table with the trigram tokenizer on SQLite (kept by triggers), ``pg_trgm`` GIN indexes on
PostgreSQL. Both find a part of a field by its three-character pieces."""

from django.db import migrations, models

FIELDS = ("title", "filename", "submitter", "local_ids", "ark", "error")
_COLUMNS = ", ".join(FIELDS)
_NEW = ", ".join(f"new.{f}" for f in FIELDS)

SQLITE_FORWARD = [
    f"CREATE VIRTUAL TABLE queues_jobtext_fts USING fts5({_COLUMNS}, tokenize='trigram')",
    f"""CREATE TRIGGER queues_jobtext_ai AFTER INSERT ON queues_jobtext BEGIN
        INSERT INTO queues_jobtext_fts(rowid, {_COLUMNS}) VALUES (new.number, {_NEW});
    END""",
    f"""CREATE TRIGGER queues_jobtext_au AFTER UPDATE ON queues_jobtext BEGIN
        DELETE FROM queues_jobtext_fts WHERE rowid = old.number;
        INSERT INTO queues_jobtext_fts(rowid, {_COLUMNS}) VALUES (new.number, {_NEW});
    END""",
    """CREATE TRIGGER queues_jobtext_ad AFTER DELETE ON queues_jobtext BEGIN
        DELETE FROM queues_jobtext_fts WHERE rowid = old.number;
    END""",
]
SQLITE_BACKWARD = [
    "DROP TRIGGER IF EXISTS queues_jobtext_ai",
    "DROP TRIGGER IF EXISTS queues_jobtext_au",
    "DROP TRIGGER IF EXISTS queues_jobtext_ad",
    "DROP TABLE IF EXISTS queues_jobtext_fts",
]
PG_FORWARD = [
    # A trusted extension since PostgreSQL 13: the database's owner may create it.
    "CREATE EXTENSION IF NOT EXISTS pg_trgm",
    *(
        f"CREATE INDEX queues_jobtext_{f}_trgm ON queues_jobtext USING gin ({f} gin_trgm_ops)"
        for f in FIELDS
    ),
]
PG_BACKWARD = [f"DROP INDEX IF EXISTS queues_jobtext_{f}_trgm" for f in FIELDS]


def forward(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    for sql in {"sqlite": SQLITE_FORWARD, "postgresql": PG_FORWARD}.get(vendor, []):
        schema_editor.execute(sql)


def backward(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    for sql in {"sqlite": SQLITE_BACKWARD, "postgresql": PG_BACKWARD}.get(vendor, []):
        schema_editor.execute(sql)


class Migration(migrations.Migration):
    dependencies = [("queues", "0009_note_bulkrun_params")]

    operations = [
        migrations.CreateModel(
            name="JobText",
            fields=[
                ("number", models.BigIntegerField(primary_key=True, serialize=False)),
                ("made", models.BigIntegerField(default=0)),
                ("title", models.TextField(blank=True)),
                ("filename", models.TextField(blank=True)),
                ("submitter", models.TextField(blank=True)),
                ("local_ids", models.TextField(blank=True)),
                ("ark", models.TextField(blank=True)),
                ("error", models.TextField(blank=True)),
            ],
        ),
        migrations.RunPython(forward, backward),
    ]
