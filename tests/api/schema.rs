//! The schema's version: a database written by an older sekali is brought up to date in place,
//! and one written by a newer sekali is refused rather than misread.

use std::path::Path;

use rusqlite::Connection;
use sekali::store::sqlite::schema::SCHEMA_VERSION;

use crate::helpers::*;

fn user_version(db: &Path) -> i64 {
    Connection::open(db)
        .unwrap()
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap()
}

/// The schema version the database says it has.
fn stored_version(db: &Database) -> i64 {
    match db {
        Database::File(path) => user_version(path),
        // PostgreSQL has no user_version: the version is the one row of sekali_schema.
        Database::Server(_) => db.count("SELECT version FROM sekali_schema"),
    }
}

/// `db` (empty) with the tables version `version` created, on its engine: `sqlite` is that
/// version's schema.sql, `postgres` its PostgreSQL schema.
fn as_version_made_it(db: &Database, version: i64, sqlite: &str, postgres: &str) {
    match db {
        Database::File(path) => {
            let conn = Connection::open(path).unwrap();
            conn.execute_batch(sqlite).unwrap();
            conn.execute_batch(&format!("PRAGMA user_version = {version}"))
                .unwrap();
        }
        Database::Server(_) => db.execute(&format!(
            "{postgres} INSERT INTO sekali_schema (version) VALUES ({version});"
        )),
    }
}

/// A database exactly as sekali's schema version 1 created it, with an order and its event.
fn version_1_database(db: &Path) {
    let conn = Connection::open(db).unwrap();
    conn.execute_batch(include_str!("../../fixtures/schema-v1.sql"))
        .unwrap();
    conn.execute_batch(
        "PRAGMA user_version = 1;
         INSERT INTO orders (order_id, provider, status, amount, currency, customer_email,
                             created_at, updated_at, last_event_id)
         VALUES ('ord_1001', 'stripe', 'pending', 2500, 'usd', 'budi@example.com',
                 '2026-11-01T10:00:00Z', '2026-11-01T10:00:00Z', 'evt_v1_pending');
         INSERT INTO processed_events (provider, event_id, event_type, order_id, outcome,
                                       received_at, expires_at, payload)
         VALUES ('stripe', 'evt_v1_pending', 'payment_intent.processing', 'ord_1001',
                 'processed', '2026-11-01T10:00:00Z', '2099-01-01T00:00:00Z', '{}');
         INSERT INTO email_outbox (id, order_id, recipient, template, params, idempotency_key,
                                   status, attempts, created_at, event_id, sent_at)
         VALUES (41, 'ord_1001', 'budi@example.com', 'payment_failed', '{}', 'v1-key', 'sent',
                 1, '2026-11-01T09:00:00Z', 'evt_v1_failed', '2026-11-01T09:00:01.000Z');",
    )
    .unwrap();
}

