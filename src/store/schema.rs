//! The schema, embedded from the top-level `schema.sql` and versioned with `PRAGMA user_version`.

use rusqlite::Connection;

use super::StoreError;

/// The text of `schema.sql`: version 1.
pub const SCHEMA_SQL: &str = include_str!("../../schema.sql");

/// The schema version this build writes. Later versions append migrations below.
pub const SCHEMA_VERSION: i64 = 1;

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
        let version = user_version(conn)?;
        if version < 1 {
            conn.execute_batch(SCHEMA_SQL)?;
        }
        conn.pragma_update(None, "user_version", SCHEMA_VERSION)?;
        Ok::<_, StoreError>(())
    })();
    match result {
        Ok(()) => conn.execute_batch("COMMIT")?,
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            return Err(e);
        }
    }
    Ok(())
}

pub fn user_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.pragma_query_value(None, "user_version", |row| row.get(0))
}
