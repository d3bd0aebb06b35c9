//! The ledger's tables: `payments`, `payment_refunds`, `payment_disputes`, `payment_aliases`.
//!
//! A payment row holds the join of every fact its events reported (`domain::ledger`); this
//! reads it back into [`PaymentFacts`] and writes the merged facts, changing only the child
//! rows whose facts changed. The computing is the domain's: here are only the rows.

use rusqlite::{params, OptionalExtension};

use super::statements::Statements;
use crate::domain::ledger::{
    Attempt, Dispute, DisputeStage, PaymentFacts, Refund, RefundState, RefundedSnapshot,
};
use crate::store::payments::{time_of, time_text};
pub use crate::store::payments::{views, StoredPayment};

/// The payment `reference` names: the one it is an alias of, else itself.
pub fn canonical(
    db: &mut Statements<'_>,
    provider: &str,
    reference: &str,
) -> rusqlite::Result<String> {
    Ok(db
        .prepare("SELECT payment_ref FROM payment_aliases WHERE provider = ?1 AND alias = ?2")?
        .query_row(params![provider, reference], |row| row.get(0))
        .optional()?
        .unwrap_or_else(|| reference.to_owned()))
}

/// Records that each of `aliases` names the payment `reference`, folding into it the facts that
/// arrived under an alias before it was known to be one (the alias's own row goes). Returns the
/// facts folded in, and the order one of them was linked to.
pub fn adopt_aliases(
    db: &mut Statements<'_>,
    provider: &str,
    reference: &str,
    aliases: &[String],
) -> rusqlite::Result<(PaymentFacts, Option<String>)> {
    let mut folded = PaymentFacts::default();
    let mut linked = None;
    for alias in aliases.iter().filter(|a| a.as_str() != reference) {
        let inserted = db
            .prepare(
                "INSERT INTO payment_aliases (provider, alias, payment_ref) VALUES (?1, ?2, ?3)
                 ON CONFLICT (provider, alias) DO NOTHING",
            )?
            .execute(params![provider, alias, reference])?;
        if inserted == 0 {
            continue;
        }
        // Events parked under the alias wait on the payment now (see `events::PARK_RELEASE`).
        db.prepare(
            "UPDATE processed_events SET payment_intent_id = ?3
             WHERE outcome = 'parked' AND payment_intent_id = ?2 AND provider = ?1",
        )?
        .execute(params![provider, alias, reference])?;
        if let Some(stored) = load(db, provider, alias)? {
            folded.merge(&stored.facts);
            linked = linked.or(stored.order_id);
            for sql in [
                "DELETE FROM payments WHERE provider = ?1 AND payment_ref = ?2",
                "DELETE FROM payment_refunds WHERE provider = ?1 AND payment_ref = ?2",
                "DELETE FROM payment_disputes WHERE provider = ?1 AND payment_ref = ?2",
            ] {
                db.prepare(sql)?.execute(params![provider, alias])?;
            }
        }
    }
    Ok((folded, linked))
}

/// The payment `reference` of `provider`, with its refunds and disputes, if it is known.
pub fn load(
    db: &mut Statements<'_>,
    provider: &str,
    reference: &str,
) -> rusqlite::Result<Option<StoredPayment>> {
    let row = db
        .prepare(
            "SELECT order_id, currency, requested, expected, authorized, captured, captured_at,
                    released, released_as_refunds, attempt, attempt_at, undone,
                    refunded_reported, refunded_reported_at, refund_count, dispute_count
             FROM payments WHERE provider = ?1 AND payment_ref = ?2",
        )?
        .query_row(params![provider, reference], payment_row)
        .optional()?;
    let Some((order_id, mut facts, refunds, disputes)) = row else {
        return Ok(None);
    };
    if refunds > 0 {
        load_refunds(db, provider, reference, &mut facts)?;
    }
    if disputes > 0 {
        load_disputes(db, provider, reference, &mut facts)?;
    }
    Ok(Some(StoredPayment {
        reference: reference.to_owned(),
        order_id,
        facts,
    }))
}

