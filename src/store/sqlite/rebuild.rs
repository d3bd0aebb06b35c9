//! The ledger of a database that comes from before it (schema version 6 or earlier): rebuilt
//! from the stored events when a sekali that can read them back first opens it for writing.
//!
//! The migration to version 7 (`schema.rs`) makes the tables and leaves a note that the ledger
//! is still to be built (`pending_work`); building it needs each provider to read its stored
//! bodies again, which the store cannot do by itself, so it is done here, by whoever is given a
//! reader ([`RereadStored`]), in one transaction:
//!
//! 1. Every stored event is read back and its facts merged into its payment, linked to the
//!    order it names, in arrival order (the order does not matter to the merge).
//! 2. An order whose events were purged, or say nothing of money its status says it had, gets
//!    what its row says instead (a payment that took its paid amount, refunds of its refunded
//!    amount): the ledger never forgets money the order showed.
//! 3. Each order is computed from its payments. A status an operator set by hand
//!    (`orders set-status`, the order's last transition) stands as the operator's decision. An
//!    order the ledger sees otherwise than it was shown gets its new status, a transition by
//!    `ledger` saying why, and a line in the log; no email is sent for the past.

use rusqlite::{params, Connection, OptionalExtension};

use super::events::{load_order, record_transition, write_order, ChangedBy, RereadStored};
use super::ledger;
use super::statements::Statements;
use super::StoreError;
use crate::clock::iso_seconds;
use crate::domain::decision::rescale;
use crate::domain::ledger::{
    compute, Attempt, Dispute, DisputeStage, OperatorDecision, PaymentFacts, RefundedSnapshot,
};
use crate::domain::money::iso_exponent;
use crate::domain::text::Escaped;
use crate::domain::{OrderRef, OrderStatus};

/// The note the migration to version 7 leaves.
pub const LEDGER_PENDING: &str = "ledger";

/// One order whose status the rebuilt ledger changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changed {
    pub order_id: String,
    pub was: OrderStatus,
    pub now: OrderStatus,
    pub why: String,
}

/// True when the ledger is still to be built.
pub fn is_pending(conn: &Connection) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM pending_work WHERE name = ?1)",
        [LEDGER_PENDING],
        |row| row.get(0),
    )
}