#[actix_web::test]
async fn a_version_1_database_is_rewritten_in_place_and_keeps_its_rows() {
    // Schema version 1 was SQLite's only: PostgreSQL databases start at version 7.
    if sqlite_only("migrating a version-1 SQLite file") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("v1.db");
    version_1_database(&db);

    let v1_db = db.clone();
    let app = spawn_app_with(move |settings| settings.db = v1_db.into()).await;
    assert_eq!(user_version(&db), SCHEMA_VERSION);

    // The stored definitions no longer hold IN lists over three or more values.
    let conn = Connection::open(&db).unwrap();
    let definitions = texts(&conn, "SELECT sql FROM sqlite_schema WHERE type = 'table'");
    for sql in &definitions {
        assert!(!sql.contains("IN ('pending'"), "{sql}");
        assert!(!sql.contains("IN ('processed'"), "{sql}");
        assert!(!sql.contains("IN ('receipt'"), "{sql}");
    }
    // email_outbox was rebuilt: its key is unique through the order-first index, and its rows
    // (ids included) came across.
    let outbox_indexes = texts(
        &conn,
        "SELECT name FROM pragma_index_list('email_outbox') ORDER BY name",
    );
    assert_eq!(
        outbox_indexes,
        ["email_outbox_due", "email_outbox_order_key"]
    );
    let old_email: (String, String, i64) = conn
        .query_row(
            "SELECT status, sent_at, attempts FROM email_outbox WHERE id = 41",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!(
        old_email,
        ("sent".into(), "2026-11-01T09:00:01.000Z".into(), 1)
    );
    let integrity: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(integrity, "ok");

    // The rows version 1 wrote are still there and still deduplicate.
    let answer = app
        .post_stripe(
            &fixture("stripe/payment_intent.succeeded.json"),
            Some(&stripe_header(
                &fixture("stripe/payment_intent.succeeded.json"),
                app.clock.now_unix(),
            )),
        )
        .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let (status, receipts): (String, i64) = conn
        .query_row(
            "SELECT status, (SELECT count(*) FROM email_outbox WHERE order_id = 'ord_1001')
             FROM orders WHERE order_id = 'ord_1001'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(
        (status.as_str(), receipts),
        ("paid", 2),
        "the old email and a new receipt"
    );
    let old_event: i64 = conn
        .query_row(
            "SELECT count(*) FROM processed_events WHERE event_id = 'evt_v1_pending'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(old_event, 1);

    // The rewritten constraints still refuse what version 1 refused.
    let bad_status = conn.execute(
        "UPDATE orders SET status = 'shipped' WHERE order_id = 'ord_1001'",
        [],
    );
    assert!(
        matches!(&bad_status, Err(e) if e.to_string().contains("CHECK constraint failed")),
        "{bad_status:?}"
    );
    let same_key = conn.execute(
        "INSERT INTO email_outbox (order_id, template, params, idempotency_key, created_at,
                                   event_id)
         VALUES ('ord_1001', 'receipt', '{}', 'v1-key', '2026-11-02T00:00:00Z', 'evt_again')",
        [],
    );
    assert!(
        matches!(&same_key, Err(e) if e.to_string().contains("UNIQUE constraint failed")),
        "{same_key:?}"
    );
    let bad_template = conn.execute(
        "UPDATE email_outbox SET template = 'newsletter' WHERE order_id = 'ord_1001'",
        [],
    );
    assert!(bad_template.is_err(), "{bad_template:?}");
    app.stop().await;
}

#[actix_web::test]
async fn a_version_2_database_gains_the_first_try_column_in_place_and_keeps_its_rows() {
    // Schema version 2 was SQLite's only: PostgreSQL databases start at version 7.
    if sqlite_only("migrating a version-2 SQLite file") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("v2.db");
    let conn = Connection::open(&db).unwrap();
    conn.execute_batch(include_str!("../../fixtures/schema-v2.sql"))
        .unwrap();
    conn.execute_batch(
        "PRAGMA user_version = 2;
         INSERT INTO orders (order_id, provider, status, amount, currency, customer_email,
                             created_at, updated_at, last_event_id)
         VALUES ('ord_1001', 'stripe', 'paid', 2500, 'usd', 'budi@example.com',
                 '2026-11-01T10:00:00Z', '2026-11-01T10:00:00Z', 'evt_v2_paid');
         INSERT INTO email_outbox (id, order_id, recipient, template, params, idempotency_key,
                                   status, attempts, created_at, event_id, next_attempt_at)
         VALUES (7, 'ord_1001', 'budi@example.com', 'receipt', '{}', 'v2-key', 'pending',
                 2, '2026-11-01T10:00:00Z', 'evt_v2_paid', '2026-11-01T10:05:00.000Z');",
    )
    .unwrap();
    drop(conn);

    let v2_db = db.clone();
    let app = spawn_app_with(move |settings| settings.db = v2_db.into()).await;
    assert_eq!(user_version(&db), SCHEMA_VERSION);
    let conn = Connection::open(&db).unwrap();
    let (key, attempts, first): (String, i64, Option<String>) = conn
        .query_row(
            "SELECT idempotency_key, attempts, first_tried_at FROM email_outbox WHERE id = 7",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    // Tried twice before the upgrade: its first try was no earlier than the row, so the HTTP
    // key-lifetime guard counts from there.
    assert_eq!(
        (key.as_str(), attempts, first.as_deref()),
        ("v2-key", 2, Some("2026-11-01T10:00:00.000Z"))
    );
    // The migrated database takes deliveries as a new one does.
    assert_eq!(
        app.deliver_stripe("payment_intent.succeeded").await.status,
        200
    );
    app.stop().await;
}

#[actix_web::test]
async fn a_version_3_database_gains_the_paid_amount_and_the_reversed_outcome_in_place() {
    // Schema version 3 was SQLite's only: PostgreSQL databases start at version 7.
    if sqlite_only("migrating a version-3 SQLite file") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("v3.db");
    let conn = Connection::open(&db).unwrap();
    conn.execute_batch(include_str!("../../fixtures/schema-v3.sql"))
        .unwrap();
    conn.execute_batch(
        "PRAGMA user_version = 3;
         INSERT INTO orders (order_id, provider, status, amount, currency, customer_email,
                             created_at, updated_at, last_event_id)
         VALUES ('ORDER-2007', 'midtrans', 'paid', 8500000, 'IDR', 'budi@example.com',
                 '2026-11-01T10:00:00Z', '2026-11-01T10:00:00Z', 'ORDER-2007:settlement:200:accept');",
    )
    .unwrap();
    // The settlement as version 3 stored it: its body, from which the ledger learns its
    // transaction.
    conn.execute(
        "INSERT INTO processed_events (provider, event_id, event_type, order_id, outcome,
                                       received_at, expires_at, payload)
         VALUES ('midtrans', 'ORDER-2007:settlement:200:accept', 'settlement', 'ORDER-2007',
                 'processed', '2026-11-01T10:00:00Z', '2099-01-01T00:00:00Z', ?1)",
        [String::from_utf8(fixture("midtrans/echannel.settlement.json")).unwrap()],
    )
    .unwrap();
    // Version 3 refuses the new outcome.
    assert!(conn
        .execute(
            "UPDATE processed_events SET outcome = 'reversed' WHERE event_id LIKE 'ORDER-2007%'",
            []
        )
        .is_err());
    drop(conn);

    let v3_db = db.clone();
    let app = spawn_app_with(move |settings| settings.db = v3_db.into()).await;
    assert_eq!(user_version(&db), SCHEMA_VERSION);
    // The order kept its row; its stored event says nothing of money, and the ledger takes what
    // the row showed paid as its payment's (version 3 kept no paid amount).
    let conn = Connection::open(&db).unwrap();
    let paid: (String, i64, Option<i64>, Option<String>) = conn
        .query_row(
            "SELECT status, amount, paid_amount, paid_currency FROM orders WHERE order_id = 'ORDER-2007'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .unwrap();
    assert_eq!(
        paid,
        (
            "paid".into(),
            8_500_000,
            Some(8_500_000),
            Some("IDR".into())
        )
    );
    // The reversal of that payment is recorded with its outcome.
    let answer = app.deliver_midtrans("echannel.deny").await;
    assert_eq!(
        (answer.status, answer.outcome()),
        (200, "reversed"),
        "{:?}",
        answer.body
    );
    let status: String = conn
        .query_row(
            "SELECT status FROM orders WHERE order_id = 'ORDER-2007'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(status, "needs_review");
    app.stop().await;
}

/// Version 4 listed the providers in CHECK constraints and parked an event as its body only,
/// re-read through the provider when its payment was linked. Version 5 lists no provider, and
/// parks an event in its normalised form: the upgrade converts the parked rows it finds.
#[actix_web::test]
async fn a_version_4_database_loses_its_provider_checks_and_its_parked_events_still_apply() {
    // Schema version 4 was SQLite's only: PostgreSQL databases start at version 7.
    if sqlite_only("migrating a version-4 SQLite file") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("v4.db");
    let conn = Connection::open(&db).unwrap();
    conn.execute_batch(include_str!("../../fixtures/schema-v4.sql"))
        .unwrap();
    conn.execute_batch("PRAGMA user_version = 4").unwrap();
    // A partial refund that arrived before the payment linking its charge to an order, parked
    // by a version 4 sekali: its payload and nothing else.
    conn.execute(
        "INSERT INTO processed_events (provider, event_id, event_type, order_id, outcome,
                                       received_at, expires_at, payment_intent_id, payload)
         VALUES ('stripe', 'evt_1QA0003refundpartial01', 'charge.refunded', NULL, 'parked',
                 '2026-11-01T10:00:00Z', '2099-01-01T00:00:00Z', 'pi_3QA0001Order1001', ?1)",
        [String::from_utf8(fixture("stripe/charge.refunded.partial.json")).unwrap()],
    )
    .unwrap();
    // Version 4 knows two providers only.
    assert!(conn
        .execute(
            "INSERT INTO orders (order_id, provider, status, refunded_amount, created_at,
                                 updated_at, last_event_id)
             VALUES ('inv_1', 'xendit', 'pending', 0, '2026-11-01T10:00:00Z',
                     '2026-11-01T10:00:00Z', 'x')",
            []
        )
        .is_err());
    drop(conn);

    let v4_db = db.clone();
    let app = spawn_app_with(move |settings| settings.db = v4_db.into()).await;
    assert_eq!(user_version(&db), SCHEMA_VERSION);
    let linking = app.deliver_stripe("payment_intent.succeeded").await;
    assert_eq!(linking.outcome(), "processed");
    // A version 5 that could not read the old parked row would leave the refund parked and the
    // order paid.
    assert_eq!(
        app.order("ord_1001"),
        ("partially_refunded".into(), 2500, 1000)
    );
    assert_eq!(
        app.outbox_templates("ord_1001"),
        ["receipt", "refund_notice"]
    );
    let conn = Connection::open(&db).unwrap();
    conn.execute(
        "INSERT INTO orders (order_id, provider, status, refunded_amount, created_at,
                             updated_at, last_event_id)
         VALUES ('inv_1', 'xendit', 'pending', 0, '2026-11-01T10:00:00Z',
                 '2026-11-01T10:00:00Z', 'x')",
        [],
    )
    .expect("version 5 lists no providers");
    app.stop().await;
}

/// Version 5 kept one address per order, which a webhook overwrote, and transitions without
/// who or why. Version 6 adds the payer's address apart from the shop's (a webhook order's
/// address was its payer's, and is copied there), and the transitions' actor and reason.
#[actix_web::test]
async fn a_version_5_database_gains_the_payers_address_and_the_transitions_author() {
    // Schema version 5 was SQLite's only: PostgreSQL databases start at version 7.
    if sqlite_only("migrating a version-5 SQLite file") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("v5.db");
    let conn = Connection::open(&db).unwrap();
    conn.execute_batch(include_str!("../../fixtures/schema-v5.sql"))
        .unwrap();
    conn.execute_batch(
        "PRAGMA user_version = 5;
         INSERT INTO orders (order_id, provider, status, amount, refunded_amount, currency,
                             customer_email, created_at, updated_at, last_event_id, source)
         VALUES ('ord_web', 'stripe', 'paid', 2500, 0, 'usd', 'payer@example.com',
                 '2026-11-01T10:00:00Z', '2026-11-01T10:00:00Z', 'evt_1', 'webhook'),
                ('ord_api', 'stripe', 'pending', 2500, 0, 'usd', 'shop@example.com',
                 '2026-11-01T10:00:00Z', '2026-11-01T10:00:00Z', 'api:shop', 'api');
         INSERT INTO order_transitions (order_id, from_status, to_status, refunded_amount,
                                        provider, event_id, changed_at)
         VALUES ('ord_web', NULL, 'paid', 0, 'stripe', 'evt_1', '2026-11-01T10:00:00Z');",
    )
    .unwrap();
    drop(conn);

    let v5_db = db.clone();
    let app = spawn_app_with(move |settings| settings.db = v5_db.into()).await;
    assert_eq!(user_version(&db), SCHEMA_VERSION);
    assert_eq!(
        app.texts("SELECT order_id || ' ' || customer_email || ' ' || coalesce(payer_email, '-') FROM orders ORDER BY order_id"),
        ["ord_api shop@example.com -", "ord_web payer@example.com payer@example.com"]
    );
    assert_eq!(
        app.texts(
            "SELECT coalesce(actor, '-') || ' ' || coalesce(reason, '-') FROM order_transitions"
        ),
        ["- -"]
    );
    // The new columns are written from now on.
    assert_eq!(
        app.deliver_stripe("payment_intent.succeeded")
            .await
            .outcome(),
        "processed"
    );
    assert_eq!(
        app.texts("SELECT payer_email FROM orders WHERE order_id = 'ord_1001'"),
        ["ana@example.com"]
    );
    app.stop().await;
}

/// Version 7 kept no change numbers; version 8 numbers each order's changes in the order they
/// were written and gives them the order's amount and currency, so the change feed serves the
/// old changes first, in their order, then the new ones, numbered on (on both engines).
#[actix_web::test]
async fn a_version_7_database_numbers_its_changes_and_the_feed_serves_them_first() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::fresh(dir.path().join("v7.db"));
    as_version_made_it(
        &db,
        7,
        include_str!("../../fixtures/schema-v7.sql"),
        include_str!("../../fixtures/postgres-schema-v7.sql"),
    );
    db.execute(
        "INSERT INTO orders (order_id, provider, status, amount, refunded_amount, currency,
                             created_at, updated_at, last_event_id, source)
         VALUES ('ord_1001', 'stripe', 'refunded', 2000, 2000, 'usd',
                 '2026-11-01T10:00:00Z', '2026-11-01T10:05:00Z', 'evt_3', 'webhook'),
                ('ord_b', 'midtrans', 'paid', 150000, 0, 'IDR',
                 '2026-11-01T10:01:00Z', '2026-11-01T10:01:00Z', 'evt_b', 'webhook');
         INSERT INTO order_transitions (order_id, from_status, to_status, refunded_amount,
                                        provider, event_id, changed_at)
         VALUES ('ord_1001', NULL, 'pending', 0, 'stripe', 'evt_1', '2026-11-01T10:00:00Z'),
                ('ord_b', NULL, 'paid', 0, 'midtrans', 'evt_b', '2026-11-01T10:01:00Z'),
                ('ord_1001', 'pending', 'paid', 0, 'stripe', 'evt_2', '2026-11-01T10:02:00Z'),
                ('ord_1001', 'paid', 'refunded', 2000, 'stripe', 'evt_3', '2026-11-01T10:05:00Z');",
    );
    let v7 = db.location();
    let app = spawn_app_with(move |settings| {
        settings.db = v7;
        settings.api_tokens = sekali::config::parse_api_tokens("shop:tok-feed-v7").unwrap();
    })
    .await;
    assert_eq!(stored_version(&app.database), SCHEMA_VERSION);
    assert_eq!(
        app.texts(
            "SELECT order_id || ' ' || sequence || ' ' || amount || ' ' || currency \
             FROM order_transitions ORDER BY id"
        ),
        [
            "ord_1001 1 2000 usd",
            "ord_b 1 150000 IDR",
            "ord_1001 2 2000 usd",
            "ord_1001 3 2000 usd"
        ]
    );
    // A change written now is numbered on, after the old ones in the feed.
    let output = std::process::Command::new(sekali_bin())
        .args(["orders", "set-status", "ord_b", "cancelled", "--reason"])
        .arg("the customer cancelled by phone")
        .args(["--by", "rina", "--db"])
        .arg(app.db_arg())
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let mut feed = app
        .client
        .get(format!("{}/changes", app.address))
        .insert_header(("Authorization", "Bearer tok-feed-v7"))
        .send()
        .await
        .unwrap();
    assert_eq!(feed.status().as_u16(), 200);
    let page: serde_json::Value = feed.json().await.unwrap();
    let changes: Vec<String> = page["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| format!("{} {} {}", c["order_id"], c["sequence"], c["type"]))
        .collect();
    assert_eq!(
        changes,
        [
            r#""ord_1001" 1 "order.pending""#,
            r#""ord_b" 1 "order.paid""#,
            r#""ord_1001" 2 "order.paid""#,
            r#""ord_1001" 3 "order.refunded""#,
            r#""ord_b" 2 "order.cancelled""#,
        ]
    );
    app.stop().await;
}

