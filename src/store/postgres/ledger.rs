//! The ledger's tables: `payments`, `payment_refunds`, `payment_disputes`, `payment_aliases`.
//!
//! A payment row holds the join of every fact its events reported (`domain::ledger`); this
//! reads it back into [`PaymentFacts`] and writes the merged facts, changing only the child
//! rows whose facts changed. The computing is the domain's: here are only the rows.
//!
//! On PostgreSQL several instances write at once: a payment's facts are read and merged under a
//! lock on its row ([`load_locked`]), which every writer of the payment takes first, so that two
//! deliveries about one payment merge one after the other instead of each overwriting the
//! other's facts. The row of a payment's refunds and disputes are written only with the
//! payment's row, so its lock covers them too.

use postgres::Row;

use super::{get, Db, StoreError};
use crate::domain::ledger::{
    Attempt, Dispute, DisputeStage, PaymentFacts, Refund, RefundState, RefundedSnapshot,
};
use crate::store::payments::{time_of, time_text};
pub use crate::store::payments::{views, StoredPayment};
use crate::store::ErrorKind;

/// Records that each of `aliases` names the payment `reference`, folding into it the facts that
/// arrived under an alias before it was known to be one (the alias's own row goes). Returns the
/// facts folded in, and the order one of them was linked to.
pub fn adopt_aliases(
    db: &mut Db<'_, '_>,
    provider: &str,
    reference: &str,
    aliases: &[String],
) -> Result<(PaymentFacts, Option<String>), StoreError> {
    let mut folded = PaymentFacts::default();
    let mut linked = None;
    for alias in aliases.iter().filter(|a| a.as_str() != reference) {
        let inserted = db.execute(
            "INSERT INTO payment_aliases (provider, alias, payment_ref) VALUES ($1, $2, $3)
             ON CONFLICT (provider, alias) DO NOTHING",
            &[&provider, alias, &reference],
        )?;
        if inserted == 0 {
            continue;
        }
        // Locked (and read) before the parked events move, unlike SQLite's order (where nothing
        // runs between the two): another instance may be writing facts under the alias right
        // now, having resolved it before this alias was committed. The lock waits for its
        // commit, so its facts are folded in here rather than left behind on a row no one reads
        // again, and the events it parked under the alias are visible to the update below.
        let stored = load_locked(db, provider, alias)?;
        // Events parked under the alias wait on the payment now (see
        // `events::OrderWrite::release_parked`).
        db.execute(
            "UPDATE processed_events SET payment_intent_id = $3
             WHERE outcome = 'parked' AND payment_intent_id = $2 AND provider = $1",
            &[&provider, alias, &reference],
        )?;
        if let Some(stored) = stored {
            folded.merge(&stored.facts);
            linked = linked.or(stored.order_id);
            db.execute(
                "DELETE FROM payments WHERE provider = $1 AND payment_ref = $2",
                &[&provider, alias],
            )?;
            db.execute(
                "DELETE FROM payment_refunds WHERE provider = $1 AND payment_ref = $2",
                &[&provider, alias],
            )?;
            db.execute(
                "DELETE FROM payment_disputes WHERE provider = $1 AND payment_ref = $2",
                &[&provider, alias],
            )?;
        }
    }
    Ok((folded, linked))
}

/// The payment `reference` of `provider`, with its refunds and disputes, if it is known.
///
/// Reads without a lock: for readers, and for the other payments of an order whose row the
/// caller has locked (every writer of a linked payment locks its order's row before it reads
/// the order's payments).
pub fn load(
    db: &mut Db<'_, '_>,
    provider: &str,
    reference: &str,
) -> Result<Option<StoredPayment>, StoreError> {
    let row = db.query_opt(
        "SELECT order_id, currency, requested, expected, authorized, captured, captured_at,
                released, released_as_refunds, attempt, attempt_at, undone,
                refunded_reported, refunded_reported_at, refund_count, dispute_count
         FROM payments WHERE provider = $1 AND payment_ref = $2",
        &[&provider, &reference],
    )?;
    with_children(db, provider, reference, row)
}