/// Builds the ledger if it is still to be built; the orders whose status it changed.
pub fn rebuild_ledger(
    conn: &Connection,
    reread: RereadStored,
    now_unix: i64,
) -> Result<Vec<Changed>, StoreError> {
    if !is_pending(conn)? {
        return Ok(Vec::new());
    }
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let result = (|| {
        // Read again under the write lock: another process may have built it meanwhile.
        if !is_pending(conn)? {
            return Ok(Vec::new());
        }
        let changed = rebuild(conn, reread, &iso_seconds(now_unix))?;
        conn.execute("DELETE FROM pending_work WHERE name = ?1", [LEDGER_PENDING])?;
        Ok(changed)
    })();
    match result {
        Ok(changed) => {
            conn.execute_batch("COMMIT")?;
            tracing::info!(
                changed = changed.len(),
                "the ledger of payments was built from the stored events"
            );
            Ok(changed)
        }
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

fn rebuild(conn: &Connection, reread: RereadStored, now: &str) -> Result<Vec<Changed>, StoreError> {
    let db = &mut Statements::new(conn);
    let events: Vec<(String, String, String, String)> = conn
        .prepare(
            "SELECT provider, event_id, event_type, payload FROM processed_events ORDER BY rowid",
        )?
        .query_map([], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    // Each event read, under its payment's key.
    let mut read = Vec::new();
    for (provider, event_id, event_type, payload) in events {
        let event = match reread(&provider, &event_type, payload.as_bytes()) {
            Ok(event) => event,
            Err(e) => {
                tracing::warn!(
                    %provider,
                    event_id = %Escaped(&event_id),
                    error = %Escaped(&e),
                    "a stored event cannot be read back; the ledger is built without it"
                );
                continue;
            }
        };
        let Some(report) = &event.payment else {
            continue;
        };
        let reference = ledger::canonical(db, &provider, &report.reference)?;
        let (folded, through_alias) =
            ledger::adopt_aliases(db, &provider, &reference, &report.aliases)?;
        let stored = ledger::load(db, &provider, &reference)?;
        let linked = stored
            .as_ref()
            .and_then(|s| s.order_id.clone())
            .or(through_alias)
            .or(match &event.order_ref {
                OrderRef::OrderId(id) => Some(id.clone()),
                _ => None,
            });
        let before = stored.map(|s| s.facts).unwrap_or_default();
        let mut after = before.clone();
        after.merge(&folded);
        after.merge(&report.facts);
        ledger::save(
            db,
            &provider,
            &reference,
            linked.as_deref(),
            &before,
            &after,
            now,
        )?;
        read.push((provider, event_id, reference));
    }
    // A parked event counts as processed once its payment is linked to an order, by it or by an
    // event read after it (an invoice naming the PaymentIntent a refund was parked under).
    for (provider, event_id, reference) in read {
        let reference = ledger::canonical(db, &provider, &reference)?;
        if let Some(order_id) = ledger::load(db, &provider, &reference)?.and_then(|p| p.order_id) {
            db.prepare(
                "UPDATE processed_events SET outcome = 'processed', order_id = ?3
                 WHERE provider = ?1 AND event_id = ?2 AND outcome = 'parked'",
            )?
            .execute(params![provider, event_id, order_id])?;
        }
    }
    conn.execute("UPDATE processed_events SET parked_event = NULL", [])?;

    let orders: Vec<String> = conn
        .prepare("SELECT order_id FROM orders ORDER BY order_id")?
        .query_map([], |row| row.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let mut changed = Vec::new();
    for order_id in orders {
        if let Some(change) = settle_order(db, &order_id, now)? {
            tracing::info!(
                order_id = %Escaped(&change.order_id),
                was = change.was.as_str(),
                now = change.now.as_str(),
                why = %Escaped(&change.why),
                "the ledger changed an order's status"
            );
            changed.push(change);
        }
    }
    Ok(changed)
}

/// Computes one order from its rebuilt payments, after giving it what its row says where its
/// events say nothing of it; writes what changed.
fn settle_order(
    db: &mut Statements<'_>,
    order_id: &str,
    now: &str,
) -> Result<Option<Changed>, StoreError> {
    let Some(mut order) = load_order(db, order_id)? else {
        return Ok(None);
    };
    let was = order.status;
    let mut payments = ledger::of_order(db, order_id)?;
    seed_from_the_row(db, order_id, &order, &mut payments, now)?;
    let set_by_operator: bool = db
        .prepare(
            "SELECT provider = 'operator' FROM order_transitions WHERE order_id = ?1
             ORDER BY id DESC LIMIT 1",
        )?
        .query_row([order_id], |row| row.get(0))
        .optional()?
        .unwrap_or(false);
    let terms = order.terms();
    let computed = compute(&terms, &ledger::views(&payments), None, &[], 0);
    let iso = computed.currency.as_deref().map_or(2, iso_exponent);
    let own = order.exponent.unwrap_or(iso);
    // What the customer was told of refunds: what the order showed refunded.
    order.announced = rescale(order.refunded_amount, own, iso).max(0);
    if set_by_operator {
        order.operator = Some(OperatorDecision {
            status: was,
            money: computed.money,
        });
    } else {
        order.status = computed.status;
        order.review = computed.review.as_ref().map(|r| r.reason.clone());
        order.refunded_amount = rescale(computed.money.returned, iso, own);
    }
    if computed.money.captured > 0 {
        order.paid_amount = Some(rescale(computed.money.captured, iso, own));
        order.paid_currency.clone_from(&computed.currency);
    }
    let by = ChangedBy {
        provider: "ledger",
        event_id: "schema-v7",
        actor: Some("sekali"),
        reason: None,
    };
    let change = (order.status != was).then(|| Changed {
        order_id: order_id.to_owned(),
        was,
        now: order.status,
        why: match &computed.review {
            Some(review) => review.reason.clone(),
            None => why(&computed),
        },
    });
    write_order(db, order_id, &order, &by, now, change.is_some())?;
    if let Some(change) = &change {
        let by = ChangedBy {
            reason: Some(&change.why),
            ..by
        };
        record_transition(db, &by, order_id, Some(was), &order, now)?;
    }
    Ok(change)
}

/// Why the ledger puts an order in `computed.status`, when no review reason says it.
fn why(computed: &crate::domain::ledger::Computed) -> String {
    let money = computed.money;
    let text = |amount| crate::domain::ledger::amount_text(amount, computed.currency.as_deref());
    match computed.status {
        OrderStatus::Paid => format!(
            "its payments took {} and gave none back",
            text(money.captured)
        ),
        OrderStatus::PartiallyRefunded | OrderStatus::Refunded => format!(
            "its payments took {} and gave back {}",
            text(money.captured),
            text(money.returned)
        ),
        OrderStatus::Disputed => format!("disputes hold {}", text(money.withdrawn)),
        status => format!("its payments took no money and ended {status}"),
    }
}

/// Gives the order's payments what its row says of money and attempts where its stored events
/// say nothing of them (events purged after their retention, or never stored): the ledger never
/// forgets money an order showed. Kept on the payment the order records (else `legacy:` and the
/// order id).
fn seed_from_the_row(
    db: &mut Statements<'_>,
    order_id: &str,
    order: &crate::domain::OrderState,
    payments: &mut Vec<(String, ledger::StoredPayment)>,
    now: &str,
) -> Result<(), StoreError> {
    use OrderStatus::*;
    let took_money = matches!(order.status, Paid | PartiallyRefunded | Refunded | Disputed)
        || (order.status == NeedsReview && order.paid_amount.is_some());
    let captured: i64 = payments.iter().map(|(_, p)| p.facts.captured()).sum();
    let attempted = payments.iter().any(|(_, p)| {
        p.facts.captured() > 0 || p.facts.attempt.is_some_and(|(a, _)| a != Attempt::Pending)
    });
    let currency = order
        .paid_currency
        .clone()
        .or_else(|| order.currency.clone());
    let iso = currency.as_deref().map_or(2, iso_exponent);
    let own = order.exponent.unwrap_or(iso);
    let mut facts = PaymentFacts {
        currency: currency.as_deref().map(str::to_ascii_uppercase),
        ..PaymentFacts::default()
    };
    if took_money && captured == 0 {
        let paid = order.paid_amount.or(order.amount).unwrap_or(0);
        facts.captured = Some(rescale(paid, own, iso));
        if order.refunded_amount > 0 {
            facts.refunded_snapshot = Some(RefundedSnapshot {
                amount: rescale(order.refunded_amount, own, iso),
                at: 0,
            });
        }
        if order.status == Disputed {
            facts.disputes.insert(
                "legacy".into(),
                Dispute {
                    amount: rescale(paid, own, iso),
                    stage: DisputeStage::Open,
                    withdrawn: true,
                    reinstated: false,
                },
            );
        }
    } else if !took_money && !attempted {
        let attempt = match order.status {
            Failed => Attempt::Failed,
            Expired => Attempt::Expired,
            Cancelled => Attempt::Canceled,
            _ => return Ok(()),
        };
        facts.attempt = Some((attempt, 0));
    } else {
        return Ok(());
    }
    let provider = order.provider.as_str();
    let reference = order
        .payment_ref
        .clone()
        .unwrap_or_else(|| format!("legacy:{order_id}"));
    let stored = ledger::load(db, provider, &reference)?;
    let before = stored.map(|s| s.facts).unwrap_or_default();
    let mut after = before.clone();
    after.merge(&facts);
    ledger::save(
        db,
        provider,
        &reference,
        Some(order_id),
        &before,
        &after,
        now,
    )?;
    payments.retain(|(p, s)| !(p == provider && s.reference == reference));
    payments.push((
        provider.to_owned(),
        ledger::StoredPayment {
            reference,
            order_id: Some(order_id.to_owned()),
            facts: after,
        },
    ));
    Ok(())
}
