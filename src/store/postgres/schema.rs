//! The PostgreSQL schema (`schema.sql` in this folder: the top-level SQLite schema's tables and
//! columns, translated), versioned in the table `sekali_schema` (PostgreSQL has no
//! `PRAGMA user_version`) and applied at startup.
//!
//! PostgreSQL support starts at version 7, the SQLite schema's current one: the two engines'
//! versions move together, and a PostgreSQL database never held an older one.

use postgres::Client;

use super::StoreError;

/// The text of the PostgreSQL schema.
pub const SCHEMA_SQL: &str = include_str!("schema.sql");

/// The schema version this build writes: the same number as the SQLite schema's.
pub const SCHEMA_VERSION: i64 = crate::store::sqlite::schema::SCHEMA_VERSION;

/// The key of the transaction-scoped advisory lock that migrations hold: several instances
/// starting at once take turns, and the second finds the schema in place. Transaction-scoped
/// (`pg_advisory_xact_lock`), so it is released at COMMIT or when the connection drops, and
/// works through PgBouncer in transaction mode, where a session lock may outlive its session.
const MIGRATION_LOCK: i64 = 0x73656b616c69; // "sekali"

/// Brings the database to [`SCHEMA_VERSION`]: creates the tables in an empty database, leaves
/// a current one as it is, refuses one written by a newer sekali, and one that holds sekali's
/// tables without a version (made by hand, or restored without `sekali_schema`).
pub fn migrate(client: &mut Client) -> Result<(), StoreError> {
    let mut tx = client.transaction()?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
    let has_version_table: bool = tx
        .query_one("SELECT to_regclass('sekali_schema') IS NOT NULL", &[])?
        .try_get(0)?;
    let version: Option<i64> = if has_version_table {
        tx.query_opt("SELECT version FROM sekali_schema", &[])?
            .map(|row| row.try_get(0))
            .transpose()?
    } else {
        None
    };
    match version {
        Some(found) if found > SCHEMA_VERSION => {
            return Err(StoreError::SchemaTooNew {
                found,
                known: SCHEMA_VERSION,
            })
        }
        Some(_) => {}
        None => {
            let has_tables: bool = tx
                .query_one("SELECT to_regclass('processed_events') IS NOT NULL", &[])?
                .try_get(0)?;
            if has_tables {
                return Err(StoreError::Unfit(
                    "the database holds sekali's tables but no schema version (the table sekali_schema is missing or empty), so sekali cannot tell what to migrate; restore the whole database (pg_dump keeps sekali_schema), or insert the version of the sekali that wrote it: INSERT INTO sekali_schema VALUES (N)".into(),
                ));
            }
            tx.batch_execute(SCHEMA_SQL)?;
            tx.execute(
                "INSERT INTO sekali_schema (version) VALUES ($1)",
                &[&SCHEMA_VERSION],
            )?;
        }
    }
    tx.commit()?;
    Ok(())
}
