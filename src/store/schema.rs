//! The schema, embedded from the top-level `schema.sql` and versioned with `PRAGMA user_version`.
//!
//! Versions:
//! 1. The first schema.
//! 2. Cheaper writes, same content. CHECK constraints over three or more values are OR chains
//!    instead of IN lists (SQLite builds a temporary B-tree for such an IN list on every row it
//!    checks), and `email_outbox.idempotency_key` is unique through an index behind the order
//!    id instead of a random hash order. A version-1 database is brought to version 2 in place
//!    by [`migrate`].
//! 3. `email_outbox.first_tried_at`, a nullable column: added in place to a version-2 database
//!    (`ALTER TABLE ... ADD COLUMN`); a version-1 database gets it when its `email_outbox` is
//!    rebuilt from this schema. Rows already tried get their `created_at`, the earliest their
//!    first try can have been.

use rusqlite::{Connection, OptionalExtension};

use super::StoreError;

/// The text of `schema.sql`: version 3.
pub const SCHEMA_SQL: &str = include_str!("../../schema.sql");

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = 3;

/// Version-1 constraints that version 2 rewrites in place: (table, version-1 text, version-2
/// text). Each pair accepts exactly the same values, so no stored row can violate the new text,
/// and the rewrite changes nothing on disk but the table's definition in `sqlite_schema`.
/// (`email_outbox` is rebuilt instead: see [`rebuild_email_outbox`].)
const V1_CHECKS: [(&str, &str, &str); 2] = [
    (
        "processed_events",
        "CHECK (outcome IN ('processed', 'stale', 'ignored', 'parked',
                                                       'amount_mismatch'))",
        "CHECK (outcome = 'processed' OR outcome = 'stale'
                          OR outcome = 'ignored' OR outcome = 'parked'
                          OR outcome = 'amount_mismatch')",
    ),
    (
        "orders",
        "CHECK (status IN ('pending', 'paid', 'failed', 'cancelled',
                          'expired', 'partially_refunded', 'refunded', 'disputed', 'needs_review'))",
        "CHECK (status = 'pending' OR status = 'paid'
                          OR status = 'failed' OR status = 'cancelled' OR status = 'expired'
                          OR status = 'partially_refunded' OR status = 'refunded'
                          OR status = 'disputed' OR status = 'needs_review')",
    ),
];

/// Brings the database to [`SCHEMA_VERSION`]. Idempotent, and safe when several processes start
/// at once: the version is read again inside the write transaction.
pub fn migrate(conn: &Connection) -> Result<(), StoreError> {
    let version = user_version(conn)?;
    if version == SCHEMA_VERSION {
        return Ok(());
    }
    if version > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            found: version,
            known: SCHEMA_VERSION,
        });
    }
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let result = (|| {
        // Read again under the write lock: another process may have migrated meanwhile.
        let version = user_version(conn)?;
        if version > SCHEMA_VERSION {
            return Err(StoreError::SchemaTooNew {
                found: version,
                known: SCHEMA_VERSION,
            });
        }
        if version < 1 {
            conn.execute_batch(SCHEMA_SQL)?;
        } else if version == 1 {
            // The rebuilt email_outbox takes this schema's definition, version 3's column
            // included.
            rewrite_v1_checks(conn)?;
            rebuild_email_outbox(conn)?;
        } else if version == 2 {
            conn.execute_batch("ALTER TABLE email_outbox ADD COLUMN first_tried_at TEXT")?;
        }
        if (1..3).contains(&version) {
            // Rows tried before version 3 keep the HTTP key-lifetime guard: their first try was
            // no earlier than the row, so the guard counts from `created_at`, as it used to.
            conn.execute_batch(
                "UPDATE email_outbox SET first_tried_at = strftime('%Y-%m-%dT%H:%M:%fZ', created_at)
                 WHERE attempts > 0 AND first_tried_at IS NULL",
            )?;
        }
        conn.pragma_update(None, "user_version", SCHEMA_VERSION)?;
        Ok::<_, StoreError>(())
    })();
    let _ = conn.pragma_update(None, "writable_schema", false);
    match result {
        Ok(()) => conn.execute_batch("COMMIT")?,
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            return Err(e);
        }
    }
    if (1..SCHEMA_VERSION).contains(&version) {
        tracing::info!(
            from = version,
            to = SCHEMA_VERSION,
            "database schema migrated"
        );
    }
    Ok(())
}

