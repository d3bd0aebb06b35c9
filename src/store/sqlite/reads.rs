//! Read-only queries: health and inspection.

use rusqlite::types::Value;
use rusqlite::{params, Connection, OptionalExtension};

use crate::clock::iso_seconds;
use crate::store::model::{
    EventCount, EventDetail, EventQuery, EventSummary, OutboxBacklog, OutboxKind, RunCounts,
};

/// The WHERE clause of a listing's filters and their values, in order. Only the filters given
/// are in the SQL: SQLite can use an index for `order_id = ?`, but not for `(? IS NULL OR
/// order_id = ?)`.
#[derive(Default)]
pub(super) struct Filters {
    clauses: Vec<&'static str>,
    values: Vec<Value>,
}

impl Filters {
    /// Adds `clause`, with one `?` for `value`, when there is a value.
    pub(super) fn add(&mut self, clause: &'static str, value: Option<impl Into<Value>>) {
        if let Some(value) = value {
            self.clauses.push(clause);
            self.values.push(value.into());
        }
    }

    /// `WHERE a AND b …`, or nothing when no filter was given.
    pub(super) fn sql(&self) -> String {
        if self.clauses.is_empty() {
            String::new()
        } else {
            format!("WHERE {}", self.clauses.join(" AND "))
        }
    }

    /// The values, then `last` (the limit).
    pub(super) fn values_then(mut self, last: impl Into<Value>) -> Vec<Value> {
        self.values.push(last.into());
        self.values
    }
}

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
    "provider, event_id, event_type, order_id, outcome, received_at, expires_at, rowid";

fn summary(row: &rusqlite::Row<'_>) -> rusqlite::Result<EventSummary> {
    Ok(EventSummary {
        provider: row.get(0)?,
        event_id: row.get(1)?,
        event_type: row.get(2)?,
        order_id: row.get(3)?,
        outcome: row.get(4)?,
        received_at: row.get(5)?,
        expires_at: row.get(6)?,
        seq: row.get(7)?,
    })
}

/// The events that match `query`, newest first: in the order they arrived (`rowid`), which
/// `received_at` cannot give, as several events share a second. Timestamps are fixed-width
/// text, so `--since` is a comparison of text.
pub fn list_events(conn: &Connection, query: &EventQuery) -> rusqlite::Result<Vec<EventSummary>> {
    let mut filters = Filters::default();
    filters.add("provider = ?", query.provider.clone());
    filters.add("outcome = ?", query.outcome.map(|o| o.as_str().to_owned()));
    filters.add("order_id = ?", query.order_id.clone());
    filters.add("received_at >= ?", query.since_unix.map(iso_seconds));
    // The same bound as a place in arrival order, which the rowid's order can seek to: rows
    // received before it are not read at all (received_at has no index of its own).
    filters.add(
        "rowid > coalesce((SELECT rowid FROM processed_events WHERE received_at < ? \
                           ORDER BY rowid DESC LIMIT 1), 0)",
        query.since_unix.map(iso_seconds),
    );
    filters.add("received_at < ?", query.until_unix.map(iso_seconds));
    filters.add("event_type = ?", query.event_type.clone());
    filters.add("rowid < ?", query.before_seq);
    let sql = format!(
        "SELECT {SUMMARY_COLUMNS} FROM processed_events {} ORDER BY rowid DESC LIMIT ?",
        filters.sql()
    );
    conn.prepare(&sql)?
        .query_map(
            rusqlite::params_from_iter(filters.values_then(query.limit)),
            summary,
        )?
        .collect()
}

/// The events received since `since_unix`, counted by provider and outcome. It reads back from
/// the newest row while rows are that recent (arrival order, `rowid`), not the whole table.
pub fn event_counts(conn: &Connection, since_unix: i64) -> rusqlite::Result<Vec<EventCount>> {
    conn.prepare(
        "SELECT provider, outcome, count(*) FROM processed_events
         WHERE rowid > coalesce((SELECT rowid FROM processed_events WHERE received_at < ?1
                                 ORDER BY rowid DESC LIMIT 1), 0)
           AND received_at >= ?1
         GROUP BY provider, outcome ORDER BY provider, outcome",
    )?
    .query_map([iso_seconds(since_unix)], |row| {
        Ok(EventCount {
            provider: row.get(0)?,
            outcome: row.get(1)?,
            count: row.get(2)?,
        })
    })?
    .collect()
}

/// Every result recorded for row `row_id` of `outbox`, oldest first.
pub fn outbox_attempts(
    conn: &Connection,
    outbox: OutboxKind,
    row_id: i64,
) -> rusqlite::Result<Vec<crate::store::OutboxAttempt>> {
    conn.prepare_cached(
        "SELECT at, relay, result, error FROM outbox_attempts
         WHERE outbox = ?1 AND row_id = ?2 ORDER BY id",
    )?
    .query_map(params![outbox.label(), row_id], |row| {
        Ok(crate::store::OutboxAttempt {
            at: row.get(0)?,
            relay: row.get(1)?,
            result: row.get(2)?,
            error: row.get(3)?,
        })
    })?
    .collect()
}

/// Every stored event with this id (one per provider at most).
pub fn find_events(
    conn: &Connection,
    event_id: &str,
    provider: Option<&str>,
) -> rusqlite::Result<Vec<EventDetail>> {
    let sql = format!(
        "SELECT {SUMMARY_COLUMNS}, payment_intent_id, payload, headers FROM processed_events
         WHERE event_id = ?1 AND (?2 IS NULL OR provider = ?2) ORDER BY provider"
    );
    conn.prepare(&sql)?
        .query_map(params![event_id, provider], |row| {
            Ok(EventDetail {
                summary: summary(row)?,
                payment_intent_id: row.get(8)?,
                payload: row.get(9)?,
                headers: row.get(10)?,
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

/// Each outbox's backlog as of `now_ms` (see [`crate::store::Store::outbox_backlog`]): three
/// index lookups per outbox (`(status, next_attempt_at)`).
pub fn outbox_backlog(
    conn: &Connection,
    now_ms: i64,
) -> rusqlite::Result<[(OutboxKind, OutboxBacklog); 2]> {
    let now = crate::clock::iso_millis(now_ms);
    let read = |kind: OutboxKind| -> rusqlite::Result<(OutboxKind, OutboxBacklog)> {
        let table = kind.table();
        conn.prepare_cached(&format!(
            "SELECT (SELECT count(*) FROM {table} WHERE status = 'pending'),
                    (SELECT count(*) FROM {table} WHERE status = 'dead'),
                    (SELECT min(next_attempt_at) FROM {table}
                     WHERE status = 'pending' AND next_attempt_at <= ?1)"
        ))?
        .query_row([&now], |row| {
            let oldest: Option<String> = row.get(2)?;
            Ok((
                kind,
                OutboxBacklog::at(row.get(0)?, row.get(1)?, oldest.as_deref(), now_ms),
            ))
        })
    };
    Ok([read(OutboxKind::Email)?, read(OutboxKind::Forward)?])
}
