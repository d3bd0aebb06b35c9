//! Claiming an event and applying its effects, inside a transaction the caller owns.
//!
//! The caller (the writer thread) opens a transaction and a SAVEPOINT per delivery, calls
//! [`record_event_and_apply`], and rolls the savepoint back on [`Outcome::Duplicate`] or an error.
//! So the claim in `processed_events`, the payment's facts, the order change and the outbox rows
//! commit together or not at all.
//!
//! Several instances write at once (READ COMMITTED), where SQLite had one writer: what a
//! delivery reads to decide what it writes is locked first. The claim is a unique key (a second
//! instance's claim of the same event waits for the first's commit, then finds it claimed); the
//! payment's row is locked before its facts are read and merged ([`ledger::load_locked`]); the
//! order's row is locked before it is read ([`load_order`]), which also serialises the reading
//! of the order's other payments, since every writer linking or changing one of them locks the
//! order first. Payment before order, as the order is found through the payment.

use postgres::types::ToSql;

use super::ledger;
use super::{get, Db, StoreError};
use crate::clock::iso_seconds;
use crate::domain::ledger::{OperatorDecision, PaymentFacts};
pub use crate::domain::Outcome;
use crate::domain::{
    NormalizedEvent, OrderRef, OrderState, OrderStatus, ProviderName, QueuedNotice,
};
use crate::store::payments::{order_for, Applied, Merged};
use crate::store::ErrorKind;

/// Claims `event` and applies its effects. `payload` is the raw verified body.
///
/// Returns [`Outcome::Duplicate`] when a live claim already exists; the caller must then roll
/// back its savepoint (nothing was written, but rolling back keeps that a structural guarantee).
pub fn record_event_and_apply(
    db: &mut Db<'_, '_>,
    event: &NormalizedEvent,
    payload: &str,
    now_unix: i64,
) -> Result<Outcome, StoreError> {
    if let Some(legacy) = &event.legacy_event_id {
        let now = iso_seconds(now_unix);
        if is_claimed_for_order(db, &event.provider, legacy, named_order(event), &now)? {
            return Ok(Outcome::Duplicate);
        }
    }
    let claimed = claim(db, &[(event, payload)], now_unix, true)?;
    if claimed[0] != Claim::Claimed {
        return Ok(Outcome::Duplicate);
    }
    apply_claimed(db, event, now_unix)
}

/// The order `event` names itself, if it does (else its payment's link says).
fn named_order(event: &NormalizedEvent) -> Option<&str> {
    match &event.order_ref {
        OrderRef::OrderId(id) => Some(id),
        _ => None,
    }
}

/// What [`claim`] did with a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// Claimed: its effects are to be applied ([`apply_claimed`]).
    Claimed,
    /// A live claim already exists, or an earlier delivery of the same event in the same call
    /// claimed it: a duplicate.
    Taken,
    /// Not claimed: an event that may have been claimed under its earlier id form claims
    /// itself ([`record_event_and_apply`]), after that check.
    Left,
}

