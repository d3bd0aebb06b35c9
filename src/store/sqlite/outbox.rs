//! The email outbox as the relay sees it: lease-based claims and recorded results.
//!
//! A relay claims due rows by setting its lease in one statement; a row whose lease ran out
//! (its relay died) is due again. Results are recorded only while the relay still holds the
//! row's lease, so two relays never both record a row: the lease is longer than the transport
//! timeout, and a relay that overran its lease finds its update refused.

use crate::store::model::{
    ClaimRequest, Claimed, ClaimedEmail, OutboxKind, OutboxQuery, OutboxRow, Retried, SendOutcome,
    SendResult, Skipped,
};
use rusqlite::{params, Connection, OptionalExtension};

use super::reads::Filters;
use super::StoreError;
use crate::clock::{iso_millis, iso_seconds};

pub(super) fn in_write_transaction<T>(
    conn: &Connection,
    work: impl FnOnce() -> rusqlite::Result<T>,
) -> Result<T, StoreError> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    match work() {
        Ok(value) => {
            conn.execute_batch("COMMIT")?;
            Ok(value)
        }
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e.into())
        }
    }
}

/// Claims due rows of the outbox `request` names inside the caller's transaction (the writer's
/// batch, for the relays inside `serve`).
pub fn claim_due_in_transaction(
    conn: &Connection,
    request: &ClaimRequest,
    now_ms: i64,
) -> rusqlite::Result<Claimed> {
    Ok(match request.outbox {
        OutboxKind::Email => Claimed::Emails(claim_emails(conn, request, now_ms)?),
        OutboxKind::Forward => Claimed::Forwards(super::forward::claim_due(conn, request, now_ms)?),
    })
}

/// Claims due emails. One UPDATE claims them all.
fn claim_emails(
    conn: &Connection,
    request: &ClaimRequest,
    now_ms: i64,
) -> rusqlite::Result<Vec<ClaimedEmail>> {
    let now = iso_millis(now_ms);
    let mut claimed: Vec<ClaimedEmail> = conn
        .prepare_cached(
            "UPDATE email_outbox SET lease_owner = ?1, lease_until = ?2
             WHERE id IN (SELECT id FROM email_outbox
                          WHERE status = 'pending' AND next_attempt_at <= ?3
                            AND (lease_until IS NULL OR lease_until <= ?3)
                          ORDER BY next_attempt_at, id LIMIT ?4)
             RETURNING id, order_id, recipient, template, params, idempotency_key, attempts,
                       unixepoch(first_tried_at) * 1000",
        )?
        .query_map(
            params![
                request.owner,
                iso_millis(now_ms + request.lease_ms),
                now,
                request.limit as i64
            ],
            |row| {
                Ok(ClaimedEmail {
                    id: row.get(0)?,
                    order_id: row.get(1)?,
                    recipient: row.get(2)?,
                    template: row.get(3)?,
                    params: row.get(4)?,
                    idempotency_key: row.get(5)?,
                    attempts: row.get(6)?,
                    first_tried_ms: row.get(7)?,
                    locale: None,
                })
            },
        )?
        .collect::<rusqlite::Result<_>>()?;
    // Only a text locale counts: an order's metadata is the shop's JSON, and one row's odd value
    // must not fail the claim of every row behind it (before this, a `"locale": 5` stopped all
    // email).
    let mut locale = conn.prepare_cached(
        "SELECT CASE WHEN json_type(metadata, '$.locale') = 'text'
                     THEN json_extract(metadata, '$.locale') END
         FROM orders WHERE order_id = ?1 AND json_valid(metadata)",
    )?;
    for email in &mut claimed {
        email.locale = locale
            .query_row([&email.order_id], |row| row.get::<_, Option<String>>(0))
            .optional()?
            .flatten();
    }
    claimed.sort_by_key(|e| e.id);
    Ok(claimed)
}

