//! Moving a whole database from one engine to another (`sekali copy`, and `sekali backup` of a
//! PostgreSQL database into a SQLite file): every table, every row, every column, from one
//! consistent snapshot of the source into a new, empty target, in one transaction there, with
//! each table's row count checked.
//!
//! The engines meet in [`Cell`]s (every column sekali stores is an integer or text) and in
//! [`TABLES`]: the tables and columns both schemas share, named alike. Each engine reads them
//! ([`Maintenance::export`]) and writes them ([`Import`]) with SQL of its own.

use std::path::Path;

use super::{Location, Maintenance, StoreError};
use crate::store::model::BackupReport;

/// One stored value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cell {
    Null,
    Int(i64),
    Text(String),
}

/// What receives the rows of an export: `visit(table, row)`, `table` an index into [`TABLES`].
pub type Visit<'v> = &'v mut (dyn FnMut(usize, &[Cell]) -> Result<(), StoreError> + Send);

/// sekali's tables, parents before the tables whose foreign keys name them, each with the
/// columns both engines give it. `processed_events` starts with `rowid`, its arrival order
/// (SQLite's implicit rowid; an identity column on PostgreSQL), so that listings come out in
/// the same order after a copy.
pub const TABLES: &[(&str, &[&str])] = &[
    (
        "processed_events",
        &[
            "rowid",
            "provider",
            "event_id",
            "event_type",
            "order_id",
            "outcome",
            "received_at",
            "expires_at",
            "payment_intent_id",
            "payload",
            "parked_event",
            "headers",
        ],
    ),
    (
        "orders",
        &[
            "order_id",
            "provider",
            "status",
            "amount",
            "refunded_amount",
            "currency",
            "customer_email",
            "payment_intent_id",
            "created_at",
            "updated_at",
            "last_event_id",
            "source",
            "metadata",
            "paid_amount",
            "paid_currency",
            "amount_exponent",
            "payer_email",
            "review_reason",
            "operator_status",
            "operator_money",
            "acknowledged",
            "announced_returned",
        ],
    ),
    (
        "order_transitions",
        &[
            "id",
            "order_id",
            "from_status",
            "to_status",
            "refunded_amount",
            "provider",
            "event_id",
            "changed_at",
            "actor",
            "reason",
            "sequence",
            "amount",
            "currency",
        ],
    ),
    (
        "payments",
        &[
            "provider",
            "payment_ref",
            "order_id",
            "currency",
            "requested",
            "expected",
            "authorized",
            "captured",
            "captured_at",
            "released",
            "released_as_refunds",
            "attempt",
            "attempt_at",
            "undone",
            "refunded_reported",
            "refunded_reported_at",
            "returned",
            "withdrawn",
            "refund_count",
            "dispute_count",
            "created_at",
            "updated_at",
        ],
    ),
    (
        "payment_refunds",
        &[
            "provider",
            "payment_ref",
            "refund_id",
            "amount",
            "state",
            "failed_at",
        ],
    ),
    (
        "payment_disputes",
        &[
            "provider",
            "payment_ref",
            "dispute_id",
            "amount",
            "stage",
            "withdrawn",
            "reinstated",
        ],
    ),
    ("payment_aliases", &["provider", "alias", "payment_ref"]),
    ("pending_work", &["name"]),
    (
        "email_outbox",
        &[
            "id",
            "order_id",
            "recipient",
            "template",
            "params",
            "idempotency_key",
            "status",
            "attempts",
            "created_at",
            "event_id",
            "next_attempt_at",
            "lease_owner",
            "lease_until",
            "last_error",
            "sent_at",
            "first_tried_at",
        ],
    ),
    ("forward_state", &["only_row", "since"]),
    (
        "forward_outbox",
        &[
            "id",
            "change_id",
            "order_id",
            "status",
            "attempts",
            "created_at",
            "next_attempt_at",
            "lease_owner",
            "lease_until",
            "last_error",
            "sent_at",
            "first_tried_at",
        ],
    ),
    (
        "outbox_attempts",
        &["id", "outbox", "row_id", "at", "relay", "result", "error"],
    ),
    ("console_logouts", &["session", "expires_at"]),
    (
        "idempotency_keys",
        &[
            "client",
            "key",
            "fingerprint",
            "status",
            "response_status",
            "response_body",
            "response_content_type",
            "created_at",
            "expires_at",
        ],
    ),
];