/// Claims the `deliveries` (each an event and its raw verified body) in ONE statement, in the
/// order given (a batch's lock order: another instance claiming some of the same events claims
/// them in the same order, and the two wait for each other rather than deadlock). Events with
/// an earlier id form are `Left` unless `all` (the caller checked that form).
///
/// A row whose retention has run out counts as absent even before the purge removes it, so the
/// contract "a delivery older than the retention is new" holds exactly. Claimed again, it takes
/// a new rowid: listings go by rowid as arrival order, and the new claim is the newest arrival
/// (`rowid = DEFAULT`: the identity's next value, where SQLite takes max(rowid) + 1). Another
/// instance claiming the same event at the same time waits here for its transaction's end (the
/// unique key), then finds the claim live: a duplicate.
pub fn claim(
    db: &mut Db<'_, '_>,
    deliveries: &[(&NormalizedEvent, &str)],
    now_unix: i64,
    all: bool,
) -> Result<Vec<Claim>, StoreError> {
    let now = iso_seconds(now_unix);
    let mut seen = std::collections::HashSet::new();
    let mut claims = Vec::with_capacity(deliveries.len());
    let mut rows = ClaimRows::default();
    for (event, payload) in deliveries {
        if event.legacy_event_id.is_some() && !all {
            claims.push(Claim::Left);
            continue;
        }
        if !seen.insert((event.provider.as_str(), event.event_id.as_str())) {
            claims.push(Claim::Taken);
            continue;
        }
        // Claimed, unless the statement says otherwise below.
        claims.push(Claim::Claimed);
        let retention = i64::try_from(event.retention.as_secs()).unwrap_or(i64::MAX / 2);
        rows.provider.push(event.provider.as_str());
        rows.event_id.push(&event.event_id);
        rows.event_type.push(&event.event_type);
        rows.order_id.push(named_order(event));
        rows.expires_at
            .push(iso_seconds(now_unix.saturating_add(retention)));
        rows.payment_ref.push(event.payment_ref());
        rows.payload.push(payload);
        rows.headers.push(event.headers.as_deref());
    }
    if rows.provider.is_empty() {
        return Ok(claims);
    }
    let claimed = db.query(
        "INSERT INTO processed_events
             (provider, event_id, event_type, order_id, outcome, received_at, expires_at,
              payment_intent_id, payload, headers)
         SELECT e.provider, e.event_id, e.event_type, e.order_id, 'processed', $1::text,
                e.expires_at, e.payment_intent_id, e.payload, e.headers
         FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[],
                     $8::text[], $9::text[])
              WITH ORDINALITY AS e (provider, event_id, event_type, order_id, expires_at,
                                    payment_intent_id, payload, headers, n)
         ORDER BY e.n
         ON CONFLICT (provider, event_id) DO UPDATE SET
             event_type = excluded.event_type, order_id = excluded.order_id,
             outcome = excluded.outcome, received_at = excluded.received_at,
             expires_at = excluded.expires_at, payment_intent_id = excluded.payment_intent_id,
             payload = excluded.payload, headers = excluded.headers,
             rowid = DEFAULT
         WHERE processed_events.expires_at <= excluded.received_at
         RETURNING provider, event_id",
        &[
            &now,
            &rows.provider,
            &rows.event_id,
            &rows.event_type,
            &rows.order_id,
            &rows.expires_at,
            &rows.payment_ref,
            &rows.payload,
            &rows.headers,
        ],
    )?;
    let claimed = claimed
        .iter()
        .map(|row| Ok((get::<String>(row, 0)?, get::<String>(row, 1)?)))
        .collect::<Result<std::collections::HashSet<_>, StoreError>>()?;
    for (claim, (event, _)) in claims.iter_mut().zip(deliveries) {
        if *claim == Claim::Claimed
            && !claimed.contains(&(event.provider.as_str().to_owned(), event.event_id.clone()))
        {
            *claim = Claim::Taken;
        }
    }
    Ok(claims)
}

/// The columns of the rows [`claim`] inserts, one array each.
#[derive(Default)]
struct ClaimRows<'a> {
    provider: Vec<&'a str>,
    event_id: Vec<&'a str>,
    event_type: Vec<&'a str>,
    order_id: Vec<Option<&'a str>>,
    expires_at: Vec<String>,
    payment_ref: Vec<Option<&'a str>>,
    payload: Vec<&'a str>,
    headers: Vec<Option<&'a str>>,
}

/// Applies the effects of `event`, whose claim this transaction has made ([`claim`]).
pub fn apply_claimed(
    db: &mut Db<'_, '_>,
    event: &NormalizedEvent,
    now_unix: i64,
) -> Result<Outcome, StoreError> {
    fail::fail_point!("store::after_claim", |_| Err(StoreError::Injected(
        "store::after_claim"
    )));
    let now = iso_seconds(now_unix);
    let (outcome, order_id) = resolve_and_apply(db, event, &now)?;
    if outcome != Outcome::Processed || order_id.as_deref() != named_order(event) {
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
    db: &mut Db<'_, '_>,
    provider: &ProviderName,
    event_id: &str,
    order_id: Option<&str>,
    now: &str,
) -> Result<bool, StoreError> {
    let row = db.query_one(
        "SELECT EXISTS (SELECT 1 FROM processed_events
                        WHERE provider = $1::text AND event_id = $2::text
                          AND expires_at > $3::text
                          AND (order_id IS NULL OR order_id IS NOT DISTINCT FROM $4::text))",
        &[&provider.as_str(), &event_id, &now, &order_id],
    )?;
    get(&row, 0)
}

