//! Claiming an event and applying its effects, inside a transaction the caller owns.
//!
//! The caller (the writer thread) opens `BEGIN IMMEDIATE` and a SAVEPOINT per delivery, calls
//! [`record_event_and_apply`], and rolls the savepoint back on [`Outcome::Duplicate`] or an error.
//! So the claim in `processed_events`, the order change and the outbox row commit together or not
//! at all.

use rusqlite::{params, OptionalExtension};

use super::statements::Statements;
use super::StoreError;
use crate::clock::iso_seconds;
pub use crate::domain::Outcome;
use crate::domain::{
    decide, Decision, NormalizedEvent, OrderRef, OrderState, OrderStatus, ProviderName,
    StatusChange,
};

/// Claims `event` and applies its effects. `payload` is the raw verified body.
///
/// Returns [`Outcome::Duplicate`] when a live claim already exists; the caller must then roll
/// back its savepoint (nothing was written, but rolling back keeps that a structural guarantee).
pub fn record_event_and_apply(
    db: &mut Statements<'_>,
    event: &NormalizedEvent,
    payload: &str,
    now_unix: i64,
) -> Result<Outcome, StoreError> {
    let now = iso_seconds(now_unix);
    let retention = i64::try_from(event.retention.as_secs()).unwrap_or(i64::MAX / 2);
    let expires_at = iso_seconds(now_unix.saturating_add(retention));
    let known_order_id = match &event.order_ref {
        OrderRef::OrderId(id) => Some(id.as_str()),
        _ => None,
    };
    if let Some(legacy) = &event.legacy_event_id {
        if is_claimed_for_order(db, &event.provider, legacy, known_order_id, &now)? {
            return Ok(Outcome::Duplicate);
        }
    }

    // The claim. A row whose retention has run out counts as absent even before the purge
    // removes it, so the contract "a delivery older than the retention is new" holds exactly.
    // Claimed again, it takes a new rowid: listings go by rowid as arrival order, and the new
    // claim is the newest arrival.
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
                 payload = excluded.payload,
                 rowid = (SELECT max(rowid) FROM processed_events) + 1
             WHERE processed_events.expires_at <= excluded.received_at",
        )?
        .execute(params![
            event.provider.as_str(),
            event.event_id,
            event.event_type,
            known_order_id,
            now,
            expires_at,
            event.payment_ref,
            payload,
        ])?;
    if claimed == 0 {
        return Ok(Outcome::Duplicate);
    }
    fail::fail_point!("store::after_claim", |_| Err(StoreError::Injected(
        "store::after_claim"
    )));

    let (outcome, order_id) = resolve_and_apply(db, event, &now)?;
    if outcome == Outcome::Parked {
        park(db, event)?;
    }
    if outcome != Outcome::Processed || order_id.as_deref() != known_order_id {
        set_event_outcome(
            db,
            &event.provider,
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

/// True when `event_id` holds a claim that has not expired, made for `order_id` (or for no
/// order). An id in the earlier, unescaped form is ambiguous: the same text can stand for two
/// orders' notifications, and only the one of the same order is this delivery.
fn is_claimed_for_order(
    db: &mut Statements<'_>,
    provider: &ProviderName,
    event_id: &str,
    order_id: Option<&str>,
    now: &str,
) -> rusqlite::Result<bool> {
    db.prepare(
        "SELECT EXISTS (SELECT 1 FROM processed_events
                        WHERE provider = ?1 AND event_id = ?2 AND expires_at > ?3
                          AND (order_id IS NULL OR order_id IS ?4))",
    )?
    .query_row(params![provider.as_str(), event_id, now, order_id], |row| {
        row.get(0)
    })
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
        OrderRef::Payment {
            reference,
            park_if_unlinked,
        } => match order_for_payment(db, reference)? {
            Some(order_id) => order_id,
            None if *park_if_unlinked => return Ok((Outcome::Parked, None)),
            None => return Ok((Outcome::Ignored, None)),
        },
        OrderRef::None => return Ok((Outcome::Ignored, None)),
    };
    let outcome = apply_change(db, event, change, &order_id, now)?;
    Ok((outcome, Some(order_id)))
}

