//! The forwarding outbox (`forward_outbox`) on PostgreSQL: claims that keep each order's changes
//! in order across instances, the operator's listing, skip and retry, and turning forwarding on
//! and off. Results are recorded as the emails' are ([`super::outbox`]).

use postgres::Row;

use super::orders::change_by_id;
use super::reads::{params, Filters};
use super::{get, Db, StoreError};
use crate::clock::{iso_millis, iso_seconds};
use crate::store::model::{ClaimRequest, ClaimedForward, ForwardRow, OutboxQuery};

/// Claims due rows inside the caller's transaction: among pending rows whose time has come and
/// whose lease (if any) ran out, only those with no earlier pending or dead row of their order.
///
/// With several instances: the candidates are locked `FOR UPDATE SKIP LOCKED`, so two claims
/// never take one row. An earlier row of the order being claimed by another instance right now
/// is still `pending` (claiming changes only its lease), so the later one is held back here
/// whether or not that claim has committed. Ids follow each order's changes (inserted one after
/// another under the order's lock), so "earlier" is by id.
pub fn claim_due(
    db: &mut Db<'_, '_>,
    request: &ClaimRequest,
    now_ms: i64,
) -> Result<Vec<ClaimedForward>, StoreError> {
    let now = iso_millis(now_ms);
    let rows = db.query(
        "UPDATE forward_outbox SET lease_owner = $1, lease_until = $2
         WHERE id IN (SELECT f.id FROM forward_outbox AS f
                      WHERE f.status = 'pending' AND f.next_attempt_at <= $3::text
                        AND (f.lease_until IS NULL OR f.lease_until <= $3::text)
                        AND NOT EXISTS (SELECT 1 FROM forward_outbox AS earlier
                                        WHERE earlier.order_id = f.order_id
                                          AND earlier.id < f.id
                                          AND (earlier.status = 'pending'
                                               OR earlier.status = 'dead'))
                      ORDER BY f.next_attempt_at, f.id LIMIT $4::bigint
                      FOR UPDATE OF f SKIP LOCKED)
         RETURNING id, change_id, order_id, attempts",
        &[
            &request.owner,
            &iso_millis(now_ms + request.lease_ms),
            &now,
            &(request.limit as i64),
        ],
    )?;
    let mut claimed = Vec::with_capacity(rows.len());
    for row in &rows {
        let change = change_by_id(db, get(row, 1)?)?;
        claimed.push(ClaimedForward {
            id: get(row, 0)?,
            order_id: get(row, 2)?,
            message_id: change.id.clone(),
            body: serde_json::to_string(&change).expect("a change serialises"),
            attempts: get(row, 3)?,
        });
    }
    claimed.sort_by_key(|r| r.id);
    Ok(claimed)
}

/// Turns forwarding on (the row of `forward_state` in place) or off, in the caller's
/// transaction; says whether that changed anything.
pub fn set_forwarding(db: &mut Db<'_, '_>, on: bool, now_unix: i64) -> Result<bool, StoreError> {
    let changed = if on {
        db.execute(
            "INSERT INTO forward_state (only_row, since) VALUES (1, $1)
             ON CONFLICT (only_row) DO NOTHING",
            &[&iso_seconds(now_unix)],
        )?
    } else {
        db.execute("DELETE FROM forward_state", &[])?
    };
    Ok(changed > 0)
}

/// The columns [`forward_row`] reads. A macro, so that statements stay `&'static str` literals.
macro_rules! row_columns {
    () => {
        "f.id, f.change_id, f.order_id, t.to_status, f.status, f.attempts, f.created_at, \
         f.next_attempt_at, f.lease_owner, f.lease_until, f.last_error, f.sent_at, \
         f.first_tried_at FROM forward_outbox AS f JOIN order_transitions AS t \
         ON t.id = f.change_id"
    };
}

fn forward_row(row: &Row) -> Result<ForwardRow, StoreError> {
    Ok(ForwardRow {
        id: get(row, 0)?,
        message_id: format!("chg_{}", get::<i64>(row, 1)?),
        order_id: get(row, 2)?,
        kind: format!("order.{}", get::<String>(row, 3)?),
        status: get(row, 4)?,
        attempts: get(row, 5)?,
        created_at: get(row, 6)?,
        next_attempt_at: get(row, 7)?,
        lease_owner: get(row, 8)?,
        lease_until: get(row, 9)?,
        last_error: get(row, 10)?,
        sent_at: get(row, 11)?,
        first_tried_at: get(row, 12)?,
    })
}

/// The rows that match `query`, newest first.
pub fn list(db: &mut Db<'_, '_>, query: &OutboxQuery) -> Result<Vec<ForwardRow>, StoreError> {
    let mut filters = Filters::default();
    filters.add("f.status = ?", query.status.clone());
    filters.add("f.order_id = ?", query.order_id.clone());
    filters.add("f.created_at >= ?", query.since_unix.map(iso_seconds));
    let sql = format!(
        concat!("SELECT ", row_columns!(), " {} ORDER BY f.id DESC LIMIT {}"),
        filters.sql(),
        filters.last_placeholder()
    );
    let values = filters.values_then(i64::from(query.limit));
    db.query_built(&sql, &params(&values))?
        .iter()
        .map(forward_row)
        .collect()
}

/// One row, with the message it sends (the change as JSON).
pub fn get_row(db: &mut Db<'_, '_>, id: i64) -> Result<Option<(ForwardRow, String)>, StoreError> {
    let Some(row) = db.query_opt(
        concat!("SELECT ", row_columns!(), " WHERE f.id = $1"),
        &[&id],
    )?
    else {
        return Ok(None);
    };
    let change = change_by_id(db, get(&row, 1)?)?;
    Ok(Some((
        forward_row(&row)?,
        serde_json::to_string_pretty(&change).expect("a change serialises"),
    )))
}