/// Merges the event's facts into its payment and, when the payment's order is known, applies
/// what the order's payments now say; returns the outcome and the order id.
fn resolve_and_apply(
    db: &mut Db<'_, '_>,
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
    // The payment's row is locked before anything of it is read, and read here, before the
    // aliases are adopted rather than after as in SQLite (adopting them writes no row of this
    // payment, so it reads the same): two instances delivering events of one payment merge one
    // after the other. A payment with no row yet is held by its key (`load_locked`); when this
    // had to wait for another instance that has meanwhile made the name an alias of another
    // payment (and folded its row into it), the name is looked up again, and the payment it
    // now names is the one locked: as SQLite, running after that instance, would have found.
    // The key of the order the event names is held with the payment's row (its key first, as
    // every writer of both takes them), a round trip saved: see `lock_order` below.
    let named_key = named_order(event).map(super::order_key);
    let mut reference = ledger::canonical_held(db, provider, &report.reference)?;
    let stored = loop {
        match ledger::read_locked(
            db,
            provider,
            &reference,
            &report.reference,
            named_key.as_deref(),
        )? {
            ledger::Locked::Found(stored) => break Some(*stored),
            ledger::Locked::Absent { now_named } if now_named == reference => break None,
            ledger::Locked::Absent { now_named } => {
                reference = now_named;
                super::hold(db, &super::payment_key(provider, &reference))?;
            }
        }
    };
    let (folded, linked_through_alias) =
        ledger::adopt_aliases(db, provider, &reference, &report.aliases)?;
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
            db.execute(
                "UPDATE processed_events SET payment_intent_id = $3
                 WHERE provider = $1 AND event_id = $2",
                &[&provider, &event.event_id, &reference],
            )?;
        }
        return Ok((Outcome::Parked, None));
    };

    // The order's row is locked before it is read (`load_order`), and its key held (with the
    // payment's row when the event names the order) for when it has none yet: two instances
    // changing one order (two of its payments, or a payment and an operator's decision or the API's
    // creation of it) compute it one after the other, each from the other's result, instead of the
    // later commit overwriting the earlier's.
    let current = if named_order(event) == Some(order_id.as_str()) {
        load_order(db, &order_id)?
    } else {
        lock_order(db, &order_id)?
    };
    let others = ledger::others_of_order(db, &order_id, Some((provider, &reference)))?;
    let applied = merged.apply(event, &reference, &order_id, current.as_ref(), &others);
    if applied.save_payment {
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
    let by = ChangedBy::event(provider, &event.event_id);
    write_order(
        db,
        &order_id,
        &applied.decision.next,
        &by,
        now,
        applied.order_write(provider, &reference),
    )?;
    Ok((applied.decision.outcome, Some(order_id)))
}

impl Applied {
    /// What [`write_order`] writes for the change, of the payment `reference` of `provider`.
    fn order_write<'a>(&'a self, provider: &'a str, reference: &'a str) -> OrderWrite<'a> {
        let decision = &self.decision;
        OrderWrite {
            row: Some(decision.record || decision.created),
            transition: decision.record.then_some(decision.from),
            notices: &decision.notices,
            release_parked: self.release_parked.then_some((provider, reference)),
        }
    }
}

