//! Read-only queries: health and inspection.

use postgres::types::ToSql;
use postgres::Row;

use super::{get, Db, StoreError};
use crate::clock::iso_seconds;
use crate::store::model::{
    EventCount, EventDetail, EventQuery, EventSummary, OutboxBacklog, OutboxKind, RunCounts,
};
use crate::store::ErrorKind;

/// A filter's value, owned by [`Filters`].
type Value = Box<dyn ToSql + Sync>;

/// The WHERE clause of a listing's filters and their values, in order. Only the filters given
/// are in the SQL: an index serves `order_id = $1`, but not `($1 IS NULL OR order_id = $1)`.
#[derive(Default)]
pub(super) struct Filters {
    clauses: Vec<String>,
    values: Vec<Value>,
}

impl Filters {
    /// Adds `clause`, whose one `?` stands for `value` (numbered `$n` here, in the order the
    /// values are added), when there is a value.
    pub(super) fn add<T: ToSql + Sync + 'static>(
        &mut self,
        clause: &'static str,
        value: Option<T>,
    ) {
        if let Some(value) = value {
            self.values.push(Box::new(value));
            let placeholder = format!("${}", self.values.len());
            self.clauses.push(clause.replacen('?', &placeholder, 1));
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

    /// The placeholder of the value [`values_then`](Self::values_then) adds last (the limit).
    pub(super) fn last_placeholder(&self) -> String {
        format!("${}", self.values.len() + 1)
    }

    /// The values, then `last` (the limit).
    pub(super) fn values_then(mut self, last: impl ToSql + Sync + 'static) -> Vec<Value> {
        self.values.push(Box::new(last));
        self.values
    }
}

/// `values` as the statement's parameters.
pub(super) fn params(values: &[Value]) -> Vec<&(dyn ToSql + Sync)> {
    values.iter().map(|value| value.as_ref()).collect()
}

/// Proves the database answers: the schema is readable.
pub fn check_health(db: &mut Db<'_, '_>) -> Result<(), StoreError> {
    // SQLite looked in sqlite_schema; here the table is looked up as the queries find it
    // (through the search_path).
    let row = db.query_one(
        "SELECT count(*) FROM pg_catalog.pg_class WHERE oid = to_regclass('processed_events')",
        &[],
    )?;
    let n: i64 = get(&row, 0)?;
    if n == 1 {
        Ok(())
    } else {
        Err(StoreError::database(
            ErrorKind::Permanent,
            std::io::Error::other("the table processed_events does not exist"),
        ))
    }
}

/// The columns [`summary`] reads. A macro, so that statements stay `&'static str` literals.
macro_rules! summary_columns {
    () => {
        "provider, event_id, event_type, order_id, outcome, received_at, expires_at, rowid"
    };
}

fn summary(row: &Row) -> Result<EventSummary, StoreError> {
    Ok(EventSummary {
        provider: get(row, 0)?,
        event_id: get(row, 1)?,
        event_type: get(row, 2)?,
        order_id: get(row, 3)?,
        outcome: get(row, 4)?,
        received_at: get(row, 5)?,
        expires_at: get(row, 6)?,
        seq: get(row, 7)?,
    })
}

/// The events that match `query`, newest first: in the order they arrived (`rowid`), which
/// `received_at` cannot give, as several events share a second. Timestamps are fixed-width
/// text, so `--since` is a comparison of text.
pub fn list_events(
    db: &mut Db<'_, '_>,
    query: &EventQuery,
) -> Result<Vec<EventSummary>, StoreError> {
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
    // rowid: PostgreSQL's explicit column for SQLite's implicit one (arrival order).
    let sql = format!(
        concat!(
            "SELECT ",
            summary_columns!(),
            " FROM processed_events {} ORDER BY rowid DESC LIMIT {}"
        ),
        filters.sql(),
        filters.last_placeholder()
    );
    let values = filters.values_then(i64::from(query.limit));
    db.query_built(&sql, &params(&values))?
        .iter()
        .map(summary)
        .collect()
}

/// The events received since `since_unix`, counted by provider and outcome. It reads back from
/// the newest row while rows are that recent (arrival order, `rowid`), not the whole table.
pub fn event_counts(db: &mut Db<'_, '_>, since_unix: i64) -> Result<Vec<EventCount>, StoreError> {
    let since = iso_seconds(since_unix);
    db.query(
        "SELECT provider, outcome, count(*) FROM processed_events
         WHERE rowid > coalesce((SELECT rowid FROM processed_events WHERE received_at < $1
                                 ORDER BY rowid DESC LIMIT 1), 0)
           AND received_at >= $1
         GROUP BY provider, outcome ORDER BY provider, outcome",
        &[&since],
    )?
    .iter()
    .map(|row| {
        Ok(EventCount {
            provider: get(row, 0)?,
            outcome: get(row, 1)?,
            count: get(row, 2)?,
        })
    })
    .collect()
}

/// Every result recorded for row `row_id` of `outbox`, oldest first.
pub fn outbox_attempts(
    db: &mut Db<'_, '_>,
    outbox: OutboxKind,
    row_id: i64,
) -> Result<Vec<crate::store::OutboxAttempt>, StoreError> {
    db.query(
        "SELECT at, relay, result, error FROM outbox_attempts
         WHERE outbox = $1 AND row_id = $2 ORDER BY id",
        &[&outbox.label(), &row_id],
    )?
    .iter()
    .map(|row| {
        Ok(crate::store::OutboxAttempt {
            at: get(row, 0)?,
            relay: get(row, 1)?,
            result: get(row, 2)?,
            error: get(row, 3)?,
        })
    })
    .collect()
}

/// Every stored event with this id (one per provider at most).
pub fn find_events(
    db: &mut Db<'_, '_>,
    event_id: &str,
    provider: Option<&str>,
) -> Result<Vec<EventDetail>, StoreError> {
    db.query(
        concat!(
            "SELECT ",
            summary_columns!(),
            ", payment_intent_id, payload, headers FROM processed_events
         WHERE event_id = $1 AND ($2::text IS NULL OR provider = $2::text) ORDER BY provider"
        ),
        &[&event_id, &provider],
    )?
    .iter()
    .map(|row| {
        Ok(EventDetail {
            summary: summary(row)?,
            payment_intent_id: get(row, 8)?,
            payload: get(row, 9)?,
            headers: get(row, 10)?,
        })
    })
    .collect()
}

/// An order's status, for tests and inspection.
pub fn order_status(db: &mut Db<'_, '_>, order_id: &str) -> Result<Option<String>, StoreError> {
    db.query_opt(
        "SELECT status FROM orders WHERE order_id = $1",
        &[&order_id],
    )?
    .map(|row| get(&row, 0))
    .transpose()
}

/// The rows of one load-generator run: every id of a run contains its marker.
pub fn run_counts(db: &mut Db<'_, '_>, marker: &str) -> Result<RunCounts, StoreError> {
    // SQLite's LIKE, exactly: case-insensitive for ASCII letters only (ILIKE on these COLLATE
    // "C" columns), `%` and `_` wildcards, and no escape character (PostgreSQL's default one,
    // `\`, is turned off). A marker is `bench_` and hex digits then `_`, whose `_`s match any
    // character on both engines.
    let pattern = format!("%{marker}%");
    let mut count = |sql: &'static str| -> Result<i64, StoreError> {
        let row = db.query_one(sql, &[&pattern])?;
        get(&row, 0)
    };
    Ok(RunCounts {
        events: count("SELECT count(*) FROM processed_events WHERE event_id ILIKE $1 ESCAPE ''")?,
        orders: count("SELECT count(*) FROM orders WHERE order_id ILIKE $1 ESCAPE ''")?,
        emails: count("SELECT count(*) FROM email_outbox WHERE order_id ILIKE $1 ESCAPE ''")?,
        orders_emailed: count(
            "SELECT count(DISTINCT order_id) FROM email_outbox WHERE order_id ILIKE $1 ESCAPE ''",
        )?,
    })
}