/// [`load`], the payment's row locked (`FOR UPDATE`) until the transaction ends: what a
/// delivery calls before it merges facts into the payment, so that two instances merging into
/// one payment at once merge one after the other (each reads the other's facts) rather than
/// both from the same old row, the later commit losing the earlier's facts.
///
/// A payment not stored yet has no row to lock: its key is held first ([`super::hold`]), so
/// another instance's first write of the same payment waits for this transaction to end. Returns
/// `None` then, as [`load`] does.
pub fn load_locked(
    db: &mut Db<'_, '_>,
    provider: &str,
    reference: &str,
) -> Result<Option<StoredPayment>, StoreError> {
    super::hold(db, &super::payment_key(provider, reference))?;
    // None when there is no row yet, or when another instance deleted it while this one waited
    // (it folded the payment into another as an alias).
    match read_locked(db, provider, reference, reference, None)? {
        Locked::Found(stored) => Ok(Some(*stored)),
        Locked::Absent { .. } => Ok(None),
    }
}

/// The payment `reference` names (the one it is an alias of, else itself), with its key held
/// ([`super::hold`]), in one statement: the name is looked up, then its key waited for, as a lookup
/// and a hold one after the other would. Another instance that held the key meanwhile may have made
/// the name an alias of another payment: [`read_locked`] says so.
pub fn canonical_held(
    db: &mut Db<'_, '_>,
    provider: &str,
    reference: &str,
) -> Result<String, StoreError> {
    // The key as `payment_key` builds it, the name appended in the statement.
    let prefix = super::payment_key(provider, "");
    let row = db.query_one(
        "SELECT name, pg_advisory_xact_lock(hashtextextended($3::text || name, 0))
         FROM (SELECT coalesce((SELECT payment_ref FROM payment_aliases
                                WHERE provider = $1::text AND alias = $2::text),
                               $2::text) AS name) AS named",
        &[&provider, &reference, &prefix],
    )?;
    get(&row, 0)
}

/// What [`read_locked`] found.
pub enum Locked {
    /// The payment, its row locked.
    Found(Box<StoredPayment>),
    /// No row (none yet, or another instance folded it into another payment while this one
    /// waited for its key), and the payment the name looked up names now.
    Absent { now_named: String },
}

/// The payment `reference` with its row locked (`FOR UPDATE`), its key held by the caller; when
/// it has no row, what `name` (the name the delivery looked up) names now, read in the same
/// statement, after the wait for the key: one round trip for what was two. With `then_hold`,
/// that key ([`super::hold`]) is held too, after the payment's, as a delivery holds the key of
/// the order it names: the wait for it cannot change what this statement read, which only a
/// holder of the payment's key writes.
pub fn read_locked(
    db: &mut Db<'_, '_>,
    provider: &str,
    reference: &str,
    name: &str,
    then_hold: Option<&str>,
) -> Result<Locked, StoreError> {
    let row = db.query_one(
        "SELECT p.order_id, p.currency, p.requested, p.expected, p.authorized, p.captured,
                p.captured_at, p.released, p.released_as_refunds, p.attempt, p.attempt_at,
                p.undone, p.refunded_reported, p.refunded_reported_at, p.refund_count,
                p.dispute_count, p.payment_ref IS NOT NULL,
                coalesce((SELECT payment_ref FROM payment_aliases
                          WHERE provider = $1::text AND alias = $3::text), $3::text),
                pg_advisory_xact_lock(hashtextextended($4::text, 0))
         FROM (SELECT) AS one
         LEFT JOIN LATERAL (
             SELECT * FROM payments WHERE provider = $1::text AND payment_ref = $2::text
             FOR UPDATE) AS p ON true",
        &[&provider, &reference, &name, &then_hold],
    )?;
    locked(db, provider, reference, row)
}