/// Version 1 to 2, inside the caller's transaction: replaces each IN-list CHECK with its OR
/// chain in the stored table definitions. This is the procedure SQLite documents for changes
/// that leave the stored content valid ("ALTER TABLE: making other kinds of table schema
/// changes"): edit `sqlite_schema` under `writable_schema`, then bump `schema_version` so every
/// connection re-reads it. The edited definitions are parsed again before the caller commits,
/// so a mistake rolls back instead of leaving an unreadable schema.
fn rewrite_v1_checks(conn: &Connection) -> Result<(), StoreError> {
    let schema_version: i64 = conn.pragma_query_value(None, "schema_version", |r| r.get(0))?;
    conn.pragma_update(None, "writable_schema", true)?;
    let mut rewritten = 0;
    for (table, v1, v2) in V1_CHECKS {
        let sql: Option<String> = conn
            .query_row(
                "SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = ?1",
                [table],
                |row| row.get(0),
            )
            .optional()?;
        match sql {
            Some(sql) if sql.contains(v1) => {
                conn.execute(
                    "UPDATE sqlite_schema SET sql = ?2 WHERE type = 'table' AND name = ?1",
                    [table, &sql.replacen(v1, v2, 1)],
                )?;
                rewritten += 1;
            }
            Some(sql) if sql.contains(v2) => {}
            // Not the text version 1 wrote: left alone. Nothing is lost, as the old constraint
            // accepts the same values, only more slowly.
            _ => tracing::warn!(
                table,
                "a version-1 CHECK constraint was not found; left as it is"
            ),
        }
    }
    conn.pragma_update(None, "writable_schema", false)?;
    if rewritten > 0 {
        conn.pragma_update(None, "schema_version", schema_version + 1)?;
        // Parses the new definitions now: an error here rolls the migration back.
        conn.query_row("SELECT count(*) FROM processed_events WHERE 0", [], |_| {
            Ok(())
        })?;
    }
    Ok(())
}

/// Version 1 to 2, inside the caller's transaction: `email_outbox` loses its column-level
/// UNIQUE (whose automatic index cannot be dropped) for `email_outbox_order_key`. SQLite's
/// procedure for such changes: create the new table, copy every row, drop the old one, rename,
/// and create the indexes. Nothing references `email_outbox`, so no foreign key is affected;
/// row ids are kept.
fn rebuild_email_outbox(conn: &Connection) -> Result<(), StoreError> {
    let definition = table_definition(SCHEMA_SQL, "email_outbox");
    let columns: Vec<String> = conn
        .prepare("SELECT name FROM pragma_table_info('email_outbox') ORDER BY cid")?
        .query_map([], |row| row.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let columns = columns.join(", ");
    conn.execute_batch(&format!(
        "{create};
         INSERT INTO email_outbox_v2 ({columns}) SELECT {columns} FROM email_outbox;
         DROP TABLE email_outbox;
         ALTER TABLE email_outbox_v2 RENAME TO email_outbox;",
        create = definition.replacen(
            "CREATE TABLE IF NOT EXISTS email_outbox (",
            "CREATE TABLE email_outbox_v2 (",
            1
        ),
    ))?;
    // The indexes went with the old table; schema.sql's statements create them again.
    conn.execute_batch(SCHEMA_SQL)?;
    Ok(())
}

/// The `CREATE TABLE IF NOT EXISTS <table> (...);` statement in `sql`, without the semicolon.
fn table_definition<'a>(sql: &'a str, table: &str) -> &'a str {
    let start = sql
        .find(&format!("CREATE TABLE IF NOT EXISTS {table} ("))
        .expect("schema.sql defines the table");
    let end = start + sql[start..].find("\n);").expect("the definition ends") + 2;
    &sql[start..end]
}

pub fn user_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.pragma_query_value(None, "user_version", |row| row.get(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rewrite's texts match the two schema files exactly, so it finds what it replaces.
    #[test]
    fn version_1_checks_are_found_in_both_schema_texts() {
        let v1 = include_str!("../../fixtures/schema-v1.sql");
        for (table, old, new) in V1_CHECKS {
            assert!(
                v1.contains(old),
                "{table}: version-1 text not in schema-v1.sql"
            );
            assert!(
                SCHEMA_SQL.contains(new),
                "{table}: version-2 text not in schema.sql"
            );
            assert!(
                !SCHEMA_SQL.contains(old),
                "{table}: schema.sql still has the IN list"
            );
        }
    }

    #[test]
    fn table_definition_is_the_whole_create_statement() {
        let outbox = table_definition(SCHEMA_SQL, "email_outbox");
        assert!(outbox.starts_with("CREATE TABLE IF NOT EXISTS email_outbox ("));
        assert!(outbox.ends_with("\n)"), "{outbox}");
        assert!(outbox.contains("sent_at"));
        assert!(!outbox.contains("CREATE INDEX"));
    }
}