fn order_for_payment(db: &mut Statements<'_>, reference: &str) -> rusqlite::Result<Option<String>> {
    db.prepare("SELECT order_id FROM order_payment_intents WHERE payment_intent_id = ?1")?
        .query_row([reference], |row| row.get(0))
        .optional()
}

/// Keeps a parked event in its normalised form, so that the link that frees it applies it
/// without reading its payload again.
fn park(db: &mut Statements<'_>, event: &NormalizedEvent) -> rusqlite::Result<()> {
    let parked = serde_json::to_string(event).expect("serialising plain fields cannot fail");
    db.prepare(
        "UPDATE processed_events SET parked_event = ?3 WHERE provider = ?1 AND event_id = ?2",
    )?
    .execute(params![event.provider.as_str(), event.event_id, parked])?;
    Ok(())
}

fn set_event_outcome(
    db: &mut Statements<'_>,
    provider: &ProviderName,
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

pub(crate) fn load_order(
    db: &mut Statements<'_>,
    order_id: &str,
) -> Result<Option<OrderState>, StoreError> {
    let row = db
        .prepare(
            "SELECT status, provider, amount, refunded_amount, currency, customer_email,
                    payment_intent_id, source = 'api', paid_amount, paid_currency, amount_exponent,
                    payer_email
             FROM orders WHERE order_id = ?1",
        )?
        .query_row([order_id], |row| {
            let unreadable = |column: &str, value: &str| {
                rusqlite::Error::FromSqlConversionFailure(
                    0,
                    rusqlite::types::Type::Text,
                    format!("orders.{column} holds `{value}`").into(),
                )
            };
            let status: String = row.get(0)?;
            let provider: String = row.get(1)?;
            Ok(OrderState {
                status: status.parse().map_err(|_| unreadable("status", &status))?,
                provider: ProviderName::from_owned(provider)
                    .map_err(|provider| unreadable("provider", &provider))?,
                exponent: row.get(10)?,
                from_api: row.get(7)?,
                amount: row.get(2)?,
                refunded_amount: row.get(3)?,
                currency: row.get(4)?,
                customer_email: row.get(5)?,
                payer_email: row.get(11)?,
                payment_ref: row.get(6)?,
                paid_amount: row.get(8)?,
                paid_currency: row.get(9)?,
            })
        })
        .optional()?;
    Ok(row)
}

/// Moves `order_id` as [`decide`] says and queues the customer notice for the status reached.
/// The order is read once and written with one statement.
fn apply_change(
    db: &mut Statements<'_>,
    event: &NormalizedEvent,
    change: &StatusChange,
    order_id: &str,
    now: &str,
) -> Result<Outcome, StoreError> {
    let current = load_order(db, order_id)?;
    let linked = current.as_ref().and_then(|c| c.payment_ref.clone());
    let decision = decide(current.as_ref(), event, change);
    let outcome = decision.outcome();
    match decision {
        Decision::Create { state } => save_change(db, event, order_id, None, &state, now)?,
        Decision::Move {
            from,
            next,
            outcome,
        } => {
            if outcome != Outcome::Processed {
                tracing::warn!(
                    order_id = %crate::domain::text::Escaped(order_id),
                    provider = %event.provider,
                    event_type = %crate::domain::text::Escaped(&event.event_type),
                    outcome = outcome.as_str(),
                    "order moved to needs_review: {}",
                    match outcome {
                        Outcome::Reversed => "the provider reversed a payment it had settled; no email was queued",
                        _ => "the payment does not match the order's amount or currency",
                    }
                );
            }
            save_change(db, event, order_id, Some(from), &next, now)?
        }
        Decision::Keep { next, .. } => {
            if current.as_ref() != Some(&next) {
                db.prepare(
                    "UPDATE orders SET amount = ?2, currency = ?3, customer_email = ?4,
                                       payment_intent_id = ?5, amount_exponent = ?6,
                                       payer_email = ?7
                     WHERE order_id = ?1",
                )?
                .execute(params![
                    order_id,
                    next.amount,
                    next.currency,
                    next.customer_email,
                    next.payment_ref,
                    next.exponent,
                    next.payer_email,
                ])?;
            }
        }
    }

    if let Some(reference) = &event.payment_ref {
        // An order's recorded payment was linked when it was recorded.
        if linked.as_deref() != Some(reference.as_str()) {
            link_payment(db, &event.provider, reference, order_id, now)?;
        }
    }
    Ok(outcome)
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
                             customer_email, payment_intent_id, created_at, updated_at, last_event_id,
                             paid_amount, paid_currency, amount_exponent, payer_email)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9, ?10, ?11, ?12, ?13, ?14)
         ON CONFLICT (order_id) DO UPDATE SET
             status = excluded.status, amount = excluded.amount,
             refunded_amount = excluded.refunded_amount, currency = excluded.currency,
             customer_email = excluded.customer_email, payment_intent_id = excluded.payment_intent_id,
             updated_at = excluded.updated_at, last_event_id = excluded.last_event_id,
             paid_amount = excluded.paid_amount, paid_currency = excluded.paid_currency,
             amount_exponent = excluded.amount_exponent, payer_email = excluded.payer_email",
    )?
    .execute(params![
        order_id,
        state.provider.as_str(),
        state.status.as_str(),
        state.amount,
        state.refunded_amount,
        state.currency,
        state.customer_email,
        state.payment_ref,
        now,
        event.event_id,
        state.paid_amount,
        state.paid_currency,
        state.exponent,
        state.payer_email,
    ])?;
    record_change(
        db,
        &ChangedBy::event(event.provider.as_str(), &event.event_id),
        order_id,
        from,
        state,
        now,
    )
}