type PaymentRow = (Option<String>, PaymentFacts, i64, i64);

fn payment_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<PaymentRow> {
    let attempt: String = row.get(9)?;
    let attempt = Attempt::parse(&attempt).ok_or_else(|| unreadable("attempt", &attempt))?;
    let attempt_at: Option<String> = row.get(10)?;
    let captured: i64 = row.get(5)?;
    let released: i64 = row.get(7)?;
    let released_as_refunds: i64 = row.get(8)?;
    let reported: Option<i64> = row.get(12)?;
    let facts = PaymentFacts {
        currency: row.get(1)?,
        requested: row.get(2)?,
        expected: row.get(3)?,
        authorized: row.get(4)?,
        captured: (captured > 0).then_some(captured),
        captured_at: row.get::<_, Option<String>>(6)?.map(|t| time_of(Some(t))),
        released: (released > 0).then_some(released),
        released_as_refunds: (released_as_refunds > 0).then_some(released_as_refunds),
        // A stored `pending` with no time may be no word at all; it merges the same either way.
        attempt: Some((attempt, time_of(attempt_at))),
        undone: row.get(11)?,
        refunded_snapshot: reported.map(|amount| RefundedSnapshot {
            amount,
            at: time_of(row.get(13).ok().flatten()),
        }),
        ..PaymentFacts::default()
    };
    Ok((row.get(0)?, facts, row.get(14)?, row.get(15)?))
}

fn unreadable(column: &str, value: &str) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(
        0,
        rusqlite::types::Type::Text,
        format!("payments.{column} holds `{value}`").into(),
    )
}

