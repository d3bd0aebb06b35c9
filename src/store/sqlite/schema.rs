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
//! 4. `orders.paid_amount` and `orders.paid_currency` (what the receipt shows), added in place;
//!    the outcome `reversed`, whose CHECK is rewritten in place as version 2's were (it accepts a
//!    superset of the values it accepted, so no stored row can violate it).
//! 5. Providers come from the registry: the CHECKs that listed `stripe` and `midtrans` are
//!    removed in place. `orders.amount_exponent` and `processed_events.parked_event` (a parked
//!    event, normalised, so that it is applied without its provider) are added in place; parked
//!    rows written before were given their normalised event at startup (from version 7 the
//!    ledger's rebuild reads their bodies instead, `rebuild.rs`).
//! 6. `orders.payer_email` (the payer's address as the provider reported it, apart from the
//!    shop's `customer_email`), `order_transitions.actor` and `.reason` (who made an operator's or
//!    the API's change, and the operator's reason), and the index of an order's transitions; all
//!    added in place. Orders first seen in a webhook get their `customer_email` as their payer's
//!    address, where it came from.
//! 7. The ledger: `payments`, `payment_refunds`, `payment_disputes`, `payment_aliases` (which
//!    replace `order_payment_intents`: its rows become payments linked to their orders), the
//!    orders' `review_reason`, `operator_status`, `operator_money`, `acknowledged` and
//!    `announced_returned`, and the outcome `needs_review`, all in place; the ledger itself is
//!    rebuilt from the stored events afterwards ([`super::rebuild`], noted in `pending_work`).
//! 8. `order_transitions.sequence` (the order's change number), `.amount` and `.currency` (the
//!    order's at the change): what the change feed serves. Added in place; earlier rows get
//!    their numbers in id order, and their order's amount and currency as they are now. The
//!    forwarding tables, `forward_state` and `forward_outbox`.
//! 9. `processed_events.headers` (the request's headers that are no secret, for the console),
//!    `outbox_attempts` (each try of an outbox row) and `console_logouts`, added in place.
//! 10. The index of an order's events (`processed_events_order`), built in place: the
//!     console's order page and `sekali events list --order` read an order's events through it
//!     instead of the whole table.

use rusqlite::{Connection, OptionalExtension};

use super::StoreError;

/// The text of `schema.sql`: version 10.
pub const SCHEMA_SQL: &str = include_str!("../../../schema.sql");

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = 10;

/// CHECK constraints rewritten in place, in order: (the version whose text `new` is, table, the
/// text before it, `new`). Each new text accepts every value the old one did, so no stored row
/// can violate it, and the rewrite changes nothing on disk but the table's definition in
/// `sqlite_schema`. (`email_outbox` was rebuilt instead, at version 2: see
/// [`rebuild_email_outbox`].)
const CHECK_REWRITES: [(i64, &str, &str, &str); 6] = [
    (
        2,
        "processed_events",
        "CHECK (outcome IN ('processed', 'stale', 'ignored', 'parked',
                                                       'amount_mismatch'))",
        V2_OUTCOME_CHECK,
    ),
    (
        2,
        "orders",
        "CHECK (status IN ('pending', 'paid', 'failed', 'cancelled',
                          'expired', 'partially_refunded', 'refunded', 'disputed', 'needs_review'))",
        "CHECK (status = 'pending' OR status = 'paid'
                          OR status = 'failed' OR status = 'cancelled' OR status = 'expired'
                          OR status = 'partially_refunded' OR status = 'refunded'
                          OR status = 'disputed' OR status = 'needs_review')",
    ),
    (4, "processed_events", V2_OUTCOME_CHECK, V4_OUTCOME_CHECK),
    (
        5,
        "processed_events",
        "provider          TEXT NOT NULL CHECK (provider IN ('stripe', 'midtrans')),",
        "provider          TEXT NOT NULL,",
    ),
    (
        5,
        "orders",
        "provider          TEXT NOT NULL CHECK (provider IN ('stripe', 'midtrans')),",
        "provider          TEXT NOT NULL,",
    ),
    (7, "processed_events", V4_OUTCOME_CHECK, V7_OUTCOME_CHECK),
];

