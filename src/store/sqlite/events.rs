//! Claiming an event and applying its effects, inside a transaction the caller owns.
//!
//! The caller (the writer thread) opens `BEGIN IMMEDIATE` and a SAVEPOINT per delivery, calls
//! [`record_event_and_apply`], and rolls the savepoint back on [`Outcome::Duplicate`] or an error.
//! So the claim in `processed_events`, the payment's facts, the order change and the outbox rows
//! commit together or not at all.

use rusqlite::{params, OptionalExtension};

use super::ledger;
use super::statements::Statements;
use super::StoreError;
use crate::clock::iso_seconds;
use crate::domain::ledger::OperatorDecision;
pub use crate::domain::Outcome;
use crate::domain::{
    NormalizedEvent, OrderRef, OrderState, OrderStatus, ProviderName, QueuedNotice,
};
use crate::store::payments::{order_for, Applied, Merged};

/// Marks processed the events parked under the payment `?2` of provider `?1`, for the order
/// `?3`. A parked event waits under its payment's key (`processed_events.payment_intent_id`):
/// the key its payment had when it was parked, moved to the payment's own when that name turns
/// out to be another name of it (`ledger::adopt_aliases`). One key, so that the statement is a
/// search of the partial index of parked events: a list of the payment's names (an `IN`
/// subquery) cost an ephemeral table, with its own page cache, on every new payment.
pub(super) const PARK_RELEASE: &str =
    "UPDATE processed_events SET outcome = 'processed', order_id = ?3
     WHERE outcome = 'parked' AND payment_intent_id = ?2 AND provider = ?1";

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
                  payment_intent_id, payload, headers)
             VALUES (?1, ?2, ?3, ?4, 'processed', ?5, ?6, ?7, ?8, ?9)
             ON CONFLICT (provider, event_id) DO UPDATE SET
                 event_type = excluded.event_type, order_id = excluded.order_id,
                 outcome = excluded.outcome, received_at = excluded.received_at,
                 expires_at = excluded.expires_at, payment_intent_id = excluded.payment_intent_id,
                 payload = excluded.payload, headers = excluded.headers,
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
            event.payment_ref(),
            payload,
            event.headers,
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

/// Merges the event's facts into its payment and, when the payment's order is known, applies
/// what the order's payments now say; returns the outcome and the order id.
fn resolve_and_apply(
    db: &mut Statements<'_>,
    event: &NormalizedEvent,
    now: &str,
) -> Result<(Outcome, Option<String>), StoreError> {
    let Some(report) = &event.payment else {
        let order_id = match &event.order_ref {
            OrderRef::OrderId(id) => Some(id.clone()),
            _ => None,
        };
        return Ok((Outcome::Ignored, order_id));
    };
    let provider = event.provider.as_str();
    let reference = ledger::canonical(db, provider, &report.reference)?;
    let (folded, linked_through_alias) =
        ledger::adopt_aliases(db, provider, &reference, &report.aliases)?;
    let stored = ledger::load(db, provider, &reference)?;
    let merged = Merged::of(report, stored, folded, linked_through_alias);
    let Some(order_id) = order_for(event, &reference, merged.linked.as_deref()) else {
        // No order yet: the facts wait on the payment, and the event under its key.
        ledger::save(
            db,
            provider,
            &reference,
            None,
            &merged.before,
            &merged.after,
            now,
        )?;
        if reference != report.reference {
            db.prepare(
                "UPDATE processed_events SET payment_intent_id = ?3
                 WHERE provider = ?1 AND event_id = ?2",
            )?
            .execute(params![provider, event.event_id, reference])?;
        }
        return Ok((Outcome::Parked, None));
    };

    let current = load_order(db, &order_id)?;
    let others: Vec<(String, ledger::StoredPayment)> = ledger::of_order(db, &order_id)?
        .into_iter()
        .filter(|(p, stored)| !(p == provider && stored.reference == reference))
        .collect();
    let Applied {
        decision,
        save_payment,
        release_parked,
    } = merged.apply(event, &reference, &order_id, current.as_ref(), &others);
    if save_payment {
        ledger::save(
            db,
            provider,
            &reference,
            Some(&order_id),
            &merged.before,
            &merged.after,
            now,
        )?;
    }
    if release_parked {
        db.prepare(PARK_RELEASE)?
            .execute(params![provider, reference, order_id])?;
    }
    save_order(db, event, &order_id, &decision, now)?;
    Ok((decision.outcome, Some(order_id)))
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
                    payer_email, review_reason, operator_status, operator_money, acknowledged,
                    announced_returned
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
            let operator_status: Option<String> = row.get(13)?;
            let operator_money: Option<String> = row.get(14)?;
            let operator = match (operator_status, operator_money) {
                (Some(status), Some(money)) => Some(OperatorDecision {
                    status: status
                        .parse()
                        .map_err(|_| unreadable("operator_status", &status))?,
                    money: serde_json::from_str(&money)
                        .map_err(|_| unreadable("operator_money", &money))?,
                }),
                _ => None,
            };
            let acknowledged: Option<String> = row.get(15)?;
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
                review: row.get(12)?,
                operator,
                acknowledged: match acknowledged {
                    Some(text) => serde_json::from_str(&text)
                        .map_err(|_| unreadable("acknowledged", &text))?,
                    None => Vec::new(),
                },
                announced: row.get(16)?,
            })
        })
        .optional()?;
    Ok(row)
}