/// Version 8 kept neither a delivery's headers nor each try of an outbox row; version 9 keeps
/// both, from the migration on: the old event reads none, a new delivery its headers (never a
/// signature), and the new tables take rows (on both engines).
#[actix_web::test]
async fn a_version_8_database_keeps_its_events_and_gains_headers_and_the_tries_log() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::fresh(dir.path().join("v8.db"));
    as_version_made_it(
        &db,
        8,
        include_str!("../../fixtures/schema-v8.sql"),
        include_str!("../../fixtures/postgres-schema-v8.sql"),
    );
    db.execute(
        "INSERT INTO processed_events (provider, event_id, event_type, order_id, outcome,
                                       received_at, expires_at, payload)
         VALUES ('stripe', 'evt_old', 'customer.created', NULL, 'ignored',
                 '2026-11-01T10:00:00Z', '2099-01-01T00:00:00Z', '{}')",
    );
    let v8 = db.location();
    let app = spawn_app_with(move |settings| settings.db = v8).await;
    assert_eq!(stored_version(&app.database), SCHEMA_VERSION);
    assert_eq!(
        app.deliver_stripe("payment_intent.succeeded")
            .await
            .outcome(),
        "processed"
    );
    let headers =
        app.texts("SELECT coalesce(headers, 'none') FROM processed_events ORDER BY rowid");
    assert_eq!(headers[0], "none", "the old event: {headers:?}");
    let new: serde_json::Value = serde_json::from_str(&headers[1]).unwrap();
    assert_eq!(new["content-type"], "application/json", "{new}");
    assert!(
        !headers[1].to_lowercase().contains("signature"),
        "{headers:?}"
    );
    app.database.execute(
        "INSERT INTO outbox_attempts (outbox, row_id, at, relay, result)
         VALUES ('email', 1, '2026-12-06T00:00:00.000Z', 'relay', 'sent');
         INSERT INTO console_logouts (session, expires_at)
         VALUES ('00', '2026-12-06T12:00:00Z');",
    );
    assert_eq!(app.count("SELECT count(*) FROM outbox_attempts"), 1);
    assert_eq!(app.count("SELECT count(*) FROM console_logouts"), 1);
    app.stop().await;
}