/// A new, empty database being filled, in one open transaction.
pub trait Import: Send {
    /// Adds `row` (the columns of `TABLES[table]`, in order).
    fn insert(&mut self, table: usize, row: &[Cell]) -> Result<(), StoreError>;

    /// Commits, makes the copy durable, and returns each table's row count as the target
    /// counts it.
    fn finish(self: Box<Self>) -> Result<Vec<i64>, StoreError>;
}

/// What a copy moved: each table's name and rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyReport {
    pub tables: Vec<(&'static str, i64)>,
}

impl CopyReport {
    fn rows_of(&self, table: &str) -> i64 {
        self.tables
            .iter()
            .find(|(name, _)| *name == table)
            .map_or(0, |(_, rows)| *rows)
    }
}

/// Copies `source` into the new database at `to`, which must not hold sekali's data yet: a
/// SQLite file that does not exist, or a PostgreSQL database whose tables are empty.
pub fn copy(source: &dyn Maintenance, to: &Location) -> Result<CopyReport, StoreError> {
    let target = match to {
        Location::File(path) => super::sqlite::copy::create(path)?,
        Location::Server(url) => {
            super::postgres::copy::create(&super::postgres::Target::parse(url)?)?
        }
    };
    copy_into(source, target)
}

fn copy_into(
    source: &dyn Maintenance,
    mut target: Box<dyn Import>,
) -> Result<CopyReport, StoreError> {
    let mut exported = vec![0_i64; TABLES.len()];
    source.export(&mut |table, row| {
        exported[table] += 1;
        target.insert(table, row)
    })?;
    let imported = target.finish()?;
    let tables: Vec<(&'static str, i64)> = TABLES
        .iter()
        .zip(&imported)
        .map(|((name, _), rows)| (*name, *rows))
        .collect();
    for ((name, copied), read) in tables.iter().zip(&exported) {
        if copied != read {
            return Err(StoreError::Integrity(format!(
                "{name}: {read} rows read from the source, {copied} in the copy"
            )));
        }
    }
    Ok(CopyReport { tables })
}

/// Where a backup may go: nowhere that exists (a backup never overwrites), in a directory that
/// does.
pub(crate) fn check_backup_path(out: &Path) -> Result<(), StoreError> {
    if out.exists() {
        return Err(StoreError::Exists(out.display().to_string()));
    }
    match out.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) if !dir.is_dir() => Err(StoreError::BackupOut {
            path: out.display().to_string(),
            reason: format!("the directory {} does not exist", dir.display()),
        }),
        _ => Ok(()),
    }
}

/// `sekali backup` of a database that is not a SQLite file: a copy into a new SQLite file at
/// `out` (which `sekali --db OUT` and `sqlite3` open), written beside it and renamed into
/// place once whole, so that `out` is a whole copy or absent.
pub fn backup_to_file(source: &dyn Maintenance, out: &Path) -> Result<BackupReport, StoreError> {
    check_backup_path(out)?;
    let out_error = |reason: String| StoreError::BackupOut {
        path: out.display().to_string(),
        reason,
    };
    let partial = out.with_extension("partial");
    let _ = std::fs::remove_file(&partial);
    let copied = copy(source, &Location::File(partial.clone())).and_then(|report| {
        let pages = super::sqlite::copy::page_count(&partial)?;
        std::fs::rename(&partial, out)
            .map_err(|e| out_error(format!("renaming the copy into place: {e}")))?;
        crate::durable::sync_parent(out)
            .map_err(|e| out_error(format!("syncing its directory: {e}")))?;
        Ok(BackupReport {
            pages,
            processed_events: report.rows_of("processed_events"),
            orders: report.rows_of("orders"),
        })
    });
    if copied.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    copied
}
