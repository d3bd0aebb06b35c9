//! The load generator's rows: whether a database holds orders that are not its own, and the
//! deletion of one run's rows (`sekali bench --check-db --cleanup`).
//!
//! Matches are case-sensitive and literal, as SQLite's GLOBs were: `starts_with` for SQLite's
//! `GLOB 'marker*'`, `strpos(...) > 0` for `GLOB '*marker*'` (a `LIKE 'bench_…'` would match
//! `BENCH_…` too, and read `_` as a wildcard). A [`RunMarker`] holds no pattern character, so
//! both read the same.

use super::{get, Db, StoreError};
use crate::clock::iso_millis;
use crate::store::model::{
    DeletedRun, OrdersOutsideRuns, RunDeletion, RunEmail, RunMarker, RUN_ORDER_PREFIX,
};

/// True for an order id of some load-generator run, `bench_{hex}_{hex or decimal}` and nothing
/// more: after the prefix, hex digits, one `_`, hex digits (`$1` is the prefix). A shop's
/// `bench_deluxe_1` is not one. SQLite's `GLOB '_[0-9a-f]*'` (a literal `_`, then a hex digit)
/// is the regular expression `^_[0-9a-f]` (byte ranges: the column is COLLATE "C"). A macro, so
/// that the statements stay `&'static str` literals.
macro_rules! is_run_order {
    () => {
        "(substr(order_id, 1, length($1::text)) = $1::text
     AND ltrim(substr(order_id, length($1::text) + 1), '0123456789abcdef') ~ '^_[0-9a-f]'
     AND ltrim(substr(ltrim(substr(order_id, length($1::text) + 1), '0123456789abcdef'), 2),
               '0123456789abcdef') = ''
     AND substr(order_id, length($1::text) + 1, 1) <> '_')"
    };
}

/// Orders no load-generator run wrote: how many, and the first `examples` ids.
pub fn orders_outside_runs(
    db: &mut Db<'_, '_>,
    examples: u32,
) -> Result<OrdersOutsideRuns, StoreError> {
    let row = db.query_one(
        concat!("SELECT count(*) FROM orders WHERE NOT ", is_run_order!()),
        &[&RUN_ORDER_PREFIX],
    )?;
    let count: i64 = get(&row, 0)?;
    let examples = db
        .query(
            concat!(
                "SELECT order_id FROM orders WHERE NOT ",
                is_run_order!(),
                " ORDER BY order_id LIMIT $2::bigint"
            ),
            &[&RUN_ORDER_PREFIX, &i64::from(examples)],
        )?
        .iter()
        .map(|row| get(row, 0))
        .collect::<Result<_, StoreError>>()?;
    Ok(OrdersOutsideRuns { count, examples })
}

/// Deletes the rows of the run `run` in the caller's transaction (SQLite opened its own
/// `BEGIN IMMEDIATE`), unless one of its emails is leased at `now_ms` (see
/// [`Maintenance::delete_run`](crate::store::Maintenance)): then nothing is written, and the
/// caller rolls back (or commits: the same). Children first, as the foreign keys require:
/// emails, transitions and payments, then events, then orders.
pub fn delete_run(
    db: &mut Db<'_, '_>,
    run: &RunMarker,
    now_ms: i64,
) -> Result<RunDeletion, StoreError> {
    // SQLite's `GLOB 'marker*'` (orders) and `GLOB '*marker*'` (events): both the marker here,
    // for starts_with and strpos.
    let orders = run.as_str();
    let events = run.as_str();
    // FOR UPDATE on the run's emails: SQLite's BEGIN IMMEDIATE kept every relay out between
    // this check and the deletion. Here a relay on another instance could claim one of them in
    // between and send an email whose row is then gone. Locked, a claim in progress is waited
    // for (and its lease then counted), and a later claim skips the rows (SKIP LOCKED) until
    // this transaction ends; a result recorded meanwhile waits, then finds its row deleted and
    // counts as a lease lost.
    let row = db.query_one(
        "SELECT count(*) FROM (
             SELECT status, lease_until FROM email_outbox
             WHERE starts_with(order_id, $1::text) FOR UPDATE) AS run
         WHERE status = 'pending' AND lease_until > $2::text",
        &[&orders, &iso_millis(now_ms)],
    )?;
    let leased: i64 = get(&row, 0)?;
    if leased > 0 {
        return Ok(RunDeletion::Leased { emails: leased });
    }
    // Their rows' recorded tries first, while the rows still say whose they are.
    db.execute(
        "DELETE FROM outbox_attempts
         WHERE (outbox = 'email' AND row_id IN (SELECT id FROM email_outbox
                                                WHERE starts_with(order_id, $1::text)))
            OR (outbox = 'forward' AND row_id IN (SELECT id FROM forward_outbox
                                                  WHERE starts_with(order_id, $1::text)))",
        &[&orders],
    )?;
    // The keys of exactly the rows deleted (SQLite read them, then deleted the same rows: its
    // writers were serialized; here an email written meanwhile is deleted and returned too).
    let emails = db
        .query(
            "DELETE FROM email_outbox WHERE starts_with(order_id, $1::text)
             RETURNING idempotency_key, order_id",
            &[&orders],
        )?
        .iter()
        .map(|row| {
            Ok(RunEmail {
                idempotency_key: get(row, 0)?,
                order_id: get(row, 1)?,
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    db.execute(
        "DELETE FROM forward_outbox WHERE starts_with(order_id, $1::text)",
        &[&orders],
    )?;
    let transitions = db.execute(
        "DELETE FROM order_transitions WHERE starts_with(order_id, $1::text)",
        &[&orders],
    )? as usize;
    // The run's payments: its orders', and those no order was linked to yet whose
    // reference holds the marker (the load generator's `pi_bench_{run}_{n}`).
    for sql in [
        "DELETE FROM payment_refunds WHERE (provider, payment_ref) IN (
             SELECT provider, payment_ref FROM payments
             WHERE starts_with(order_id, $1::text) OR strpos(payment_ref, $2::text) > 0)",
        "DELETE FROM payment_disputes WHERE (provider, payment_ref) IN (
             SELECT provider, payment_ref FROM payments
             WHERE starts_with(order_id, $1::text) OR strpos(payment_ref, $2::text) > 0)",
        "DELETE FROM payment_aliases WHERE (provider, payment_ref) IN (
             SELECT provider, payment_ref FROM payments
             WHERE starts_with(order_id, $1::text) OR strpos(payment_ref, $2::text) > 0)",
    ] {
        db.execute(sql, &[&orders, &events])?;
    }
    let payments = db.execute(
        "DELETE FROM payments
         WHERE starts_with(order_id, $1::text) OR strpos(payment_ref, $2::text) > 0",
        &[&orders, &events],
    )? as usize;
    // A run's event names its order; one parked or ignored names none, but its id holds
    // the marker.
    let events = db.execute(
        "DELETE FROM processed_events
         WHERE starts_with(order_id, $1::text) OR strpos(event_id, $2::text) > 0",
        &[&orders, &events],
    )? as usize;
    let orders = db.execute(
        "DELETE FROM orders WHERE starts_with(order_id, $1::text)",
        &[&orders],
    )? as usize;
    Ok(RunDeletion::Deleted(DeletedRun {
        events,
        orders,
        transitions,
        payments,
        emails,
    }))
}