/// Writes the order as `decision` says (inserting it when the event created it), and records the
/// change with its notices when it is one.
fn save_order(
    db: &mut Statements<'_>,
    event: &NormalizedEvent,
    order_id: &str,
    decision: &crate::domain::Decision,
    now: &str,
) -> rusqlite::Result<()> {
    let state = &decision.next;
    let by = ChangedBy::event(event.provider.as_str(), &event.event_id);
    write_order(
        db,
        order_id,
        state,
        &by,
        now,
        decision.record || decision.created,
    )?;
    if decision.record {
        record_transition(db, &by, order_id, decision.from, state, now)?;
    }
    for notice in &decision.notices {
        queue(db, by.provider, by.event_id, order_id, state, notice, now)?;
    }
    Ok(())
}

/// Inserts or updates the order's row; `changed` also sets when and by which event it last
/// changed.
pub(crate) fn write_order(
    db: &mut Statements<'_>,
    order_id: &str,
    state: &OrderState,
    by: &ChangedBy<'_>,
    now: &str,
    changed: bool,
) -> rusqlite::Result<()> {
    let operator_money = state
        .operator
        .as_ref()
        .map(|d| serde_json::to_string(&d.money).expect("plain numbers serialise"));
    let acknowledged = (!state.acknowledged.is_empty())
        .then(|| serde_json::to_string(&state.acknowledged).expect("strings serialise"));
    db.prepare(
        "INSERT INTO orders (order_id, provider, status, amount, refunded_amount, currency,
                             customer_email, payment_intent_id, created_at, updated_at, last_event_id,
                             paid_amount, paid_currency, amount_exponent, payer_email, review_reason,
                             operator_status, operator_money, acknowledged, announced_returned)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18,
                 ?19)
         ON CONFLICT (order_id) DO UPDATE SET
             status = excluded.status, amount = excluded.amount,
             refunded_amount = excluded.refunded_amount, currency = excluded.currency,
             customer_email = excluded.customer_email, payment_intent_id = excluded.payment_intent_id,
             updated_at = CASE WHEN ?20 THEN excluded.updated_at ELSE orders.updated_at END,
             last_event_id = CASE WHEN ?20 THEN excluded.last_event_id ELSE orders.last_event_id END,
             paid_amount = excluded.paid_amount, paid_currency = excluded.paid_currency,
             amount_exponent = excluded.amount_exponent, payer_email = excluded.payer_email,
             review_reason = excluded.review_reason, operator_status = excluded.operator_status,
             operator_money = excluded.operator_money, acknowledged = excluded.acknowledged,
             announced_returned = excluded.announced_returned",
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
        by.event_id,
        state.paid_amount,
        state.paid_currency,
        state.exponent,
        state.payer_email,
        state.review,
        state.operator.as_ref().map(|d| d.status.as_str()),
        operator_money,
        acknowledged,
        state.announced,
        changed,
    ])?;
    Ok(())
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