/// Records every result of a relay's batch inside the caller's transaction: one commit (and one
/// fsync) for the batch, not one per row. A result is recorded only while `owner` still holds
/// the row's lease; the answer says, per result, whether it was (false: the lease ran out and
/// another relay may have the row).
pub fn record_results_in_transaction(
    conn: &Connection,
    outbox: OutboxKind,
    owner: &str,
    results: &[SendResult],
    now_ms: i64,
) -> rusqlite::Result<Vec<bool>> {
    // Tests (`failpoints`): recording a batch of results fails, as a statement of it would.
    fail::fail_point!("store::outbox_results", |_| Err(
        rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
            Some("fault injected at store::outbox_results".into()),
        )
    ));
    let now = iso_millis(now_ms);
    let table = outbox.table();
    let mut sent = conn.prepare_cached(&format!(
        "UPDATE {table} SET status = 'sent', attempts = attempts + 1, sent_at = ?3,
                first_tried_at = coalesce(first_tried_at, ?3),
                next_attempt_at = NULL, lease_owner = NULL, lease_until = NULL, last_error = NULL
         WHERE id = ?1 AND status = 'pending' AND lease_owner = ?2 AND lease_until > ?3"
    ))?;
    let mut failed = conn.prepare_cached(&format!(
        "UPDATE {table} SET attempts = attempts + ?6, last_error = ?4,
                first_tried_at = CASE WHEN ?6 > 0 THEN coalesce(first_tried_at, ?3)
                                      ELSE first_tried_at END,
                status = CASE WHEN ?5 IS NULL THEN 'dead' ELSE 'pending' END,
                next_attempt_at = ?5, lease_owner = NULL, lease_until = NULL
         WHERE id = ?1 AND status = 'pending' AND lease_owner = ?2 AND lease_until > ?3"
    ))?;
    let mut skipped = conn.prepare_cached(&format!(
        "UPDATE {table} SET status = 'skipped', next_attempt_at = NULL, lease_owner = NULL,
                lease_until = NULL, last_error = 'no recipient address'
         WHERE id = ?1 AND status = 'pending' AND lease_owner = ?2 AND lease_until > ?3"
    ))?;
    let mut attempt = conn.prepare_cached(
        "INSERT INTO outbox_attempts (outbox, row_id, at, relay, result, error)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?;
    results
        .iter()
        .map(|result| {
            let changed = match &result.outcome {
                SendOutcome::Sent => sent.execute(params![result.id, owner, now])?,
                SendOutcome::Failed { error, retry_at_ms } => failed.execute(params![
                    result.id,
                    owner,
                    now,
                    error,
                    retry_at_ms.map(iso_millis),
                    1
                ])?,
                SendOutcome::Untried { error, retry_at_ms } => failed.execute(params![
                    result.id,
                    owner,
                    now,
                    error,
                    retry_at_ms.map(iso_millis),
                    0
                ])?,
                SendOutcome::Skipped => skipped.execute(params![result.id, owner, now])?,
            };
            if changed == 1 {
                let (what, error) = result.outcome.attempt();
                attempt.execute(params![outbox.label(), result.id, now, owner, what, error])?;
            }
            Ok(changed == 1)
        })
        .collect()
}

/// `sekali outbox retry` (see [`Retried`]), in one write transaction. Times are fixed-width
/// text here, compared as text, as the claim compares them.
pub fn retry(
    conn: &Connection,
    outbox: OutboxKind,
    id: i64,
    now_ms: i64,
) -> Result<Retried, StoreError> {
    let table = outbox.table();
    let now = iso_millis(now_ms);
    in_write_transaction(conn, || {
        let row = conn
            .prepare_cached(&format!(
                "SELECT status, next_attempt_at, attempts, lease_owner, lease_until
                 FROM {table} WHERE id = ?1"
            ))?
            .query_row([id], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, Option<String>>(1)?,
                    row.get::<_, i64>(2)?,
                    row.get::<_, Option<String>>(3)?,
                    row.get::<_, Option<String>>(4)?,
                ))
            })
            .optional()?;
        let Some((status, next_attempt_at, attempts, lease_owner, lease_until)) = row else {
            return Ok(Retried::Missing);
        };
        match (status.as_str(), lease_owner, lease_until) {
            ("dead", _, _) => {
                conn.prepare_cached(&format!(
                    "UPDATE {table} SET status = 'pending', attempts = 0, next_attempt_at = ?2,
                            lease_owner = NULL, lease_until = NULL, first_tried_at = NULL
                     WHERE id = ?1"
                ))?
                .execute(params![id, now])?;
                Ok(Retried::Revived)
            }
            ("pending", Some(owner), Some(until)) if until > now => {
                Ok(Retried::Leased { owner, until })
            }
            ("pending", _, _) => {
                // A row already due keeps its time, and so its place in the claims' order; a
                // lease that ran out (its relay died) is cleared.
                conn.prepare_cached(&format!(
                    "UPDATE {table} SET next_attempt_at = min(coalesce(next_attempt_at, ?2), ?2),
                            lease_owner = NULL, lease_until = NULL
                     WHERE id = ?1"
                ))?
                .execute(params![id, now])?;
                Ok(Retried::DueNow {
                    was: next_attempt_at.unwrap_or(now),
                    attempts,
                })
            }
            _ => Ok(Retried::Finished { status }),
        }
    })
}