/// Who made a change, as the audit trail records it (`order_transitions.provider`, `event_id`,
/// `actor`, `reason`).
pub(crate) struct ChangedBy<'a> {
    /// A provider's name, `api` or `operator`.
    pub provider: &'a str,
    pub event_id: &'a str,
    /// The operator's or the API client's name.
    pub actor: Option<&'a str>,
    /// The operator's reason.
    pub reason: Option<&'a str>,
}

impl<'a> ChangedBy<'a> {
    /// A provider's event.
    pub fn event(provider: &'a str, event_id: &'a str) -> Self {
        ChangedBy {
            provider,
            event_id,
            actor: None,
            reason: None,
        }
    }
}

/// The effects of a status change: its row in the audit trail and the customer notice the new
/// status carries. Called exactly where an order's status or refund changes.
pub(crate) fn record_change(
    db: &mut Statements<'_>,
    by: &ChangedBy<'_>,
    order_id: &str,
    from: Option<OrderStatus>,
    to: &OrderState,
    now: &str,
) -> rusqlite::Result<()> {
    record_transition(db, by, order_id, from, to, now)?;
    queue_notice(db, by.provider, by.event_id, order_id, to, now)
}

/// Appends to the audit trail.
fn record_transition(
    db: &mut Statements<'_>,
    by: &ChangedBy<'_>,
    order_id: &str,
    from: Option<OrderStatus>,
    to: &OrderState,
    now: &str,
) -> rusqlite::Result<()> {
    db.prepare(
        "INSERT INTO order_transitions (order_id, from_status, to_status, refunded_amount, provider,
                                        event_id, changed_at, actor, reason)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    )?
    .execute(params![
        order_id,
        from.map(OrderStatus::as_str),
        to.status.as_str(),
        to.refunded_amount,
        by.provider,
        by.event_id,
        now,
        by.actor,
        by.reason,
    ])?;
    Ok(())
}

/// Queues the notice the order's new state carries, if it has one (see
/// [`crate::domain::notice_for`]). Its key is the change itself, so two different events
/// announcing the same change cannot queue two emails.
fn queue_notice(
    db: &mut Statements<'_>,
    provider: &str,
    event_id: &str,
    order_id: &str,
    order: &OrderState,
    now: &str,
) -> rusqlite::Result<()> {
    let Some(notice) = crate::domain::notice_for(order_id, order, provider, event_id) else {
        return Ok(());
    };
    db.prepare(
        "INSERT INTO email_outbox (order_id, recipient, template, params, idempotency_key, status,
                                   attempts, created_at, event_id, next_attempt_at)
         VALUES (?1, ?2, ?3, ?4, ?5, 'pending', 0, ?6, ?7, replace(?6, 'Z', '.000Z'))
         ON CONFLICT (order_id, idempotency_key) DO NOTHING",
    )?
    .execute(params![
        order_id,
        order.customer_email,
        notice.template,
        notice.params,
        notice.key,
        now,
        event_id
    ])?;
    Ok(())
}

