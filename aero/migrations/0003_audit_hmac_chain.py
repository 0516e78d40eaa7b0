"""The audit log becomes a keyed hash chain, and the database enforces its shape.

- `prev_digest` per entry; every existing entry is re-sealed in id order with the HMAC
  key (aero.audit_chain). This runs as the tables' owner, the only role that may (it
  disables the append-only trigger for the re-seal, inside this migration's transaction).
- Both digests must be 64 lowercase hex characters: an empty digest is refused.
- PostgreSQL: an INSERT whose prev_digest is not the newest entry's digest is refused
  (trigger, ENABLE ALWAYS), under the same advisory lock the app takes to append.
- PostgreSQL: the TRUNCATE escape hatch (`aero.allow_audit_truncate`, a setting any
  session could SET) is gone; UPDATE, DELETE and TRUNCATE are refused for everyone.
  The app's role does not own the table and holds only SELECT and INSERT on it
  (`manage.py db_roles`), so it can neither change rows nor disable the triggers.
"""

import django.utils.timezone
from django.db import migrations, models

from aero import audit_chain

FORBID = """
CREATE OR REPLACE FUNCTION aero_audit_forbid() RETURNS trigger AS $$
BEGIN
  RAISE EXCEPTION 'aero_auditlog is append-only (% refused)', TG_OP
    USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
"""

LINK = f"""
CREATE OR REPLACE FUNCTION aero_audit_link() RETURNS trigger AS $$
DECLARE
  head text;
BEGIN
  PERFORM pg_advisory_xact_lock({audit_chain.CHAIN_LOCK});
  SELECT digest INTO head FROM aero_auditlog ORDER BY id DESC LIMIT 1;
  IF NEW.prev_digest IS DISTINCT FROM coalesce(head, repeat('0', 64)) THEN
    RAISE EXCEPTION 'aero_auditlog: prev_digest does not continue the chain'
      USING ERRCODE = 'check_violation';
  END IF;
  RETURN NEW;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER aero_audit_chain_link BEFORE INSERT ON aero_auditlog
  FOR EACH ROW EXECUTE FUNCTION aero_audit_link();
ALTER TABLE aero_auditlog ENABLE ALWAYS TRIGGER aero_audit_chain_link;
"""

UNLINK = """
DROP TRIGGER IF EXISTS aero_audit_chain_link ON aero_auditlog;
DROP FUNCTION IF EXISTS aero_audit_link();
"""


def reseal(apps, schema_editor):
    AuditLog = apps.get_model("aero", "AuditLog")
    postgresql = schema_editor.connection.vendor == "postgresql"
    if postgresql:
        schema_editor.execute(
            "ALTER TABLE aero_auditlog DISABLE TRIGGER aero_audit_no_update_delete"
        )
    previous = audit_chain.GENESIS
    for entry in AuditLog.objects.order_by("id").values(*audit_chain.FIELDS).iterator():
        entry["prev_digest"] = previous
        digest = audit_chain.digest_of(entry)
        AuditLog.objects.filter(pk=entry["id"]).update(prev_digest=previous, digest=digest)
        previous = digest
    if postgresql:
        schema_editor.execute(
            "ALTER TABLE aero_auditlog ENABLE ALWAYS TRIGGER aero_audit_no_update_delete"
        )


def forward_sql(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FORBID, params=None)
        schema_editor.execute(LINK, params=None)


def backward_sql(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(UNLINK, params=None)


class Migration(migrations.Migration):
    dependencies = [("aero", "0002_audit_append_only")]

    operations = [
        migrations.AlterField(
            model_name="auditlog",
            name="created_at",
            field=models.DateTimeField(
                db_index=True, default=django.utils.timezone.now, editable=False
            ),
        ),
        migrations.AddField(
            model_name="auditlog",
            name="prev_digest",
            field=models.CharField(default="", editable=False, max_length=64),
            preserve_default=False,
        ),
        migrations.RunPython(reseal, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="auditlog",
            constraint=models.CheckConstraint(
                condition=models.Q(digest__regex="^[0-9a-f]{64}$")
                & models.Q(prev_digest__regex="^[0-9a-f]{64}$"),
                name="audit_digests_are_sha256_hex",
            ),
        ),
        migrations.RunPython(forward_sql, backward_sql),
    ]
