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