/// Each outbox's backlog as of `now_ms` (see [`crate::store::Store::outbox_backlog`]).
pub fn outbox_backlog(
    db: &mut Db<'_, '_>,
    now_ms: i64,
) -> Result<[(OutboxKind, OutboxBacklog); 2], StoreError> {
    let now = crate::clock::iso_millis(now_ms);
    let mut read = |kind: OutboxKind, sql: &'static str| -> Result<_, StoreError> {
        let row = db.query_one(sql, &[&now])?;
        let oldest: Option<String> = get(&row, 2)?;
        Ok((
            kind,
            OutboxBacklog::at(get(&row, 0)?, get(&row, 1)?, oldest.as_deref(), now_ms),
        ))
    };
    Ok([
        read(
            OutboxKind::Email,
            "SELECT (SELECT count(*) FROM email_outbox WHERE status = 'pending'),
                    (SELECT count(*) FROM email_outbox WHERE status = 'dead'),
                    (SELECT min(next_attempt_at) FROM email_outbox
                     WHERE status = 'pending' AND next_attempt_at <= $1::text)",
        )?,
        read(
            OutboxKind::Forward,
            "SELECT (SELECT count(*) FROM forward_outbox WHERE status = 'pending'),
                    (SELECT count(*) FROM forward_outbox WHERE status = 'dead'),
                    (SELECT min(next_attempt_at) FROM forward_outbox
                     WHERE status = 'pending' AND next_attempt_at <= $1::text)",
        )?,
    ])
}
