//! Claiming an event and applying its effects, inside a transaction the caller owns.
//!
//! The caller (the writer thread) opens `BEGIN IMMEDIATE` and a SAVEPOINT per delivery, calls
//! [`record_event_and_apply`], and rolls the savepoint back on [`Outcome::Duplicate`] or an error.
//! So the claim in `processed_events`, the order change and the outbox row commit together or not
//! at all.

use rusqlite::{params, OptionalExtension};
use sha2::{Digest, Sha256};

use super::statements::Statements;
use super::StoreError;
use crate::clock::iso_seconds;
use crate::domain::{NormalizedEvent, OrderRef, OrderStatus, Provider, StatusChange};
use crate::providers::normalise_stored;

/// What happened to a delivery. The first four are stored in `processed_events.outcome`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Processed,
    Stale,
    Ignored,
    Parked,
    /// A payment for an API order did not match its amount or currency: the order went to
    /// `needs_review` instead of `paid`.
    AmountMismatch,
    /// The event id was already claimed: nothing changed.
    Duplicate,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Processed => "processed",
            Outcome::Stale => "stale",
            Outcome::Ignored => "ignored",
            Outcome::Parked => "parked",
            Outcome::AmountMismatch => "amount_mismatch",
            Outcome::Duplicate => "duplicate",
        }
    }
}

/// How long each provider's event ids are kept, in seconds.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    pub stripe_secs: i64,
    pub midtrans_secs: i64,
}

impl Retention {
    pub fn for_provider(&self, provider: Provider) -> i64 {
        match provider {
            Provider::Stripe => self.stripe_secs,
            Provider::Midtrans => self.midtrans_secs,
        }
    }
}

/// Claims `event` and applies its effects. `payload` is the raw verified body.
///
/// Returns [`Outcome::Duplicate`] when a live claim already exists; the caller must then roll
/// back its savepoint (nothing was written, but rolling back keeps that a structural guarantee).
pub fn record_event_and_apply(
    db: &mut Statements<'_>,
    event: &NormalizedEvent,
    payload: &str,
    now_unix: i64,
    retention: &Retention,
) -> Result<Outcome, StoreError> {
    let now = iso_seconds(now_unix);
    let expires_at = iso_seconds(now_unix + retention.for_provider(event.provider));
    let known_order_id = match &event.order_ref {
        OrderRef::OrderId(id) => Some(id.as_str()),
        _ => None,
    };

    // The claim. A row whose retention has run out counts as absent even before the purge
    // removes it, so the contract "a delivery older than the retention is new" holds exactly.
    let claimed = db
        .prepare(
            "INSERT INTO processed_events
                 (provider, event_id, event_type, order_id, outcome, received_at, expires_at,
                  payment_intent_id, payload)
             VALUES (?1, ?2, ?3, ?4, 'processed', ?5, ?6, ?7, ?8)
             ON CONFLICT (provider, event_id) DO UPDATE SET
                 event_type = excluded.event_type, order_id = excluded.order_id,
                 outcome = excluded.outcome, received_at = excluded.received_at,
                 expires_at = excluded.expires_at, payment_intent_id = excluded.payment_intent_id,
                 payload = excluded.payload
             WHERE processed_events.expires_at <= excluded.received_at",
        )?
        .execute(params![
            event.provider.as_str(),
            event.event_id,
            event.event_type,
            known_order_id,
            now,
            expires_at,
            event.payment_intent_id,
            payload,
        ])?;
    if claimed == 0 {
        return Ok(Outcome::Duplicate);
    }
    fail::fail_point!("store::after_claim", |_| Err(StoreError::Injected(
        "store::after_claim"
    )));

    let (outcome, order_id) = resolve_and_apply(db, event, &now)?;
    if outcome != Outcome::Processed || order_id.as_deref() != known_order_id {
        set_event_outcome(
            db,
            event.provider,
            &event.event_id,
            outcome,
            order_id.as_deref(),
        )?;
    }
    fail::fail_point!("store::after_effects", |_| Err(StoreError::Injected(
        "store::after_effects"
    )));
    Ok(outcome)
}

/// Finds the event's order and applies its change; returns the outcome and the order id.
fn resolve_and_apply(
    db: &mut Statements<'_>,
    event: &NormalizedEvent,
    now: &str,
) -> Result<(Outcome, Option<String>), StoreError> {
    let Some(change) = &event.change else {
        let order_id = match &event.order_ref {
            OrderRef::OrderId(id) => Some(id.clone()),
            _ => None,
        };
        return Ok((Outcome::Ignored, order_id));
    };
    let order_id = match &event.order_ref {
        OrderRef::OrderId(id) => id.clone(),
        OrderRef::PaymentIntent {
            payment_intent_id,
            park_if_unlinked,
        } => match order_for_payment_intent(db, payment_intent_id)? {
            Some(order_id) => order_id,
            None if *park_if_unlinked => return Ok((Outcome::Parked, None)),
            None => return Ok((Outcome::Ignored, None)),
        },
        OrderRef::None => return Ok((Outcome::Ignored, None)),
    };
    let outcome = apply_change(db, event, change, &order_id, now)?;
    Ok((outcome, Some(order_id)))
}

