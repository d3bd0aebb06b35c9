//! Claiming an event and applying its effects, inside a transaction the caller owns.
//!
//! The caller (the writer thread) opens `BEGIN IMMEDIATE` and a SAVEPOINT per delivery, calls
//! [`record_event_and_apply`], and rolls the savepoint back on [`Outcome::Duplicate`] or an error.
//! So the claim in `processed_events`, the order change and the outbox row commit together or not
//! at all.

use rusqlite::{params, Connection, OptionalExtension};
use sha2::{Digest, Sha256};

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
    conn: &Connection,
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
    let claimed = conn
        .prepare_cached(
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

    let (outcome, order_id) = resolve_and_apply(conn, event, &now)?;
    if outcome != Outcome::Processed || order_id.as_deref() != known_order_id {
        set_event_outcome(
            conn,
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
    conn: &Connection,
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
        } => match order_for_payment_intent(conn, payment_intent_id)? {
            Some(order_id) => order_id,
            None if *park_if_unlinked => return Ok((Outcome::Parked, None)),
            None => return Ok((Outcome::Ignored, None)),
        },
        OrderRef::None => return Ok((Outcome::Ignored, None)),
    };
    let outcome = apply_change(conn, event, change, &order_id, now)?;
    Ok((outcome, Some(order_id)))
}

fn order_for_payment_intent(
    conn: &Connection,
    payment_intent_id: &str,
) -> rusqlite::Result<Option<String>> {
    conn.prepare_cached("SELECT order_id FROM order_payment_intents WHERE payment_intent_id = ?1")?
        .query_row([payment_intent_id], |row| row.get(0))
        .optional()
}

fn set_event_outcome(
    conn: &Connection,
    provider: Provider,
    event_id: &str,
    outcome: Outcome,
    order_id: Option<&str>,
) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "UPDATE processed_events SET outcome = ?3, order_id = ?4 WHERE provider = ?1 AND event_id = ?2",
    )?
    .execute(params![provider.as_str(), event_id, outcome.as_str(), order_id])?;
    Ok(())
}

struct OrderRow {
    status: OrderStatus,
    refunded_amount: i64,
}

/// Moves `order_id` by the state machine and queues the customer notice for the status reached.
fn apply_change(
    conn: &Connection,
    event: &NormalizedEvent,
    change: &StatusChange,
    order_id: &str,
    now: &str,
) -> Result<Outcome, StoreError> {
    let current = conn
        .prepare_cached("SELECT status, refunded_amount FROM orders WHERE order_id = ?1")?
        .query_row([order_id], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
        })
        .optional()?;

    let refunded = change.refunded_amount.unwrap_or(0);
    let outcome =
        match current {
            None => {
                // First seen through this event: created in the state the event reports.
                conn.prepare_cached(
                "INSERT INTO orders (order_id, provider, status, amount, refunded_amount, currency,
                                     customer_email, payment_intent_id, created_at, updated_at,
                                     last_event_id)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9, ?10)",
            )?
            .execute(params![
                order_id,
                event.provider.as_str(),
                change.target.as_str(),
                change.amount,
                if change.target.is_refund() { refunded } else { 0 },
                change.currency,
                change.customer_email,
                event.payment_intent_id,
                now,
                event.event_id,
            ])?;
                record_transition(conn, event, order_id, None, change.target, now)?;
                queue_notice(conn, event, order_id, change.target, now)?;
                Outcome::Processed
            }
            Some((status, recorded_refund)) => {
                let row = OrderRow {
                    status: status.parse().map_err(|_| {
                        rusqlite::Error::FromSqlConversionFailure(
                            0,
                            rusqlite::types::Type::Text,
                            format!("orders.status holds `{status}`").into(),
                        )
                    })?,
                    refunded_amount: recorded_refund,
                };
                move_existing_order(conn, event, change, order_id, &row, now)?
            }
        };

    if let Some(pi) = &event.payment_intent_id {
        link_payment_intent(conn, pi, order_id, now)?;
    }
    Ok(outcome)
}

fn move_existing_order(
    conn: &Connection,
    event: &NormalizedEvent,
    change: &StatusChange,
    order_id: &str,
    row: &OrderRow,
    now: &str,
) -> Result<Outcome, StoreError> {
    let target = change.target;
    let refunded = change.refunded_amount.unwrap_or(0);
    let further_refund =
        target == row.status && target.is_refund() && refunded > row.refunded_amount;
    let forward = row.status.can_move_forward_to(target)
        // A forward move that reports less refunded money than already recorded comes from an
        // older refund event than one already applied: money is never un-refunded.
        && !(target.is_refund() && refunded < row.refunded_amount);
    let outcome = if further_refund || forward {
        update_order(conn, event, change, order_id, now)?;
        record_transition(conn, event, order_id, Some(row.status), target, now)?;
        queue_notice(conn, event, order_id, target, now)?;
        Outcome::Processed
    } else if target == row.status && !target.is_refund() {
        // Already there: processed, no effects.
        Outcome::Processed
    } else {
        // Backwards, or a refund event that reports no more refunded money than recorded.
        Outcome::Stale
    };

    if !(further_refund || forward) {
        // Details the order lacks (first PaymentIntent, email, amount, currency) are filled in
        // from any event, even one that does not move the status; they are not effects.
        // update_order does the same for moving events.
        conn.prepare_cached(
            "UPDATE orders SET
                 payment_intent_id = COALESCE(payment_intent_id, ?2),
                 customer_email = COALESCE(customer_email, ?3),
                 amount = COALESCE(amount, ?4),
                 currency = COALESCE(currency, ?5)
             WHERE order_id = ?1",
        )?
        .execute(params![
            order_id,
            event.payment_intent_id,
            change.customer_email,
            change.amount,
            change.currency
        ])?;
    }
    Ok(outcome)
}

