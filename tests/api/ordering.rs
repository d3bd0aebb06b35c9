use crate::helpers::*;

/// Final (status, amount, refunded) of each order after delivering `names` in the given order.
async fn final_orders(
    stripe: &[&str],
    midtrans: &[&str],
    orders: &[&str],
) -> Vec<(String, i64, i64)> {
    let app = spawn_app().await;
    for name in stripe {
        assert_eq!(app.deliver_stripe(name).await.status, 200, "{name}");
    }
    for name in midtrans {
        assert_eq!(app.deliver_midtrans(name).await.status, 200, "{name}");
    }
    orders.iter().map(|o| app.order(o)).collect()
}

#[actix_web::test]
async fn out_of_order_lifecycles_end_in_the_same_state_as_in_order() {
    let stripe: Vec<&str> = STRIPE_IN_ORDER.iter().map(|(n, _)| *n).collect();
    let mut stripe_reversed = stripe.clone();
    stripe_reversed.reverse();
    let mut midtrans_reversed = MIDTRANS_IN_ORDER.to_vec();
    midtrans_reversed.reverse();
    let orders = [
        "ord_1001",
        "ord_1002",
        "ord_1003",
        "ord_1004",
        "ord_1005",
        "ORDER-2001",
        "ORDER-2002",
        "ORDER-2003",
        "ORDER-2004",
        "ORDER-2005",
        "ORDER-2006",
    ];
    let in_order = final_orders(&stripe, &MIDTRANS_IN_ORDER, &orders).await;
    let reversed = final_orders(&stripe_reversed, &midtrans_reversed, &orders).await;
    assert_eq!(in_order, reversed);
    assert_eq!(in_order[0], ("refunded".into(), 2500, 2500));
    assert_eq!(
        in_order[5],
        ("partially_refunded".into(), 15_000_000, 7_500_000)
    );
}

#[actix_web::test]
async fn a_refund_before_the_payment_that_links_it_is_parked_then_applied() {
    let app = spawn_app().await;
    let parked = app.deliver_stripe("charge.refunded.partial").await;
    assert_eq!((parked.status, parked.outcome()), (200, "parked"));
    assert_eq!(
        app.count("SELECT count(*) FROM orders"),
        0,
        "nothing to apply it to yet"
    );

    let linking = app.deliver_stripe("payment_intent.succeeded").await;
    assert_eq!(linking.outcome(), "processed");
    assert_eq!(
        app.order("ord_1001"),
        ("partially_refunded".into(), 2500, 1000)
    );
    let rows = app.query(
        "SELECT outcome, order_id FROM processed_events WHERE event_id = 'evt_1QA0003refundpartial01'",
    );
    assert_eq!(
        rows,
        [[Some("processed".to_owned()), Some("ord_1001".to_owned())]]
    );
    assert_eq!(
        app.outbox_templates("ord_1001"),
        ["receipt", "refund_notice"]
    );
}

#[actix_web::test]
async fn a_dispute_before_its_checkout_session_is_parked_then_applied() {
    let app = spawn_app().await;
    assert_eq!(
        app.deliver_stripe("charge.dispute.created").await.outcome(),
        "parked"
    );
    assert_eq!(
        app.deliver_stripe("checkout.session.completed")
            .await
            .outcome(),
        "processed"
    );
    assert_eq!(app.order_status("ord_1003").as_deref(), Some("disputed"));
}

#[actix_web::test]
async fn late_events_that_would_move_an_order_backwards_are_stale() {
    let app = spawn_app().await;
    app.deliver_midtrans("settlement").await;
    let late = app.deliver_midtrans("pending").await;
    assert_eq!((late.status, late.outcome()), (200, "stale"));
    assert_eq!(app.order_status("ORDER-2001").as_deref(), Some("paid"));

    app.deliver_stripe("payment_intent.succeeded").await;
    let late = app.deliver_stripe("payment_intent.processing").await;
    assert_eq!(late.outcome(), "stale");
    let outcome = app.texts(
        "SELECT outcome FROM processed_events WHERE event_id = 'evt_1QA0001processing00001'",
    );
    assert_eq!(outcome, ["stale"]);
}

/// A refund says the money was taken before it was given back: an order first seen refunded
/// gets the receipt for what was taken and the notice of what was given back, and the payment
/// arriving afterwards is stale and sends nothing.
#[actix_web::test]
async fn an_order_first_seen_refunded_gets_its_receipt_and_refund_notice() {
    let app = spawn_app().await;
    app.deliver_midtrans("refund").await;
    assert_eq!(
        app.order("ORDER-2002"),
        ("refunded".into(), 27_500_000, 27_500_000)
    );
    assert_eq!(
        app.outbox_templates("ORDER-2002"),
        ["receipt", "refund_notice"]
    );
    assert_eq!(
        app.deliver_midtrans("capture.accept").await.outcome(),
        "stale"
    );
    assert_eq!(
        app.outbox_templates("ORDER-2002"),
        ["receipt", "refund_notice"]
    );
}

#[actix_web::test]
async fn an_older_partial_refund_after_a_newer_one_is_stale() {
    let app = spawn_app().await;
    app.deliver_midtrans("settlement").await;
    assert_eq!(
        app.deliver_midtrans("partial_refund.2").await.outcome(),
        "processed"
    );
    assert_eq!(
        app.deliver_midtrans("partial_refund.1").await.outcome(),
        "stale"
    );
    assert_eq!(
        app.order("ORDER-2001"),
        ("partially_refunded".into(), 15_000_000, 7_500_000)
    );
    assert_eq!(
        app.outbox_templates("ORDER-2001"),
        ["receipt", "refund_notice"]
    );
}

/// A type sekali does not act on is ignored; a payment no order names waits on its payment
/// (parked), and counts once an event names it with its order.
#[actix_web::test]
async fn unknown_types_are_ignored_and_payments_without_an_order_wait() {
    let app = spawn_app().await;
    let answer = app.deliver_stripe("customer.created").await;
    assert_eq!((answer.status, answer.outcome()), (200, "ignored"));
    let no_order = br#"{"id":"evt_no_order","object":"event","type":"payment_intent.succeeded","data":{"object":{"id":"pi_unlinked","object":"payment_intent","amount":100,"amount_received":100,"currency":"usd","metadata":{}}}}"#;
    assert_eq!(app.deliver_stripe_body(no_order).await.outcome(), "parked");
    assert_eq!(app.row_counts(), (2, 0, 0));
    let linking = br#"{"id":"evt_linking","object":"event","type":"payment_intent.processing","data":{"object":{"id":"pi_unlinked","object":"payment_intent","amount":100,"currency":"usd","metadata":{"order_id":"ord_late"}}}}"#;
    assert_eq!(
        app.deliver_stripe_body(linking).await.outcome(),
        "processed"
    );
    assert_eq!(app.order("ord_late"), ("paid".into(), 100, 0));
    assert_eq!(app.outbox_templates("ord_late"), ["receipt"]);
}
