use futures_util::future::join_all;

use crate::helpers::*;

#[actix_web::test]
async fn fifty_concurrent_identical_deliveries_apply_effects_exactly_once() {
    let app = spawn_app().await;
    let body = fixture("stripe/payment_intent.succeeded.json");
    let header = stripe_header(&body, app.clock.now_unix());
    let answers = join_all((0..50).map(|_| app.post_stripe(&body, Some(&header)))).await;

    assert!(answers.iter().all(|a| a.status == 200), "{answers:?}");
    let processed = answers
        .iter()
        .filter(|a| a.outcome() == "processed")
        .count();
    let duplicates = answers
        .iter()
        .filter(|a| a.outcome() == "duplicate")
        .count();
    assert_eq!((processed, duplicates), (1, 49));
    assert_eq!(
        app.row_counts(),
        (1, 1, 1),
        "one event row, one order, one email"
    );
}

#[actix_web::test]
async fn concurrent_deliveries_of_different_events_are_all_recorded() {
    let app = spawn_app().await;
    let template = String::from_utf8(fixture("stripe/payment_intent.succeeded.json")).unwrap();
    let bodies: Vec<Vec<u8>> = (0..200)
        .map(|i| {
            template
                .replace(
                    "evt_1QA0002succeeded000001",
                    &format!("evt_concurrent_{i:04}"),
                )
                .replace("ord_1001", &format!("ord_c{i:04}"))
                .replace("pi_3QA0001Order1001", &format!("pi_concurrent_{i:04}"))
                .into_bytes()
        })
        .collect();
    let answers = join_all(bodies.iter().map(|b| app.deliver_stripe_body(b))).await;
    assert!(
        answers
            .iter()
            .all(|a| a.status == 200 && a.outcome() == "processed"),
        "{answers:?}"
    );
    assert_eq!(app.row_counts(), (200, 200, 200));
}

#[actix_web::test]
async fn two_servers_on_one_database_file_apply_each_event_once_between_them() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::fresh(dir.path().join("shared.db"));
    // Two processes, each with its own writer; SQLite's write lock orders their transactions,
    // PostgreSQL's unique key on the claim does.
    let start = || {
        ServeProcess::start_on(
            Some(db.path()),
            &[("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET)],
            "warn",
            &["--no-relay"],
        )
    };
    let servers = [start(), start()];
    let client = &awc::Client::builder()
        .timeout(std::time::Duration::from_secs(30))
        .finish();
    let bodies = distinct_succeeded_bodies("shared", 100);
    let servers_ref = &servers;
    let answers = join_all(bodies.iter().flat_map(|body| {
        servers_ref.iter().map(move |server| {
            let header = stripe_header(body, sekali::clock::SystemClock.now_unix());
            let request = client
                .post(format!("{}/webhooks/stripe", server.base_url()))
                .insert_header(("Stripe-Signature", header))
                .insert_header(("Content-Type", "application/json"));
            async move {
                let mut response = request.send_body(body.clone()).await.unwrap();
                let answer: serde_json::Value = response.json().await.unwrap();
                (response.status().as_u16(), answer)
            }
        })
    }))
    .await;

    // Each event was sent to both at once: one applied it, the other saw its row.
    for pair in answers.chunks(2) {
        assert!(pair.iter().all(|(status, _)| *status == 200), "{pair:?}");
        let mut outcomes: Vec<_> = pair.iter().map(|(_, a)| a["status"].clone()).collect();
        outcomes.sort_by_key(|o| o.to_string());
        assert_eq!(outcomes, ["duplicate", "processed"], "{pair:?}");
    }
    drop(servers);
    for table in [
        "processed_events",
        "orders",
        "order_transitions",
        "email_outbox",
    ] {
        let rows = db.count(&format!("SELECT count(*) FROM {table}"));
        assert_eq!(rows, 100, "{table}");
    }
}