/// Applies, in a few statements for them all rather than six each, the effects of the claimed
/// `deliveries` (each with its tracing span) that can be applied side by side: each with a
/// payment and the order it names, no other name of the payment, and neither shared with
/// another delivery of the call. Returns each delivery's outcome, `None` for those it left to be
/// applied one by one ([`apply_claimed`], after this).
///
/// It takes the locks one by one would, in the same order (each payment's key, then its order's,
/// in the batch's order), then reads every payment and order under them, computes each change as
/// [`resolve_and_apply`] does, and writes them all ([`ledger::save_all`], [`write_orders`]). A
/// delivery whose payment turns out to be linked to another order, or to be another payment's
/// other name, is left to the one-by-one path, which says so and follows the link.
pub fn apply_claimed_together(
    db: &mut Db<'_, '_>,
    deliveries: &[(&NormalizedEvent, &tracing::Span)],
    now_unix: i64,
) -> Result<Vec<Option<Outcome>>, StoreError> {
    let mut outcomes = vec![None; deliveries.len()];
    // How many deliveries name each payment and each order.
    let mut payment_uses = std::collections::HashMap::new();
    let mut order_uses = std::collections::HashMap::new();
    let keyed: Vec<Option<(&str, &str, &str)>> = deliveries
        .iter()
        .map(|(event, _)| {
            let report = event.payment.as_ref()?;
            let order = named_order(event)?;
            if report.aliases.iter().any(|a| *a != report.reference) {
                return None;
            }
            let provider = event.provider.as_str();
            *payment_uses
                .entry((provider, report.reference.as_str()))
                .or_insert(0) += 1;
            *order_uses.entry(order).or_insert(0) += 1;
            Some((provider, report.reference.as_str(), order))
        })
        .collect();
    let mut together: Vec<usize> = (0..deliveries.len())
        .filter(|&i| {
            keyed[i].is_some_and(|(provider, reference, order)| {
                payment_uses[&(provider, reference)] == 1 && order_uses[order] == 1
            })
        })
        .collect();
    if together.len() < 2 {
        return Ok(outcomes);
    }
    fail::fail_point!("store::after_claim", |_| Err(StoreError::Injected(
        "store::after_claim"
    )));
    let now = iso_seconds(now_unix);
    let key = |i: usize| keyed[i].expect("only keyed deliveries go together");

    // Each payment's key (of the name it stands for), then its order's, in the batch's order.
    let (mut providers, mut references, mut prefixes, mut order_keys) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for &i in &together {
        let (provider, reference, order) = key(i);
        providers.push(provider);
        references.push(reference);
        prefixes.push(super::payment_key(provider, ""));
        order_keys.push(super::order_key(order));
    }
    let named = db.query(
        "SELECT named.name,
                pg_advisory_xact_lock(hashtextextended(h.prefix || named.name, 0)),
                pg_advisory_xact_lock(hashtextextended(h.order_key, 0))
         FROM unnest($1::text[], $2::text[], $3::text[], $4::text[])
                  WITH ORDINALITY AS h (provider, reference, prefix, order_key, n)
              CROSS JOIN LATERAL (
                  SELECT coalesce((SELECT payment_ref FROM payment_aliases
                                   WHERE provider = h.provider AND alias = h.reference),
                                  h.reference) AS name) AS named
         ORDER BY h.n",
        &[&providers, &references, &prefixes, &order_keys],
    )?;
    let mut standing = Vec::with_capacity(together.len());
    for (&i, row) in together.iter().zip(&named) {
        // Another payment's other name: the one-by-one path follows it.
        if get::<String>(row, 0)? == key(i).1 {
            standing.push(i);
        }
    }
    together = standing;

    // Every payment, its row locked; then every order, its row locked, and their other payments.
    let payment = |i: usize| (key(i).0, key(i).1);
    let payments: Vec<(&str, &str)> = together.iter().map(|&i| payment(i)).collect();
    let read = ledger::read_all_locked(db, &payments)?;
    let mut stored = Vec::with_capacity(together.len());
    let mut standing = Vec::with_capacity(together.len());
    for (&i, locked) in together.iter().zip(read) {
        match locked {
            ledger::Locked::Found(payment)
                if payment.order_id.is_none() || payment.order_id.as_deref() == Some(key(i).2) =>
            {
                stored.push(Some(*payment));
                standing.push(i);
            }
            ledger::Locked::Absent { now_named } if now_named == key(i).1 => {
                stored.push(None);
                standing.push(i);
            }
            // Linked to another order, or made another's other name meanwhile.
            _ => {}
        }
    }
    together = standing;
    if together.is_empty() {
        return Ok(outcomes);
    }
    let orders: Vec<&str> = together.iter().map(|&i| key(i).2).collect();
    let payments: Vec<(&str, &str)> = together.iter().map(|&i| payment(i)).collect();
    let mut current = load_orders(db, &orders)?;
    let mut others = ledger::others_of_orders(db, &orders, &payments)?;

    let applied: Vec<(usize, Merged, Applied)> = together
        .iter()
        .zip(stored)
        .map(|(&i, stored)| {
            let (event, span) = deliveries[i];
            let _entered = span.enter();
            let report = event.payment.as_ref().expect("only payments go together");
            let (_, reference, order) = key(i);
            let merged = Merged::of(report, stored, PaymentFacts::default(), None);
            let applied = merged.apply(
                event,
                reference,
                order,
                current.remove(order).as_ref(),
                &others.remove(order).unwrap_or_default(),
            );
            (i, merged, applied)
        })
        .collect();
    let saves: Vec<ledger::PaymentSave<'_>> = applied
        .iter()
        .filter(|(_, _, applied)| applied.save_payment)
        .map(|(i, merged, _)| {
            let (provider, reference, order) = key(*i);
            ledger::PaymentSave {
                provider,
                reference,
                order_id: Some(order),
                before: &merged.before,
                facts: &merged.after,
            }
        })
        .collect();
    ledger::save_all(db, &saves, &now)?;
    let by: Vec<ChangedBy<'_>> = applied
        .iter()
        .map(|(i, _, _)| {
            let event = deliveries[*i].0;
            ChangedBy::event(event.provider.as_str(), &event.event_id)
        })
        .collect();
    let writes: Vec<OrderSave<'_>> = applied
        .iter()
        .zip(&by)
        .map(|((i, _, applied), by)| {
            let (provider, reference, order) = key(*i);
            OrderSave {
                order_id: order,
                state: &applied.decision.next,
                by,
                write: applied.order_write(provider, reference),
            }
        })
        .collect();
    write_orders(db, &writes, &now)?;
    for (i, _, applied) in &applied {
        let outcome = applied.decision.outcome;
        if outcome != Outcome::Processed {
            let event = deliveries[*i].0;
            set_event_outcome(
                db,
                &event.provider,
                &event.event_id,
                outcome,
                Some(key(*i).2),
            )?;
        }
        outcomes[*i] = Some(outcome);
    }
    fail::fail_point!("store::after_effects", |_| Err(StoreError::Injected(
        "store::after_effects"
    )));
    Ok(outcomes)
}