/// What a row of [`read_locked`] (or [`read_all_locked`]) says of the payment `reference`.
fn locked(
    db: &mut Db<'_, '_>,
    provider: &str,
    reference: &str,
    row: Row,
) -> Result<Locked, StoreError> {
    if !get::<bool>(&row, 16)? {
        return Ok(Locked::Absent {
            now_named: get(&row, 17)?,
        });
    }
    let stored = with_children(db, provider, reference, Some(row))?;
    Ok(Locked::Found(Box::new(stored.expect("a row was found"))))
}

/// [`read_locked`] of each of `payments` (provider, reference), each its own name, in ONE
/// statement (and one more for each that has refunds or disputes), their rows locked in the
/// order given. The caller holds their keys.
pub fn read_all_locked(
    db: &mut Db<'_, '_>,
    payments: &[(&str, &str)],
) -> Result<Vec<Locked>, StoreError> {
    let (providers, references): (Vec<&str>, Vec<&str>) = payments.iter().copied().unzip();
    let rows = db.query(
        "SELECT p.order_id, p.currency, p.requested, p.expected, p.authorized, p.captured,
                p.captured_at, p.released, p.released_as_refunds, p.attempt, p.attempt_at,
                p.undone, p.refunded_reported, p.refunded_reported_at, p.refund_count,
                p.dispute_count, p.payment_ref IS NOT NULL,
                coalesce((SELECT payment_ref FROM payment_aliases
                          WHERE provider = r.provider AND alias = r.reference), r.reference)
         FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS r (provider, reference, n)
              LEFT JOIN LATERAL (
                  SELECT * FROM payments
                  WHERE provider = r.provider AND payment_ref = r.reference
                  FOR UPDATE) AS p ON true
         ORDER BY r.n",
        &[&providers, &references],
    )?;
    rows.into_iter()
        .zip(payments)
        .map(|(row, (provider, reference))| locked(db, provider, reference, row))
        .collect()
}

