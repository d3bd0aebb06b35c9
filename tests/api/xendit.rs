//! Xendit invoice callbacks through the real server and SQLite file, and the binary's `replay`,
//! `bench` and `serve` with the provider configured.

use std::process::Command;

use crate::helpers::*;

const XENDIT_TOKEN: &str = "cb-token-sekali-api-test-5f0c2e9a7b41d8";

/// The environment of [`spawn_app`], with Xendit's token set.
fn env_with_xendit() -> Vec<(&'static str, &'static str)> {
    let mut env = PROVIDER_ENV.to_vec();
    env.push(("XENDIT_CALLBACK_TOKEN", XENDIT_TOKEN));
    env
}

async fn spawn_with_xendit() -> TestApp {
    spawn_app_with(|s| s.providers = providers_from(&env_with_xendit(), &[])).await
}

/// POSTs `body` to the Xendit route with `headers`.
async fn post_xendit(app: &TestApp, body: Vec<u8>, headers: &[(&str, &str)]) -> Answer {
    app.post("/webhooks/xendit", body, headers).await
}

/// Delivers `body` as Xendit does: the token header, no webhook-id.
async fn deliver_body(app: &TestApp, body: Vec<u8>) -> Answer {
    post_xendit(app, body, &[("x-callback-token", XENDIT_TOKEN)]).await
}

/// Delivers `fixtures/xendit/{name}.json` with the token.
async fn deliver_xendit(app: &TestApp, name: &str) -> Answer {
    deliver_body(app, fixture(&format!("xendit/{name}.json"))).await
}

/// `fixtures/xendit/{name}.json` with `field` set to `value`.
fn fixture_with(name: &str, field: &str, value: serde_json::Value) -> Vec<u8> {
    let mut callback: serde_json::Value =
        serde_json::from_slice(&fixture(&format!("xendit/{name}.json"))).unwrap();
    callback[field] = value;
    serde_json::to_vec_pretty(&callback).unwrap()
}

