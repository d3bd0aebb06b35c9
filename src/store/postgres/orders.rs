//! Orders as sekali's own API sees them: creation, reads, and the operator's override.

use postgres::Row;

use super::events::{load_order, record_change, write_order, ChangedBy};
use super::{get, ledger, Db, StoreError};
use crate::clock::iso_seconds;
use crate::domain::ledger::{compute, OperatorDecision};
use crate::domain::OrderStatus;
use crate::store::model::{
    NewOrder, OperatorChange, OrderView, PaymentView, SetStatusError, Transition,
};

/// The columns [`view`] reads, in its order. A macro, not a `const`, so that each statement
/// stays one `&'static str` literal (`concat!`), as [`Db`] caches statements by address.
macro_rules! view_columns {
    () => {
        "order_id, status, provider, amount, refunded_amount, currency, \
         customer_email, metadata, source, payment_intent_id, created_at, updated_at, paid_amount, \
         paid_currency, payer_email, review_reason"
    };
}

fn view(row: &Row) -> Result<OrderView, StoreError> {
    let metadata: Option<String> = get(row, 7)?;
    let amount: Option<i64> = get(row, 3)?;
    let currency: Option<String> = get(row, 5)?;
    let (paid_amount, paid_currency) =
        OrderView::paid_if_different(amount, currency.as_deref(), get(row, 12)?, get(row, 13)?);
    Ok(OrderView {
        order_id: get(row, 0)?,
        status: get(row, 1)?,
        review_reason: get(row, 15)?,
        provider: get(row, 2)?,
        amount,
        refunded_amount: get(row, 4)?,
        currency,
        paid_amount,
        paid_currency,
        customer_email: get(row, 6)?,
        payer_email: get(row, 14)?,
        metadata: metadata.and_then(|m| serde_json::from_str(&m).ok()),
        source: get(row, 8)?,
        payment_intent_id: get(row, 9)?,
        created_at: get(row, 10)?,
        updated_at: get(row, 11)?,
        payments: None,
        history: None,
    })
}

/// One order with its history.
pub fn get_order(db: &mut Db<'_, '_>, order_id: &str) -> Result<Option<OrderView>, StoreError> {
    let Some(row) = db.query_opt(
        concat!(
            "SELECT ",
            view_columns!(),
            " FROM orders WHERE order_id = $1"
        ),
        &[&order_id],
    )?
    else {
        return Ok(None);
    };
    let mut order = view(&row)?;
    let payments = ledger::of_order(db, order_id)?;
    let mut payments: Vec<PaymentView> = payments
        .iter()
        .map(|(provider, stored)| PaymentView::of(provider, &stored.reference, &stored.facts))
        .collect();
    payments.sort_by(|a, b| (&a.provider, &a.payment_ref).cmp(&(&b.provider, &b.payment_ref)));
    order.payments = Some(payments);
    order.history = Some(transitions(db, order_id)?);
    Ok(Some(order))
}

/// Every change of `order_id`'s status, oldest first.
pub fn transitions(db: &mut Db<'_, '_>, order_id: &str) -> Result<Vec<Transition>, StoreError> {
    db.query(
        "SELECT changed_at, from_status, to_status, refunded_amount, provider, event_id, actor,
                reason
         FROM order_transitions WHERE order_id = $1 ORDER BY id",
        &[&order_id],
    )?
    .iter()
    .map(|row| {
        Ok(Transition {
            changed_at: get(row, 0)?,
            from_status: get(row, 1)?,
            to_status: get(row, 2)?,
            refunded_amount: get(row, 3)?,
            provider: get(row, 4)?,
            event_id: get(row, 5)?,
            actor: get(row, 6)?,
            reason: get(row, 7)?,
        })
    })
    .collect()
}

