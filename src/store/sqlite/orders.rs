//! Orders as sekali's own API sees them: creation, reads, and the operator's override.

use rusqlite::{params, Connection, OptionalExtension};

use super::events::{load_order, record_change, write_order, ChangedBy};
use super::ledger;
use super::statements::Statements;
use super::StoreError;
use crate::clock::iso_seconds;
use crate::domain::ledger::{compute, OperatorDecision};
use crate::domain::OrderStatus;
use crate::store::changes::{Change, ChangeCursor, ChangeRow};
use crate::store::model::{
    NewOrder, OperatorChange, OrderView, PaymentView, SetStatusError, Transition,
};

const VIEW_COLUMNS: &str = "order_id, status, provider, amount, refunded_amount, currency, \
     customer_email, metadata, source, payment_intent_id, created_at, updated_at, paid_amount, \
     paid_currency, payer_email, review_reason";

fn view(row: &rusqlite::Row<'_>) -> rusqlite::Result<OrderView> {
    let metadata: Option<String> = row.get(7)?;
    let amount: Option<i64> = row.get(3)?;
    let currency: Option<String> = row.get(5)?;
    let (paid_amount, paid_currency) =
        OrderView::paid_if_different(amount, currency.as_deref(), row.get(12)?, row.get(13)?);
    Ok(OrderView {
        order_id: row.get(0)?,
        status: row.get(1)?,
        review_reason: row.get(15)?,
        provider: row.get(2)?,
        amount,
        refunded_amount: row.get(4)?,
        currency,
        paid_amount,
        paid_currency,
        customer_email: row.get(6)?,
        payer_email: row.get(14)?,
        metadata: metadata.and_then(|m| serde_json::from_str(&m).ok()),
        source: row.get(8)?,
        payment_intent_id: row.get(9)?,
        created_at: row.get(10)?,
        updated_at: row.get(11)?,
        payments: None,
        history: None,
    })
}

/// One order with its history.
pub fn get_order(conn: &Connection, order_id: &str) -> rusqlite::Result<Option<OrderView>> {
    let Some(mut order) = conn
        .prepare_cached(&format!(
            "SELECT {VIEW_COLUMNS} FROM orders WHERE order_id = ?1"
        ))?
        .query_row([order_id], view)
        .optional()?
    else {
        return Ok(None);
    };
    let db = &mut Statements::new(conn);
    let payments = ledger::of_order(db, order_id)?;
    let mut payments: Vec<PaymentView> = payments
        .iter()
        .map(|(provider, stored)| PaymentView::of(provider, &stored.reference, &stored.facts))
        .collect();
    payments.sort_by(|a, b| (&a.provider, &a.payment_ref).cmp(&(&b.provider, &b.payment_ref)));
    order.payments = Some(payments);
    order.history = Some(transitions(conn, order_id)?);
    Ok(Some(order))
}

/// Every change of `order_id`'s status, oldest first.
pub fn transitions(conn: &Connection, order_id: &str) -> rusqlite::Result<Vec<Transition>> {
    conn.prepare_cached(
        "SELECT changed_at, from_status, to_status, refunded_amount, provider, event_id, actor,
                reason
         FROM order_transitions WHERE order_id = ?1 ORDER BY id",
    )?
    .query_map([order_id], |row| {
        Ok(Transition {
            changed_at: row.get(0)?,
            from_status: row.get(1)?,
            to_status: row.get(2)?,
            refunded_amount: row.get(3)?,
            provider: row.get(4)?,
            event_id: row.get(5)?,
            actor: row.get(6)?,
            reason: row.get(7)?,
        })
    })?
    .collect()
}

/// Orders by id, after the cursor `after`, optionally of one status.
pub fn list_orders(
    conn: &Connection,
    status: Option<&str>,
    after: Option<&str>,
    limit: u32,
) -> rusqlite::Result<Vec<OrderView>> {
    conn.prepare_cached(&format!(
        "SELECT {VIEW_COLUMNS} FROM orders
         WHERE (?1 IS NULL OR status = ?1) AND (?2 IS NULL OR order_id > ?2)
         ORDER BY order_id LIMIT ?3"
    ))?
    .query_map(params![status, after, limit], view)?
    .collect()
}