/// The payment of `row` (read by [`load`] or [`load_locked`]) with its refunds and disputes.
fn with_children(
    db: &mut Db<'_, '_>,
    provider: &str,
    reference: &str,
    row: Option<Row>,
) -> Result<Option<StoredPayment>, StoreError> {
    let Some(row) = row else {
        return Ok(None);
    };
    let (order_id, mut facts, refunds, disputes) = payment_row(&row)?;
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

fn payment_row(row: &Row) -> Result<PaymentRow, StoreError> {
    let attempt: String = get(row, 9)?;
    let attempt = Attempt::parse(&attempt).ok_or_else(|| unreadable("attempt", &attempt))?;
    let attempt_at: Option<String> = get(row, 10)?;
    let captured: i64 = get(row, 5)?;
    let released: i64 = get(row, 7)?;
    let released_as_refunds: i64 = get(row, 8)?;
    let reported: Option<i64> = get(row, 12)?;
    let undone: i64 = get(row, 11)?;
    let facts = PaymentFacts {
        currency: get(row, 1)?,
        requested: get(row, 2)?,
        expected: get(row, 3)?,
        authorized: get(row, 4)?,
        captured: (captured > 0).then_some(captured),
        captured_at: get::<Option<String>>(row, 6)?.map(|t| time_of(Some(t))),
        released: (released > 0).then_some(released),
        released_as_refunds: (released_as_refunds > 0).then_some(released_as_refunds),
        // A stored `pending` with no time may be no word at all; it merges the same either way.
        attempt: Some((attempt, time_of(attempt_at))),
        undone: undone != 0,
        refunded_snapshot: reported.map(|amount| RefundedSnapshot {
            amount,
            at: time_of(row.try_get::<_, Option<String>>(13).ok().flatten()),
        }),
        ..PaymentFacts::default()
    };
    Ok((get(row, 0)?, facts, get(row, 14)?, get(row, 15)?))
}

fn unreadable(column: &str, value: &str) -> StoreError {
    StoreError::database(
        ErrorKind::Permanent,
        std::io::Error::other(format!("payments.{column} holds `{value}`")),
    )
}

fn load_refunds(
    db: &mut Db<'_, '_>,
    provider: &str,
    reference: &str,
    facts: &mut PaymentFacts,
) -> Result<(), StoreError> {
    let rows = db.query(
        "SELECT refund_id, amount, state, failed_at FROM payment_refunds
         WHERE provider = $1 AND payment_ref = $2",
        &[&provider, &reference],
    )?;
    for row in rows {
        let id: String = get(&row, 0)?;
        let amount: i64 = get(&row, 1)?;
        let state: String = get(&row, 2)?;
        let failed_at: Option<String> = get(&row, 3)?;
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
    db: &mut Db<'_, '_>,
    provider: &str,
    reference: &str,
    facts: &mut PaymentFacts,
) -> Result<(), StoreError> {
    let rows = db.query(
        "SELECT dispute_id, amount, stage, withdrawn, reinstated FROM payment_disputes
         WHERE provider = $1 AND payment_ref = $2",
        &[&provider, &reference],
    )?;
    for row in rows {
        let id: String = get(&row, 0)?;
        let amount: i64 = get(&row, 1)?;
        let stage: String = get(&row, 2)?;
        let withdrawn: i64 = get(&row, 3)?;
        let reinstated: i64 = get(&row, 4)?;
        let stage = DisputeStage::parse(&stage).ok_or_else(|| unreadable("stage", &stage))?;
        facts.disputes.insert(
            id,
            Dispute {
                amount,
                stage,
                withdrawn: withdrawn != 0,
                reinstated: reinstated != 0,
            },
        );
    }
    Ok(())
}

/// Every payment linked to `order_id`, with its refunds and disputes, and its provider.
///
/// In key order (provider, payment_ref): the order SQLite's scan of its index on `order_id`
/// gives (the index holds the primary key behind it), which the order's computation can depend
/// on (the first payment linked is the order's payment when none took money).
pub fn of_order(
    db: &mut Db<'_, '_>,
    order_id: &str,
) -> Result<Vec<(String, StoredPayment)>, StoreError> {
    others_of_order(db, order_id, None)
}

/// [`of_order`] but the payment `except` (provider, reference), which is not read: a delivery
/// has read it already, locked.
pub fn others_of_order(
    db: &mut Db<'_, '_>,
    order_id: &str,
    except: Option<(&str, &str)>,
) -> Result<Vec<(String, StoredPayment)>, StoreError> {
    Ok(others_of_orders(db, &[order_id], except.as_slice())?
        .remove(order_id)
        .unwrap_or_default())
}

/// The payments linked to each of `order_ids` but those `except` (provider, reference), by order,
/// each order's in key order ([`of_order`]): in one statement, and one more for each payment.
pub fn others_of_orders(
    db: &mut Db<'_, '_>,
    order_ids: &[&str],
    except: &[(&str, &str)],
) -> Result<std::collections::HashMap<String, Vec<(String, StoredPayment)>>, StoreError> {
    let rows = db.query(
        // Each order's looked up by its key, as `events::load_orders` does (`OFFSET 0` keeps
        // the subquery from being merged into a join that may scan the whole table).
        "SELECT u.order_id, p.provider, p.payment_ref
         FROM unnest($1::text[]) AS u (order_id)
              CROSS JOIN LATERAL (
                  SELECT provider, payment_ref FROM payments WHERE order_id = u.order_id
                  OFFSET 0) AS p
         ORDER BY u.order_id, p.provider, p.payment_ref",
        &[&order_ids],
    )?;
    let mut payments = std::collections::HashMap::<String, Vec<_>>::new();
    for row in rows {
        let order_id: String = get(&row, 0)?;
        let provider: String = get(&row, 1)?;
        let reference: String = get(&row, 2)?;
        if except.contains(&(provider.as_str(), reference.as_str())) {
            continue;
        }
        if let Some(stored) = load(db, &provider, &reference)? {
            payments
                .entry(order_id)
                .or_default()
                .push((provider, stored));
        }
    }
    Ok(payments)
}

/// Writes `facts` as the payment `reference`'s, linked to `order_id`: the row, and the refunds and
/// disputes that differ from `before`'s.
///
/// `before` must have been read under the payment's lock ([`load_locked`]) in this transaction.
pub fn save(
    db: &mut Db<'_, '_>,
    provider: &str,
    reference: &str,
    order_id: Option<&str>,
    before: &PaymentFacts,
    facts: &PaymentFacts,
    now: &str,
) -> Result<(), StoreError> {
    save_all(
        db,
        &[PaymentSave {
            provider,
            reference,
            order_id,
            before,
            facts,
        }],
        now,
    )
}

/// A payment's facts for [`save_all`] to write.
pub struct PaymentSave<'a> {
    pub provider: &'a str,
    pub reference: &'a str,
    pub order_id: Option<&'a str>,
    /// The facts the payment had, read under its lock in this transaction: only its refunds and
    /// disputes that differ from these are written.
    pub before: &'a PaymentFacts,
    pub facts: &'a PaymentFacts,
}

/// Writes each of `saves` as [`save`] does, in ONE statement: every payment's row, then the refunds
/// and disputes that changed. The payments must be distinct (one statement cannot change a row
/// twice): a batch's deliveries of one payment are applied one by one.
pub fn save_all(
    db: &mut Db<'_, '_>,
    saves: &[PaymentSave<'_>],
    now: &str,
) -> Result<(), StoreError> {
    let mut rows = PaymentRows::default();
    for save in saves {
        rows.push(save);
    }
    let PaymentRows {
        provider,
        reference,
        order_id,
        currency,
        requested,
        expected,
        authorized,
        captured,
        captured_at,
        released,
        released_as_refunds,
        attempt,
        attempt_at,
        undone,
        reported,
        reported_at,
        returned,
        withdrawn,
        refund_count,
        dispute_count,
        refunds,
        disputes,
    } = rows;
    db.execute(
        "WITH saved AS (
             INSERT INTO payments (provider, payment_ref, order_id, currency, requested, expected,
                                   authorized, captured, captured_at, released,
                                   released_as_refunds, attempt, attempt_at, undone,
                                   refunded_reported, refunded_reported_at, returned, withdrawn,
                                   refund_count, dispute_count, created_at, updated_at)
             SELECT p.*, $21::text, $21::text
             FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[],
                         $6::bigint[], $7::bigint[], $8::bigint[], $9::text[], $10::bigint[],
                         $11::bigint[], $12::text[], $13::text[], $14::bigint[], $15::bigint[],
                         $16::text[], $17::bigint[], $18::bigint[], $19::bigint[], $20::bigint[])
                  AS p
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
                 updated_at = excluded.updated_at),
         refunds AS (
             INSERT INTO payment_refunds (provider, payment_ref, refund_id, amount, state,
                                          failed_at)
             SELECT * FROM unnest($22::text[], $23::text[], $24::text[], $25::bigint[],
                                  $26::text[], $27::text[])
             ON CONFLICT (provider, payment_ref, refund_id) DO UPDATE SET
                 amount = excluded.amount, state = excluded.state,
                 failed_at = excluded.failed_at)
         INSERT INTO payment_disputes (provider, payment_ref, dispute_id, amount, stage, withdrawn,
                                       reinstated)
         SELECT * FROM unnest($28::text[], $29::text[], $30::text[], $31::bigint[], $32::text[],
                              $33::bigint[], $34::bigint[])
         ON CONFLICT (provider, payment_ref, dispute_id) DO UPDATE SET
             amount = excluded.amount, stage = excluded.stage,
             withdrawn = excluded.withdrawn, reinstated = excluded.reinstated",
        &[
            &provider,
            &reference,
            &order_id,
            &currency,
            &requested,
            &expected,
            &authorized,
            &captured,
            &captured_at,
            &released,
            &released_as_refunds,
            &attempt,
            &attempt_at,
            &undone,
            &reported,
            &reported_at,
            &returned,
            &withdrawn,
            &refund_count,
            &dispute_count,
            &now,
            &refunds.provider,
            &refunds.reference,
            &refunds.id,
            &refunds.amount,
            &refunds.state,
            &refunds.failed_at,
            &disputes.provider,
            &disputes.reference,
            &disputes.id,
            &disputes.amount,
            &disputes.stage,
            &disputes.withdrawn,
            &disputes.reinstated,
        ],
    )?;
    Ok(())
}

