//! Orders as sekali's own API sees them: creation, reads, and the operator's override.

use postgres::Row;

use super::events::{load_order, write_change, ChangedBy};
use super::{get, ledger, Db, StoreError};
use crate::clock::iso_seconds;
use crate::domain::ledger::{compute, OperatorDecision};
use crate::domain::OrderStatus;
use crate::store::changes::{Change, ChangeCursor, ChangeRow};
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
    write_change(db, &by, &order.order_id, None, &state, &now, false)?;
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
    write_change(db, &by, order_id, Some(previous), &state, &now, true)?;
    Ok(previous)
}

/// The key of the transaction-scoped advisory lock a publisher of the change feed holds.
const PUBLISHER: i64 = 0x73656b2d66656564; // "sek-feed"

/// Gives the committed changes that have no place in the feed yet theirs, after the last one
/// given, in id order: unless another instance is doing it right now (then its places become
/// visible when it commits, and this reader reads what was given before). Returns how many it
/// gave. Its own transaction, run before a page is read.
///
/// Why places, and why this way: identity values are taken when rows are inserted, and several
/// instances commit in another order, so a feed by id could pass a change that commits later
/// with a lower id. A place is given only to a change already committed (this statement sees
/// nothing else), by one publisher at a time (the lock, held until its commit), each after the
/// largest given before (read after the lock is held, in a statement of its own, so that its
/// snapshot includes the last publisher's commit). So places become visible in increasing
/// order: a reader never finds a new one below a place it has read. Within one order, ids follow
/// its changes (each is written under the order's lock, after the one before committed), and a
/// change is visible only if every earlier change of its order is: each order's changes get
/// their places in order.
pub fn publish_changes(db: &mut Db<'_, '_>) -> Result<u64, StoreError> {
    let free: bool = get(
        &db.query_one("SELECT pg_try_advisory_xact_lock($1)", &[&PUBLISHER])?,
        0,
    )?;
    if !free {
        return Ok(0);
    }
    // A place a reader has seen must survive a crash (else it could be given again, to other
    // changes): durable as a delivery, whatever the server's default for this pooled session.
    db.execute("SET LOCAL synchronous_commit = on", &[])?;
    db.execute(
        "UPDATE order_transitions SET position = placed.position
         FROM (SELECT id, (SELECT coalesce(max(position), 0) FROM order_transitions)
                          + row_number() OVER (ORDER BY id) AS position
               FROM order_transitions WHERE position IS NULL) AS placed
         WHERE order_transitions.id = placed.id",
        &[],
    )
}

/// The columns [`change_row`] reads: a change and its order. A macro, so that statements stay
/// `&'static str` literals.
macro_rules! change_columns {
    () => {
        "t.position, t.id, t.order_id, t.from_status, t.to_status, t.refunded_amount, t.provider,
         t.event_id, t.changed_at, t.sequence, t.amount, t.currency, o.provider, o.metadata
         FROM order_transitions AS t JOIN orders AS o USING (order_id)"
    };
}

fn change_row(row: &Row) -> Result<Change, StoreError> {
    Ok(Change::from(ChangeRow {
        // A change not yet given its place (only forwarding reads those) has none to page from.
        position: get::<Option<i64>>(row, 0)?.unwrap_or(0),
        id: get(row, 1)?,
        order_id: get(row, 2)?,
        from_status: get(row, 3)?,
        to_status: get(row, 4)?,
        refunded_amount: get(row, 5)?,
        changed_by: get(row, 6)?,
        event_id: get(row, 7)?,
        changed_at: get(row, 8)?,
        sequence: get(row, 9)?,
        amount: get(row, 10)?,
        currency: get(row, 11)?,
        provider: get(row, 12)?,
        metadata: get(row, 13)?,
    }))
}

/// Up to `limit` order changes after `after`, in the order of their places in the feed (see
/// [`publish_changes`], which the caller runs first).
pub fn changes(
    db: &mut Db<'_, '_>,
    after: Option<ChangeCursor>,
    limit: u32,
) -> Result<Vec<Change>, StoreError> {
    db.query(
        concat!(
            "SELECT ",
            change_columns!(),
            " WHERE t.position > $1::bigint ORDER BY t.position LIMIT $2::bigint"
        ),
        &[&after.map_or(0, |c| c.0), &i64::from(limit)],
    )?
    .iter()
    .map(change_row)
    .collect()
}

/// The change `id` (what forwarding sends for it).
pub fn change_by_id(db: &mut Db<'_, '_>, id: i64) -> Result<Change, StoreError> {
    change_row(&db.query_one(
        concat!("SELECT ", change_columns!(), " WHERE t.id = $1"),
        &[&id],
    )?)
}