fn order_for_payment_intent(
    db: &mut Statements<'_>,
    payment_intent_id: &str,
) -> rusqlite::Result<Option<String>> {
    db.prepare("SELECT order_id FROM order_payment_intents WHERE payment_intent_id = ?1")?
        .query_row([payment_intent_id], |row| row.get(0))
        .optional()
}

fn set_event_outcome(
    db: &mut Statements<'_>,
    provider: Provider,
    event_id: &str,
    outcome: Outcome,
    order_id: Option<&str>,
) -> rusqlite::Result<()> {
    db.prepare(
        "UPDATE processed_events SET outcome = ?3, order_id = ?4 WHERE provider = ?1 AND event_id = ?2",
    )?
    .execute(params![provider.as_str(), event_id, outcome.as_str(), order_id])?;
    Ok(())
}

/// An order row as the state machine sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OrderState {
    pub(crate) status: OrderStatus,
    /// Created through the API (its amount and currency are the shop's own).
    pub(crate) from_api: bool,
    pub(crate) amount: Option<i64>,
    pub(crate) refunded_amount: i64,
    pub(crate) currency: Option<String>,
    pub(crate) customer_email: Option<String>,
    pub(crate) payment_intent_id: Option<String>,
}

pub(crate) fn load_order(
    db: &mut Statements<'_>,
    order_id: &str,
) -> Result<Option<OrderState>, StoreError> {
    let row = db
        .prepare(
            "SELECT status, amount, refunded_amount, currency, customer_email, payment_intent_id,
                    source = 'api'
             FROM orders WHERE order_id = ?1",
        )?
        .query_row([order_id], |row| {
            Ok((
                row.get::<_, String>(0)?,
                OrderState {
                    status: OrderStatus::Pending, // replaced below
                    from_api: row.get(6)?,
                    amount: row.get(1)?,
                    refunded_amount: row.get(2)?,
                    currency: row.get(3)?,
                    customer_email: row.get(4)?,
                    payment_intent_id: row.get(5)?,
                },
            ))
        })
        .optional()?;
    let Some((status, mut state)) = row else {
        return Ok(None);
    };
    state.status = status.parse().map_err(|_| {
        rusqlite::Error::FromSqlConversionFailure(
            0,
            rusqlite::types::Type::Text,
            format!("orders.status holds `{status}`").into(),
        )
    })?;
    Ok(Some(state))
}

/// Moves `order_id` by the state machine and queues the customer notice for the status reached.
/// The order is read once; its new state is computed here and written with one statement.
fn apply_change(
    db: &mut Statements<'_>,
    event: &NormalizedEvent,
    change: &StatusChange,
    order_id: &str,
    now: &str,
) -> Result<Outcome, StoreError> {
    let current = load_order(db, order_id)?;
    let linked_pi = current.as_ref().and_then(|c| c.payment_intent_id.clone());
    let outcome = match current {
        None => {
            // First seen through this event: created in the state the event reports.
            let state = OrderState {
                status: change.target,
                from_api: false,
                amount: change.amount,
                refunded_amount: if change.target.is_refund() {
                    change.refunded_amount.unwrap_or(0)
                } else {
                    0
                },
                currency: change.currency.clone(),
                customer_email: change.customer_email.clone(),
                payment_intent_id: event.payment_intent_id.clone(),
            };
            save_change(db, event, order_id, None, &state, now)?;
            Outcome::Processed
        }
        Some(current) => move_existing_order(db, event, change, order_id, &current, now)?,
    };

    if let Some(pi) = &event.payment_intent_id {
        // An order's recorded PaymentIntent was linked when it was recorded.
        if linked_pi.as_deref() != Some(pi.as_str()) {
            link_payment_intent(db, pi, order_id, now)?;
        }
    }
    Ok(outcome)
}

