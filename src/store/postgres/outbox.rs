//! The email outbox as the relay sees it: lease-based claims and recorded results.
//!
//! A relay claims due rows by setting its lease in one statement; a row whose lease ran out
//! (its relay died) is due again. Results are recorded only while the relay still holds the
//! row's lease, so two relays never both record a row: the lease is longer than the transport
//! timeout, and a relay that overran its lease finds its update refused.
//!
//! Several instances share the database, so the claim locks the rows it takes and skips those
//! another instance is claiming (`FOR UPDATE SKIP LOCKED`): two relays never claim one row.

use postgres::Row;

use super::reads::{params, Filters};
use super::{Db, StoreError};
use crate::clock::{iso_millis, iso_seconds};
use crate::store::model::{
    ClaimRequest, Claimed, ClaimedEmail, OutboxKind, OutboxQuery, OutboxRow, Retried, SendOutcome,
    SendResult, Skipped,
};

/// Claims due rows of the outbox `request` names inside the caller's transaction (the writer's
/// batch, for the relays inside `serve`).
pub fn claim_due_in_transaction(
    db: &mut Db<'_, '_>,
    request: &ClaimRequest,
    now_ms: i64,
) -> Result<Claimed, StoreError> {
    Ok(match request.outbox {
        OutboxKind::Email => Claimed::Emails(claim_emails(db, request, now_ms)?),
        OutboxKind::Forward => Claimed::Forwards(super::forward::claim_due(db, request, now_ms)?),
    })
}