/// The columns [`save_all`] writes, one array each.
#[derive(Default)]
struct PaymentRows<'a> {
    provider: Vec<&'a str>,
    reference: Vec<&'a str>,
    order_id: Vec<Option<&'a str>>,
    currency: Vec<Option<&'a str>>,
    requested: Vec<Option<i64>>,
    expected: Vec<Option<i64>>,
    authorized: Vec<Option<i64>>,
    captured: Vec<i64>,
    captured_at: Vec<Option<String>>,
    released: Vec<i64>,
    released_as_refunds: Vec<i64>,
    attempt: Vec<&'static str>,
    attempt_at: Vec<Option<String>>,
    undone: Vec<i64>,
    reported: Vec<Option<i64>>,
    reported_at: Vec<Option<String>>,
    returned: Vec<i64>,
    withdrawn: Vec<i64>,
    refund_count: Vec<i64>,
    dispute_count: Vec<i64>,
    refunds: RefundRows<'a>,
    disputes: DisputeRows<'a>,
}

#[derive(Default)]
struct RefundRows<'a> {
    provider: Vec<&'a str>,
    reference: Vec<&'a str>,
    id: Vec<&'a str>,
    amount: Vec<i64>,
    state: Vec<&'static str>,
    failed_at: Vec<Option<String>>,
}