fn move_existing_order(
    db: &mut Statements<'_>,
    event: &NormalizedEvent,
    change: &StatusChange,
    order_id: &str,
    current: &OrderState,
    now: &str,
) -> Result<Outcome, StoreError> {
    let target = change.target;
    let refunded = change.refunded_amount.unwrap_or(0);
    let further_refund =
        target == current.status && target.is_refund() && refunded > current.refunded_amount;
    let forward = current.status.can_move_forward_to(target)
        // A forward move that reports less refunded money than already recorded comes from an
        // older refund event than one already applied: money is never un-refunded.
        && !(target.is_refund() && refunded < current.refunded_amount);

    // Details the order lacks (first PaymentIntent, amount, currency, email) are filled in from
    // any event, even one that does not move the status; they are not effects.
    let mut next = OrderState {
        status: current.status,
        from_api: current.from_api,
        amount: current.amount.or(change.amount),
        refunded_amount: current.refunded_amount,
        currency: current.currency.clone().or_else(|| change.currency.clone()),
        customer_email: current
            .customer_email
            .clone()
            .or_else(|| change.customer_email.clone()),
        payment_intent_id: current
            .payment_intent_id
            .clone()
            .or_else(|| event.payment_intent_id.clone()),
    };

    if further_refund || forward {
        next.status = target;
        let mismatch =
            target == OrderStatus::Paid && current.from_api && payment_mismatch(current, change);
        if mismatch {
            // Do not mark it paid: an operator has to look (sekali orders set-status).
            next.status = OrderStatus::NeedsReview;
            tracing::warn!(
                order_id,
                expected_amount = ?current.amount,
                paid_amount = ?change.paid_amount,
                expected_currency = ?current.currency,
                paid_currency = ?change.currency,
                "payment does not match the order; order moved to needs_review"
            );
        }
        if let Some(reported) = change.refunded_amount {
            next.refunded_amount = next.refunded_amount.max(reported);
        }
        // The newest address wins for the notice this change sends.
        if change.customer_email.is_some() {
            next.customer_email = change.customer_email.clone();
        }
        save_change(db, event, order_id, Some(current.status), &next, now)?;
        return Ok(if mismatch {
            Outcome::AmountMismatch
        } else {
            Outcome::Processed
        });
    }

    if next != *current {
        db.prepare(
            "UPDATE orders SET amount = ?2, currency = ?3, customer_email = ?4, payment_intent_id = ?5
             WHERE order_id = ?1",
        )?
        .execute(params![
            order_id,
            next.amount,
            next.currency,
            next.customer_email,
            next.payment_intent_id
        ])?;
    }
    Ok(if target == current.status && !target.is_refund() {
        // Already there: processed, no effects.
        Outcome::Processed
    } else {
        // Backwards, or a refund event that reports no more refunded money than recorded.
        Outcome::Stale
    })
}

/// Writes an order's new state (creating the order if `from` is `None`) and records the change
/// with its notice: the one place a status change is stored.
fn save_change(
    db: &mut Statements<'_>,
    event: &NormalizedEvent,
    order_id: &str,
    from: Option<OrderStatus>,
    state: &OrderState,
    now: &str,
) -> rusqlite::Result<()> {
    db.prepare(
        "INSERT INTO orders (order_id, provider, status, amount, refunded_amount, currency,
                             customer_email, payment_intent_id, created_at, updated_at, last_event_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9, ?10)
         ON CONFLICT (order_id) DO UPDATE SET
             status = excluded.status, amount = excluded.amount,
             refunded_amount = excluded.refunded_amount, currency = excluded.currency,
             customer_email = excluded.customer_email, payment_intent_id = excluded.payment_intent_id,
             updated_at = excluded.updated_at, last_event_id = excluded.last_event_id",
    )?
    .execute(params![
        order_id,
        event.provider.as_str(),
        state.status.as_str(),
        state.amount,
        state.refunded_amount,
        state.currency,
        state.customer_email,
        state.payment_intent_id,
        now,
        event.event_id,
    ])?;
    record_change(
        db,
        event.provider.as_str(),
        &event.event_id,
        order_id,
        from,
        state,
        now,
    )
}

/// True when a payment's amount or currency differs from what the order asked for (currencies
/// compare case-insensitively: Stripe sends `idr`, Midtrans `IDR`).
fn payment_mismatch(order: &OrderState, change: &StatusChange) -> bool {
    let amount_differs =
        matches!((order.amount, change.paid_amount), (Some(want), Some(paid)) if want != paid);
    let currency_differs = matches!(
        (&order.currency, &change.currency),
        (Some(want), Some(paid)) if !want.eq_ignore_ascii_case(paid)
    );
    amount_differs || currency_differs
}

/// The effects of a status change: its row in the audit trail and the customer notice the new
/// status carries. Called exactly where an order's status or refund changes.
pub(crate) fn record_change(
    db: &mut Statements<'_>,
    provider: &str,
    event_id: &str,
    order_id: &str,
    from: Option<OrderStatus>,
    to: &OrderState,
    now: &str,
) -> rusqlite::Result<()> {
    record_transition(db, provider, event_id, order_id, from, to, now)?;
    queue_notice(db, provider, event_id, order_id, to, now)
}

