//! Fault points inside a delivery (the `fail` crate; run with `--features failpoints`).
//!
//! Each point stands for a crash or error at one moment of the write path. Whatever the moment,
//! a delivery is either committed whole (claim, order change, transition, outbox row) or not at
//! all, and it is answered 2xx only if committed. `FailScenario` holds a process-wide lock, so
//! these tests run one at a time.

#[allow(dead_code)]
#[path = "api/helpers.rs"]
mod helpers;

use fail::FailScenario;
use futures_util::future::join_all;
use helpers::*;

/// (processed_events, orders, email_outbox, order_transitions)
fn all_rows(app: &TestApp) -> (i64, i64, i64, i64) {
    let (events, orders, outbox) = app.row_counts();
    (
        events,
        orders,
        outbox,
        app.count("SELECT count(*) FROM order_transitions"),
    )
}

#[actix_web::test]
async fn a_fault_before_commit_stores_nothing_and_the_retry_succeeds() {
    for point in [
        "writer::after_begin",
        "store::after_claim",
        "store::after_effects",
        "writer::before_commit",
    ] {
        let scenario = FailScenario::setup();
        let app = spawn_app().await;
        fail::cfg(point, "return").unwrap();
        let answer = app.deliver_stripe("payment_intent.succeeded").await;
        assert_eq!(answer.status, 503, "{point}: {:?}", answer.body);
        assert_eq!(
            all_rows(&app),
            (0, 0, 0, 0),
            "{point}: nothing half-written"
        );

        fail::remove(point);
        let retry = app.deliver_stripe("payment_intent.succeeded").await;
        assert_eq!(
            (retry.status, retry.outcome()),
            (200, "processed"),
            "{point}"
        );
        assert_eq!(all_rows(&app), (1, 1, 1, 1), "{point}");
        app.stop().await;
        scenario.teardown();
    }
}

#[actix_web::test]
async fn a_fault_after_commit_loses_only_the_answer_and_the_redelivery_is_a_duplicate() {
    let scenario = FailScenario::setup();
    let app = spawn_app().await;
    fail::cfg("writer::after_commit", "return").unwrap();
    let answer = app.deliver_stripe("payment_intent.succeeded").await;
    assert_eq!(answer.status, 503, "no 2xx, though the commit happened");
    assert_eq!(all_rows(&app), (1, 1, 1, 1), "committed whole");

    fail::remove("writer::after_commit");
    let redelivery = app.deliver_stripe("payment_intent.succeeded").await;
    assert_eq!(
        (redelivery.status, redelivery.outcome()),
        (200, "duplicate")
    );
    assert_eq!(all_rows(&app), (1, 1, 1, 1), "applied once");
    scenario.teardown();
}

/// `/healthz`'s count of the writer's connection replacements.
async fn writer_reopens(app: &TestApp) -> u64 {
    let body: serde_json::Value = app
        .client
        .get(format!("{}/healthz", app.address))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    body["writer_reopens"].as_u64().unwrap()
}

#[actix_web::test]
async fn an_io_error_at_commit_answers_503_and_the_writer_reopens_its_connection() {
    let scenario = FailScenario::setup();
    let app = spawn_app().await;
    assert_eq!(writer_reopens(&app).await, 0);
    fail::cfg("writer::commit_io_error", "1*return->off").unwrap();
    let (stripe, midtrans) = futures_util::future::join(
        app.deliver_stripe("payment_intent.succeeded"),
        app.deliver_midtrans("settlement"),
    )
    .await;
    let lost = [stripe, midtrans];
    // Both may have been in the failed batch, or the second in the next one.
    assert!(lost.iter().any(|a| a.status == 503), "{lost:?}");
    assert!(lost.iter().all(|a| a.status == 503 || a.status == 200));
    let committed = lost.iter().filter(|a| a.status == 200).count() as i64;
    assert_eq!(
        all_rows(&app),
        (committed, committed, committed, committed),
        "only what was answered 2xx is stored"
    );
    assert_eq!(writer_reopens(&app).await, 1, "the connection was replaced");

    // The providers retry; the new connection records them once.
    assert_eq!(
        app.deliver_stripe("payment_intent.succeeded").await.status,
        200
    );
    assert_eq!(app.deliver_midtrans("settlement").await.status, 200);
    assert_eq!(all_rows(&app), (2, 2, 2, 2));
    assert_eq!(writer_reopens(&app).await, 1);
    scenario.teardown();
}

#[actix_web::test]
async fn a_panic_inside_a_delivery_answers_503_and_the_writer_carries_on() {
    let scenario = FailScenario::setup();
    let app = spawn_app().await;
    fail::cfg("store::after_effects", "panic").unwrap();
    let answer = app.deliver_stripe("payment_intent.succeeded").await;
    assert_eq!(answer.status, 503);
    assert_eq!(all_rows(&app), (0, 0, 0, 0));

    fail::remove("store::after_effects");
    assert_eq!(
        app.deliver_stripe("payment_intent.succeeded")
            .await
            .outcome(),
        "processed"
    );
    assert_eq!(
        app.deliver_midtrans("settlement").await.outcome(),
        "processed"
    );
    assert_eq!(all_rows(&app), (2, 2, 2, 2));
    assert_eq!(
        writer_reopens(&app).await,
        1,
        "the panic replaced the connection"
    );
    scenario.teardown();
}

