"""Make the audit log append-only inside PostgreSQL too: row and TRUNCATE triggers that
raise, enabled ALWAYS (so session_replication_role cannot skip them).

Test databases only: a database whose `aero.allow_audit_truncate` setting is 'on' may be
TRUNCATEd (Django's test flush); UPDATE and DELETE stay forbidden everywhere.
"""

from django.db import migrations

FORWARD = """
CREATE OR REPLACE FUNCTION aero_audit_forbid() RETURNS trigger AS $$
BEGIN
  IF TG_OP = 'TRUNCATE' AND current_setting('aero.allow_audit_truncate', true) = 'on' THEN
    RETURN NULL;
  END IF;
  RAISE EXCEPTION 'aero_auditlog is append-only (% refused)', TG_OP
    USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER aero_audit_no_update_delete BEFORE UPDATE OR DELETE ON aero_auditlog
  FOR EACH ROW EXECUTE FUNCTION aero_audit_forbid();
CREATE TRIGGER aero_audit_no_truncate BEFORE TRUNCATE ON aero_auditlog
  FOR EACH STATEMENT EXECUTE FUNCTION aero_audit_forbid();
ALTER TABLE aero_auditlog ENABLE ALWAYS TRIGGER aero_audit_no_update_delete;
ALTER TABLE aero_auditlog ENABLE ALWAYS TRIGGER aero_audit_no_truncate;
"""

BACKWARD = """
DROP TRIGGER IF EXISTS aero_audit_no_update_delete ON aero_auditlog;
DROP TRIGGER IF EXISTS aero_audit_no_truncate ON aero_auditlog;
DROP FUNCTION IF EXISTS aero_audit_forbid();
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FORWARD, params=None)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BACKWARD, params=None)


class Migration(migrations.Migration):
    dependencies = [("aero", "0001_initial")]
    operations = [migrations.RunPython(forward, backward)]
