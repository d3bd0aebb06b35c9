//! Fault points inside a delivery (the `fail` crate; run with `--features failpoints`).
//!
//! Each point stands for a crash or error at one moment of the write path. Whatever the moment,
//! a delivery is either committed whole (claim, order change, transition, outbox row) or not at
//! all, and it is answered 2xx only if committed. `FailScenario` holds a process-wide lock, so
//! these tests run one at a time.
//!
//! The tests of what deliveries that share a batch do to each other are here too: the fault
//! point `writer::before_batch` holds the writer while they queue (see [`in_one_batch`]), and
//! the writer's counters show that they did share one transaction. (Fault points are the
//! process's, so a test that holds the writer must not run beside other tests' servers.)

#[allow(dead_code)]
#[path = "api/helpers.rs"]
mod helpers;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fail::FailScenario;
use futures_util::future::join_all;
use helpers::*;
use sekali::store::WriterStats;

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

/// What the writer committed while [`in_one_batch`] ran.
#[derive(Debug, PartialEq, Eq)]
struct Committed {
    transactions: u64,
    deliveries: u64,
}

/// Runs `send` while the writer is held before its next batch (fault point
/// `writer::before_batch`), and releases it once `jobs` units of work (deliveries and API
/// requests) are in its queue (counted at `writer::queued`): the writer then takes them all
/// into one batch. Returns what `send` returned, and what the writer committed meanwhile
/// (`/healthz`'s `writer` counters), from which a test tells whether they really shared one
/// transaction. No sleeping on a lock and hoping: with `batch_max = 1`, the same test sees one
/// transaction per delivery.
async fn in_one_batch<T>(
    app: &TestApp,
    jobs: u64,
    send: impl std::future::Future<Output = T>,
) -> (T, Committed) {
    let queued = Arc::new(AtomicU64::new(0));
    let counter = queued.clone();
    fail::cfg_callback("writer::queued", move || {
        counter.fetch_add(1, Ordering::SeqCst);
    })
    .unwrap();
    fail::cfg("writer::before_batch", "pause").unwrap();
    let before = app.store.stats().writer;
    let release = async {
        let deadline = Instant::now() + Duration::from_secs(20);
        while queued.load(Ordering::SeqCst) < jobs {
            // (A panic here drops the test's FailScenario, which releases the writer.)
            assert!(
                Instant::now() < deadline,
                "only {} of {jobs} jobs reached the writer's queue",
                queued.load(Ordering::SeqCst)
            );
            actix_web::rt::time::sleep(Duration::from_millis(2)).await;
        }
        // Everything but the queue, which the jobs just filled.
        let held = app.store.stats().writer;
        assert_eq!(
            WriterStats {
                queued: before.queued,
                ..held
            },
            before,
            "the writer committed nothing while it was held"
        );
        // The writer holds the first job it took; the others wait in its queue.
        assert!(
            held.queued + 1 >= before.queued + jobs,
            "the queue's depth counts the jobs waiting for the writer: {} before, {} held, {jobs} jobs",
            before.queued,
            held.queued
        );
        fail::remove("writer::before_batch");
    };
    let (sent, ()) = futures_util::future::join(send, release).await;
    fail::remove("writer::queued");
    assert_eq!(queued.load(Ordering::SeqCst), jobs, "no other work queued");
    let after = app.store.stats().writer;
    let committed = Committed {
        transactions: after.transactions - before.transactions,
        deliveries: after.deliveries - before.deliveries,
    };
    (sent, committed)
}