const ROW_COLUMNS: &str =
    "id, order_id, recipient, template, status, attempts, idempotency_key, created_at, \
                           next_attempt_at, lease_owner, lease_until, last_error, sent_at, params, first_tried_at";

fn outbox_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<OutboxRow> {
    Ok(OutboxRow {
        id: row.get(0)?,
        order_id: row.get(1)?,
        recipient: row.get(2)?,
        template: row.get(3)?,
        status: row.get(4)?,
        attempts: row.get(5)?,
        idempotency_key: row.get(6)?,
        created_at: row.get(7)?,
        next_attempt_at: row.get(8)?,
        lease_owner: row.get(9)?,
        lease_until: row.get(10)?,
        last_error: row.get(11)?,
        sent_at: row.get(12)?,
        params: row.get(13)?,
        first_tried_at: row.get(14)?,
    })
}

/// The rows that match `query`, newest first.
pub fn list(conn: &Connection, query: &OutboxQuery) -> rusqlite::Result<Vec<OutboxRow>> {
    let mut filters = Filters::default();
    filters.add("status = ?", query.status.clone());
    filters.add("order_id = ?", query.order_id.clone());
    filters.add("created_at >= ?", query.since_unix.map(iso_seconds));
    conn.prepare(&format!(
        "SELECT {ROW_COLUMNS} FROM email_outbox {} ORDER BY id DESC LIMIT ?",
        filters.sql()
    ))?
    .query_map(
        rusqlite::params_from_iter(filters.values_then(query.limit)),
        outbox_row,
    )?
    .collect()
}

pub fn get(conn: &Connection, id: i64) -> rusqlite::Result<Option<OutboxRow>> {
    conn.prepare(&format!(
        "SELECT {ROW_COLUMNS} FROM email_outbox WHERE id = ?1"
    ))?
    .query_row([id], outbox_row)
    .optional()
}

/// `sekali outbox skip` and `sekali forward skip`: a pending or dead row is skipped (never sent), which lets its order's
/// later changes go; unless a relay holds it right now. One write transaction.
pub fn skip(
    conn: &Connection,
    outbox: OutboxKind,
    id: i64,
    now_ms: i64,
) -> Result<Skipped, StoreError> {
    let table = outbox.table();
    let now = iso_millis(now_ms);
    in_write_transaction(conn, || {
        let row = conn
            .prepare_cached(&format!(
                "SELECT status, lease_owner, lease_until FROM {table} WHERE id = ?1"
            ))?
            .query_row([id], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, Option<String>>(1)?,
                    row.get::<_, Option<String>>(2)?,
                ))
            })
            .optional()?;
        let Some((status, owner, until)) = row else {
            return Ok(Skipped::Missing);
        };
        match (status.as_str(), owner, until) {
            ("pending", Some(owner), Some(until)) if until > now => {
                Ok(Skipped::Leased { owner, until })
            }
            ("pending" | "dead", _, _) => {
                conn.prepare_cached(
                    &format!("UPDATE {table} SET status = 'skipped', next_attempt_at = NULL,
                            lease_owner = NULL, lease_until = NULL,
                            last_error = coalesce(last_error || '; ', '') || 'skipped by an operator at ' || ?2
                     WHERE id = ?1"),
                )?
                .execute(params![id, now])?;
                Ok(Skipped::Skipped { was: status })
            }
            _ => Ok(Skipped::Finished { status }),
        }
    })
}
