//! A database from before the ledger (schema version 6) opened by today's `sekali serve`: each
//! order's payments are rebuilt from its stored events, and every order whose status the ledger
//! changes is listed in the log with why.
//!
//! The database is `fixtures/ledger-v6.sql`, written by the last version with the order state
//! machine (commit 29f6a4a) after every fixture of `fixtures/README.md`, two orders of the orders
//! API and an operator's decision; `fixtures/ledger-v6.sh` says how to make it again.

use std::collections::BTreeMap;

use rusqlite::Connection;

use crate::helpers::*;

/// The order statuses of the database: order id → status.
fn statuses(conn: &Connection) -> BTreeMap<String, String> {
    conn.prepare("SELECT order_id, status FROM orders")
        .unwrap()
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn count(conn: &Connection, sql: &str) -> i64 {
    conn.query_row(sql, [], |row| row.get(0)).expect(sql)
}

/// What the state machine showed and what the ledger shows, with a part of why, for each order
/// the ledger sees otherwise: the money the audit (issue 31) found dropped or invented.
const CHANGED: &[(&str, &str, &str, &str)] = &[
    // A declined card is an attempt that failed, not an order called off.
    (
        "ORDER-2003",
        "cancelled",
        "failed",
        "took no money and ended failed",
    ),
    // Chargebacks were ignored.
    (
        "ORDER-2008",
        "paid",
        "disputed",
        "disputes hold IDR 200,000",
    ),
    // Paid after a declined card, and after a cancelled attempt: the payment was dropped.
    (
        "ORDER-2009",
        "cancelled",
        "paid",
        "took IDR 175,000 and gave none back",
    ),
    (
        "ORDER-2010",
        "cancelled",
        "paid",
        "took IDR 64,000 and gave none back",
    ),
    // A won dispute left the order disputed for good.
    (
        "ord_1003",
        "disputed",
        "paid",
        "took $42.00 and gave none back",
    ),
    // A chargeback of a charge refunded in full: more given back than was taken.
    (
        "ord_1008",
        "refunded",
        "needs_review",
        "$36.00 given back (refunds $18.00, chargebacks $18.00) is more than the $18.00",
    ),
    // An authorisation released is no refund: the attempt was abandoned.
    (
        "ord_1011",
        "cancelled",
        "expired",
        "took no money and ended expired",
    ),
    // A second PaymentIntent paid after the first was cancelled: dropped as stale.
    (
        "ord_1013",
        "cancelled",
        "needs_review",
        "took $48.00 although the payment stripe pi_3QA0026Order1013 was canceled",
    ),
    // A setup session took no money, yet made a paid order.
    (
        "ord_1014",
        "paid",
        "pending",
        "took no money and ended pending",
    ),
    // The refund of a subscription's invoice payment was parked for good.
    (
        "ord_1015",
        "paid",
        "refunded",
        "took $20.00 and gave back $20.00",
    ),
    // The same, its refund sent before the invoice and from a charge that does not name it.
    (
        "ord_1018",
        "paid",
        "refunded",
        "took $20.00 and gave back $20.00",
    ),
    // An API order for Xendit paid by a Stripe payment in Stripe's ISK units.
    (
        "ord_api_1",
        "paid",
        "needs_review",
        "stripe payment pi_v6_api1 took ISK 500; the order names xendit",
    ),
    // Xendit invoices paid short and over.
    (
        "ord_x_1005",
        "paid",
        "needs_review",
        "took IDR 200,000 of the IDR 250,000 it asked for",
    ),
    (
        "ord_x_1006",
        "paid",
        "needs_review",
        "took IDR 150,000 of the IDR 120,000 it asked for",
    ),
];

#[test]
fn a_database_from_before_the_ledger_gets_each_order_from_its_payments_and_the_log_lists_every_change(
) {
    // Version 6 was a SQLite schema only: PostgreSQL databases start at version 7.
    if sqlite_only("migrating a version-6 SQLite file") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("v6.db");
    let conn = Connection::open(&db).unwrap();
    conn.execute_batch(include_str!("../../fixtures/ledger-v6.sql"))
        .unwrap();
    let before = statuses(&conn);
    let emails_before = count(&conn, "SELECT count(*) FROM email_outbox");
    drop(conn);
    assert_eq!(before.len(), 37, "the fixture's orders: {before:?}");

    let server = ServeProcess::start_on(
        Some(&db),
        &[
            ("STRIPE_WEBHOOK_SECRET", "whsec_test_secret"),
            ("MIDTRANS_SERVER_KEY", "SB-Mid-server-fixture-key"),
            ("XENDIT_CALLBACK_TOKEN", "cb-token-sekali-migration-v6-5f0a"),
        ],
        "info",
        &["--no-relay"],
    );
    let conn = Connection::open(server.db().file()).unwrap();
    let after = statuses(&conn);
    // Amounts are written as CLDR writes them, some with a no-break space ("IDR\u{a0}200,000").
    let logs = server.logs_so_far().replace('\u{a0}', " ");

    // Every order the ledger changed, and only those, as the audit expects.
    let changed: Vec<(&str, &str, &str)> = before
        .iter()
        .filter(|(id, was)| after[*id] != **was)
        .map(|(id, was)| (id.as_str(), was.as_str(), after[id].as_str()))
        .collect();
    let expected: Vec<(&str, &str, &str)> = CHANGED
        .iter()
        .map(|(id, was, now, _)| (*id, *was, *now))
        .collect();
    assert_eq!(changed, expected, "orders changed by the ledger");

    // Each of them in the log, with why, and in the order's history.
    let lines: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("the ledger changed an order's status"))
        .collect();
    assert_eq!(lines.len(), CHANGED.len(), "{logs}");
    for (id, was, now, why) in CHANGED {
        let line = lines
            .iter()
            .find(|l| l.contains(&format!("order_id={id} ")))
            .unwrap_or_else(|| panic!("no log line for {id}: {logs}"));
        for part in [
            format!("was=\"{was}\""),
            format!("now=\"{now}\""),
            (*why).to_owned(),
        ] {
            assert!(line.contains(&part), "{id}: {part:?} not in {line}");
        }
        let (by, reason): (String, String) = conn
            .query_row(
                "SELECT provider, reason FROM order_transitions WHERE order_id = ?1
                 ORDER BY id DESC LIMIT 1",
                [id],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .unwrap();
        assert_eq!(by, "ledger", "{id}'s last transition");
        assert!(
            reason.replace('\u{a0}', " ").contains(why),
            "{id}: {reason}"
        );
    }
    assert!(
        logs.contains(&format!("changed={}", CHANGED.len())),
        "the summary line: {logs}"
    );
    assert!(
        !logs.contains("cannot be read back"),
        "every stored event was read again: {logs}"
    );

    // The operator's decision stands: the reversed Mandiri bill they settled as refunded.
    assert_eq!(after["ORDER-2007"], "refunded");
    // No email for the past.
    assert_eq!(
        count(&conn, "SELECT count(*) FROM email_outbox"),
        emails_before
    );
    // Both attempts of the order paid after a declined card are in its ledger, the retry's
    // money held; the facts parked for want of an order are linked and applied.
    assert_eq!(
        count(
            &conn,
            "SELECT count(*) FROM payments WHERE order_id = 'ORDER-2009'"
        ),
        2
    );
    assert_eq!(
        count(
            &conn,
            "SELECT count(*) FROM processed_events WHERE outcome = 'parked'
             AND event_id IN ('evt_1QA0024capturedprebas1', 'evt_1QA0025refundrelease01',
                              'evt_1QA0028refundauthrel01', 'evt_v6_sub_refund')"
        ),
        0
    );
    // Every order that took money has a payment that says so.
    assert_eq!(
        count(
            &conn,
            "SELECT count(*) FROM orders WHERE status IN ('paid', 'partially_refunded', 'refunded')
             AND NOT EXISTS (SELECT 1 FROM payments p WHERE p.order_id = orders.order_id)"
        ),
        0
    );
}

/// `sqlite3 .dump` leaves the schema version out. Restored from such a dump, a version-6 file
/// looked new: sekali kept its old tables, marked it version 7, and its first delivery failed on
/// a missing column. It is refused at startup instead, with what to do, and left as it was.
#[test]
fn a_database_restored_from_a_dump_without_its_version_is_refused_with_what_to_do() {
    // A SQLite file without PRAGMA user_version, from `sqlite3 .dump`.
    if sqlite_only("a SQLite file restored from sqlite3 .dump") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("restored.db");
    let dump = include_str!("../../fixtures/ledger-v6.sql");
    let without_version: String = dump
        .lines()
        .filter(|line| !line.starts_with("PRAGMA user_version"))
        .map(|line| format!("{line}\n"))
        .collect();
    Connection::open(&db)
        .unwrap()
        .execute_batch(&without_version)
        .unwrap();

    let mut child = std::process::Command::new(sekali_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--no-relay", "--db"])
        .arg(&db)
        .env("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET)
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // It must stop by itself; one that serves is stopped and the test fails.
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > std::time::Duration::from_secs(20) {
            child.kill().unwrap();
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    for words in [
        "no schema version",
        "sqlite3 .dump",
        "PRAGMA user_version = N",
        "sekali backup",
    ] {
        assert!(stderr.contains(words), "{words:?} not in {stderr}");
    }
    let conn = Connection::open(&db).unwrap();
    assert_eq!(
        count(&conn, "PRAGMA user_version"),
        0,
        "the file is left as it was"
    );
    assert_eq!(
        count(
            &conn,
            "SELECT count(*) FROM sqlite_schema WHERE name = 'payments'"
        ),
        0
    );
}