fn load_refunds(
    db: &mut Statements<'_>,
    provider: &str,
    reference: &str,
    facts: &mut PaymentFacts,
) -> rusqlite::Result<()> {
    let rows: Vec<(String, i64, String, Option<String>)> = db
        .prepare(
            "SELECT refund_id, amount, state, failed_at FROM payment_refunds
             WHERE provider = ?1 AND payment_ref = ?2",
        )?
        .query_map(params![provider, reference], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    for (id, amount, state, failed_at) in rows {
        let state = RefundState::parse(&state).ok_or_else(|| unreadable("state", &state))?;
        facts.refunds.insert(
            id,
            Refund {
                amount,
                state,
                failed_at: failed_at.map(|t| time_of(Some(t))),
            },
        );
    }
    Ok(())
}

fn load_disputes(
    db: &mut Statements<'_>,
    provider: &str,
    reference: &str,
    facts: &mut PaymentFacts,
) -> rusqlite::Result<()> {
    let rows: Vec<(String, i64, String, bool, bool)> = db
        .prepare(
            "SELECT dispute_id, amount, stage, withdrawn, reinstated FROM payment_disputes
             WHERE provider = ?1 AND payment_ref = ?2",
        )?
        .query_map(params![provider, reference], |row| {
            Ok((
                row.get(0)?,
                row.get(1)?,
                row.get(2)?,
                row.get(3)?,
                row.get(4)?,
            ))
        })?
        .collect::<rusqlite::Result<_>>()?;
    for (id, amount, stage, withdrawn, reinstated) in rows {
        let stage = DisputeStage::parse(&stage).ok_or_else(|| unreadable("stage", &stage))?;
        facts.disputes.insert(
            id,
            Dispute {
                amount,
                stage,
                withdrawn,
                reinstated,
            },
        );
    }
    Ok(())
}

/// Every payment linked to `order_id`, with its refunds and disputes, and its provider.
pub fn of_order(
    db: &mut Statements<'_>,
    order_id: &str,
) -> rusqlite::Result<Vec<(String, StoredPayment)>> {
    let rows: Vec<(String, String)> = db
        .prepare("SELECT provider, payment_ref FROM payments WHERE order_id = ?1")?
        .query_map([order_id], |row| Ok((row.get(0)?, row.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let mut payments = Vec::with_capacity(rows.len());
    for (provider, reference) in rows {
        if let Some(stored) = load(db, &provider, &reference)? {
            payments.push((provider, stored));
        }
    }
    Ok(payments)
}

/// Writes `facts` as the payment `reference`'s, linked to `order_id`: the row, and the refunds and
/// disputes that differ from `before`'s.
pub fn save(
    db: &mut Statements<'_>,
    provider: &str,
    reference: &str,
    order_id: Option<&str>,
    before: &PaymentFacts,
    facts: &PaymentFacts,
    now: &str,
) -> rusqlite::Result<()> {
    let (attempt, attempt_at) = facts.attempt.unwrap_or((Attempt::Pending, 0));
    db.prepare(
        "INSERT INTO payments (provider, payment_ref, order_id, currency, requested, expected,
                               authorized, captured, captured_at, released, released_as_refunds,
                               attempt, attempt_at, undone, refunded_reported,
                               refunded_reported_at, returned, withdrawn, refund_count,
                               dispute_count, created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18,
                 ?19, ?20, ?21, ?21)
         ON CONFLICT (provider, payment_ref) DO UPDATE SET
             order_id = excluded.order_id, currency = excluded.currency,
             requested = excluded.requested, expected = excluded.expected,
             authorized = excluded.authorized, captured = excluded.captured,
             captured_at = excluded.captured_at, released = excluded.released,
             released_as_refunds = excluded.released_as_refunds, attempt = excluded.attempt,
             attempt_at = excluded.attempt_at, undone = excluded.undone,
             refunded_reported = excluded.refunded_reported,
             refunded_reported_at = excluded.refunded_reported_at,
             returned = excluded.returned, withdrawn = excluded.withdrawn,
             refund_count = excluded.refund_count, dispute_count = excluded.dispute_count,
             updated_at = excluded.updated_at",
    )?
    .execute(params![
        provider,
        reference,
        order_id,
        facts.currency,
        facts.requested,
        facts.expected,
        facts.authorized,
        facts.captured(),
        facts.captured_at.and_then(time_text),
        facts.released.unwrap_or(0),
        facts.released_as_refunds.unwrap_or(0),
        attempt.as_str(),
        time_text(attempt_at),
        facts.undone,
        facts.refunded_snapshot.map(|s| s.amount),
        facts.refunded_snapshot.and_then(|s| time_text(s.at)),
        facts.returned(),
        facts.withdrawn(),
        facts.refunds.len() as i64,
        facts.disputes.len() as i64,
        now,
    ])?;
    for (id, refund) in &facts.refunds {
        if before.refunds.get(id) == Some(refund) {
            continue;
        }
        db.prepare(
            "INSERT INTO payment_refunds (provider, payment_ref, refund_id, amount, state,
                                          failed_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT (provider, payment_ref, refund_id) DO UPDATE SET
                 amount = excluded.amount, state = excluded.state,
                 failed_at = excluded.failed_at",
        )?
        .execute(params![
            provider,
            reference,
            id,
            refund.amount,
            refund.state.as_str(),
            refund.failed_at.and_then(time_text),
        ])?;
    }
    for (id, dispute) in &facts.disputes {
        if before.disputes.get(id) == Some(dispute) {
            continue;
        }
        db.prepare(
            "INSERT INTO payment_disputes (provider, payment_ref, dispute_id, amount, stage,
                                           withdrawn, reinstated)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT (provider, payment_ref, dispute_id) DO UPDATE SET
                 amount = excluded.amount, stage = excluded.stage,
                 withdrawn = excluded.withdrawn, reinstated = excluded.reinstated",
        )?
        .execute(params![
            provider,
            reference,
            id,
            dispute.amount,
            dispute.stage.as_str(),
            dispute.withdrawn,
            dispute.reinstated,
        ])?;
    }
    Ok(())
}