/// Version 10 reads an order's events through an index of their order (the console's order
/// page, `sekali events list --order`), where version 9 read the whole table: a version-9
/// database gains it in place, on both engines, and lists the order's events, old and new.
#[actix_web::test]
async fn a_version_9_database_gains_the_index_of_an_orders_events_and_lists_them() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::fresh(dir.path().join("v9.db"));
    as_version_made_it(
        &db,
        9,
        include_str!("../../fixtures/schema-v9.sql"),
        include_str!("../../fixtures/postgres-schema-v9.sql"),
    );
    let index = match &db {
        Database::File(_) => {
            "SELECT count(*) FROM sqlite_schema WHERE name = 'processed_events_order'"
        }
        Database::Server(_) => {
            "SELECT count(*) FROM pg_indexes WHERE indexname = 'processed_events_order'"
        }
    };
    assert_eq!(db.count(index), 0, "version 9 had no such index");
    db.execute(
        "INSERT INTO processed_events (provider, event_id, event_type, order_id, outcome,
                                       received_at, expires_at, payload)
         VALUES ('stripe', 'evt_v9_old', 'charge.updated', 'ord_1001', 'stale',
                 '2026-11-01T10:00:00Z', '2099-01-01T00:00:00Z', '{}')",
    );
    let v9 = db.location();
    let app = spawn_app_with(move |settings| settings.db = v9).await;
    assert_eq!(stored_version(&app.database), SCHEMA_VERSION);
    assert_eq!(app.count(index), 1);
    assert_eq!(
        app.deliver_stripe("payment_intent.succeeded")
            .await
            .outcome(),
        "processed"
    );
    let listed = std::process::Command::new(sekali_bin())
        .args(["events", "list", "--json", "--order", "ord_1001", "--db"])
        .arg(app.database.arg())
        .output()
        .unwrap();
    assert!(listed.status.success(), "{listed:?}");
    let ids: Vec<String> = String::from_utf8(listed.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            serde_json::from_str::<serde_json::Value>(line).unwrap()["event_id"].to_string()
        })
        .collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert!(ids[1].contains("evt_v9_old"), "newest first: {ids:?}");
    if let Database::File(path) = &app.database {
        // SQLite's plan for the listing's statement: the index, not a scan of the table.
        let plan: Vec<String> = Connection::open(path)
            .unwrap()
            .prepare(
                "EXPLAIN QUERY PLAN SELECT event_id FROM processed_events
                 WHERE order_id = 'ord_1001' ORDER BY rowid DESC LIMIT 50",
            )
            .unwrap()
            .query_map([], |row| row.get::<_, String>(3))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(
            plan.iter()
                .any(|step| step.contains("processed_events_order")),
            "{plan:?}"
        );
    }
    app.stop().await;
}

#[actix_web::test]
async fn a_new_database_starts_at_the_current_version() {
    let app = spawn_app().await;
    assert_eq!(stored_version(&app.database), SCHEMA_VERSION);
    app.stop().await;
}

#[test]
fn a_database_from_a_newer_sekali_is_refused_with_its_version() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::fresh(dir.path().join("newer.db"));
    // Today's tables, marked as a newer sekali would mark them.
    let newer = SCHEMA_VERSION + 1;
    match &db {
        Database::File(path) => {
            version_1_database(path);
            Connection::open(path)
                .unwrap()
                .execute_batch(&format!("PRAGMA user_version = {newer}"))
                .unwrap();
        }
        Database::Server(_) => db.execute(&format!(
            "{}; INSERT INTO sekali_schema (version) VALUES ({newer})",
            sekali::store::postgres::schema::SCHEMA_SQL
        )),
    }
    let out = std::process::Command::new(sekali_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--db"])
        .arg(db.arg())
        .env("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("schema version {}", SCHEMA_VERSION + 1))
            && stderr.contains(&format!("knows up to {SCHEMA_VERSION}")),
        "{stderr}"
    );
    assert_eq!(stored_version(&db), newer, "nothing was rewritten");
}
