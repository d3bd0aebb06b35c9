//! The ledger (issue 31) through the real server and SQLite file: each case the audit found,
//! where money that moved was dropped or money that did not move was reported, sent as the
//! providers send it (the fixtures of `fixtures/README.md`, section "Ledger fixtures"). Each
//! test fails on the version with the order state machine; what that version did is in the
//! test's comment.

use std::time::Duration;

use serde_json::Value;

use crate::helpers::*;

const XENDIT_TOKEN: &str = "cb-token-sekali-ledger-test-8e21c4";
const SHOP: &str = "tok-ledger-shop-2b7d";

/// A server with the three providers (the Midtrans status check off) and the orders API.
async fn spawn_ledger() -> TestApp {
    let mut env = PROVIDER_ENV.to_vec();
    env.push(("XENDIT_CALLBACK_TOKEN", XENDIT_TOKEN));
    spawn_app_with(|s| {
        s.providers = providers_from(&env, &[]);
        s.api_tokens = sekali::config::parse_api_tokens(&format!("shop:{SHOP}")).unwrap();
    })
    .await
}

/// Delivers `fixtures/{name}` (`stripe/…`, `midtrans/…`, `xendit/…`, without `.json`) as its
/// provider would, and answers its outcome.
async fn send(app: &TestApp, name: &str) -> String {
    let answer = deliver(app, name, |_| {}).await;
    assert_eq!(answer.status, 200, "{name}: {answer:?}");
    answer.outcome().to_owned()
}

/// Like [`send`], the file changed by `edit` first (and signed as changed).
async fn deliver(app: &TestApp, name: &str, edit: impl FnOnce(&mut Value)) -> Answer {
    let mut body: Value = serde_json::from_slice(&fixture(&format!("{name}.json"))).unwrap();
    edit(&mut body);
    let bytes = serde_json::to_vec(&body).unwrap();
    match name.split('/').next().unwrap() {
        "stripe" => app.deliver_stripe_body(&bytes).await,
        "midtrans" => {
            app.post("/webhooks/midtrans", sign_midtrans(&bytes), &[])
                .await
        }
        "xendit" => {
            app.post(
                "/webhooks/xendit",
                bytes,
                &[("x-callback-token", XENDIT_TOKEN)],
            )
            .await
        }
        other => panic!("no provider {other}"),
    }
}

fn status(app: &TestApp, order_id: &str) -> String {
    app.order_status(order_id)
        .unwrap_or_else(|| "no order".into())
}

/// The order's emails in the order they were queued: each template with the money it names
/// (a receipt's amount, a refund notice's refund this time).
fn emails(app: &TestApp, order_id: &str) -> Vec<(String, i64)> {
    let rows = app.query(&format!(
        "SELECT template, params FROM email_outbox WHERE order_id = {} ORDER BY id",
        sql_text(order_id)
    ));
    rows.into_iter()
        .map(|row| {
            let (template, params) = (row[0].clone().unwrap(), row[1].clone().unwrap());
            let params: Value = serde_json::from_str(&params).unwrap();
            let money = match template.as_str() {
                "refund_notice" => params["refund_amount"].as_i64(),
                _ => params["amount"].as_i64(),
            };
            (template, money.unwrap_or(-1))
        })
        .collect()
}

fn email(template: &str, money: i64) -> (String, i64) {
    (template.to_owned(), money)
}

/// `GET /orders/{order_id}` as the shop reads it.
async fn order_view(app: &TestApp, order_id: &str) -> Value {
    let mut response = app
        .client
        .get(format!("{}/orders/{order_id}", app.address))
        .insert_header(("Authorization", format!("Bearer {SHOP}")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200, "GET /orders/{order_id}");
    serde_json::from_slice(&response.body().await.unwrap()).unwrap()
}

fn order_id_of(body: &str) -> String {
    let order: Value = serde_json::from_str(body).unwrap();
    order["order_id"].as_str().unwrap().to_owned()
}

/// Creates an order through the API.
async fn create_order(app: &TestApp, body: &str) {
    let response = app
        .client
        .post(format!("{}/orders", app.address))
        .insert_header(("Authorization", format!("Bearer {SHOP}")))
        .insert_header(("Idempotency-Key", format!("k-{}", order_id_of(body))))
        .insert_header(("Content-Type", "application/json"))
        .send_body(body.to_owned())
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 201, "{body}");
}

// --- paid after a cancel ------------------------------------------------------------------------

