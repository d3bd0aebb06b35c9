use std::process::Command;
use std::time::Duration;

use crate::helpers::*;

const DAY: i64 = 24 * 3600;

#[actix_web::test]
async fn a_redelivery_just_before_expiry_is_a_duplicate_and_after_it_is_new() {
    let app = spawn_app().await;
    let start = app.clock.now_unix();
    assert_eq!(
        app.deliver_midtrans("settlement").await.outcome(),
        "processed"
    );

    app.clock.set(start + 7 * DAY - 1);
    assert_eq!(
        app.deliver_midtrans("settlement").await.outcome(),
        "duplicate"
    );

    // Past the retention the id counts as absent even before a purge removes it: the delivery
    // is treated as new (the order is already paid, so it changes nothing).
    app.clock.set(start + 7 * DAY);
    assert_eq!(
        app.deliver_midtrans("settlement").await.outcome(),
        "processed"
    );
    assert_eq!(app.count("SELECT count(*) FROM processed_events"), 1);
    assert_eq!(
        app.outbox_templates("ORDER-2001"),
        ["receipt"],
        "no second receipt"
    );
}

#[actix_web::test]
async fn the_purge_command_removes_only_expired_ids_and_keeps_orders() {
    let app = spawn_app().await;
    let now = app.clock.now_unix();
    app.clock.set(now - 31 * DAY); // Stripe id expired a day ago
    app.deliver_stripe_body(&fixture("stripe/payment_intent.processing.json"))
        .await;
    app.clock.set(now - 8 * DAY); // Midtrans id expired a day ago
    app.deliver_midtrans("settlement").await;
    app.clock.set(now - 6 * DAY); // Midtrans id still live
    app.deliver_midtrans("capture.accept").await;
    app.clock.set(now - 29 * DAY + 60); // Stripe id still live
    app.deliver_stripe("checkout.session.completed").await;
    app.stop().await;
    let before = app.row_counts();
    assert_eq!(before.0, 4);

    let output = Command::new(sekali_bin())
        .args(["purge", "--db"])
        .arg(app.db_arg())
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "purged 2 expired event ids\npurged 0 expired idempotency keys\n"
    );

    let after = app.row_counts();
    assert_eq!(
        after,
        (2, before.1, before.2),
        "orders and outbox rows are never purged"
    );
    let ids = app.texts("SELECT event_id FROM processed_events ORDER BY event_id");
    assert_eq!(
        ids,
        [
            "ORDER-2002:capture:200:accept",
            "evt_1QA0006checkoutpaid001"
        ]
    );
}

#[actix_web::test]
async fn parked_events_survive_the_purge() {
    let app = spawn_app().await;
    let now = app.clock.now_unix();
    app.clock.set(now - 40 * DAY);
    assert_eq!(
        app.deliver_stripe("charge.refunded.partial")
            .await
            .outcome(),
        "parked"
    );
    app.stop().await;
    let output = Command::new(sekali_bin())
        .args(["purge", "--db"])
        .arg(app.db_arg())
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "purged 0 expired event ids\npurged 0 expired idempotency keys\n"
    );
}

#[actix_web::test]
async fn the_purge_job_runs_on_its_interval_in_batches() {
    let app = spawn_app_with(|s| {
        s.purge_interval = Duration::from_millis(100);
        s.purge_batch = 2; // several batches for one pass
    })
    .await;
    let start = app.clock.now_unix();
    for name in MIDTRANS_IN_ORDER {
        app.deliver_midtrans(name).await;
    }
    app.clock.set(start + 3 * DAY);
    app.deliver_stripe("payment_intent.processing").await;
    assert_eq!(app.count("SELECT count(*) FROM processed_events"), 12);

    app.clock.set(start + 7 * DAY); // every Midtrans id expires, the Stripe one does not
    let mut remaining = 12;
    for _ in 0..100 {
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
        remaining = app.count("SELECT count(*) FROM processed_events");
        if remaining == 1 {
            break;
        }
    }
    assert_eq!(remaining, 1);
    assert_eq!(
        app.count("SELECT count(*) FROM orders"),
        7,
        "orders are kept"
    );
}

#[test]
fn purging_a_database_that_does_not_exist_is_an_error_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::missing(dir.path().join("missing.db"));
    let output = Command::new(sekali_bin())
        .args(["purge", "--db"])
        .arg(db.arg())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("does not exist"), "{stderr}");
    assert!(!db.path().exists());
}

#[test]
fn the_served_purge_job_deletes_in_transactions_of_500_and_logs_each_pass() {
    let server = ServeProcess::start_with(
        &[("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET)],
        "info",
        &["--stripe-retention", "1s", "--purge-interval", "4s"],
    );
    // 1,200 ids that expire a second after they arrive, most likely all before the first pass.
    let bench = Command::new(sekali_bin())
        .args(["bench", "--url"])
        .arg(format!("{}/webhooks/stripe", server.base_url()))
        .args(["--events", "1200", "--dup-ratio", "0", "--concurrency", "8"])
        .env("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET)
        .output()
        .unwrap();
    assert!(bench.status.success(), "{bench:?}");

    let count = |sql: &str| server.db().count(sql);
    let purged = (0..200).any(|_| {
        count("SELECT count(*) FROM processed_events") == 0 || {
            std::thread::sleep(Duration::from_millis(100));
            false
        }
    });
    assert!(purged, "every expired id was purged within 20 s");
    assert_eq!(
        count("SELECT count(*) FROM orders"),
        1200,
        "orders are kept"
    );

    // Each pass logs what it deleted, in how many transactions and how long it took. A pass
    // runs 500-row transactions until one comes back short: n ids take n / 500 + 1.
    let (_, logs) = server.stop();
    let field = |line: &str, name: &str| -> usize {
        let start = line.find(&format!(" {name}=")).expect(name) + name.len() + 2;
        line[start..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let passes: Vec<(usize, usize)> = logs
        .lines()
        .filter(|l| l.contains("INFO") && l.contains("expired idempotency keys"))
        .inspect(|l| assert!(l.contains(" seconds="), "{l}"))
        .map(|l| (field(l, "events"), field(l, "transactions")))
        .filter(|(events, _)| *events > 0)
        .collect();
    assert_eq!(
        passes.iter().map(|(events, _)| events).sum::<usize>(),
        1200,
        "{logs}"
    );
    for (events, transactions) in &passes {
        assert_eq!(*transactions, events / 500 + 1, "{events} ids: {logs}");
    }
    assert!(
        passes.iter().any(|(_, transactions)| *transactions >= 2),
        "a pass took more than one transaction: {passes:?}"
    );
}
