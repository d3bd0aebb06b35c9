//! The forwarding outbox (`forward_outbox`): claims that keep each order's changes in order,
//! the operator's listing, skip and retry, and turning forwarding on and off. Results are
//! recorded as the emails' are ([`super::outbox::record_results_in_transaction`]).

use rusqlite::{params, Connection, OptionalExtension};

use super::orders::change_by_id;
use super::reads::Filters;
use super::StoreError;
use crate::clock::{iso_millis, iso_seconds};
use crate::store::model::{ClaimRequest, ClaimedForward, ForwardRow, OutboxQuery};

/// Claims due rows inside the caller's transaction: among pending rows whose time has come and
/// whose lease (if any) ran out, only those with no earlier pending or dead row of their order.
/// So at most one change of an order is out at a time, and a later one goes only after the one
/// before it was sent or skipped.
pub fn claim_due(
    conn: &Connection,
    request: &ClaimRequest,
    now_ms: i64,
) -> rusqlite::Result<Vec<ClaimedForward>> {
    let now = iso_millis(now_ms);
    let claimed: Vec<(i64, i64, String, i64)> = conn
        .prepare_cached(
            "UPDATE forward_outbox SET lease_owner = ?1, lease_until = ?2
             WHERE id IN (SELECT f.id FROM forward_outbox AS f
                          WHERE f.status = 'pending' AND f.next_attempt_at <= ?3
                            AND (f.lease_until IS NULL OR f.lease_until <= ?3)
                            AND NOT EXISTS (SELECT 1 FROM forward_outbox AS earlier
                                            WHERE earlier.order_id = f.order_id
                                              AND earlier.id < f.id
                                              AND (earlier.status = 'pending'
                                                   OR earlier.status = 'dead'))
                          ORDER BY f.next_attempt_at, f.id LIMIT ?4)
             RETURNING id, change_id, order_id, attempts",
        )?
        .query_map(
            params![
                request.owner,
                iso_millis(now_ms + request.lease_ms),
                now,
                request.limit as i64
            ],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)),
        )?
        .collect::<rusqlite::Result<_>>()?;
    let mut rows = claimed
        .into_iter()
        .map(|(id, change_id, order_id, attempts)| {
            let change = change_by_id(conn, change_id)?;
            Ok(ClaimedForward {
                id,
                order_id,
                message_id: change.id.clone(),
                body: serde_json::to_string(&change).expect("a change serialises"),
                attempts,
            })
        })
        .collect::<rusqlite::Result<Vec<_>>>()?;
    rows.sort_by_key(|r| r.id);
    Ok(rows)
}

/// Turns forwarding on (`true`: the row of `forward_state` in place) or off; says whether that
/// changed anything. One write transaction.
pub fn set_forwarding(conn: &Connection, on: bool, now_unix: i64) -> Result<bool, StoreError> {
    super::outbox::in_write_transaction(conn, || {
        if on {
            conn.execute(
                "INSERT INTO forward_state (only_row, since) VALUES (1, ?1)
                 ON CONFLICT (only_row) DO NOTHING",
                [iso_seconds(now_unix)],
            )
        } else {
            conn.execute("DELETE FROM forward_state", [])
        }
    })
    .map(|changed| changed > 0)
}

const ROW_COLUMNS: &str = "f.id, f.change_id, f.order_id, t.to_status, f.status, f.attempts, \
     f.created_at, f.next_attempt_at, f.lease_owner, f.lease_until, f.last_error, f.sent_at, \
     f.first_tried_at";

fn forward_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<ForwardRow> {
    Ok(ForwardRow {
        id: row.get(0)?,
        message_id: format!("chg_{}", row.get::<_, i64>(1)?),
        order_id: row.get(2)?,
        kind: format!("order.{}", row.get::<_, String>(3)?),
        status: row.get(4)?,
        attempts: row.get(5)?,
        created_at: row.get(6)?,
        next_attempt_at: row.get(7)?,
        lease_owner: row.get(8)?,
        lease_until: row.get(9)?,
        last_error: row.get(10)?,
        sent_at: row.get(11)?,
        first_tried_at: row.get(12)?,
    })
}

/// The rows that match `query`, newest first.
pub fn list(conn: &Connection, query: &OutboxQuery) -> rusqlite::Result<Vec<ForwardRow>> {
    let mut filters = Filters::default();
    filters.add("f.status = ?", query.status.clone());
    filters.add("f.order_id = ?", query.order_id.clone());
    filters.add("f.created_at >= ?", query.since_unix.map(iso_seconds));
    conn.prepare(&format!(
        "SELECT {ROW_COLUMNS} FROM forward_outbox AS f
         JOIN order_transitions AS t ON t.id = f.change_id {} ORDER BY f.id DESC LIMIT ?",
        filters.sql()
    ))?
    .query_map(
        rusqlite::params_from_iter(filters.values_then(query.limit)),
        forward_row,
    )?
    .collect()
}

/// One row, with the message it sends (the change as JSON).
pub fn get(conn: &Connection, id: i64) -> rusqlite::Result<Option<(ForwardRow, String)>> {
    let Some((row, change_id)) = conn
        .prepare(&format!(
            "SELECT {ROW_COLUMNS} FROM forward_outbox AS f
             JOIN order_transitions AS t ON t.id = f.change_id WHERE f.id = ?1"
        ))?
        .query_row([id], |row| Ok((forward_row(row)?, row.get::<_, i64>(1)?)))
        .optional()?
    else {
        return Ok(None);
    };
    let change = change_by_id(conn, change_id)?;
    Ok(Some((
        row,
        serde_json::to_string_pretty(&change).expect("a change serialises"),
    )))
}