/// Creates an API order in `pending`; `Ok(None)` when the order id already exists (created by
/// another key or by a webhook).
pub fn insert_api_order(
    conn: &Connection,
    order: &NewOrder,
    client: &str,
    now_unix: i64,
) -> Result<Option<OrderView>, StoreError> {
    let now = iso_seconds(now_unix);
    let origin = format!("api:{client}");
    let inserted = conn
        .prepare_cached(
            "INSERT INTO orders (order_id, provider, status, amount, refunded_amount, currency,
                                 customer_email, created_at, updated_at, last_event_id, source, metadata,
                                 amount_exponent)
             VALUES (?1, ?2, 'pending', ?3, 0, ?4, ?5, ?6, ?6, ?7, 'api', ?8, ?9)
             ON CONFLICT (order_id) DO NOTHING",
        )?
        .execute(params![
            order.order_id,
            order.provider,
            order.amount,
            order.currency,
            order.customer_email,
            now,
            origin,
            order.metadata,
            order.exponent
        ])?;
    if inserted == 0 {
        return Ok(None);
    }
    let db = &mut Statements::new(conn);
    let state = load_order(db, &order.order_id)?.expect("the order was just inserted");
    // Created in pending, which carries no notice: this records the transition only.
    let by = ChangedBy {
        provider: "api",
        event_id: &origin,
        actor: Some(client),
        reason: None,
    };
    record_change(db, &by, &order.order_id, None, &state, &now)?;
    Ok(get_order(conn, &order.order_id)?)
}

/// The operator's override (`sekali orders set-status`): any status but the one the order has,
/// recorded as a transition by `operator` with the operator's name and reason, with the customer
/// notice the new status carries. Returns the previous status.
pub fn set_status_by_operator(
    conn: &Connection,
    order_id: &str,
    change: &OperatorChange,
    now_unix: i64,
) -> Result<OrderStatus, SetStatusError> {
    let now = iso_seconds(now_unix);
    conn.execute_batch("BEGIN IMMEDIATE")
        .map_err(StoreError::from)?;
    let result = (|| {
        let db = &mut Statements::new(conn);
        let mut state = load_order(db, order_id)?
            .ok_or_else(|| SetStatusError::NoSuchOrder(order_id.into()))?;
        let previous = state.status;
        if previous == change.status {
            return Err(SetStatusError::Unchanged {
                order_id: order_id.into(),
                status: previous,
            });
        }
        // The decision stands until money moves: what the order's payments say now is kept
        // with it, and the review reason the operator saw no longer counts.
        let payments = ledger::of_order(db, order_id).map_err(StoreError::from)?;
        let money = compute(&state.terms(), &ledger::views(&payments), None, &[], 0).money;
        if let Some(reason) = state.review.take() {
            state.acknowledged.push(reason);
        }
        state.status = change.status;
        state.operator = Some(OperatorDecision {
            status: change.status,
            money,
        });
        let by = ChangedBy {
            provider: "operator",
            event_id: "operator",
            actor: Some(&change.operator),
            reason: Some(&change.reason),
        };
        write_order(db, order_id, &state, &by, &now, true).map_err(StoreError::from)?;
        record_change(db, &by, order_id, Some(previous), &state, &now).map_err(StoreError::from)?;
        Ok(previous)
    })();
    match result {
        Ok(previous) => {
            conn.execute_batch("COMMIT").map_err(StoreError::from)?;
            Ok(previous)
        }
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// The columns [`change_row`] reads: a change and its order.
const CHANGE_COLUMNS: &str = "t.id, t.order_id, t.from_status, t.to_status, t.refunded_amount, \
     t.provider, t.event_id, t.changed_at, t.sequence, t.amount, t.currency, o.provider, \
     o.metadata FROM order_transitions AS t JOIN orders AS o USING (order_id)";

fn change_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Change> {
    Ok(Change::from(ChangeRow {
        position: row.get(0)?,
        id: row.get(0)?,
        order_id: row.get(1)?,
        from_status: row.get(2)?,
        to_status: row.get(3)?,
        refunded_amount: row.get(4)?,
        changed_by: row.get(5)?,
        event_id: row.get(6)?,
        changed_at: row.get(7)?,
        sequence: row.get(8)?,
        amount: row.get(9)?,
        currency: row.get(10)?,
        provider: row.get(11)?,
        metadata: row.get(12)?,
    }))
}

/// Up to `limit` order changes after `after`, by id: the one writer commits them in id order,
/// so a change's id is its place in the feed.
pub fn changes(
    conn: &Connection,
    after: Option<ChangeCursor>,
    limit: u32,
) -> rusqlite::Result<Vec<Change>> {
    conn.prepare_cached(&format!(
        "SELECT {CHANGE_COLUMNS} WHERE t.id > ?1 ORDER BY t.id LIMIT ?2"
    ))?
    .query_map(params![after.map_or(0, |c| c.0), limit], change_row)?
    .collect()
}

/// The change `id` (what forwarding sends for it).
pub fn change_by_id(conn: &Connection, id: i64) -> rusqlite::Result<Change> {
    conn.prepare_cached(&format!("SELECT {CHANGE_COLUMNS} WHERE t.id = ?1"))?
        .query_row([id], change_row)
}
