//! The PostgreSQL schema (`schema.sql` in this folder: the top-level SQLite schema's tables and
//! columns, translated), versioned in the table `sekali_schema` (PostgreSQL has no
//! `PRAGMA user_version`) and applied at startup.
//!
//! PostgreSQL support starts at version 7: the two engines' versions move together, and a
//! PostgreSQL database never held an older one.
//!
//! 8. `order_transitions.sequence`, `.amount`, `.currency` (as in SQLite) and `.position` (the
//!    change feed's place; the rows before get theirs in id order) with its indexes, added in
//!    place; the forwarding tables, `forward_state` and `forward_outbox`.
//! 9. `processed_events.headers`, `outbox_attempts` and `console_logouts`, added in place.
//! 10. The index of an order's events (`processed_events_order`), built in place.

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

/// Version 8's columns of `order_transitions`, added and filled as SQLite's migration does; the
/// rows before get their place in the change feed in id order (they all committed long ago).
const V8_TRANSITIONS: &str = "
    ALTER TABLE order_transitions ADD COLUMN sequence BIGINT, ADD COLUMN amount BIGINT,
        ADD COLUMN currency TEXT COLLATE \"C\", ADD COLUMN position BIGINT;
    UPDATE order_transitions SET sequence = numbered.sequence, position = numbered.position,
                                 amount = orders.amount, currency = orders.currency
    FROM (SELECT id, row_number() OVER (PARTITION BY order_id ORDER BY id) AS sequence,
                 row_number() OVER (ORDER BY id) AS position
          FROM order_transitions) AS numbered, orders
    WHERE numbered.id = order_transitions.id AND orders.order_id = order_transitions.order_id;
    CREATE UNIQUE INDEX IF NOT EXISTS order_transitions_feed ON order_transitions (position);
    CREATE INDEX IF NOT EXISTS order_transitions_unpublished ON order_transitions (id)
        WHERE position IS NULL;";

/// True when the database has sekali's version table.
fn has_version_table(client: &mut impl postgres::GenericClient) -> Result<bool, StoreError> {
    Ok(client
        .query_one("SELECT to_regclass('sekali_schema') IS NOT NULL", &[])?
        .try_get(0)?)
}

/// True when sekali's tables are in the database (its version table, or its events' without
/// one): a command that only reads says when they are not, rather than failing on the first
/// table it reads.
pub fn has_tables(client: &mut Client) -> Result<bool, StoreError> {
    Ok(client
        .query_one(
            "SELECT to_regclass('sekali_schema') IS NOT NULL
                 OR to_regclass('processed_events') IS NOT NULL",
            &[],
        )?
        .try_get(0)?)
}

/// Brings the database to [`SCHEMA_VERSION`]: creates the tables in an empty database, leaves
/// a current one as it is, refuses one written by a newer sekali, and one that holds sekali's
/// tables without a version (made by hand, or restored without `sekali_schema`).
pub fn migrate(client: &mut Client) -> Result<(), StoreError> {
    let mut tx = client.transaction()?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
    let version: Option<i64> = if has_version_table(&mut tx)? {
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
        Some(found) if found < SCHEMA_VERSION => {
            if found < 8 {
                tx.batch_execute(V8_TRANSITIONS)?;
                // The forwarding tables.
                tx.batch_execute(SCHEMA_SQL)?;
            }
            if found < 9 {
                tx.batch_execute(
                    "ALTER TABLE processed_events ADD COLUMN headers TEXT COLLATE \"C\"",
                )?;
                // outbox_attempts.
                tx.batch_execute(SCHEMA_SQL)?;
            }
            if found < 10 {
                // Built under the migration's lock, in its transaction: deliveries of instances
                // running an older sekali on the same database wait for it (or get 503 after
                // their lock timeout, which providers retry) while it is built.
                tx.batch_execute(
                    "CREATE INDEX IF NOT EXISTS processed_events_order
                         ON processed_events (order_id, rowid) WHERE order_id IS NOT NULL",
                )?;
            }
            tx.execute("UPDATE sekali_schema SET version = $1", &[&SCHEMA_VERSION])?;
            tracing::info!(
                from = found,
                to = SCHEMA_VERSION,
                "database schema migrated"
            );
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