#[actix_web::test]
async fn a_poisoned_delivery_inside_a_batch_fails_alone_and_the_rest_commit() {
    let scenario = FailScenario::setup();
    let app = spawn_app().await;
    // The second delivery to reach this point fails; every other one passes.
    fail::cfg("store::after_effects", "1*off->1*return->off").unwrap();

    let bodies = batch_bodies(20);
    let sending = join_all(bodies.iter().map(|b| app.deliver_stripe_body(b)));
    let (answers, committed) = in_one_batch(&app, 20, sending).await;

    let failed: Vec<usize> = (0..20).filter(|&i| answers[i].status != 200).collect();
    assert_eq!(failed.len(), 1, "{answers:?}");
    assert_eq!(answers[failed[0]].status, 503);
    assert_eq!(
        all_rows(&app),
        (19, 19, 19, 19),
        "the other nineteen committed"
    );
    assert_eq!(
        committed,
        Committed {
            transactions: 1,
            deliveries: 19
        },
        "the twenty shared one batch, and its transaction committed the nineteen"
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
    fail::cfg("store::after_effects", "1*off->1*return->off").unwrap();

    let bodies = batch_bodies(10);
    let deliveries = join_all(bodies.iter().map(|b| app.deliver_stripe_body(b)));
    let order =
        r#"{"order_id": "ord_api_batch", "amount": 2500, "currency": "usd", "provider": "stripe"}"#;
    let authorization = format!("Bearer {TOKEN}");
    let headers = [
        ("Authorization", authorization.as_str()),
        ("Idempotency-Key", "k-batch-1"),
    ];
    let api_call = app.post("/orders", order.as_bytes().to_vec(), &headers);
    // Whichever the writer takes first, the batch holds the ten deliveries and the API
    // request, and runs the deliveries first.
    let sending = futures_util::future::join(deliveries, api_call);
    let ((answers, created), committed) = in_one_batch(&app, 11, sending).await;

    let failed = answers.iter().filter(|a| a.status != 200).count();
    assert_eq!(failed, 1, "{answers:?}");
    assert_eq!(created.status, 201, "{:?}", created.body);
    assert_eq!(
        app.count("SELECT count(*) FROM orders WHERE order_id = 'ord_api_batch'"),
        1
    );
    assert_eq!(app.count("SELECT count(*) FROM idempotency_keys"), 1);
    assert_eq!(app.count("SELECT count(*) FROM processed_events"), 9);
    assert_eq!(
        committed,
        Committed {
            transactions: 1,
            deliveries: 9
        },
        "the API request committed in the transaction of the nine deliveries"
    );
    scenario.teardown();
}

/// Five receipts delivered and claimed by a relay, with what it would record once they are
/// written: the relay's results for [`in_one_batch`].
async fn claimed_receipts(app: &TestApp) -> Vec<sekali::store::SendResult> {
    for body in distinct_succeeded_bodies("relayed", 5) {
        assert_eq!(app.deliver_stripe_body(&body).await.outcome(), "processed");
    }
    let claimed = app
        .store
        .claim_outbox(sekali::store::ClaimRequest {
            owner: RELAY.into(),
            lease_ms: 60_000,
            limit: 256,
            outbox: sekali::store::OutboxKind::Email,
        })
        .await
        .unwrap();
    assert_eq!(claimed.len(), 5);
    claimed
        .iter()
        .map(|email| sekali::store::SendResult {
            id: email.id,
            outcome: sekali::store::SendOutcome::Sent,
        })
        .collect()
}

const RELAY: &str = "relay-under-test";

/// The relay's results run in the deliveries' first pass, without a savepoint of their own: a
/// poisoned delivery beside them sends them through the rerun, where they commit with the
/// other deliveries, once.
#[actix_web::test]
async fn a_poisoned_delivery_does_not_fail_the_relay_results_in_its_batch() {
    let scenario = FailScenario::setup();
    let app = spawn_app().await;
    let results = claimed_receipts(&app).await;
    fail::cfg("store::after_effects", "1*off->1*return->off").unwrap();

    let bodies = batch_bodies(10);
    let deliveries = join_all(bodies.iter().map(|b| app.deliver_stripe_body(b)));
    let recording = app.store.record_outbox_results(RELAY.into(), results);
    let sending = futures_util::future::join(deliveries, recording);
    let ((answers, recorded), committed) = in_one_batch(&app, 11, sending).await;

    assert_eq!(
        answers.iter().filter(|a| a.status != 200).count(),
        1,
        "{answers:?}"
    );
    assert_eq!(
        recorded.unwrap(),
        vec![true; 5],
        "every result recorded, the lease held"
    );
    assert_eq!(
        committed,
        Committed {
            transactions: 1,
            deliveries: 9
        },
        "the results committed in the transaction of the nine deliveries"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM email_outbox WHERE status = 'sent'"),
        5
    );
    assert_eq!(
        app.count("SELECT count(*) FROM email_outbox WHERE status = 'sent' AND attempts = 1"),
        5,
        "each counted one try: the first pass's recording was rolled back, not kept beside the rerun's"
    );
    scenario.teardown();
}

/// A batch of results that fails is rolled back alone: the relay gets the error (and its rows
/// are sent again after their lease), and the deliveries it shared the batch with commit.
#[actix_web::test]
async fn relay_results_that_fail_fail_alone_and_the_deliveries_in_their_batch_commit() {
    let scenario = FailScenario::setup();
    let app = spawn_app().await;
    let results = claimed_receipts(&app).await;
    fail::cfg("store::outbox_results", "1*return->off").unwrap();

    let bodies = batch_bodies(10);
    let deliveries = join_all(bodies.iter().map(|b| app.deliver_stripe_body(b)));
    let recording = app
        .store
        .record_outbox_results(RELAY.into(), results.clone());
    let sending = futures_util::future::join(deliveries, recording);
    let ((answers, recorded), committed) = in_one_batch(&app, 11, sending).await;

    assert!(answers.iter().all(|a| a.status == 200), "{answers:?}");
    let error = recorded.unwrap_err().to_string();
    assert!(
        error.contains("fault injected at store::outbox_results"),
        "{error}"
    );
    assert_eq!(
        committed,
        Committed {
            transactions: 1,
            deliveries: 10
        },
        "the ten deliveries committed in one transaction, without the results"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM email_outbox WHERE status = 'sent'"),
        0
    );
    assert_eq!(
        app.count("SELECT count(*) FROM email_outbox WHERE lease_owner = 'relay-under-test'"),
        5,
        "the claimed rows still wait under the relay's lease"
    );
    // Recorded again, they are sent.
    let again = app
        .store
        .record_outbox_results(RELAY.into(), results)
        .await
        .unwrap();
    assert_eq!(again, vec![true; 5]);
    assert_eq!(
        app.count("SELECT count(*) FROM email_outbox WHERE status = 'sent'"),
        5
    );
    scenario.teardown();
}

#[actix_web::test]
async fn a_delivery_that_always_fails_fails_alone_in_every_batch() {
    let scenario = FailScenario::setup();
    let app = spawn_app().await;
    // Every delivery fails after its effects: each must be rolled back, none committed.
    fail::cfg("store::after_effects", "return").unwrap();

    let bodies = batch_bodies(12);
    let sending = join_all(bodies.iter().map(|b| app.deliver_stripe_body(b)));
    let (answers, committed) = in_one_batch(&app, 12, sending).await;
    assert!(answers.iter().all(|a| a.status == 503), "{answers:?}");
    assert_eq!(all_rows(&app), (0, 0, 0, 0), "nothing committed");
    // The first failed the batch's first pass; the eleven others were rerun with a savepoint
    // each, in one transaction, each failed in its savepoint, and that transaction committed
    // none of them. (Alone in a batch, a delivery that fails commits no transaction at all.)
    assert_eq!(
        committed,
        Committed {
            transactions: 1,
            deliveries: 0
        },
        "the twelve shared one batch"
    );

    fail::remove("store::after_effects");
    for body in &bodies {
        assert_eq!(app.deliver_stripe_body(body).await.outcome(), "processed");
    }
    assert_eq!(all_rows(&app), (12, 12, 12, 12));
    scenario.teardown();
}

#[actix_web::test]
async fn the_same_event_twice_in_one_batch_applies_its_effects_once() {
    let scenario = FailScenario::setup();
    let app = spawn_app().await;
    let body = fixture("stripe/payment_intent.succeeded.json");
    let now = app.clock.now_unix();
    // Two deliveries of one event, signed a second apart as Stripe's retry would be.
    let (first, second) = (stripe_header(&body, now), stripe_header(&body, now - 1));
    let sending = futures_util::future::join(
        app.post_stripe(&body, Some(&first)),
        app.post_stripe(&body, Some(&second)),
    );
    let ((first, second), committed) = in_one_batch(&app, 2, sending).await;
    let mut outcomes = [first.outcome(), second.outcome()];
    outcomes.sort();
    assert_eq!(outcomes, ["duplicate", "processed"]);
    assert_eq!(
        app.row_counts(),
        (1, 1, 1),
        "one row, one order, one email for the pair"
    );
    assert_eq!(
        committed,
        Committed {
            transactions: 1,
            deliveries: 2
        },
        "both deliveries were in one transaction"
    );
    scenario.teardown();
}

#[actix_web::test]
async fn api_requests_batched_with_webhook_deliveries_are_all_answered_and_committed() {
    const TOKEN: &str = "tok-shop-mixed";
    let scenario = FailScenario::setup();
    let app = spawn_app_with(|s| {
        s.api_tokens = sekali::config::parse_api_tokens(&format!("shop:{TOKEN}")).unwrap();
    })
    .await;
    let bodies = batch_bodies(10);
    let deliveries = join_all(bodies.iter().map(|b| app.deliver_stripe_body(b)));
    let app = &app;
    let authorization = &format!("Bearer {TOKEN}");
    let api_calls = join_all((0..5).map(|i| async move {
        let body = format!(
            r#"{{"order_id": "ord_api_mixed_{i}", "amount": 2500, "currency": "usd", "provider": "stripe"}}"#
        );
        let key = format!("mixed-{i}");
        let headers = [("Authorization", authorization.as_str()), ("Idempotency-Key", &key)];
        app.post("/orders", body.into_bytes(), &headers).await
    }));
    let sending = futures_util::future::join(deliveries, api_calls);
    let ((delivered, created), committed) = in_one_batch(app, 15, sending).await;

    assert!(delivered.iter().all(|a| a.status == 200), "{delivered:?}");
    assert!(created.iter().all(|r| r.status == 201), "{created:?}");
    assert_eq!(
        app.count("SELECT count(*) FROM orders WHERE source = 'api'"),
        5
    );
    assert_eq!(app.count("SELECT count(*) FROM processed_events"), 10);
    assert_eq!(
        committed,
        Committed {
            transactions: 1,
            deliveries: 10
        },
        "ten deliveries and five API requests in one transaction"
    );
    scenario.teardown();
}

/// Webhooks first, and the relay not forgotten: a relay claim that arrives while deliveries
/// queue for the writer (twenty in one batch: busy) waits, so it does not ride in their
/// transaction; once they are committed and no more come, the writer serves it on its own,
/// long before the claim's longest wait (`CLAIM_MAX_DEFER`, 10 s). Fails on the version that
/// waited for the next job to look at a waiting claim again: after a load's last delivery none
/// came, and the relay sat idle for the full 10 s with the backlog pending.
#[actix_web::test]
async fn a_claim_waits_while_deliveries_queue_and_is_served_once_they_stop() {
    let scenario = FailScenario::setup();
    let app = spawn_app().await;
    let bodies = batch_bodies(20);
    let deliveries = join_all(bodies.iter().map(|b| app.deliver_stripe_body(b)));
    let claim = async {
        let started = Instant::now();
        let claimed = app
            .store
            .claim_outbox(sekali::store::ClaimRequest {
                owner: "relay-under-test".into(),
                lease_ms: 60_000,
                limit: 256,
                outbox: sekali::store::OutboxKind::Email,
            })
            .await
            .unwrap();
        (claimed.len(), started.elapsed())
    };
    let sending = futures_util::future::join(deliveries, claim);
    let ((delivered, (claimed, waited)), committed) = in_one_batch(&app, 21, sending).await;

    assert!(delivered.iter().all(|a| a.status == 200), "{delivered:?}");
    assert_eq!(
        committed,
        Committed {
            transactions: 2,
            deliveries: 20
        },
        "the deliveries committed alone, and the claim after them in a transaction of its own"
    );
    assert_eq!(
        claimed, 20,
        "the claim took the twenty receipts the deliveries queued"
    );
    assert!(
        waited < sekali::store::sqlite::writer::CLAIM_MAX_DEFER / 2,
        "the claim was served {waited:?} after it was sent: it waited for a job to come"
    );
    scenario.teardown();
}