/// `processed_events.outcome`'s CHECK from version 4 to version 6.
const V4_OUTCOME_CHECK: &str = "CHECK (outcome = 'processed' OR outcome = 'stale'
                          OR outcome = 'ignored' OR outcome = 'parked'
                          OR outcome = 'amount_mismatch' OR outcome = 'reversed')";

/// `processed_events.outcome`'s CHECK from version 7.
const V7_OUTCOME_CHECK: &str = "CHECK (outcome = 'processed' OR outcome = 'stale'
                          OR outcome = 'ignored' OR outcome = 'parked'
                          OR outcome = 'amount_mismatch' OR outcome = 'reversed'
                          OR outcome = 'needs_review')";

/// `processed_events.outcome`'s CHECK from version 2 to version 3.
const V2_OUTCOME_CHECK: &str = "CHECK (outcome = 'processed' OR outcome = 'stale'
                          OR outcome = 'ignored' OR outcome = 'parked'
                          OR outcome = 'amount_mismatch')";

/// Version 8's columns of `order_transitions`, added in place and filled for the rows before
/// them: each order's changes numbered in id order (the order they were written in), and the
/// order's amount and currency as they are now (what version 7 kept of them).
const V8_TRANSITIONS: &str = "
    ALTER TABLE order_transitions ADD COLUMN sequence INTEGER;
    ALTER TABLE order_transitions ADD COLUMN amount INTEGER;
    ALTER TABLE order_transitions ADD COLUMN currency TEXT;
    UPDATE order_transitions SET
        sequence = (SELECT count(*) FROM order_transitions AS earlier
                    WHERE earlier.order_id = order_transitions.order_id
                      AND earlier.id <= order_transitions.id),
        amount = (SELECT amount FROM orders WHERE orders.order_id = order_transitions.order_id),
        currency = (SELECT currency FROM orders WHERE orders.order_id = order_transitions.order_id);";