/// The order `order_id` as [`load_order`] reads it, its row locked, after holding its key
/// ([`super::hold`]): when it has no row yet, another instance's insert of the order (a delivery
/// creating it, `POST /orders`) waits for this transaction to end, and then finds the order this
/// one wrote (the caller writes the order, `write_order` inserting it).
fn lock_order(db: &mut Db<'_, '_>, order_id: &str) -> Result<Option<OrderState>, StoreError> {
    super::hold(db, &super::order_key(order_id))?;
    load_order(db, order_id)
}

fn set_event_outcome(
    db: &mut Db<'_, '_>,
    provider: &ProviderName,
    event_id: &str,
    outcome: Outcome,
    order_id: Option<&str>,
) -> Result<(), StoreError> {
    db.execute(
        "UPDATE processed_events SET outcome = $3, order_id = $4 WHERE provider = $1 AND event_id = $2",
        &[&provider.as_str(), &event_id, &outcome.as_str(), &order_id],
    )?;
    Ok(())
}

/// An order's column that holds what no order can have.
fn unreadable(column: &str, value: &str) -> StoreError {
    StoreError::database(
        ErrorKind::Permanent,
        std::io::Error::other(format!("orders.{column} holds `{value}`")),
    )
}

/// The order `order_id`, if it exists, its row locked (`FOR UPDATE`) until the transaction
/// ends: its callers read it to write it (a delivery, an operator's decision), and another
/// instance changing the same order meanwhile would otherwise be overwritten by a change
/// computed from the row before its own.
pub(crate) fn load_order(
    db: &mut Db<'_, '_>,
    order_id: &str,
) -> Result<Option<OrderState>, StoreError> {
    Ok(load_orders(db, &[order_id])?.remove(order_id))
}

/// The orders `order_ids` that exist, by id, their rows locked (`FOR UPDATE`, as [`load_order`]
/// says why) in the order given.
fn load_orders(
    db: &mut Db<'_, '_>,
    order_ids: &[&str],
) -> Result<std::collections::HashMap<String, OrderState>, StoreError> {
    db.query(
        // Each order looked up by its key (a subquery that locks is not merged into a join):
        // a plan the statement keeps however its tables grow, where `= ANY` of an array may
        // be planned, when the tables are small, as a scan of the whole table.
        "SELECT o.status, o.provider, o.amount, o.refunded_amount, o.currency,
                o.customer_email, o.payment_intent_id, o.source = 'api', o.paid_amount,
                o.paid_currency, o.amount_exponent, o.payer_email, o.review_reason,
                o.operator_status, o.operator_money, o.acknowledged, o.announced_returned,
                o.order_id
         FROM unnest($1::text[]) WITH ORDINALITY AS u (order_id, n)
              CROSS JOIN LATERAL (
                  SELECT * FROM orders WHERE order_id = u.order_id FOR UPDATE) AS o
         ORDER BY u.n",
        &[&order_ids],
    )?
    .iter()
    .map(|row| Ok((get(row, 17)?, order_row(row)?)))
    .collect()
}

/// The order of a row whose first columns are those [`load_orders`] reads.
fn order_row(row: &postgres::Row) -> Result<OrderState, StoreError> {
    let status: String = get(row, 0)?;
    let provider: String = get(row, 1)?;
    let operator_status: Option<String> = get(row, 13)?;
    let operator_money: Option<String> = get(row, 14)?;
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
    let acknowledged: Option<String> = get(row, 15)?;
    let exponent: Option<i64> = get(row, 10)?;
    Ok(OrderState {
        status: status.parse().map_err(|_| unreadable("status", &status))?,
        provider: ProviderName::from_owned(provider)
            .map_err(|provider| unreadable("provider", &provider))?,
        exponent: exponent
            .map(|e| u32::try_from(e).map_err(|_| unreadable("amount_exponent", &e.to_string())))
            .transpose()?,
        from_api: get(row, 7)?,
        amount: get(row, 2)?,
        refunded_amount: get(row, 3)?,
        currency: get(row, 4)?,
        customer_email: get(row, 5)?,
        payer_email: get(row, 11)?,
        payment_ref: get(row, 6)?,
        paid_amount: get(row, 8)?,
        paid_currency: get(row, 9)?,
        review: get(row, 12)?,
        operator,
        acknowledged: match acknowledged {
            Some(text) => {
                serde_json::from_str(&text).map_err(|_| unreadable("acknowledged", &text))?
            }
            None => Vec::new(),
        },
        announced: get(row, 16)?,
    })
}