#[derive(Default)]
struct DisputeRows<'a> {
    provider: Vec<&'a str>,
    reference: Vec<&'a str>,
    id: Vec<&'a str>,
    amount: Vec<i64>,
    stage: Vec<&'static str>,
    withdrawn: Vec<i64>,
    reinstated: Vec<i64>,
}

impl<'a> PaymentRows<'a> {
    fn push(&mut self, save: &PaymentSave<'a>) {
        let facts = save.facts;
        let (attempt, attempt_at) = facts.attempt.unwrap_or((Attempt::Pending, 0));
        self.provider.push(save.provider);
        self.reference.push(save.reference);
        self.order_id.push(save.order_id);
        self.currency.push(facts.currency.as_deref());
        self.requested.push(facts.requested);
        self.expected.push(facts.expected);
        self.authorized.push(facts.authorized);
        self.captured.push(facts.captured());
        self.captured_at.push(facts.captured_at.and_then(time_text));
        self.released.push(facts.released.unwrap_or(0));
        self.released_as_refunds
            .push(facts.released_as_refunds.unwrap_or(0));
        self.attempt.push(attempt.as_str());
        self.attempt_at.push(time_text(attempt_at));
        self.undone.push(i64::from(facts.undone));
        self.reported
            .push(facts.refunded_snapshot.map(|s| s.amount));
        self.reported_at
            .push(facts.refunded_snapshot.and_then(|s| time_text(s.at)));
        self.returned.push(facts.returned());
        self.withdrawn.push(facts.withdrawn());
        self.refund_count.push(facts.refunds.len() as i64);
        self.dispute_count.push(facts.disputes.len() as i64);
        for (id, refund) in &facts.refunds {
            if save.before.refunds.get(id) == Some(refund) {
                continue;
            }
            let rows = &mut self.refunds;
            rows.provider.push(save.provider);
            rows.reference.push(save.reference);
            rows.id.push(id);
            rows.amount.push(refund.amount);
            rows.state.push(refund.state.as_str());
            rows.failed_at.push(refund.failed_at.and_then(time_text));
        }
        for (id, dispute) in &facts.disputes {
            if save.before.disputes.get(id) == Some(dispute) {
                continue;
            }
            let rows = &mut self.disputes;
            rows.provider.push(save.provider);
            rows.reference.push(save.reference);
            rows.id.push(id);
            rows.amount.push(dispute.amount);
            rows.stage.push(dispute.stage.as_str());
            rows.withdrawn.push(i64::from(dispute.withdrawn));
            rows.reinstated.push(i64::from(dispute.reinstated));
        }
    }
}
