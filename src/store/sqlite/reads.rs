//! Read-only queries: health and inspection.

use rusqlite::{params, Connection, OptionalExtension};

use crate::store::model::{EventDetail, EventSummary, RunCounts};

/// Proves the database answers: the schema is readable.
pub fn check_health(conn: &Connection) -> rusqlite::Result<()> {
    conn.prepare_cached("SELECT count(*) FROM sqlite_schema WHERE name = 'processed_events'")?
        .query_row([], |row| row.get::<_, i64>(0))
        .and_then(|n| {
            if n == 1 {
                Ok(())
            } else {
                Err(rusqlite::Error::QueryReturnedNoRows)
            }
        })
}

const SUMMARY_COLUMNS: &str =
    "provider, event_id, event_type, order_id, outcome, received_at, expires_at";

fn summary(row: &rusqlite::Row<'_>) -> rusqlite::Result<EventSummary> {
    Ok(EventSummary {
        provider: row.get(0)?,
        event_id: row.get(1)?,
        event_type: row.get(2)?,
        order_id: row.get(3)?,
        outcome: row.get(4)?,
        received_at: row.get(5)?,
        expires_at: row.get(6)?,
    })
}

/// The newest events first, optionally of one provider.
pub fn list_events(
    conn: &Connection,
    provider: Option<&str>,
    limit: u32,
) -> rusqlite::Result<Vec<EventSummary>> {
    let sql = format!(
        "SELECT {SUMMARY_COLUMNS} FROM processed_events
         WHERE ?1 IS NULL OR provider = ?1
         ORDER BY rowid DESC LIMIT ?2"
    );
    conn.prepare(&sql)?
        .query_map(params![provider, limit], summary)?
        .collect()
}

/// Every stored event with this id (one per provider at most).
pub fn find_events(
    conn: &Connection,
    event_id: &str,
    provider: Option<&str>,
) -> rusqlite::Result<Vec<EventDetail>> {
    let sql = format!(
        "SELECT {SUMMARY_COLUMNS}, payment_intent_id, payload FROM processed_events
         WHERE event_id = ?1 AND (?2 IS NULL OR provider = ?2) ORDER BY provider"
    );
    conn.prepare(&sql)?
        .query_map(params![event_id, provider], |row| {
            Ok(EventDetail {
                summary: summary(row)?,
                payment_intent_id: row.get(7)?,
                payload: row.get(8)?,
            })
        })?
        .collect()
}

/// An order's status, for tests and inspection.
pub fn order_status(conn: &Connection, order_id: &str) -> rusqlite::Result<Option<String>> {
    conn.query_row(
        "SELECT status FROM orders WHERE order_id = ?1",
        [order_id],
        |row| row.get(0),
    )
    .optional()
}

/// The rows of one load-generator run: every id of a run contains its marker.
pub fn run_counts(conn: &Connection, marker: &str) -> rusqlite::Result<RunCounts> {
    let pattern = format!("%{marker}%");
    let count = |sql: &str| conn.query_row(sql, [&pattern], |row| row.get::<_, i64>(0));
    Ok(RunCounts {
        events: count("SELECT count(*) FROM processed_events WHERE event_id LIKE ?1")?,
        orders: count("SELECT count(*) FROM orders WHERE order_id LIKE ?1")?,
        emails: count("SELECT count(*) FROM email_outbox WHERE order_id LIKE ?1")?,
        orders_emailed: count(
            "SELECT count(DISTINCT order_id) FROM email_outbox WHERE order_id LIKE ?1",
        )?,
    })
}