fn fixture_path(name: &str) -> String {
    format!("{}/fixtures/xendit/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// The fixtures in the order their lifecycles happen, each with its order, the status it
/// leaves the order in, and the order's amount in minor units.
const XENDIT_IN_ORDER: [(&str, &str, &str, i64); 5] = [
    ("invoice.paid", "ord_x_1001", "paid", 15_000_000),
    ("invoice.settled", "ord_x_1001", "paid", 15_000_000),
    ("invoice.expired", "ord_x_1002", "expired", 8_900_000),
    ("invoice.paid.ewallet", "ord_x_1003", "paid", 21_000_000),
    ("invoice.paid.card", "ord_x_1004", "paid", 32_500_000),
];

#[actix_web::test]
async fn every_xendit_fixture_with_the_token_is_processed_into_its_orders_status() {
    let app = spawn_with_xendit().await;
    for (name, order, status, amount) in XENDIT_IN_ORDER {
        let answer = deliver_xendit(&app, name).await;
        assert_eq!(
            (answer.status, answer.outcome()),
            (200, "processed"),
            "{name}: {:?}",
            answer.body
        );
        assert_eq!(app.order(order), (status.into(), amount, 0), "{name}");
    }
    assert_eq!(
        app.texts("SELECT event_id FROM processed_events ORDER BY rowid"),
        [
            "65f1c0a2b3d4e5f601a01001:PAID",
            "65f1c0a2b3d4e5f601a01001:SETTLED",
            "65f1c0a2b3d4e5f601a01002:EXPIRED",
            "65f1c0a2b3d4e5f601a01003:PAID",
            "65f1c0a2b3d4e5f601a01004:PAID",
        ]
    );
    assert_eq!(
        app.texts("SELECT DISTINCT provider FROM processed_events"),
        ["xendit"]
    );
    assert_eq!(app.outbox_templates("ord_x_1001"), ["receipt"]);
    assert!(app.outbox_templates("ord_x_1002").is_empty());
}

#[actix_web::test]
async fn a_xendit_redelivery_is_a_duplicate_with_one_row_and_one_email() {
    let app = spawn_with_xendit().await;
    let first = deliver_xendit(&app, "invoice.paid").await;
    assert_eq!((first.status, first.outcome()), (200, "processed"));
    for _ in 0..2 {
        let again = deliver_xendit(&app, "invoice.paid").await;
        assert_eq!((again.status, again.outcome()), (200, "duplicate"));
        assert_eq!(again.body["event_id"], "65f1c0a2b3d4e5f601a01001:PAID");
    }
    assert_eq!(app.row_counts(), (1, 1, 1));
    let recipient = app.one_row("SELECT recipient FROM email_outbox");
    assert_eq!(recipient, ["buyer1001@example.com"]);
}

/// PAID and then SETTLED for one invoice are two events (two ids), and the second finds the order
/// paid already: no second receipt.
#[actix_web::test]
async fn a_settled_callback_after_paid_is_a_second_event_that_sends_no_second_receipt() {
    let app = spawn_with_xendit().await;
    assert_eq!(
        deliver_xendit(&app, "invoice.paid").await.outcome(),
        "processed"
    );
    let settled = deliver_xendit(&app, "invoice.settled").await;
    assert_eq!((settled.status, settled.outcome()), (200, "processed"));
    assert_eq!(settled.body["event_id"], "65f1c0a2b3d4e5f601a01001:SETTLED");
    assert_eq!(app.row_counts(), (2, 1, 1));
    assert_eq!(app.outbox_templates("ord_x_1001"), ["receipt"]);
    let trail = app.texts(
        "SELECT coalesce(from_status, '-') || '>' || to_status FROM order_transitions
         WHERE order_id = 'ord_x_1001' ORDER BY id",
    );
    assert_eq!(trail, ["->paid"]);
}

#[actix_web::test]
async fn a_wrong_or_missing_callback_token_is_a_401_that_stores_nothing() {
    let app = spawn_with_xendit().await;
    let body = fixture("xendit/invoice.paid.json");
    let wrong = post_xendit(
        &app,
        body.clone(),
        &[("x-callback-token", "cb-token-of-another-account")],
    )
    .await;
    assert_eq!(wrong.status, 401, "{:?}", wrong.body);
    assert!(
        wrong.error().starts_with("x-callback-token does not match"),
        "{}",
        wrong.error()
    );
    // A token one character short, and one with a character more.
    for token in [&XENDIT_TOKEN[1..], &format!("{XENDIT_TOKEN}x")] {
        let answer = post_xendit(&app, body.clone(), &[("x-callback-token", token)]).await;
        assert_eq!(answer.status, 401, "{token}");
    }
    let missing = post_xendit(&app, body.clone(), &[("webhook-id", "wh-1")]).await;
    assert_eq!(missing.status, 401);
    assert!(
        missing
            .error()
            .starts_with("missing x-callback-token header"),
        "{}",
        missing.error()
    );
    for answer in [&wrong, &missing] {
        let text = answer.body.to_string();
        assert!(!text.contains(XENDIT_TOKEN), "{text}");
        assert!(!text.contains("another-account"), "{text}");
    }
    // Refused before the body is read: a malformed body with a wrong token is a 401 too.
    let answer = post_xendit(
        &app,
        b"not json".to_vec(),
        &[("x-callback-token", "cb-token-of-another-account")],
    )
    .await;
    assert_eq!(answer.status, 401);
    assert_eq!(app.row_counts(), (0, 0, 0));
}

#[actix_web::test]
async fn a_malformed_xendit_body_is_a_400_naming_the_problem_that_stores_nothing() {
    let app = spawn_with_xendit().await;
    let cases: [(Vec<u8>, &str); 7] = [
        (b"not json".to_vec(), "invalid JSON"),
        (
            fixture_with("invoice.paid", "amount", "150000".into()),
            "field `amount` is not a JSON number",
        ),
        (
            fixture_with("invoice.paid", "paid_amount", serde_json::json!(-150000)),
            "field `paid_amount` is negative",
        ),
        (
            fixture_with(
                "invoice.paid",
                "amount",
                serde_json::from_str("150000.001").unwrap(),
            ),
            "field `amount` has 3 decimals, more than IDR's 2",
        ),
        (
            fixture_with("invoice.paid", "status", "paid".into()),
            "field `status` is not an upper-case status",
        ),
        (
            fixture_with("invoice.paid", "external_id", serde_json::Value::Null),
            "field `external_id`",
        ),
        (
            fixture_with("invoice.paid", "currency", serde_json::Value::Null),
            "missing field `currency`",
        ),
    ];
    for (body, expected) in cases {
        let answer = deliver_body(&app, body).await;
        assert_eq!(answer.status, 400, "{expected}: {:?}", answer.body);
        assert!(answer.error().contains(expected), "{}", answer.error());
    }
    assert_eq!(app.row_counts(), (0, 0, 0));
}

#[actix_web::test]
async fn the_xendit_route_is_404_when_no_callback_token_is_configured() {
    let app = spawn_app().await;
    let answer = post_xendit(
        &app,
        fixture("xendit/invoice.paid.json"),
        &[("x-callback-token", XENDIT_TOKEN)],
    )
    .await;
    assert_eq!(answer.status, 404);
    assert_eq!(
        answer.error(),
        "xendit webhooks are not configured on this server"
    );
    assert_eq!(app.row_counts(), (0, 0, 0));
}

/// Xendit keeps a webhook-id across the retries of one event; a retry whose body differs (a later
/// `updated`) is still that event.
#[actix_web::test]
async fn a_webhook_id_header_deduplicates_two_different_bodies() {
    let app = spawn_with_xendit().await;
    let headers = [
        ("x-callback-token", XENDIT_TOKEN),
        ("webhook-id", "whk-0a1b2c3d-0001"),
    ];
    let first = post_xendit(&app, fixture("xendit/invoice.paid.json"), &headers).await;
    assert_eq!((first.status, first.outcome()), (200, "processed"));
    assert_eq!(first.body["event_id"], "whk-0a1b2c3d-0001");
    let later = fixture_with("invoice.paid", "updated", "2026-11-29T03:32:46.202Z".into());
    let second = post_xendit(&app, later, &headers).await;
    assert_eq!((second.status, second.outcome()), (200, "duplicate"));
    assert_eq!(app.row_counts(), (1, 1, 1));
    // Without the header, the same callback is its own event, and finds the order paid.
    let plain = deliver_xendit(&app, "invoice.paid").await;
    assert_eq!(plain.body["event_id"], "65f1c0a2b3d4e5f601a01001:PAID");
    assert_eq!(app.row_counts(), (2, 1, 1));
}

/// Fails on amounts taken as minor units as sent: `amount: 150000` is Rp150.000, not Rp1.500.
#[actix_web::test]
async fn the_receipt_of_a_xendit_payment_shows_the_rupiah_amount() {
    let app = spawn_with_xendit().await;
    assert_eq!(
        deliver_xendit(&app, "invoice.paid").await.outcome(),
        "processed"
    );
    let rows = app.query(
        "SELECT id, order_id, recipient, template, params, idempotency_key FROM email_outbox",
    );
    let [r] = &rows[..] else {
        panic!("one email: {rows:?}")
    };
    let email = sekali::store::ClaimedEmail {
        id: r[0].as_deref().unwrap().parse().unwrap(),
        order_id: r[1].clone().unwrap(),
        recipient: r[2].clone(),
        template: r[3].clone().unwrap(),
        params: r[4].clone().unwrap(),
        idempotency_key: r[5].clone().unwrap(),
        attempts: 0,
        first_tried_ms: None,
        locale: None,
    };
    let params: serde_json::Value = serde_json::from_str(&email.params).unwrap();
    assert_eq!(
        (&params["amount"], &params["exponent"], &params["currency"]),
        (
            &serde_json::json!(15_000_000),
            &serde_json::json!(2),
            &serde_json::json!("IDR")
        )
    );
    let rendered =
        sekali::mail::render(&email, &sekali::mail::Sender::new("shop@sekali.test")).unwrap();
    assert_eq!(rendered.to, "buyer1001@example.com");
    assert!(
        rendered
            .text
            .contains("ord_x_1001 sebesar Rp\u{a0}150.000 telah kami terima"),
        "{}",
        rendered.text
    );
}

/// An order the shop created through the API for Rp200.000, paid by an invoice of Rp150.000:
/// not paid, but for an operator to look at, and no receipt. One created for the invoice's
/// amount is paid.
#[actix_web::test]
async fn an_api_order_paid_by_a_xendit_callback_of_another_amount_needs_review() {
    let app = spawn_app_with(|s| {
        s.providers = providers_from(&env_with_xendit(), &[]);
        s.api_tokens = sekali::config::parse_api_tokens("shop:tok-xendit-shop").unwrap();
    })
    .await;
    for (order, amount) in [("ord_x_1001", 20_000_000), ("ord_x_1004", 32_500_000)] {
        let created = app
            .client
            .post(format!("{}/orders", app.address))
            .insert_header(("Authorization", "Bearer tok-xendit-shop"))
            .insert_header(("Idempotency-Key", format!("k-{order}")))
            .insert_header(("Content-Type", "application/json"))
            .send_body(format!(
                r#"{{"order_id":"{order}","amount":{amount},"currency":"IDR","provider":"xendit","customer_email":"sari@example.com"}}"#
            ))
            .await
            .unwrap();
        assert_eq!(created.status().as_u16(), 201, "{order}");
    }
    let mismatch = deliver_xendit(&app, "invoice.paid").await;
    assert_eq!(
        (mismatch.status, mismatch.outcome()),
        (200, "amount_mismatch")
    );
    assert_eq!(
        app.order_status("ord_x_1001").as_deref(),
        Some("needs_review")
    );
    // The money was taken all the same: the customer's receipt says what.
    assert_eq!(app.outbox_templates("ord_x_1001"), ["receipt"]);
    // Its SETTLED says the same of the same invoice: no second receipt, still in review.
    assert_eq!(
        deliver_xendit(&app, "invoice.settled").await.outcome(),
        "processed"
    );
    assert_eq!(app.outbox_templates("ord_x_1001"), ["receipt"]);
    assert_eq!(
        app.order_status("ord_x_1001").as_deref(),
        Some("needs_review")
    );

    let matching = deliver_xendit(&app, "invoice.paid.card").await;
    assert_eq!(matching.outcome(), "processed");
    assert_eq!(app.order("ord_x_1004"), ("paid".into(), 32_500_000, 0));
    assert_eq!(app.outbox_templates("ord_x_1004"), ["receipt"]);
}

#[actix_web::test]
async fn an_expired_invoice_expires_its_order_and_a_later_payment_still_pays_it() {
    let app = spawn_with_xendit().await;
    let expired = deliver_xendit(&app, "invoice.expired").await;
    assert_eq!((expired.status, expired.outcome()), (200, "processed"));
    assert_eq!(app.order("ord_x_1002"), ("expired".into(), 8_900_000, 0));
    assert!(app.outbox_templates("ord_x_1002").is_empty());
    // The race Xendit documents: paid as the invoice expired.
    let mut paid: serde_json::Value =
        serde_json::from_slice(&fixture("xendit/invoice.paid.json")).unwrap();
    paid["id"] = "65f1c0a2b3d4e5f601a01002".into();
    paid["external_id"] = "ord_x_1002".into();
    paid["amount"] = 89000.into();
    paid["paid_amount"] = 89000.into();
    let answer = deliver_body(&app, serde_json::to_vec(&paid).unwrap()).await;
    assert_eq!((answer.status, answer.outcome()), (200, "processed"));
    assert_eq!(app.order_status("ord_x_1002").as_deref(), Some("paid"));
    // The expiry again changes nothing.
    assert_eq!(
        deliver_xendit(&app, "invoice.expired").await.outcome(),
        "duplicate"
    );
    assert_eq!(app.order_status("ord_x_1002").as_deref(), Some("paid"));
}

#[actix_web::test]
async fn replay_sends_xendit_fixtures_with_the_token_to_a_running_server() {
    let app = spawn_with_xendit().await;
    let url = format!("{}/webhooks/xendit", app.address);
    let output = actix_web::rt::task::spawn_blocking(move || {
        Command::new(sekali_bin())
            .args(["replay", "--url", &url])
            .arg(fixture_path("invoice.paid.json"))
            .arg(fixture_path("invoice.paid.json"))
            .arg(fixture_path("invoice.expired.json"))
            .env("XENDIT_CALLBACK_TOKEN", XENDIT_TOKEN)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert!(
        lines[0].contains("invoice.paid.json: 200 ")
            && lines[0].contains(r#""status":"processed""#),
        "{stdout}"
    );
    // The webhook-id replay sets is the event id, the same for the file sent twice.
    assert!(
        lines[0].contains(r#""event_id":"sekali-65f1c0a2b3d4e5f601a01001-"#),
        "{stdout}"
    );
    assert!(lines[1].contains(r#""status":"duplicate""#), "{stdout}");
    assert!(lines[2].contains(r#""status":"processed""#), "{stdout}");
    assert_eq!(app.order_status("ord_x_1001").as_deref(), Some("paid"));
    assert_eq!(app.order_status("ord_x_1002").as_deref(), Some("expired"));
    assert_eq!(app.row_counts(), (2, 2, 1));

    // Replay signs with the token the server verifies with: without it, it says which to set.
    let url = format!("{}/webhooks/xendit", app.address);
    let output = actix_web::rt::task::spawn_blocking(move || {
        Command::new(sekali_bin())
            .args(["replay", "--url", &url])
            .arg(fixture_path("invoice.paid.json"))
            .env_remove("XENDIT_CALLBACK_TOKEN")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("set XENDIT_CALLBACK_TOKEN"), "{stderr}");
}

#[actix_web::test]
async fn bench_against_xendit_sends_each_callback_with_the_token_and_checks_the_database() {
    let app = spawn_with_xendit().await;
    let url = format!("{}/webhooks/xendit", app.address);
    let db = app.db_arg();
    let output = actix_web::rt::task::spawn_blocking(move || {
        Command::new(sekali_bin())
            .args(["bench", "--url", &url])
            .args([
                "--events",
                "40",
                "--dup-ratio",
                "0.25",
                "--concurrency",
                "2",
            ])
            .arg("--check-db")
            .arg(&db)
            .env("XENDIT_CALLBACK_TOKEN", XENDIT_TOKEN)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report: serde_json::Value = serde_json::from_str(stdout.lines().next().unwrap()).unwrap();
    assert_eq!(report["sent"], 50, "{stdout}");
    assert_eq!(report["check_db"], "ok", "{stdout}");
    assert_eq!(
        app.count("SELECT count(*) FROM processed_events WHERE provider = 'xendit'"),
        40
    );
}

#[test]
fn serve_help_lists_the_xendit_callback_token() {
    let output = Command::new(sekali_bin())
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&output.stdout);
    let line = help
        .lines()
        .find(|l| l.contains("XENDIT_CALLBACK_TOKEN"))
        .unwrap_or_else(|| panic!("XENDIT_CALLBACK_TOKEN missing from: {help}"));
    assert!(line.contains("callback verification token"), "{line}");
}

/// Fails on the version that started without a word when the token was an API key, after which
/// every callback was a 401; and says when the retention is shorter than Xendit's day of retries.
#[test]
fn serve_warns_of_an_api_key_given_as_the_xendit_token_and_of_a_retention_under_a_day() {
    let api_key = "xnd_development_P4qDfOss0OCpl8RtKrROHjaQYNCk9dN5lSfk";
    let server = ServeProcess::start_with(
        &[("XENDIT_CALLBACK_TOKEN", api_key)],
        "info",
        &["--no-relay", "--retention", "xendit=12h"],
    );
    let (_, logs) = server.stop();
    assert!(
        logs.contains("XENDIT_CALLBACK_TOKEN starts with xnd_"),
        "{logs}"
    );
    assert!(
        logs.contains("the xendit retention (12h) is shorter than the time in which xendit may deliver an event again (1day)"),
        "{logs}"
    );
    assert!(
        logs.contains("register https://<your host>/webhooks/xendit"),
        "{logs}"
    );
    assert!(!logs.contains(api_key), "the key is never logged");
}