/// Appends to the audit trail.
fn record_transition(
    db: &mut Statements<'_>,
    provider: &str,
    event_id: &str,
    order_id: &str,
    from: Option<OrderStatus>,
    to: &OrderState,
    now: &str,
) -> rusqlite::Result<()> {
    db.prepare(
        "INSERT INTO order_transitions (order_id, from_status, to_status, refunded_amount, provider,
                                        event_id, changed_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![
        order_id,
        from.map(OrderStatus::as_str),
        to.status.as_str(),
        to.refunded_amount,
        provider,
        event_id,
        now
    ])?;
    Ok(())
}

/// `email_outbox.params`: what the templates render. Serialised straight from borrowed fields
/// (no intermediate `serde_json::Value`): this runs for most deliveries. The fields are in
/// alphabetical order, the order the rows have always had.
#[derive(serde::Serialize)]
struct NoticeParams<'a> {
    amount: Option<i64>,
    currency: Option<&'a str>,
    event_id: &'a str,
    order_id: &'a str,
    provider: &'a str,
    refunded_amount: i64,
    status: &'a str,
}

/// Queues the notice for the status in `order` if it has one. The idempotency key is derived
/// from the change itself, so two different events announcing the same change cannot queue two
/// emails.
fn queue_notice(
    db: &mut Statements<'_>,
    provider: &str,
    event_id: &str,
    order_id: &str,
    order: &OrderState,
    now: &str,
) -> rusqlite::Result<()> {
    let Some(notice) = order.status.notice() else {
        return Ok(());
    };
    let key = outbox_idempotency_key(
        order_id,
        notice.template(),
        order.status,
        order.refunded_amount,
    );
    let params_json = serde_json::to_string(&NoticeParams {
        order_id,
        status: order.status.as_str(),
        amount: order.amount,
        refunded_amount: order.refunded_amount,
        currency: order.currency.as_deref(),
        provider,
        event_id,
    })
    .expect("serialising plain fields cannot fail");
    db.prepare(
        "INSERT INTO email_outbox (order_id, recipient, template, params, idempotency_key, status,
                                   attempts, created_at, event_id, next_attempt_at)
         VALUES (?1, ?2, ?3, ?4, ?5, 'pending', 0, ?6, ?7, replace(?6, 'Z', '.000Z'))
         ON CONFLICT (order_id, idempotency_key) DO NOTHING",
    )?
    .execute(params![
        order_id,
        order.customer_email,
        notice.template(),
        params_json,
        key,
        now,
        event_id
    ])?;
    Ok(())
}

/// Hex SHA-256 over the order id, template, status and refunded amount: `[0-9a-f]{64}`, so it can
/// stand verbatim in a Message-ID or an HTTP header.
pub fn outbox_idempotency_key(
    order_id: &str,
    template: &str,
    status: OrderStatus,
    refunded_amount: i64,
) -> String {
    let mut hasher = Sha256::new();
    for part in [
        order_id,
        template,
        status.as_str(),
        &refunded_amount.to_string(),
    ] {
        hasher.update(part.as_bytes());
        hasher.update([0x1f]); // unit separator: no part can run into the next
    }
    crate::domain::hex_lower(&hasher.finalize())
}

/// Records that `payment_intent_id` belongs to `order_id` and, the first time, applies the
/// events that were parked waiting for that link, oldest first, in this same transaction.
fn link_payment_intent(
    db: &mut Statements<'_>,
    payment_intent_id: &str,
    order_id: &str,
    now: &str,
) -> Result<(), StoreError> {
    let inserted = db
        .prepare(
            "INSERT INTO order_payment_intents (payment_intent_id, order_id) VALUES (?1, ?2)
             ON CONFLICT (payment_intent_id) DO NOTHING",
        )?
        .execute(params![payment_intent_id, order_id])?;
    if inserted == 0 {
        return Ok(());
    }
    let parked: Vec<(String, String)> = db
        .prepare(
            "SELECT event_id, payload FROM processed_events
             WHERE outcome = 'parked' AND payment_intent_id = ?1 AND provider = 'stripe'
             ORDER BY received_at, rowid",
        )?
        .query_map([payment_intent_id], |row| Ok((row.get(0)?, row.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    for (event_id, payload) in parked {
        let event = normalise_stored(Provider::Stripe, payload.as_bytes())?;
        let outcome = match &event.change {
            Some(change) => apply_change(db, &event, change, order_id, now)?,
            None => Outcome::Ignored,
        };
        tracing::debug!(parked_event_id = %event_id, outcome = outcome.as_str(), "applied parked event");
        set_event_outcome(db, Provider::Stripe, &event_id, outcome, Some(order_id))?;
    }
    Ok(())
}