/// What [`write_order`] writes.
pub(crate) struct OrderWrite<'a> {
    /// The order's row, inserted or updated; `Some(true)` also sets when and by which event it
    /// last changed. `None` when the caller wrote the row itself (the API's creation).
    pub row: Option<bool>,
    /// The change to append to the audit trail (and to forward, while forwarding is on): from
    /// the status the order had, `None` for the change that created it.
    pub transition: Option<Option<OrderStatus>>,
    /// The customer notices the change carries, to the order's customer address. Each is keyed
    /// by the change itself, so two events announcing the same change cannot queue two emails.
    pub notices: &'a [QueuedNotice],
    /// The payment (provider, reference) whose parked events the change releases: marked
    /// processed for the order. A parked event waits under its payment's key
    /// (`processed_events.payment_intent_id`): the key its payment had when it was parked, moved
    /// to the payment's own when that name turns out to be another name of it
    /// (`ledger::adopt_aliases`). One key, so that the release is a search of the partial index
    /// of parked events.
    pub release_parked: Option<(&'a str, &'a str)>,
}

/// Writes what `write` says of the order `order_id` in its new `state` ([`write_orders`] with one).
pub(crate) fn write_order(
    db: &mut Db<'_, '_>,
    order_id: &str,
    state: &OrderState,
    by: &ChangedBy<'_>,
    now: &str,
    write: OrderWrite<'_>,
) -> Result<(), StoreError> {
    write_orders(
        db,
        &[OrderSave {
            order_id,
            state,
            by,
            write,
        }],
        now,
    )
}

/// One order for [`write_orders`] to write.
pub(crate) struct OrderSave<'a> {
    pub order_id: &'a str,
    pub state: &'a OrderState,
    pub by: &'a ChangedBy<'a>,
    pub write: OrderWrite<'a>,
}