/// Records that the payment `reference` belongs to `order_id` and, the first time, applies the
/// events of `provider` that were parked waiting for that link, oldest first, in this same
/// transaction. A parked event is stored in its normalised form (`parked_event`), so nothing is
/// parsed again here.
fn link_payment(
    db: &mut Statements<'_>,
    provider: &ProviderName,
    reference: &str,
    order_id: &str,
    now: &str,
) -> Result<(), StoreError> {
    let inserted = db
        .prepare(
            "INSERT INTO order_payment_intents (payment_intent_id, order_id) VALUES (?1, ?2)
             ON CONFLICT (payment_intent_id) DO NOTHING",
        )?
        .execute(params![reference, order_id])?;
    if inserted == 0 {
        return Ok(());
    }
    let parked: Vec<(String, String)> = db
        .prepare(
            "SELECT event_id, parked_event FROM processed_events
             WHERE outcome = 'parked' AND payment_intent_id = ?1 AND provider = ?2
               AND parked_event IS NOT NULL
             ORDER BY received_at, rowid",
        )?
        .query_map(params![reference, provider.as_str()], |row| {
            Ok((row.get(0)?, row.get(1)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    for (event_id, parked_event) in parked {
        let event: NormalizedEvent = serde_json::from_str(&parked_event)
            .map_err(|e| StoreError::StoredEvent(format!("parked event {event_id}: {e}")))?;
        let outcome = match &event.change {
            Some(change) => apply_change(db, &event, change, order_id, now)?,
            None => Outcome::Ignored,
        };
        tracing::debug!(parked_event_id = %crate::domain::text::Escaped(&event_id), outcome = outcome.as_str(), "applied parked event");
        set_event_outcome(db, provider, &event_id, outcome, Some(order_id))?;
    }
    Ok(())
}

/// Reads a stored body back into its event: `(provider, payload)` to the event, by the provider
/// that verified it (given by the caller; the store knows no provider).
pub type RereadStored = fn(&str, &[u8]) -> Result<NormalizedEvent, String>;

/// Gives every parked event stored before schema version 5 (its body only) its normalised form,
/// read back by `reread`, so that the link that frees it applies it as it applies newer ones.
/// One that cannot be read stays parked and is logged. Returns how many were converted.
pub fn convert_legacy_parked(
    conn: &rusqlite::Connection,
    reread: RereadStored,
) -> Result<usize, StoreError> {
    let legacy: Vec<(String, String, String)> = conn
        .prepare(
            "SELECT provider, event_id, payload FROM processed_events
             WHERE outcome = 'parked' AND parked_event IS NULL",
        )?
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))?
        .collect::<rusqlite::Result<_>>()?;
    if legacy.is_empty() {
        return Ok(0);
    }
    let tx = rusqlite::Transaction::new_unchecked(conn, rusqlite::TransactionBehavior::Immediate)?;
    let mut converted = 0;
    for (provider, event_id, payload) in legacy {
        let escaped = crate::domain::text::Escaped(&event_id);
        match reread(&provider, payload.as_bytes()) {
            Ok(mut event) => {
                // The parked event is applied under the id it was claimed with.
                event.event_id = event_id.clone();
                let parked = serde_json::to_string(&event).expect("serialising plain fields");
                tx.execute(
                    "UPDATE processed_events SET parked_event = ?3
                     WHERE provider = ?1 AND event_id = ?2",
                    params![provider, event_id, parked],
                )?;
                converted += 1;
            }
            Err(e) => tracing::warn!(
                %provider,
                event_id = %escaped,
                error = %crate::domain::text::Escaped(&e),
                "a parked event stored by an older sekali cannot be read; it stays parked"
            ),
        }
    }
    tx.commit()?;
    tracing::info!(converted, "parked events of an older sekali converted");
    Ok(converted)
}