/// Version 10's index, as `schema.sql` has it (a file older than version 9 has it already: an
/// earlier step ran `schema.sql`, which creates what is missing).
const V10_ORDER_EVENTS: &str = "CREATE INDEX IF NOT EXISTS processed_events_order
    ON processed_events (order_id) WHERE order_id IS NOT NULL";

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
            // A file with sekali's tables but no version (restored from `sqlite3 .dump`, which
            // leaves the version out) would be taken as new: its old tables kept as they are,
            // then written with this version's statements, which fail on its missing columns.
            let has_tables: bool = conn.query_row(
                "SELECT EXISTS (SELECT 1 FROM sqlite_schema
                                WHERE type = 'table' AND name = 'processed_events')",
                [],
                |row| row.get(0),
            )?;
            if has_tables {
                return Err(StoreError::SchemaUnversioned);
            }
            conn.execute_batch(SCHEMA_SQL)?;
        } else {
            rewrite_checks(conn, version)?;
            if version == 1 {
                // The rebuilt email_outbox takes this schema's definition, version 3's column
                // included.
                rebuild_email_outbox(conn)?;
            } else if version == 2 {
                conn.execute_batch("ALTER TABLE email_outbox ADD COLUMN first_tried_at TEXT")?;
            }
            if version < 4 {
                conn.execute_batch(
                    "ALTER TABLE orders ADD COLUMN paid_amount INTEGER;
                     ALTER TABLE orders ADD COLUMN paid_currency TEXT;",
                )?;
            }
            if version < 5 {
                conn.execute_batch(
                    "ALTER TABLE orders ADD COLUMN amount_exponent INTEGER;
                     ALTER TABLE processed_events ADD COLUMN parked_event TEXT;",
                )?;
            }
            if version < 6 {
                conn.execute_batch(
                    "ALTER TABLE orders ADD COLUMN payer_email TEXT;
                     ALTER TABLE order_transitions ADD COLUMN actor TEXT;
                     ALTER TABLE order_transitions ADD COLUMN reason TEXT;
                     UPDATE orders SET payer_email = customer_email WHERE source = 'webhook';",
                )?;
                // The new index.
                conn.execute_batch(SCHEMA_SQL)?;
            }
            if version < 7 {
                conn.execute_batch(
                    "ALTER TABLE orders ADD COLUMN review_reason TEXT;
                     ALTER TABLE orders ADD COLUMN operator_status TEXT;
                     ALTER TABLE orders ADD COLUMN operator_money TEXT;
                     ALTER TABLE orders ADD COLUMN acknowledged TEXT;
                     ALTER TABLE orders ADD COLUMN announced_returned INTEGER NOT NULL DEFAULT 0;",
                )?;
                // The ledger's tables.
                conn.execute_batch(SCHEMA_SQL)?;
                // Every payment an order had becomes a payment of the ledger, linked to it.
                conn.execute_batch(
                    "INSERT INTO payments (provider, payment_ref, order_id, created_at, updated_at)
                         SELECT orders.provider, order_payment_intents.payment_intent_id,
                                orders.order_id, orders.created_at, orders.updated_at
                         FROM order_payment_intents JOIN orders USING (order_id)
                         WHERE true
                     ON CONFLICT (provider, payment_ref) DO NOTHING;
                     DROP TABLE order_payment_intents;
                     INSERT INTO pending_work (name)
                         SELECT 'ledger' WHERE EXISTS (SELECT 1 FROM orders)
                                            OR EXISTS (SELECT 1 FROM processed_events);",
                )?;
            }
            if version < 8 {
                conn.execute_batch(V8_TRANSITIONS)?;
                // The forwarding tables.
                conn.execute_batch(SCHEMA_SQL)?;
            }
            if version < 9 {
                conn.execute_batch("ALTER TABLE processed_events ADD COLUMN headers TEXT")?;
                // outbox_attempts.
                conn.execute_batch(SCHEMA_SQL)?;
            }
            if version < 10 {
                conn.execute_batch(V10_ORDER_EVENTS)?;
            }
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

/// From `version`, inside the caller's transaction: applies every rewrite of [`CHECK_REWRITES`]
/// newer than `version`, in order, to the stored table definitions. This is the procedure SQLite
/// documents for changes that leave the stored content valid ("ALTER TABLE: making other kinds
/// of table schema changes"): edit `sqlite_schema` under `writable_schema`, then bump
/// `schema_version` so every connection re-reads it. The edited definitions are parsed again
/// before the caller commits, so a mistake rolls back instead of leaving an unreadable schema.
fn rewrite_checks(conn: &Connection, version: i64) -> Result<(), StoreError> {
    let schema_version: i64 = conn.pragma_query_value(None, "schema_version", |r| r.get(0))?;
    conn.pragma_update(None, "writable_schema", true)?;
    let mut rewritten = 0;
    for (_, table, v1, v2) in CHECK_REWRITES
        .into_iter()
        .filter(|(introduced, ..)| *introduced > version)
    {
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
            // Not the text the earlier version wrote: left alone, and said. (A version-2 rewrite
            // not found costs only speed; a later one would refuse the new values.)
            _ => tracing::warn!(
                table,
                "a CHECK constraint of an earlier schema version was not found; left as it is"
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

    /// Each rewrite finds its text in the schema of the version before it, and the last text of
    /// each constraint is what schema.sql has now.
    #[test]
    fn every_check_rewrite_finds_its_text_and_ends_at_schema_sql() {
        let schema_of = |version: i64| match version {
            1 => include_str!("../../../fixtures/schema-v1.sql"),
            2 => include_str!("../../../fixtures/schema-v2.sql"),
            3 => include_str!("../../../fixtures/schema-v3.sql"),
            4 => include_str!("../../../fixtures/schema-v4.sql"),
            5 => include_str!("../../../fixtures/schema-v5.sql"),
            6 => include_str!("../../../fixtures/schema-v6.sql"),
            7 => include_str!("../../../fixtures/schema-v7.sql"),
            _ => SCHEMA_SQL,
        };
        for (version, table, old, new) in CHECK_REWRITES {
            assert!(
                schema_of(version - 1).contains(old),
                "{table}: the text before version {version} is not in that version's schema"
            );
            assert!(
                schema_of(version).contains(new),
                "{table}: version {version}'s text is not in its schema"
            );
        }
        for (table, old, _) in [
            ("processed_events", CHECK_REWRITES[0].2, ()),
            ("orders", CHECK_REWRITES[1].2, ()),
            ("processed_events", V2_OUTCOME_CHECK, ()),
            ("processed_events", V4_OUTCOME_CHECK, ()),
            ("both", CHECK_REWRITES[3].2, ()),
        ] {
            assert!(
                !SCHEMA_SQL.contains(old),
                "{table}: schema.sql still has an older CHECK"
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