/// Writes what each of `saves` says of its order, in ONE statement (one round trip, where a
/// delivery makes five more to read what it writes): the order's row, the change in the audit
/// trail numbered among the order's, its row in `forward_outbox` while forwarding is on, its
/// notices in `email_outbox`, and the release of the payment's parked events. Every writer of an
/// order holds it (its row locked, or its key when it has none yet) before it records a change,
/// so two instances never count the same number. The parts touch different tables (or rows: the
/// events released are parked, a delivery's own is not), so running them side by side in one
/// snapshot (as PostgreSQL runs a statement's data-modifying `WITH` parts) is running them one
/// after the other; the foreign keys are checked at the statement's end, after the orders'
/// inserts. The orders must be distinct (a change's number counts the order's changes before the
/// statement): a batch's deliveries to one order are applied one by one.
pub(crate) fn write_orders(
    db: &mut Db<'_, '_>,
    saves: &[OrderSave<'_>],
    now: &str,
) -> Result<(), StoreError> {
    let mut rows = OrderRows::default();
    for save in saves {
        rows.push(save);
    }
    let OrderRows {
        order_id,
        provider,
        status,
        amount,
        refunded_amount,
        currency,
        customer_email,
        payment_ref,
        event_id,
        paid_amount,
        paid_currency,
        exponent,
        payer_email,
        review,
        operator_status,
        operator_money,
        acknowledged,
        announced,
        stamp,
        write_row,
        record,
        from,
        by_provider,
        actor,
        reason,
        parked_provider,
        parked_payment,
        notice_order,
        templates,
        notice_params,
        keys,
    } = rows;
    let params: [&(dyn ToSql + Sync); 32] = [
        &order_id,
        &provider,
        &status,
        &amount,
        &refunded_amount,
        &currency,
        &customer_email,
        &payment_ref,
        &event_id,
        &paid_amount,
        &paid_currency,
        &exponent,
        &payer_email,
        &review,
        &operator_status,
        &operator_money,
        &acknowledged,
        &announced,
        &stamp,
        &write_row,
        &record,
        &from,
        &by_provider,
        &actor,
        &reason,
        &parked_provider,
        &parked_payment,
        &now,
        &notice_order,
        &templates,
        &notice_params,
        &keys,
    ];
    db.execute(
        "WITH w AS (
             SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[],
                                  $5::bigint[], $6::text[], $7::text[], $8::text[], $9::text[],
                                  $10::bigint[], $11::text[], $12::bigint[], $13::text[],
                                  $14::text[], $15::text[], $16::text[], $17::text[],
                                  $18::bigint[], $19::boolean[], $20::boolean[], $21::boolean[],
                                  $22::text[], $23::text[], $24::text[], $25::text[], $26::text[],
                                  $27::text[])
                  WITH ORDINALITY AS w (order_id, provider, status, amount, refunded_amount,
                                        currency, customer_email, payment_intent_id, event_id,
                                        paid_amount, paid_currency, amount_exponent, payer_email,
                                        review_reason, operator_status, operator_money,
                                        acknowledged, announced_returned, stamp, write_row,
                                        record, from_status, by_provider, actor, reason,
                                        parked_provider, parked_payment, n)),
         written AS (
             INSERT INTO orders (order_id, provider, status, amount, refunded_amount, currency,
                                 customer_email, payment_intent_id, created_at, updated_at,
                                 last_event_id, paid_amount, paid_currency, amount_exponent,
                                 payer_email, review_reason, operator_status, operator_money,
                                 acknowledged, announced_returned)
             SELECT order_id, provider, status, amount, refunded_amount, currency,
                    customer_email, payment_intent_id, $28::text, $28::text, event_id,
                    paid_amount, paid_currency, amount_exponent, payer_email, review_reason,
                    operator_status, operator_money, acknowledged, announced_returned
             FROM w WHERE write_row ORDER BY n
             ON CONFLICT (order_id) DO UPDATE SET
                 status = excluded.status, amount = excluded.amount,
                 refunded_amount = excluded.refunded_amount, currency = excluded.currency,
                 customer_email = excluded.customer_email,
                 payment_intent_id = excluded.payment_intent_id,
                 updated_at = CASE WHEN (SELECT stamp FROM w WHERE w.order_id = excluded.order_id)
                                   THEN excluded.updated_at ELSE orders.updated_at END,
                 last_event_id = CASE WHEN (SELECT stamp FROM w
                                            WHERE w.order_id = excluded.order_id)
                                      THEN excluded.last_event_id
                                      ELSE orders.last_event_id END,
                 paid_amount = excluded.paid_amount, paid_currency = excluded.paid_currency,
                 amount_exponent = excluded.amount_exponent, payer_email = excluded.payer_email,
                 review_reason = excluded.review_reason,
                 operator_status = excluded.operator_status,
                 operator_money = excluded.operator_money, acknowledged = excluded.acknowledged,
                 announced_returned = excluded.announced_returned),
         change AS (
             INSERT INTO order_transitions (order_id, from_status, to_status, refunded_amount,
                                            provider, event_id, changed_at, actor, reason,
                                            sequence, amount, currency)
             SELECT order_id, from_status, status, refunded_amount, by_provider, event_id,
                    $28::text, actor, reason,
                    (SELECT count(*) + 1 FROM order_transitions t WHERE t.order_id = w.order_id),
                    amount, currency
             FROM w WHERE record ORDER BY n
             RETURNING id, order_id),
         forwarded AS (
             INSERT INTO forward_outbox (change_id, order_id, created_at, next_attempt_at)
             SELECT change.id, change.order_id, $28::text, replace($28::text, 'Z', '.000Z')
             FROM change, forward_state ORDER BY change.id),
         queued AS (
             INSERT INTO email_outbox (order_id, recipient, template, params, idempotency_key,
                                       status, attempts, created_at, event_id, next_attempt_at)
             SELECT w.order_id, w.customer_email, notice.template, notice.params, notice.key,
                    'pending', 0, $28::text, w.event_id, replace($28::text, 'Z', '.000Z')
             FROM unnest($29::text[], $30::text[], $31::text[], $32::text[])
                      WITH ORDINALITY AS notice (order_id, template, params, key, n)
                  JOIN w ON w.order_id = notice.order_id
             ORDER BY notice.n
             ON CONFLICT (order_id, idempotency_key) DO NOTHING),
         released AS (
             UPDATE processed_events AS e SET outcome = 'processed', order_id = w.order_id
             FROM w
             WHERE w.parked_payment IS NOT NULL AND e.outcome = 'parked'
               AND e.payment_intent_id = w.parked_payment AND e.provider = w.parked_provider)
         SELECT",
        &params,
    )?;
    Ok(())
}