#[actix_web::test]
async fn a_poisoned_delivery_inside_a_batch_fails_alone_and_the_rest_commit() {
    let scenario = FailScenario::setup();
    let app = spawn_app().await;
    // Hold the write lock from outside so the deliveries pile up and are committed together.
    let locker = rusqlite::Connection::open(&app.db_path).unwrap();
    locker.execute_batch("BEGIN IMMEDIATE").unwrap();
    // The second delivery to reach this point fails; every other one passes.
    fail::cfg("store::after_effects", "1*off->1*return->off").unwrap();

    let bodies = batch_bodies(20);
    let sending = join_all(bodies.iter().map(|b| app.deliver_stripe_body(b)));
    let release = async {
        actix_web::rt::time::sleep(std::time::Duration::from_millis(500)).await;
        locker.execute_batch("ROLLBACK").unwrap();
    };
    let (answers, ()) = futures_util::future::join(sending, release).await;

    let failed: Vec<usize> = (0..20).filter(|&i| answers[i].status != 200).collect();
    assert_eq!(failed.len(), 1, "{answers:?}");
    assert_eq!(answers[failed[0]].status, 503);
    assert_eq!(
        all_rows(&app),
        (19, 19, 19, 19),
        "the other nineteen committed"
    );

    let retry = app.deliver_stripe_body(&bodies[failed[0]]).await;
    assert_eq!(retry.outcome(), "processed");
    assert_eq!(all_rows(&app), (20, 20, 20, 20));
    scenario.teardown();
}

fn batch_bodies(count: usize) -> Vec<Vec<u8>> {
    distinct_succeeded_bodies("batch", count)
}

#[actix_web::test]
async fn a_poisoned_delivery_does_not_fail_api_work_queued_in_its_batch() {
    const TOKEN: &str = "tok-shop-faults";
    let scenario = FailScenario::setup();
    let app = spawn_app_with(|s| {
        s.api_tokens = sekali::config::parse_api_tokens(&format!("shop:{TOKEN}")).unwrap();
    })
    .await;
    let locker = rusqlite::Connection::open(&app.db_path).unwrap();
    locker.execute_batch("BEGIN IMMEDIATE").unwrap();
    fail::cfg("store::after_effects", "1*off->1*return->off").unwrap();

    let bodies = batch_bodies(10);
    let deliveries = join_all(bodies.iter().map(|b| app.deliver_stripe_body(b)));
    let order =
        r#"{"order_id": "ord_api_batch", "amount": 2500, "currency": "usd", "provider": "stripe"}"#;
    let api_call = async {
        // After the deliveries, so the first job the writer takes (alone, while it waits for
        // the lock) is a delivery and the API work queues behind it with the others.
        actix_web::rt::time::sleep(std::time::Duration::from_millis(200)).await;
        app.post(
            "/orders",
            order.as_bytes().to_vec(),
            &[
                ("Authorization", &format!("Bearer {TOKEN}")),
                ("Idempotency-Key", "k-batch-1"),
            ],
        )
        .await
    };
    let release = async {
        actix_web::rt::time::sleep(std::time::Duration::from_millis(500)).await;
        locker.execute_batch("ROLLBACK").unwrap();
    };
    let (answers, created, ()) = futures_util::future::join3(deliveries, api_call, release).await;

    let failed = answers.iter().filter(|a| a.status != 200).count();
    assert_eq!(failed, 1, "{answers:?}");
    assert_eq!(created.status, 201, "{:?}", created.body);
    assert_eq!(
        app.count("SELECT count(*) FROM orders WHERE order_id = 'ord_api_batch'"),
        1
    );
    assert_eq!(app.count("SELECT count(*) FROM idempotency_keys"), 1);
    assert_eq!(app.count("SELECT count(*) FROM processed_events"), 9);
    scenario.teardown();
}

#[actix_web::test]
async fn a_delivery_that_always_fails_fails_alone_in_every_batch() {
    let scenario = FailScenario::setup();
    let app = spawn_app().await;
    let locker = rusqlite::Connection::open(&app.db_path).unwrap();
    locker.execute_batch("BEGIN IMMEDIATE").unwrap();
    // Every delivery fails after its effects: each must be rolled back, none committed.
    fail::cfg("store::after_effects", "return").unwrap();

    let bodies = batch_bodies(12);
    let sending = join_all(bodies.iter().map(|b| app.deliver_stripe_body(b)));
    let release = async {
        actix_web::rt::time::sleep(std::time::Duration::from_millis(500)).await;
        locker.execute_batch("ROLLBACK").unwrap();
    };
    let (answers, ()) = futures_util::future::join(sending, release).await;
    assert!(answers.iter().all(|a| a.status == 503), "{answers:?}");
    assert_eq!(all_rows(&app), (0, 0, 0, 0), "nothing committed");

    fail::remove("store::after_effects");
    for body in &bodies {
        assert_eq!(app.deliver_stripe_body(body).await.outcome(), "processed");
    }
    assert_eq!(all_rows(&app), (12, 12, 12, 12));
    scenario.teardown();
}