/// Midtrans lets an order id be paid again once its transaction is no longer active: the card
/// of the first attempt declined, the customer pays by bank transfer. The old version moved the
/// order to `cancelled` at the deny and answered the settlement `stale`: the customer paid, the
/// order stayed cancelled, no receipt.
#[actix_web::test]
async fn a_declined_card_then_a_retry_that_settles_pays_the_order_with_a_receipt() {
    let app = spawn_ledger().await;
    // The first attempt (transaction A) was pending before its card was declined.
    let pending = deliver(&app, "midtrans/pending", |n| {
        n["order_id"] = "ORDER-2009".into();
        n["gross_amount"] = "175000.00".into();
        n["transaction_id"] = "c3389764-0cf2-4763-9c11-0a75628b6c95".into();
    })
    .await;
    assert_eq!(pending.outcome(), "processed");
    assert_eq!(send(&app, "midtrans/deny.bank_decline").await, "processed");
    assert_eq!(status(&app, "ORDER-2009"), "failed");
    assert_eq!(
        send(&app, "midtrans/settlement.after_deny").await,
        "processed"
    );
    assert_eq!(status(&app, "ORDER-2009"), "paid");
    assert_eq!(
        emails(&app, "ORDER-2009"),
        [
            email("payment_failed", 17_500_000),
            email("receipt", 17_500_000)
        ]
    );
    let view = order_view(&app, "ORDER-2009").await;
    let payments = view["payments"].as_array().unwrap();
    let attempts: Vec<(&str, &str, i64)> = payments
        .iter()
        .map(|p| {
            (
                p["payment_ref"].as_str().unwrap(),
                p["attempt"].as_str().unwrap(),
                p["captured"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(attempts.len(), 2, "{view}");
    assert!(
        attempts.contains(&("c3389764-0cf2-4763-9c11-0a75628b6c95", "failed", 0)),
        "{view}"
    );

    // A pending attempt called off, then another one paid: the same.
    assert_eq!(
        send(&app, "midtrans/cancel.first_attempt").await,
        "processed"
    );
    assert_eq!(status(&app, "ORDER-2010"), "cancelled");
    assert_eq!(
        send(&app, "midtrans/settlement.after_cancel").await,
        "processed"
    );
    assert_eq!(status(&app, "ORDER-2010"), "paid");
    assert_eq!(emails(&app, "ORDER-2010"), [email("receipt", 6_400_000)]);
}

/// Stripe says when each happened: a PaymentIntent the customer cancelled, then another one
/// that took the money. The old version answered `stale` and kept `cancelled`: money taken, no
/// receipt, no flag. Now the money is recorded, the customer gets a receipt, and the order waits
/// for an operator with the reason.
#[actix_web::test]
async fn a_stripe_payment_after_a_cancel_is_recorded_and_flagged_for_review() {
    let app = spawn_ledger().await;
    assert_eq!(
        send(&app, "stripe/payment_intent.canceled.before_retry").await,
        "processed"
    );
    assert_eq!(status(&app, "ord_1013"), "cancelled");
    assert_eq!(
        send(&app, "stripe/payment_intent.succeeded.after_cancel").await,
        "needs_review"
    );
    assert_eq!(status(&app, "ord_1013"), "needs_review");
    assert_eq!(emails(&app, "ord_1013"), [email("receipt", 4_800)]);
    let view = order_view(&app, "ord_1013").await;
    assert_eq!(view["status"], "needs_review");
    let reason = view["review_reason"].as_str().unwrap();
    assert!(
        reason.contains("pi_3QA0027Order1013 took $48.00")
            && reason.contains("pi_3QA0026Order1013 was canceled"),
        "{reason}"
    );
}

// --- two payments, and the refund of one ---------------------------------------------------------

/// A second, different PaymentIntent that succeeded for a paid order: the old version answered
/// `processed` and changed nothing. Then the shop refunds the duplicate: the old version marked
/// the order `refunded` with a refund notice "the full payment" while the paying payment stood.
#[actix_web::test]
async fn a_double_charge_needs_review_and_refunding_the_duplicate_leaves_the_order_paid() {
    let app = spawn_ledger().await;
    assert_eq!(
        send(&app, "stripe/payment_intent.succeeded").await,
        "processed"
    );
    assert_eq!(
        send(&app, "stripe/payment_intent.succeeded.duplicate").await,
        "needs_review"
    );
    let view = order_view(&app, "ord_1001").await;
    assert_eq!(view["status"], "needs_review");
    assert_eq!(
        view["review_reason"],
        "2 payments took money: stripe payment pi_3QA0001Order1001 ($25.00), stripe payment \
         pi_3QA0020Order1001 ($25.00)"
    );
    // One receipt: the order first held money once.
    assert_eq!(emails(&app, "ord_1001"), [email("receipt", 2_500)]);

    assert_eq!(
        send(&app, "stripe/charge.refunded.duplicate").await,
        "processed"
    );
    let view = order_view(&app, "ord_1001").await;
    assert_eq!(view["status"], "paid", "{view}");
    assert_eq!(view["review_reason"], Value::Null);
    // The duplicate's money came back to the customer, and the notice says how much.
    assert_eq!(
        emails(&app, "ord_1001"),
        [email("receipt", 2_500), email("refund_notice", 2_500)]
    );
    let by_payment: Vec<(String, i64, i64)> = view["payments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["payment_ref"].as_str().unwrap().to_owned(),
                p["captured"].as_i64().unwrap(),
                p["returned"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        by_payment,
        [
            ("pi_3QA0001Order1001".to_owned(), 2_500, 0),
            ("pi_3QA0020Order1001".to_owned(), 2_500, 2_500)
        ]
    );
}

// --- money that did not move ----------------------------------------------------------------------

/// A Checkout Session in setup mode saves a card and takes nothing (`amount_total` null). The
/// old version moved the shop's order of $5,000.00 to `paid` with a receipt for it, and without
/// an API order created a `paid` order whose receipt read "payment of ".
#[actix_web::test]
async fn a_setup_session_takes_no_money_and_pays_nothing() {
    let app = spawn_ledger().await;
    create_order(
        &app,
        r#"{"order_id":"ord_1014","amount":500000,"currency":"USD","provider":"stripe","customer_email":"dewi@example.com"}"#,
    )
    .await;
    assert_eq!(
        send(&app, "stripe/checkout.session.completed.setup").await,
        "ignored"
    );
    assert_eq!(status(&app, "ord_1014"), "pending");
    assert_eq!(emails(&app, "ord_1014"), []);

    // Without an order of the shop's, none is made.
    let other = deliver(&app, "stripe/checkout.session.completed.setup", |e| {
        e["id"] = "evt_1QA0047checkoutsetup02".into();
        e["data"]["object"]["client_reference_id"] = "ord_1014_b".into();
    })
    .await;
    assert_eq!(other.outcome(), "ignored");
    assert_eq!(status(&app, "ord_1014_b"), "no order");
    assert_eq!(app.count("SELECT count(*) FROM email_outbox"), 0);
}

/// An authorisation released by a refund before API version 2025-03-31.basil (`captured`
/// false, `amount_captured` 0, `amount_refunded` 7000): the old version made the order
/// `refunded` and emailed "We refunded $70.00 (the full payment)". No money moved, in either
/// order of delivery.
#[actix_web::test]
async fn a_released_authorisation_is_no_refund_in_either_order() {
    for order in [
        [
            "stripe/charge.refunded.released_authorization",
            "stripe/payment_intent.canceled.abandoned",
        ],
        [
            "stripe/payment_intent.canceled.abandoned",
            "stripe/charge.refunded.released_authorization",
        ],
    ] {
        let app = spawn_ledger().await;
        for name in order {
            send(&app, name).await;
        }
        assert_eq!(status(&app, "ord_1011"), "expired", "{order:?}");
        assert_eq!(emails(&app, "ord_1011"), [], "{order:?}");
        let view = order_view(&app, "ord_1011").await;
        let payment = &view["payments"][0];
        assert_eq!(
            (
                &payment["captured"],
                &payment["returned"],
                &payment["released"]
            ),
            (&Value::from(0), &Value::from(0), &Value::from(7_000)),
            "{order:?}: {view}"
        );
    }
}

/// Capturing 6,000 of a 10,000 authorisation before basil shows `amount_refunded` 4000: the
/// released rest. The old version said `partially_refunded` and "We refunded $40.00", and after
/// the 6,000 were refunded, 10,000 refunded of 6,000 paid.
#[actix_web::test]
async fn a_partial_captures_released_rest_is_no_refund() {
    let app = spawn_ledger().await;
    for name in [
        "stripe/charge.captured.partial.pre_basil",
        "stripe/charge.refunded.partial_capture_release",
        "stripe/payment_intent.succeeded.partial_capture.pre_basil",
    ] {
        send(&app, name).await;
    }
    assert_eq!(app.order("ord_1017"), ("paid".into(), 10_000, 0));
    assert_eq!(emails(&app, "ord_1017"), [email("receipt", 6_000)]);

    assert_eq!(
        send(&app, "stripe/charge.refunded.partial_capture_rest").await,
        "processed"
    );
    assert_eq!(app.order("ord_1017"), ("refunded".into(), 10_000, 6_000));
    assert_eq!(
        emails(&app, "ord_1017"),
        [email("receipt", 6_000), email("refund_notice", 6_000)]
    );

    // The same partial capture on basil: no Refund for the rest, the order paid 6,000.
    for name in [
        "stripe/payment_intent.amount_capturable_updated",
        "stripe/charge.succeeded.uncaptured",
    ] {
        send(&app, name).await;
    }
    assert_eq!(status(&app, "ord_1010"), "pending");
    assert_eq!(emails(&app, "ord_1010"), []);
    send(&app, "stripe/charge.captured.partial").await;
    send(&app, "stripe/payment_intent.succeeded.partial_capture").await;
    assert_eq!(app.order("ord_1010"), ("paid".into(), 10_000, 0));
    assert_eq!(emails(&app, "ord_1010"), [email("receipt", 6_000)]);
}

// --- a refund that fails ---------------------------------------------------------------------------

/// A refund the customer was told of failed (the card expired). The old version ignored
/// `charge.refund.updated` and `refund.failed`: the order stayed `partially_refunded` and the
/// customer kept a notice for money that never came. Now the order waits for an operator, with
/// the reason, and no email goes out by itself; the shop's new refund settles it without a
/// second notice for money already announced.
#[actix_web::test]
async fn a_refund_that_fails_after_its_notice_needs_review_until_a_new_refund_lands() {
    let app = spawn_ledger().await;
    send(&app, "stripe/payment_intent.succeeded").await;
    send(&app, "stripe/charge.refunded.partial").await;
    let view = order_view(&app, "ord_1001").await;
    assert_eq!(view["status"], "partially_refunded", "{view}");
    assert_eq!(
        emails(&app, "ord_1001"),
        [email("receipt", 2_500), email("refund_notice", 1_000)]
    );

    assert_eq!(
        send(&app, "stripe/charge.refund.updated.failed").await,
        "needs_review"
    );
    let view = order_view(&app, "ord_1001").await;
    assert_eq!(view["status"], "needs_review");
    assert_eq!(
        view["review_reason"],
        "the customer was told of $10.00 refunded, but $0.00 is: the refund \
         re_3QA0001Order1001aRf1Kq7m ($10.00) failed"
    );
    assert_eq!(view["payments"][0]["refunds"][0]["state"], "failed");
    // The same failure in the newer event type: one fact, nothing new.
    assert_eq!(send(&app, "stripe/refund.failed").await, "stale");
    assert_eq!(emails(&app, "ord_1001").len(), 2);

    assert_eq!(send(&app, "stripe/refund.created").await, "processed");
    assert_eq!(status(&app, "ord_1001"), "partially_refunded");
    assert_eq!(send(&app, "stripe/refund.updated").await, "stale");
    assert_eq!(
        emails(&app, "ord_1001"),
        [email("receipt", 2_500), email("refund_notice", 1_000)]
    );
}

// --- disputes ----------------------------------------------------------------------------------------

/// An inquiry withdraws no money: the old version made the order `disputed`, a final status, so
/// the full refund after it was `stale` and recorded nowhere.
#[actix_web::test]
async fn an_inquiry_leaves_the_order_paid_and_a_later_refund_counts() {
    let app = spawn_ledger().await;
    send(&app, "stripe/checkout.session.completed").await;
    assert_eq!(
        send(&app, "stripe/charge.dispute.created.inquiry").await,
        "processed"
    );
    assert_eq!(status(&app, "ord_1003"), "paid");
    let refund = deliver(&app, "stripe/charge.refunded.full", |e| {
        let charge = &mut e["data"]["object"];
        charge["id"] = "ch_3QA0006Order1003".into();
        charge["payment_intent"] = "pi_3QA0006Order1003".into();
        charge["amount"] = 4_200.into();
        charge["amount_captured"] = 4_200.into();
        charge["amount_refunded"] = 4_200.into();
        charge["refunds"] = Value::Null;
    })
    .await;
    assert_eq!(refund.outcome(), "processed", "{refund:?}");
    assert_eq!(app.order("ord_1003"), ("refunded".into(), 4_200, 4_200));
    assert_eq!(
        emails(&app, "ord_1003"),
        [email("receipt", 4_200), email("refund_notice", 4_200)]
    );
}

/// A chargeback withdraws the money, and winning it gives it back: the old version ignored
/// `charge.dispute.closed` (won) and `funds_reinstated`, and the order stayed `disputed`
/// forever. A lost one stays disputed.
#[actix_web::test]
async fn a_won_chargeback_returns_the_order_to_paid_and_a_lost_one_stays_disputed() {
    let app = spawn_ledger().await;
    send(&app, "stripe/checkout.session.completed").await;
    send(&app, "stripe/charge.dispute.created").await;
    assert_eq!(status(&app, "ord_1003"), "disputed");
    send(&app, "stripe/charge.dispute.funds_withdrawn").await;
    assert_eq!(status(&app, "ord_1003"), "disputed");
    assert_eq!(
        send(&app, "stripe/charge.dispute.closed.won").await,
        "processed"
    );
    assert_eq!(status(&app, "ord_1003"), "paid");
    send(&app, "stripe/charge.dispute.funds_reinstated").await;
    assert_eq!(status(&app, "ord_1003"), "paid");
    let view = order_view(&app, "ord_1003").await;
    assert_eq!(view["payments"][0]["disputes"][0]["stage"], "won", "{view}");
    assert_eq!(view["payments"][0]["disputes"][0]["holds"], 0);
    // No email for a dispute, won or not: the receipt alone.
    assert_eq!(emails(&app, "ord_1003"), [email("receipt", 4_200)]);

    for name in [
        "stripe/payment_intent.succeeded.disputed",
        "stripe/charge.dispute.created.lost",
        "stripe/charge.dispute.funds_withdrawn.lost",
        "stripe/charge.dispute.closed.lost",
    ] {
        send(&app, name).await;
    }
    assert_eq!(status(&app, "ord_1012"), "disputed");
    assert_eq!(
        order_view(&app, "ord_1012").await["payments"][0]["withdrawn"],
        5_000
    );
}

/// A chargeback after a full refund takes back money the customer already has: the old version
/// recorded it nowhere (the order stayed `refunded`). Now the dispute is on the payment, and the
/// order waits for an operator: the customer got the money twice.
#[actix_web::test]
async fn a_chargeback_after_a_full_refund_is_recorded_and_needs_review() {
    let app = spawn_ledger().await;
    send(&app, "stripe/charge.succeeded.legacy").await;
    send(&app, "stripe/charge.refunded.legacy").await;
    assert_eq!(status(&app, "ord_1008"), "refunded");
    assert_eq!(
        send(&app, "stripe/charge.dispute.created.legacy").await,
        "needs_review"
    );
    let view = order_view(&app, "ord_1008").await;
    assert_eq!(
        view["review_reason"],
        "$36.00 given back (refunds $18.00, chargebacks $18.00) is more than the $18.00 stripe \
         payment ch_1QA0014Order1008 took"
    );
    assert_eq!(view["payments"][0]["disputes"][0]["holds"], 1_800);
}

// --- Midtrans chargebacks -----------------------------------------------------------------------------

/// Midtrans `partial_chargeback` and `chargeback`: the old version ignored them, and their ids
/// carried no refund identity, so a second partial chargeback would have been a duplicate.
#[actix_web::test]
async fn midtrans_chargebacks_are_disputes_each_by_its_own_id() {
    let app = spawn_ledger().await;
    send(&app, "midtrans/settlement.card").await;
    assert_eq!(
        send(&app, "midtrans/partial_chargeback.1").await,
        "processed"
    );
    assert_eq!(status(&app, "ORDER-2008"), "disputed");
    assert_eq!(
        send(&app, "midtrans/partial_chargeback.2").await,
        "processed"
    );
    let withdrawn = |view: &Value| view["payments"][0]["withdrawn"].as_i64().unwrap();
    assert_eq!(withdrawn(&order_view(&app, "ORDER-2008").await), 8_000_000);
    assert_eq!(send(&app, "midtrans/chargeback").await, "processed");
    let view = order_view(&app, "ORDER-2008").await;
    assert_eq!(view["status"], "disputed");
    assert_eq!(withdrawn(&view), 20_000_000);
    let ids: Vec<&str> = view["payments"][0]["disputes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["dispute_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 3, "{view}");
    // A chargeback is no refund: the customer's emails are the receipt alone.
    assert_eq!(emails(&app, "ORDER-2008"), [email("receipt", 20_000_000)]);
}

// --- subscriptions ------------------------------------------------------------------------------------

/// A subscription checkout names the invoice, not a PaymentIntent: the old version parked the
/// refund of the invoice's payment forever. `invoice.paid` names both, in either order.
#[actix_web::test]
async fn a_subscription_checkouts_refund_reaches_its_order_in_any_order() {
    let files = [
        "stripe/checkout.session.completed.subscription",
        "stripe/invoice.paid",
        "stripe/charge.refunded.subscription",
    ];
    for order in [[0, 1, 2], [2, 1, 0], [2, 0, 1], [1, 2, 0]] {
        let app = spawn_ledger().await;
        for i in order {
            send(&app, files[i]).await;
        }
        assert_eq!(
            app.order("ord_1015"),
            ("refunded".into(), 2_000, 2_000),
            "{order:?}"
        );
        assert_eq!(
            emails(&app, "ord_1015"),
            [email("receipt", 2_000), email("refund_notice", 2_000)],
            "{order:?}"
        );
        assert_eq!(
            app.count("SELECT count(*) FROM processed_events WHERE outcome = 'parked'"),
            0,
            "{order:?}"
        );
    }
}

// --- units and providers ------------------------------------------------------------------------------

/// Stripe keeps two decimals for ISK, which ISO 4217 has none of: `amount_received` 50000 is
/// ISK 500. The old version let a Stripe payment of ISK 500 pay an API order created for Xendit
/// of ISK 50,000. An order for Stripe takes Stripe's units (50000, as the shop passed to
/// Stripe), and the payment pays it; the receipt names ISK 500.
#[actix_web::test]
async fn a_stripe_isk_payment_is_counted_in_krona_against_the_order_and_its_provider() {
    let app = spawn_ledger().await;
    create_order(
        &app,
        r#"{"order_id":"ord_1016","amount":50000,"currency":"ISK","provider":"xendit","customer_email":"jon@example.com"}"#,
    )
    .await;
    create_order(
        &app,
        r#"{"order_id":"ord_1016_s","amount":50000,"currency":"ISK","provider":"stripe","customer_email":"jon@example.com"}"#,
    )
    .await;
    assert_eq!(
        send(&app, "stripe/payment_intent.succeeded.isk").await,
        "amount_mismatch"
    );
    let view = order_view(&app, "ord_1016").await;
    assert_eq!(view["status"], "needs_review");
    let reason = view["review_reason"].as_str().unwrap();
    assert!(
        reason.contains("took ISK") && reason.contains("500") && reason.contains("xendit"),
        "{reason}"
    );
    assert_eq!(view["payments"][0]["captured"], 500);

    let right = deliver(&app, "stripe/payment_intent.succeeded.isk", |e| {
        e["id"] = "evt_1QA0051succeededisk002".into();
        e["data"]["object"]["id"] = "pi_3QA0031Order1016".into();
        e["data"]["object"]["metadata"]["order_id"] = "ord_1016_s".into();
    })
    .await;
    assert_eq!(
        right.outcome(),
        "processed",
        "{}",
        order_view(&app, "ord_1016_s").await
    );
    assert_eq!(status(&app, "ord_1016_s"), "paid");
    // The receipt counts in ISO units: ISK 500, no decimals.
    assert_eq!(emails(&app, "ord_1016_s"), [email("receipt", 500)]);
    // The JSON is read here: PostgreSQL keeps params as text, where ->> does not apply.
    let params = app.texts("SELECT params FROM email_outbox WHERE order_id = 'ord_1016_s'");
    let exponents: Vec<Value> = params
        .iter()
        .map(|p| serde_json::from_str::<Value>(p).unwrap()["exponent"].clone())
        .collect();
    assert_eq!(exponents, [serde_json::json!(0)]);
}

/// A Midtrans deny of an attempt that took nothing, under the id of an order Xendit paid: the
/// old version took it for a reversal of the order's payment and moved it to `needs_review`.
#[actix_web::test]
async fn a_midtrans_deny_of_an_unrelated_attempt_leaves_a_xendit_paid_order_paid() {
    let app = spawn_ledger().await;
    create_order(
        &app,
        r#"{"order_id":"ORDER-2003","amount":15000000,"currency":"IDR","provider":"xendit","customer_email":"sari@example.com"}"#,
    )
    .await;
    let paid = deliver(&app, "xendit/invoice.paid", |c| {
        c["external_id"] = "ORDER-2003".into();
    })
    .await;
    assert_eq!(paid.outcome(), "processed");
    assert_eq!(status(&app, "ORDER-2003"), "paid");
    assert_eq!(send(&app, "midtrans/deny").await, "processed");
    assert_eq!(status(&app, "ORDER-2003"), "paid");
    assert_eq!(emails(&app, "ORDER-2003"), [email("receipt", 15_000_000)]);
}

/// A Xendit invoice paid short or over (paid_amount against amount): the old version took
/// either for `paid`. The money is recorded as taken, with a receipt for it, and the order
/// waits for an operator. An invoice in pesos counts its centavos.
#[actix_web::test]
async fn a_xendit_invoice_paid_short_or_over_needs_review() {
    let app = spawn_ledger().await;
    for (file, order, reason) in [
        (
            "xendit/invoice.paid.underpaid",
            "ord_x_1005",
            "xendit payment 65f1c0a2b3d4e5f601a01005 took IDR\u{a0}200,000 of the \
             IDR\u{a0}250,000 it asked for",
        ),
        (
            "xendit/invoice.paid.overpaid",
            "ord_x_1006",
            "xendit payment 65f1c0a2b3d4e5f601a01006 took IDR\u{a0}150,000 of the \
             IDR\u{a0}120,000 it asked for",
        ),
    ] {
        assert_eq!(send(&app, file).await, "amount_mismatch", "{file}");
        let view = order_view(&app, order).await;
        assert_eq!(
            (view["status"].as_str(), view["review_reason"].as_str()),
            (Some("needs_review"), Some(reason))
        );
    }
    assert_eq!(emails(&app, "ord_x_1005"), [email("receipt", 20_000_000)]);
    assert_eq!(send(&app, "xendit/invoice.paid.php").await, "processed");
    assert_eq!(status(&app, "ord_x_1007"), "paid");
    let view = order_view(&app, "ord_x_1007").await;
    assert_eq!(
        (&view["currency"], &view["amount"]),
        (&Value::from("PHP"), &Value::from(124_975))
    );
}

// --- the operator ------------------------------------------------------------------------------------

/// `sekali orders set-status` on an order in review: the operator's status stands, the reason it
/// answered no longer counts, until money moves on the order; then the money decides again.
#[actix_web::test]
async fn an_operators_decision_stands_until_money_moves() {
    let app = spawn_ledger().await;
    send(&app, "stripe/payment_intent.succeeded").await;
    send(&app, "stripe/payment_intent.succeeded.duplicate").await;
    assert_eq!(status(&app, "ord_1001"), "needs_review");
    let output = std::process::Command::new(sekali_bin())
        .args(["orders", "set-status", "ord_1001", "paid", "--reason"])
        .arg("customer asked to keep both: a second ticket")
        .args(["--by", "rina", "--db"])
        .arg(app.db_arg())
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    assert_eq!(status(&app, "ord_1001"), "paid");
    // An event that moves no money keeps the operator's status.
    let again = deliver(&app, "stripe/payment_intent.succeeded.duplicate", |e| {
        e["id"] = "evt_1QA0043succeededdupl02".into();
    })
    .await;
    assert_eq!(again.outcome(), "processed");
    assert_eq!(status(&app, "ord_1001"), "paid");
    let view = order_view(&app, "ord_1001").await;
    assert_eq!(view["review_reason"], Value::Null);

    // Money moves: a refund of the first payment. The double charge was answered; what the
    // money says now is a partial refund of what the order holds.
    send(&app, "stripe/charge.refunded.partial").await;
    let view = order_view(&app, "ord_1001").await;
    assert_eq!(view["status"], "partially_refunded", "{view}");
}

// --- a retry of the same PaymentIntent ----------------------------------------------------------------

/// Found by the model test (tests/api/ledger_model.rs, seed 31, history 4497): a PaymentIntent
/// declined and tried again, its retry's `processing` delivered before the decline. The second
/// `processing` says nothing new but its time, and the ledger kept the first one's; the decline,
/// delivered last, was then the latest word, and the order showed `failed` (and told the
/// customer so) while the retry was in flight.
#[actix_web::test]
async fn a_decline_delivered_after_the_retry_it_preceded_leaves_the_order_pending() {
    let app = spawn_ledger().await;
    let at = |id: &'static str, created: i64| {
        move |e: &mut Value| {
            e["id"] = id.into();
            e["created"] = created.into();
            e["data"]["object"]["id"] = "pi_3QA0060Order1060".into();
            e["data"]["object"]["metadata"]["order_id"] = "ord_1060".into();
        }
    };
    let first = "stripe/payment_intent.processing";
    let decline = "stripe/payment_intent.payment_failed";
    for (name, id, created) in [
        (first, "evt_1QA0060processing0001", 1_732_900_000),
        (first, "evt_1QA0060processing0002", 1_732_900_020),
        (decline, "evt_1QA0060paymentfailed1", 1_732_900_010),
    ] {
        let answer = deliver(&app, name, at(id, created)).await;
        assert_eq!(answer.status, 200, "{name}: {answer:?}");
    }
    assert_eq!(status(&app, "ord_1060"), "pending");
    assert_eq!(emails(&app, "ord_1060"), []);
}

// --- a batch's deliveries applied together ------------------------------------------------------

/// `fixtures/stripe/{name}.json` as event `event_id`, about the PaymentIntent `pi_{payment}` (the
/// charge `ch_{payment}`), naming the order `ord_{order}` when `order` is given (else none).
fn stripe_body(name: &str, event_id: &str, payment: &str, order: Option<&str>) -> Vec<u8> {
    let mut body: Value = serde_json::from_slice(&fixture(&format!("stripe/{name}.json"))).unwrap();
    body["id"] = event_id.into();
    let object = &mut body["data"]["object"];
    if object["object"] == "charge" {
        object["id"] = format!("ch_{payment}").into();
        object["payment_intent"] = format!("pi_{payment}").into();
    } else {
        object["id"] = format!("pi_{payment}").into();
    }
    object["metadata"] = match order {
        Some(order) => serde_json::json!({ "order_id": format!("ord_{order}") }),
        None => serde_json::json!({}),
    };
    serde_json::to_vec(&body).unwrap()
}

/// On PostgreSQL, a batch's deliveries of distinct payments and orders are applied side by side
/// (their reads and writes a few statements for them all, not six each); the rest of the batch
/// one by one. Here one batch holds seven such deliveries, one of which links a payment whose
/// refund waited for its order; two deliveries of one payment; and an event naming another order
/// than the one its payment is already linked to. Each order ends as one by one would leave it:
/// the waiting refund counts, the shared payment's two events both count, the event's facts count
/// for the linked order, and no delivery is dropped or applied twice. On PostgreSQL, the batch is
/// made by holding the claims' table from another session until every delivery is queued; on
/// SQLite they are sent at once, as a provider's burst.
#[actix_web::test]
async fn a_batch_applies_distinct_orders_together_and_the_rest_one_by_one_as_one_by_one_would() {
    let app = spawn_ledger().await;
    // Before the batch: a refund whose payment names no order yet waits on it; a payment is
    // linked to its order.
    let refund_k = stripe_body(
        "charge.refunded.full",
        "evt_batch_refund_k",
        "batch_k",
        None,
    );
    assert_eq!(app.deliver_stripe_body(&refund_k).await.outcome(), "parked");
    let paid_l = stripe_body(
        "payment_intent.succeeded",
        "evt_batch_l",
        "batch_l",
        Some("batch_l"),
    );
    assert_eq!(
        app.deliver_stripe_body(&paid_l).await.outcome(),
        "processed"
    );

    let mut batch: Vec<Vec<u8>> = ["a", "b", "c", "d", "e", "f", "k"]
        .iter()
        .map(|tag| {
            let (event, payment) = (format!("evt_batch_{tag}"), format!("batch_{tag}"));
            stripe_body("payment_intent.succeeded", &event, &payment, Some(&payment))
        })
        .collect();
    batch.push(stripe_body(
        "payment_intent.succeeded",
        "evt_batch_x",
        "batch_x",
        Some("batch_x"),
    ));
    batch.push(stripe_body(
        "charge.refunded.full",
        "evt_batch_refund_x",
        "batch_x",
        Some("batch_x"),
    ));
    // The payment of order batch_l, in an event that names order batch_m.
    batch.push(stripe_body(
        "payment_intent.succeeded",
        "evt_batch_l_as_m",
        "batch_l",
        Some("batch_m"),
    ));

    let send_all = |bodies: Vec<Vec<u8>>| {
        let app = &app;
        futures_util::future::join_all(
            bodies
                .into_iter()
                .map(move |body| async move { app.deliver_stripe_body(&body).await }),
        )
    };
    let together_before = app.store.stats().writer.deliveries_together;
    let answers = match engine() {
        Engine::Sqlite => send_all(batch.clone()).await,
        Engine::Postgres => {
            // Another session holds the claims' table: every writer blocks at its batch's claim,
            // and what comes after waits in the queue, then goes as one batch when it is let go.
            // Quickly: a writer waits for the table up to the lock timeout (5 s), then gives up.
            let url = app.database.arg();
            let (locked, is_locked) = std::sync::mpsc::channel();
            let (release, released) = std::sync::mpsc::channel::<()>();
            let holder = std::thread::spawn(move || {
                let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
                let mut tx = client.transaction().unwrap();
                tx.batch_execute("LOCK TABLE processed_events IN EXCLUSIVE MODE")
                    .unwrap();
                locked.send(()).unwrap();
                let _ = released.recv();
                tx.commit().unwrap();
            });
            is_locked.recv().unwrap();
            // Events of no payment (applied one by one), each sent once the one before is
            // blocked at its claim, until one stays queued: every writer is blocked then, each
            // with a batch of one.
            let blocker = |i: usize| {
                let mut body: Value =
                    serde_json::from_slice(&fixture("stripe/customer.created.json")).unwrap();
                body["id"] = format!("evt_batch_blocker_{i:02}").into();
                let body = serde_json::to_vec(&body).unwrap();
                let header = stripe_header(&body, app.clock.now_unix());
                let url = format!("{}/webhooks/stripe", app.address);
                actix_web::rt::spawn(async move {
                    let mut response = awc::Client::builder()
                        .timeout(Duration::from_secs(120))
                        .finish()
                        .post(url)
                        .insert_header(("Content-Type", "application/json"))
                        .insert_header(("Stripe-Signature", header))
                        .send_body(body)
                        .await
                        .unwrap();
                    let body = response.body().await.unwrap();
                    (response.status().as_u16(), body)
                })
            };
            let waiting_at_claims = || {
                app.count(
                    "SELECT count(*) FROM pg_locks \
                     WHERE relation = 'processed_events'::regclass AND NOT granted",
                ) as usize
            };
            let queued = || app.store.stats().writer.queued;
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            let mut blockers = Vec::new();
            'blocking: loop {
                blockers.push(blocker(blockers.len()));
                // Taken by a writer that then blocked, or left queued: no writer is free.
                let mut queued_since = None;
                loop {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "the writers never all blocked"
                    );
                    actix_web::rt::time::sleep(Duration::from_millis(5)).await;
                    if waiting_at_claims() == blockers.len() {
                        break;
                    }
                    if queued() > 0 {
                        let since = *queued_since.get_or_insert_with(std::time::Instant::now);
                        if since.elapsed() > Duration::from_millis(200) {
                            break 'blocking;
                        }
                    }
                }
            }
            let waiting = queued();
            let answers = futures_util::future::join(send_all(batch.clone()), async {
                while queued() < waiting + batch.len() as u64 {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "the batch was not queued: {} of {}",
                        queued(),
                        waiting + batch.len() as u64
                    );
                    actix_web::rt::time::sleep(Duration::from_millis(20)).await;
                }
                release.send(()).unwrap();
            })
            .await
            .0;
            for blocked in blockers {
                let (status, body) = blocked.await.unwrap();
                assert_eq!(status, 200, "{body:?}");
            }
            holder.join().unwrap();
            answers
        }
    };
    for answer in &answers {
        assert_eq!(answer.status, 200, "{answer:?}");
    }
    let outcomes: Vec<&str> = answers.iter().map(Answer::outcome).collect();
    assert_eq!(&outcomes[..7], ["processed"; 7], "{outcomes:?}");
    // The shared payment's events one after the other, in key order: the refund first, its
    // order's payment then older news than its refund (stale), or the other way round.
    assert!(
        matches!(
            &outcomes[7..9],
            ["processed" | "stale", "processed"] | ["processed", "stale"]
        ),
        "{outcomes:?}"
    );
    if engine() == Engine::Postgres {
        // The seven of distinct payments and orders went together; the shared payment's two
        // and the event of a payment linked elsewhere one by one.
        assert_eq!(
            app.store.stats().writer.deliveries_together - together_before,
            7
        );
    }

    for tag in ["a", "b", "c", "d", "e", "f"] {
        let order = format!("ord_batch_{tag}");
        assert_eq!(status(&app, &order), "paid", "{order}");
        assert_eq!(emails(&app, &order), [email("receipt", 2500)], "{order}");
        assert_eq!(
            app.count(&format!(
                "SELECT count(*) FROM order_transitions WHERE order_id = '{order}'"
            )),
            1
        );
    }
    // The refund that waited counts once its payment's order is known, and is its order's now.
    assert_eq!(status(&app, "ord_batch_k"), "refunded");
    assert_eq!(
        app.query(
            "SELECT outcome, order_id FROM processed_events WHERE event_id = 'evt_batch_refund_k'"
        ),
        [[Some("processed".to_owned()), Some("ord_batch_k".to_owned())]]
    );
    // Both events of the shared payment count, in whichever order they were applied.
    assert_eq!(status(&app, "ord_batch_x"), "refunded");
    // The event naming another order counts for the one its payment is linked to; the other
    // order is not made up.
    assert_eq!(status(&app, "ord_batch_l"), "paid");
    assert_eq!(status(&app, "ord_batch_m"), "no order");
    assert_eq!(
        app.query("SELECT order_id FROM processed_events WHERE event_id = 'evt_batch_l_as_m'"),
        [[Some("ord_batch_l".to_owned())]]
    );
    // Each delivery recorded once.
    assert_eq!(
        app.count("SELECT count(*) FROM processed_events WHERE event_id LIKE 'evt_batch_%' AND event_id NOT LIKE 'evt_batch_blocker_%'"),
        12
    );
}