/// Claims due emails. One UPDATE claims them all.
fn claim_emails(
    db: &mut Db<'_, '_>,
    request: &ClaimRequest,
    now_ms: i64,
) -> Result<Vec<ClaimedEmail>, StoreError> {
    let now = iso_millis(now_ms);
    // FOR UPDATE SKIP LOCKED: a relay on another instance claiming at the same moment holds the
    // rows it picked until it commits; this claim skips them instead of waiting and then taking
    // them again (READ COMMITTED would re-read them, leased, and drop them, but only after
    // waiting), so two instances never claim one row and neither waits for the other. A row
    // locked for another reason (a result being recorded, an operator's retry) is skipped for
    // this claim and due for the next one.
    let rows = db.query(
        "UPDATE email_outbox SET lease_owner = $1, lease_until = $2
         WHERE id IN (SELECT id FROM email_outbox
                      WHERE status = 'pending' AND next_attempt_at <= $3::text
                        AND (lease_until IS NULL OR lease_until <= $3::text)
                      ORDER BY next_attempt_at, id LIMIT $4::bigint
                      FOR UPDATE SKIP LOCKED)
         RETURNING id, order_id, recipient, template, params, idempotency_key, attempts,
                   (floor(extract(epoch FROM first_tried_at::timestamptz)) * 1000)::bigint,
                   (SELECT metadata FROM orders WHERE orders.order_id = email_outbox.order_id)",
        &[
            &request.owner,
            &iso_millis(now_ms + request.lease_ms),
            &now,
            &(request.limit as i64),
        ],
    )?;
    // Only a text locale counts: an order's metadata is the shop's JSON, and one row's odd value
    // must not fail the claim of every row behind it (before this, a `"locale": 5` stopped all
    // email). SQLite read it with json_extract; here serde_json reads it, with the same answer:
    // none for no metadata, metadata that is not JSON, not an object, or a locale that is not a
    // string.
    let mut claimed = rows
        .iter()
        .map(|row| {
            let metadata: Option<String> = super::get(row, 8)?;
            Ok(ClaimedEmail {
                id: super::get(row, 0)?,
                order_id: super::get(row, 1)?,
                recipient: super::get(row, 2)?,
                template: super::get(row, 3)?,
                params: super::get(row, 4)?,
                idempotency_key: super::get(row, 5)?,
                attempts: super::get(row, 6)?,
                first_tried_ms: super::get(row, 7)?,
                locale: metadata.as_deref().and_then(locale_of),
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    claimed.sort_by_key(|e| e.id);
    Ok(claimed)
}

/// The `locale` member of an order's metadata when it is a string, as SQLite's
/// `CASE WHEN json_type(metadata, '$.locale') = 'text' THEN json_extract(metadata, '$.locale')
/// END ... AND json_valid(metadata)` read it.
fn locale_of(metadata: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(metadata).ok()?;
    value.get("locale")?.as_str().map(str::to_owned)
}

/// Every result of a relay's batch as ONE statement on `$table` (one round trip, where a
/// statement per result cost one each): each row updated only while the relay (`$2`) holds its
/// lease, and its attempt recorded in `outbox_attempts` in the same statement, only when it was.
/// Parameters: `$1` the outbox's label, `$2` the relay, `$3` now; then one array each, a result
/// an element: `$4` the row, `$5` its new status, `$6` the tries it counts (1 or 0), `$7` when it
/// is due again (none: done or dead), `$8` its error (the row's `last_error` and the attempt's),
/// `$9` the attempt's result. The results are given in id order, which the join follows when it
/// walks the arrays (the plan for a batch); two relays that both hold a result for one row (a
/// lease that ran out in between) that deadlock anyway are rerun as any conflict is.
/// Returns the ids recorded.
macro_rules! results_sql {
    ($table:literal) => {
        concat!(
            "WITH changed AS (
                 UPDATE ",
            $table,
            " AS o SET status = r.status, attempts = o.attempts + r.tried,
                     sent_at = CASE WHEN r.status = 'sent' THEN $3::text ELSE o.sent_at END,
                     first_tried_at = CASE WHEN r.tried > 0 THEN coalesce(o.first_tried_at, $3::text)
                                           ELSE o.first_tried_at END,
                     next_attempt_at = r.retry_at, lease_owner = NULL, lease_until = NULL,
                     last_error = r.error
                 FROM unnest($4::bigint[], $5::text[], $6::bigint[], $7::text[], $8::text[],
                             $9::text[]) WITH ORDINALITY
                      AS r (id, status, tried, retry_at, error, result, n)
                 WHERE o.id = r.id AND o.status = 'pending' AND o.lease_owner = $2::text
                   AND o.lease_until > $3::text
                 RETURNING o.id, r.result, r.error, r.n)
             INSERT INTO outbox_attempts (outbox, row_id, at, relay, result, error)
             SELECT $1::text, id, $3::text, $2::text, result, error FROM changed ORDER BY n
             RETURNING row_id"
        )
    };
}

static EMAIL_RESULTS: &str = results_sql!("email_outbox");
static FORWARD_RESULTS: &str = results_sql!("forward_outbox");

/// `sekali outbox retry`'s statements on `$table`: look (locked), revive, make due.
macro_rules! retry_sql {
    ($table:literal) => {
        [
            concat!(
                "SELECT status, next_attempt_at, attempts, lease_owner, lease_until
         FROM ",
                $table,
                " WHERE id = $1 FOR UPDATE"
            ),
            concat!(
                "UPDATE ",
                $table,
                " SET status = 'pending', attempts = 0, next_attempt_at = $2::text,
                        lease_owner = NULL, lease_until = NULL, first_tried_at = NULL
                 WHERE id = $1"
            ),
            concat!(
                "UPDATE ",
                $table,
                " SET next_attempt_at = LEAST(coalesce(next_attempt_at, $2::text), $2::text),
                        lease_owner = NULL, lease_until = NULL
                 WHERE id = $1"
            ),
        ]
    };
}

static EMAIL_RETRY: [&str; 3] = retry_sql!("email_outbox");
static FORWARD_RETRY: [&str; 3] = retry_sql!("forward_outbox");

/// Records every result of a relay's batch inside the caller's transaction: one commit (and one
/// fsync) for the batch, not one per row. A result is recorded only while `owner` still holds
/// the row's lease; the answer says, per result, whether it was (false: the lease ran out and
/// another relay may have the row).
pub fn record_results_in_transaction(
    db: &mut Db<'_, '_>,
    outbox: OutboxKind,
    owner: &str,
    results: &[SendResult],
    now_ms: i64,
) -> Result<Vec<bool>, StoreError> {
    // Tests (`failpoints`): recording a batch of results fails, as a statement of it would.
    fail::fail_point!("store::outbox_results", |_| Err(StoreError::Injected(
        "store::outbox_results"
    )));
    let now = iso_millis(now_ms);
    // The UPDATE checks the lease on each row's latest version (READ COMMITTED re-reads a row
    // another transaction changed before updating it), so a result whose lease another
    // instance's claim took over meanwhile changes nothing.
    let statement = match outbox {
        OutboxKind::Email => EMAIL_RESULTS,
        OutboxKind::Forward => FORWARD_RESULTS,
    };
    // A row given twice is recorded once, by its first result, as if each ran alone (the second
    // would find the lease given up).
    let mut seen = std::collections::HashSet::new();
    let mut ordered: Vec<&SendResult> = results.iter().filter(|r| seen.insert(r.id)).collect();
    if ordered.is_empty() {
        return Ok(Vec::new());
    }
    ordered.sort_by_key(|result| result.id);
    let mut rows = ResultRows::default();
    for result in ordered {
        let (what, error) = result.outcome.attempt();
        let (status, tried, retry_at) = match &result.outcome {
            SendOutcome::Sent => ("sent", 1, None),
            SendOutcome::Failed { retry_at_ms, .. } | SendOutcome::Untried { retry_at_ms, .. } => (
                if retry_at_ms.is_some() {
                    "pending"
                } else {
                    "dead"
                },
                i64::from(matches!(result.outcome, SendOutcome::Failed { .. })),
                retry_at_ms.map(iso_millis),
            ),
            SendOutcome::Skipped => ("skipped", 0, None),
        };
        rows.id.push(result.id);
        rows.status.push(status);
        rows.tried.push(tried);
        rows.retry_at.push(retry_at);
        rows.error.push(error);
        rows.result.push(what);
    }
    let recorded = db
        .query(
            statement,
            &[
                &outbox.label(),
                &owner,
                &now,
                &rows.id,
                &rows.status,
                &rows.tried,
                &rows.retry_at,
                &rows.error,
                &rows.result,
            ],
        )?
        .iter()
        .map(|row| super::get::<i64>(row, 0))
        .collect::<Result<std::collections::HashSet<i64>, StoreError>>()?;
    let mut answered = std::collections::HashSet::new();
    Ok(results
        .iter()
        .map(|result| recorded.contains(&result.id) && answered.insert(result.id))
        .collect())
}

/// The columns of [`results_sql`]'s arrays, one element a result.
#[derive(Default)]
struct ResultRows<'a> {
    id: Vec<i64>,
    status: Vec<&'static str>,
    tried: Vec<i64>,
    retry_at: Vec<Option<String>>,
    error: Vec<Option<&'a str>>,
    result: Vec<&'static str>,
}

/// `sekali outbox retry` (see [`Retried`]), in the caller's transaction (SQLite opened its own
/// write transaction): the caller commits it. Times are fixed-width text here, compared as
/// text, as the claim compares them.
pub fn retry(
    db: &mut Db<'_, '_>,
    outbox: OutboxKind,
    id: i64,
    now_ms: i64,
) -> Result<Retried, StoreError> {
    let now = iso_millis(now_ms);
    let [look, revive, due_now] = match outbox {
        OutboxKind::Email => &EMAIL_RETRY,
        OutboxKind::Forward => &FORWARD_RETRY,
    };
    // FOR UPDATE: SQLite's write transaction kept every relay out between this read and the
    // update below. Here a relay on another instance could claim the row (or record its
    // result) in between: the update would then clear a lease just taken (two relays sending
    // one email) or revive a row just sent. Locked, a claim in progress is waited for and then
    // read as it committed, and a claim after this one skips the row until the commit.
    let row = db.query_opt(look, &[&id])?;
    let Some(row) = row else {
        return Ok(Retried::Missing);
    };
    let status: String = super::get(&row, 0)?;
    let next_attempt_at: Option<String> = super::get(&row, 1)?;
    let attempts: i64 = super::get(&row, 2)?;
    let lease_owner: Option<String> = super::get(&row, 3)?;
    let lease_until: Option<String> = super::get(&row, 4)?;
    match (status.as_str(), lease_owner, lease_until) {
        ("dead", _, _) => {
            db.execute(revive, &[&id, &now])?;
            Ok(Retried::Revived)
        }
        ("pending", Some(owner), Some(until)) if until > now => {
            Ok(Retried::Leased { owner, until })
        }
        ("pending", _, _) => {
            // A row already due keeps its time, and so its place in the claims' order; a
            // lease that ran out (its relay died) is cleared.
            db.execute(due_now, &[&id, &now])?;
            Ok(Retried::DueNow {
                was: next_attempt_at.unwrap_or(now),
                attempts,
            })
        }
        _ => Ok(Retried::Finished { status }),
    }
}

/// The columns [`outbox_row`] reads. A macro, so that statements stay `&'static str` literals.
macro_rules! row_columns {
    () => {
        "id, order_id, recipient, template, status, attempts, idempotency_key, created_at, \
         next_attempt_at, lease_owner, lease_until, last_error, sent_at, params, first_tried_at"
    };
}

fn outbox_row(row: &Row) -> Result<OutboxRow, StoreError> {
    Ok(OutboxRow {
        id: super::get(row, 0)?,
        order_id: super::get(row, 1)?,
        recipient: super::get(row, 2)?,
        template: super::get(row, 3)?,
        status: super::get(row, 4)?,
        attempts: super::get(row, 5)?,
        idempotency_key: super::get(row, 6)?,
        created_at: super::get(row, 7)?,
        next_attempt_at: super::get(row, 8)?,
        lease_owner: super::get(row, 9)?,
        lease_until: super::get(row, 10)?,
        last_error: super::get(row, 11)?,
        sent_at: super::get(row, 12)?,
        params: super::get(row, 13)?,
        first_tried_at: super::get(row, 14)?,
    })
}

/// The rows that match `query`, newest first.
pub fn list(db: &mut Db<'_, '_>, query: &OutboxQuery) -> Result<Vec<OutboxRow>, StoreError> {
    let mut filters = Filters::default();
    filters.add("status = ?", query.status.clone());
    filters.add("order_id = ?", query.order_id.clone());
    filters.add("created_at >= ?", query.since_unix.map(iso_seconds));
    let sql = format!(
        concat!(
            "SELECT ",
            row_columns!(),
            " FROM email_outbox {} ORDER BY id DESC LIMIT {}"
        ),
        filters.sql(),
        filters.last_placeholder()
    );
    let values = filters.values_then(i64::from(query.limit));
    db.query_built(&sql, &params(&values))?
        .iter()
        .map(outbox_row)
        .collect()
}

pub fn get(db: &mut Db<'_, '_>, id: i64) -> Result<Option<OutboxRow>, StoreError> {
    db.query_opt(
        concat!(
            "SELECT ",
            row_columns!(),
            " FROM email_outbox WHERE id = $1"
        ),
        &[&id],
    )?
    .map(|row| outbox_row(&row))
    .transpose()
}

/// [`skip`]'s statements for one outbox table: the look (locked), and the skip.
macro_rules! skip_statements {
    ($table:literal) => {
        [
            concat!("SELECT status, lease_owner, lease_until FROM ", $table, " WHERE id = $1 FOR UPDATE"),
            concat!(
                "UPDATE ", $table, " SET status = 'skipped', next_attempt_at = NULL,
                        lease_owner = NULL, lease_until = NULL,
                        last_error = coalesce(last_error || '; ', '') || 'skipped by an operator at ' || $2::text
                 WHERE id = $1"
            ),
        ]
    };
}

const EMAIL_SKIP: [&str; 2] = skip_statements!("email_outbox");
const FORWARD_SKIP: [&str; 2] = skip_statements!("forward_outbox");

/// `sekali outbox skip` and `sekali forward skip`, in the caller's transaction: a pending or dead row is skipped (never
/// sent), which lets its order's later changes go; unless a relay holds it right now. Locked
/// first, so a claim on another instance in between is waited for and then seen.
pub fn skip(
    db: &mut Db<'_, '_>,
    outbox: OutboxKind,
    id: i64,
    now_ms: i64,
) -> Result<Skipped, StoreError> {
    let now = iso_millis(now_ms);
    let [look, skip] = match outbox {
        OutboxKind::Email => &EMAIL_SKIP,
        OutboxKind::Forward => &FORWARD_SKIP,
    };
    let Some(row) = db.query_opt(look, &[&id])? else {
        return Ok(Skipped::Missing);
    };
    let status: String = super::get(&row, 0)?;
    let owner: Option<String> = super::get(&row, 1)?;
    let until: Option<String> = super::get(&row, 2)?;
    match (status.as_str(), owner, until) {
        ("pending", Some(owner), Some(until)) if until > now => {
            Ok(Skipped::Leased { owner, until })
        }
        ("pending" | "dead", _, _) => {
            db.execute(skip, &[&id, &now])?;
            Ok(Skipped::Skipped { was: status })
        }
        _ => Ok(Skipped::Finished { status }),
    }
}