/// The columns [`write_orders`] writes, one array each, and the notices' (by their order).
#[derive(Default)]
struct OrderRows<'a> {
    order_id: Vec<&'a str>,
    provider: Vec<&'a str>,
    status: Vec<&'static str>,
    amount: Vec<Option<i64>>,
    refunded_amount: Vec<i64>,
    currency: Vec<Option<&'a str>>,
    customer_email: Vec<Option<&'a str>>,
    payment_ref: Vec<Option<&'a str>>,
    event_id: Vec<&'a str>,
    paid_amount: Vec<Option<i64>>,
    paid_currency: Vec<Option<&'a str>>,
    exponent: Vec<Option<i64>>,
    payer_email: Vec<Option<&'a str>>,
    review: Vec<Option<&'a str>>,
    operator_status: Vec<Option<&'static str>>,
    operator_money: Vec<Option<String>>,
    acknowledged: Vec<Option<String>>,
    announced: Vec<i64>,
    stamp: Vec<bool>,
    write_row: Vec<bool>,
    record: Vec<bool>,
    from: Vec<Option<&'static str>>,
    by_provider: Vec<&'a str>,
    actor: Vec<Option<&'a str>>,
    reason: Vec<Option<&'a str>>,
    parked_provider: Vec<Option<&'a str>>,
    parked_payment: Vec<Option<&'a str>>,
    notice_order: Vec<&'a str>,
    templates: Vec<&'a str>,
    notice_params: Vec<&'a str>,
    keys: Vec<&'a str>,
}

impl<'a> OrderRows<'a> {
    fn push(&mut self, save: &OrderSave<'a>) {
        let (state, write, by) = (save.state, &save.write, save.by);
        self.order_id.push(save.order_id);
        self.provider.push(state.provider.as_str());
        self.status.push(state.status.as_str());
        self.amount.push(state.amount);
        self.refunded_amount.push(state.refunded_amount);
        self.currency.push(state.currency.as_deref());
        self.customer_email.push(state.customer_email.as_deref());
        self.payment_ref.push(state.payment_ref.as_deref());
        self.event_id.push(by.event_id);
        self.paid_amount.push(state.paid_amount);
        self.paid_currency.push(state.paid_currency.as_deref());
        self.exponent.push(state.exponent.map(i64::from));
        self.payer_email.push(state.payer_email.as_deref());
        self.review.push(state.review.as_deref());
        self.operator_status
            .push(state.operator.as_ref().map(|d| d.status.as_str()));
        self.operator_money.push(
            state
                .operator
                .as_ref()
                .map(|d| serde_json::to_string(&d.money).expect("plain numbers serialise")),
        );
        self.acknowledged.push(
            (!state.acknowledged.is_empty())
                .then(|| serde_json::to_string(&state.acknowledged).expect("strings serialise")),
        );
        self.announced.push(state.announced);
        self.stamp.push(write.row.unwrap_or(false));
        self.write_row.push(write.row.is_some());
        self.record.push(write.transition.is_some());
        self.from
            .push(write.transition.flatten().map(OrderStatus::as_str));
        self.by_provider.push(by.provider);
        self.actor.push(by.actor);
        self.reason.push(by.reason);
        let (parked_provider, parked_payment) = write.release_parked.unzip();
        self.parked_provider.push(parked_provider);
        self.parked_payment.push(parked_payment);
        for notice in write.notices {
            self.notice_order.push(save.order_id);
            self.templates.push(notice.template);
            self.notice_params.push(&notice.params);
            self.keys.push(&notice.key);
        }
    }
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

/// A change made by hand (an operator's status, an API order's creation) to `to`, from the
/// status `from` (`None` for the creation): the order's row when `write_row` (the API inserted
/// its own), its row in the audit trail, and the customer notice the new status carries.
pub(crate) fn write_change(
    db: &mut Db<'_, '_>,
    by: &ChangedBy<'_>,
    order_id: &str,
    from: Option<OrderStatus>,
    to: &OrderState,
    now: &str,
    write_row: bool,
) -> Result<(), StoreError> {
    let notice = crate::domain::notice::for_status(order_id, to, by.provider, by.event_id);
    write_order(
        db,
        order_id,
        to,
        by,
        now,
        OrderWrite {
            row: write_row.then_some(true),
            transition: Some(from),
            notices: notice.as_slice(),
            release_parked: None,
        },
    )
}

/// Reads a stored body back into its event: `(provider, event_type, payload)` to the event, by
/// the provider that verified it (given by the caller; the store knows no provider). The stored
/// event type is the one applied (a Midtrans notification confirmed by the status API as
/// another status was applied as that one).
pub type RereadStored = fn(&str, &str, &[u8]) -> Result<NormalizedEvent, String>;