/// Orders by id, after the cursor `after`, optionally of one status.
pub fn list_orders(
    db: &mut Db<'_, '_>,
    status: Option<&str>,
    after: Option<&str>,
    limit: u32,
) -> Result<Vec<OrderView>, StoreError> {
    // order_id is COLLATE "C": the cursor compares and the page sorts in byte order, as in
    // SQLite (the column's collation wins over the parameter's default one).
    db.query(
        concat!(
            "SELECT ",
            view_columns!(),
            " FROM orders
         WHERE ($1::text IS NULL OR status = $1::text) AND ($2::text IS NULL OR order_id > $2::text)
         ORDER BY order_id LIMIT $3::bigint"
        ),
        &[&status, &after, &i64::from(limit)],
    )?
    .iter()
    .map(view)
    .collect()
}

/// Creates an API order in `pending`; `Ok(None)` when the order id already exists (created by
/// another key or by a webhook).
pub fn insert_api_order(
    db: &mut Db<'_, '_>,
    order: &NewOrder,
    client: &str,
    now_unix: i64,
) -> Result<Option<OrderView>, StoreError> {
    let now = iso_seconds(now_unix);
    let origin = format!("api:{client}");
    // Held as every writer of the order holds it (a delivery creating the same order on another
    // instance waits, and finds this one); a concurrent insert of the same order id waits on
    // the primary key until the first commits, then does nothing: exactly one creates it.
    super::hold(db, &super::order_key(&order.order_id))?;
    let inserted = db.execute(
        "INSERT INTO orders (order_id, provider, status, amount, refunded_amount, currency,
                             customer_email, created_at, updated_at, last_event_id, source, metadata,
                             amount_exponent)
         VALUES ($1, $2, 'pending', $3, 0, $4, $5, $6, $6, $7, 'api', $8, $9)
         ON CONFLICT (order_id) DO NOTHING",
        &[
            &order.order_id,
            &order.provider,
            &order.amount,
            &order.currency,
            &order.customer_email,
            &now,
            &origin,
            &order.metadata,
            &i64::from(order.exponent),
        ],
    )?;
    if inserted == 0 {
        return Ok(None);
    }
    let state = load_order(db, &order.order_id)?.expect("the order was just inserted");
    // Created in pending, which carries no notice: this records the transition only.
    let by = ChangedBy {
        provider: "api",
        event_id: &origin,
        actor: Some(client),
        reason: None,
    };
    record_change(db, &by, &order.order_id, None, &state, &now)?;
    get_order(db, &order.order_id)
}

/// The operator's override (`sekali orders set-status`): any status but the one the order has,
/// recorded as a transition by `operator` with the operator's name and reason, with the customer
/// notice the new status carries. Returns the previous status.
///
/// Runs inside the caller's transaction (SQLite opened its own `BEGIN IMMEDIATE`): the caller
/// commits on `Ok` and rolls back on `Err` (nothing is written before an error).
pub fn set_status_by_operator(
    db: &mut Db<'_, '_>,
    order_id: &str,
    change: &OperatorChange,
    now_unix: i64,
) -> Result<OrderStatus, SetStatusError> {
    let now = iso_seconds(now_unix);
    // load_order locks the order's row (FOR UPDATE) as it reads it. SQLite's BEGIN IMMEDIATE
    // kept every other writer out; here a webhook batch on another instance could change the
    // order (its status, its payments) between this read and the write below, and one of the
    // two changes would be lost. Writers lock an order's row before they read it for a change,
    // so this waits for such a batch to commit and then reads what it wrote.
    let mut state =
        load_order(db, order_id)?.ok_or_else(|| SetStatusError::NoSuchOrder(order_id.into()))?;
    let previous = state.status;
    if previous == change.status {
        return Err(SetStatusError::Unchanged {
            order_id: order_id.into(),
            status: previous,
        });
    }
    // The decision stands until money moves: what the order's payments say now is kept
    // with it, and the review reason the operator saw no longer counts.
    let payments = ledger::of_order(db, order_id)?;
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
    write_order(db, order_id, &state, &by, &now, true)?;
    record_change(db, &by, order_id, Some(previous), &state, &now)?;
    Ok(previous)
}