fn update_order(
    conn: &Connection,
    event: &NormalizedEvent,
    change: &StatusChange,
    order_id: &str,
    now: &str,
) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "UPDATE orders SET
             status = ?2,
             refunded_amount = CASE WHEN ?3 IS NULL THEN refunded_amount ELSE MAX(refunded_amount, ?3) END,
             amount = COALESCE(amount, ?4),
             currency = COALESCE(currency, ?5),
             customer_email = COALESCE(?6, customer_email),
             payment_intent_id = COALESCE(payment_intent_id, ?7),
             updated_at = ?8,
             last_event_id = ?9
         WHERE order_id = ?1",
    )?
    .execute(params![
        order_id,
        change.target.as_str(),
        change.refunded_amount,
        change.amount,
        change.currency,
        change.customer_email,
        event.payment_intent_id,
        now,
        event.event_id,
    ])?;
    Ok(())
}

/// Appends to the audit trail; called exactly where the order's status or refund changes.
fn record_transition(
    conn: &Connection,
    event: &NormalizedEvent,
    order_id: &str,
    from: Option<OrderStatus>,
    to: OrderStatus,
    now: &str,
) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO order_transitions (order_id, from_status, to_status, refunded_amount, provider,
                                        event_id, changed_at)
         SELECT order_id, ?2, ?3, refunded_amount, ?4, ?5, ?6 FROM orders WHERE order_id = ?1",
    )?
    .execute(params![
        order_id,
        from.map(OrderStatus::as_str),
        to.as_str(),
        event.provider.as_str(),
        event.event_id,
        now
    ])?;
    Ok(())
}

/// Queues the notice for `status` if it has one. The idempotency key is derived from the change
/// itself, so two different events announcing the same change cannot queue two emails.
fn queue_notice(
    conn: &Connection,
    event: &NormalizedEvent,
    order_id: &str,
    status: OrderStatus,
    now: &str,
) -> rusqlite::Result<()> {
    let Some(notice) = status.notice() else {
        return Ok(());
    };
    let (amount, refunded_amount, currency, recipient): (Option<i64>, i64, Option<String>, Option<String>) = conn
        .prepare_cached(
            "SELECT amount, refunded_amount, currency, customer_email FROM orders WHERE order_id = ?1",
        )?
        .query_row([order_id], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)))?;
    let key = outbox_idempotency_key(order_id, notice.template(), status, refunded_amount);
    let params_json = serde_json::json!({
        "order_id": order_id,
        "status": status.as_str(),
        "amount": amount,
        "refunded_amount": refunded_amount,
        "currency": currency,
        "provider": event.provider.as_str(),
        "event_id": event.event_id,
    })
    .to_string();
    conn.prepare_cached(
        "INSERT INTO email_outbox (order_id, recipient, template, params, idempotency_key, status,
                                   attempts, created_at, event_id)
         VALUES (?1, ?2, ?3, ?4, ?5, 'pending', 0, ?6, ?7)
         ON CONFLICT (idempotency_key) DO NOTHING",
    )?
    .execute(params![
        order_id,
        recipient,
        notice.template(),
        params_json,
        key,
        now,
        event.event_id
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
    hex::encode(hasher.finalize())
}

/// Records that `payment_intent_id` belongs to `order_id` and, the first time, applies the
/// events that were parked waiting for that link, oldest first, in this same transaction.
fn link_payment_intent(
    conn: &Connection,
    payment_intent_id: &str,
    order_id: &str,
    now: &str,
) -> Result<(), StoreError> {
    let inserted = conn
        .prepare_cached(
            "INSERT INTO order_payment_intents (payment_intent_id, order_id) VALUES (?1, ?2)
             ON CONFLICT (payment_intent_id) DO NOTHING",
        )?
        .execute(params![payment_intent_id, order_id])?;
    if inserted == 0 {
        return Ok(());
    }
    let parked: Vec<(String, String)> = conn
        .prepare_cached(
            "SELECT event_id, payload FROM processed_events
             WHERE outcome = 'parked' AND payment_intent_id = ?1 AND provider = 'stripe'
             ORDER BY received_at, rowid",
        )?
        .query_map([payment_intent_id], |row| Ok((row.get(0)?, row.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    for (event_id, payload) in parked {
        let event = normalise_stored(Provider::Stripe, payload.as_bytes())?;
        let outcome = match &event.change {
            Some(change) => apply_change(conn, &event, change, order_id, now)?,
            None => Outcome::Ignored,
        };
        tracing::debug!(parked_event_id = %event_id, outcome = outcome.as_str(), "applied parked event");
        set_event_outcome(conn, Provider::Stripe, &event_id, outcome, Some(order_id))?;
    }
    Ok(())
}
