//! The load generator's rows: whether a database holds orders that are not its own, and the
//! deletion of one run's rows (`sekali bench --check-db --cleanup`).
//!
//! Patterns are GLOBs, not LIKEs: GLOB is case-sensitive (`LIKE 'bench_…'` would match
//! `BENCH_…` too) and `_` is not a wildcard in it. A [`RunMarker`] holds no GLOB character.

use rusqlite::{params, Connection};

use super::StoreError;
use crate::clock::iso_millis;
use crate::store::model::{
    DeletedRun, OrdersOutsideRuns, RunDeletion, RunEmail, RunMarker, RUN_ORDER_PREFIX,
};

/// True for an order id of some load-generator run, `bench_{hex}_{hex or decimal}` and nothing
/// more: after the prefix, hex digits, one `_`, hex digits (`?1` is the prefix). A shop's
/// `bench_deluxe_1` is not one.
const IS_RUN_ORDER: &str = "(substr(order_id, 1, length(?1)) = ?1
     AND ltrim(substr(order_id, length(?1) + 1), '0123456789abcdef') GLOB '_[0-9a-f]*'
     AND ltrim(substr(ltrim(substr(order_id, length(?1) + 1), '0123456789abcdef'), 2),
               '0123456789abcdef') = ''
     AND substr(order_id, length(?1) + 1, 1) <> '_')";

/// Orders no load-generator run wrote: how many, and the first `examples` ids.
pub fn orders_outside_runs(
    conn: &Connection,
    examples: u32,
) -> rusqlite::Result<OrdersOutsideRuns> {
    let count = conn.query_row(
        &format!("SELECT count(*) FROM orders WHERE NOT {IS_RUN_ORDER}"),
        [RUN_ORDER_PREFIX],
        |row| row.get(0),
    )?;
    let examples = conn
        .prepare(&format!(
            "SELECT order_id FROM orders WHERE NOT {IS_RUN_ORDER} ORDER BY order_id LIMIT ?2"
        ))?
        .query_map(params![RUN_ORDER_PREFIX, examples], |row| row.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(OrdersOutsideRuns { count, examples })
}

/// Deletes the rows of the run `run` in one `BEGIN IMMEDIATE` transaction, unless one of its
/// emails is leased at `now_ms` (see [`Maintenance::delete_run`](crate::store::Maintenance)).
/// Children first, as the foreign keys require: emails, transitions and payments, then events,
/// then orders.
pub fn delete_run(
    conn: &Connection,
    run: &RunMarker,
    now_ms: i64,
) -> Result<RunDeletion, StoreError> {
    let orders = format!("{}*", run.as_str());
    let events = format!("*{}*", run.as_str());
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let work = || -> rusqlite::Result<RunDeletion> {
        let leased: i64 = conn.query_row(
            "SELECT count(*) FROM email_outbox
             WHERE order_id GLOB ?1 AND status = 'pending' AND lease_until > ?2",
            params![orders, iso_millis(now_ms)],
            |row| row.get(0),
        )?;
        if leased > 0 {
            return Ok(RunDeletion::Leased { emails: leased });
        }
        let emails = conn
            .prepare("SELECT idempotency_key, order_id FROM email_outbox WHERE order_id GLOB ?1")?
            .query_map([&orders], |row| {
                Ok(RunEmail {
                    idempotency_key: row.get(0)?,
                    order_id: row.get(1)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        let delete = |sql: &str, pattern: &[&str]| -> rusqlite::Result<usize> {
            conn.execute(sql, rusqlite::params_from_iter(pattern))
        };
        // Their rows' recorded tries first, while the rows still say whose they are.
        delete(
            "DELETE FROM outbox_attempts
             WHERE (outbox = 'email'
                    AND row_id IN (SELECT id FROM email_outbox WHERE order_id GLOB ?1))
                OR (outbox = 'forward'
                    AND row_id IN (SELECT id FROM forward_outbox WHERE order_id GLOB ?1))",
            &[&orders],
        )?;
        delete(
            "DELETE FROM email_outbox WHERE order_id GLOB ?1",
            &[&orders],
        )?;
        delete(
            "DELETE FROM forward_outbox WHERE order_id GLOB ?1",
            &[&orders],
        )?;
        let transitions = delete(
            "DELETE FROM order_transitions WHERE order_id GLOB ?1",
            &[&orders],
        )?;
        // The run's payments: its orders', and those no order was linked to yet whose
        // reference holds the marker (the load generator's `pi_bench_{run}_{n}`).
        const RUN_PAYMENTS: &str = "SELECT provider, payment_ref FROM payments
                                    WHERE order_id GLOB ?1 OR payment_ref GLOB ?2";
        for table in ["payment_refunds", "payment_disputes", "payment_aliases"] {
            delete(
                &format!("DELETE FROM {table} WHERE (provider, payment_ref) IN ({RUN_PAYMENTS})"),
                &[&orders, &events],
            )?;
        }
        let payments = delete(
            "DELETE FROM payments WHERE order_id GLOB ?1 OR payment_ref GLOB ?2",
            &[&orders, &events],
        )?;
        // A run's event names its order; one parked or ignored names none, but its id holds
        // the marker.
        let events = delete(
            "DELETE FROM processed_events WHERE order_id GLOB ?1 OR event_id GLOB ?2",
            &[&orders, &events],
        )?;
        let orders = delete("DELETE FROM orders WHERE order_id GLOB ?1", &[&orders])?;
        Ok(RunDeletion::Deleted(DeletedRun {
            events,
            orders,
            transitions,
            payments,
            emails,
        }))
    };
    match work() {
        Ok(deletion @ RunDeletion::Deleted(_)) => {
            conn.execute_batch("COMMIT")?;
            Ok(deletion)
        }
        Ok(leased) => {
            conn.execute_batch("ROLLBACK")?;
            Ok(leased)
        }
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e.into())
        }
    }
}