/// The effects of a change made by hand (an operator's status, an API order's creation): its row
/// in the audit trail and the customer notice the new status carries.
pub(crate) fn record_change(
    db: &mut Statements<'_>,
    by: &ChangedBy<'_>,
    order_id: &str,
    from: Option<OrderStatus>,
    to: &OrderState,
    now: &str,
) -> rusqlite::Result<()> {
    record_transition(db, by, order_id, from, to, now)?;
    if let Some(notice) = crate::domain::notice::for_status(order_id, to, by.provider, by.event_id)
    {
        queue(db, by.provider, by.event_id, order_id, to, &notice, now)?;
    }
    Ok(())
}

/// Appends to the audit trail, numbering the change among the order's (the one writer adds the
/// order's changes one after the other), and queues the change for forwarding while that is on.
pub(crate) fn record_transition(
    db: &mut Statements<'_>,
    by: &ChangedBy<'_>,
    order_id: &str,
    from: Option<OrderStatus>,
    to: &OrderState,
    now: &str,
) -> rusqlite::Result<()> {
    db.prepare(
        "INSERT INTO order_transitions (order_id, from_status, to_status, refunded_amount, provider,
                                        event_id, changed_at, actor, reason, sequence, amount,
                                        currency)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9,
                 (SELECT count(*) + 1 FROM order_transitions WHERE order_id = ?1), ?10, ?11)",
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
        to.amount,
        to.currency,
    ])?;
    // While forwarding is on, the change waits to be forwarded too: in this transaction.
    db.prepare(
        "INSERT INTO forward_outbox (change_id, order_id, created_at, next_attempt_at)
         SELECT last_insert_rowid(), ?1, ?2, replace(?2, 'Z', '.000Z') FROM forward_state",
    )?
    .execute(params![order_id, now])?;
    Ok(())
}

/// Queues `notice` for the order, to its customer's address. Its key is the change itself, so
/// two events announcing the same change cannot queue two emails.
fn queue(
    db: &mut Statements<'_>,
    _provider: &str,
    event_id: &str,
    order_id: &str,
    order: &OrderState,
    notice: &QueuedNotice,
    now: &str,
) -> rusqlite::Result<()> {
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

/// Reads a stored body back into its event: `(provider, event_type, payload)` to the event, by
/// the provider that verified it (given by the caller; the store knows no provider). The stored
/// event type is the one applied (a Midtrans notification confirmed by the status API as
/// another status was applied as that one).
pub type RereadStored = fn(&str, &str, &[u8]) -> Result<NormalizedEvent, String>;

#[cfg(test)]
mod tests {
    /// Every delivery that names a payment for the first time runs this statement. A version
    /// that scanned every event of the provider instead of the partial index of parked events
    /// fell from about 26,000 deliveries/s to 380 on a database of 100,000 events, and one that
    /// searched the index for a list of the payment's names (an ephemeral table per delivery)
    /// to 0.74 of what it had been (benches/ab.sh).
    #[test]
    fn releasing_parked_events_searches_the_index_of_parked_events() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.execute_batch(super::super::schema::SCHEMA_SQL)
            .unwrap();
        let plan: Vec<String> = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {}", super::PARK_RELEASE))
            .unwrap()
            .query_map(["stripe", "pi_1", "ord_1"], |row| row.get(3))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(
            plan.iter().any(|step| step
                == "SEARCH processed_events USING INDEX processed_events_parked (payment_intent_id=?)"),
            "{plan:#?}"
        );
        assert_eq!(plan.len(), 1, "one search, no subquery: {plan:#?}");
    }
}
