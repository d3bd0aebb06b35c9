//! sekali's own API: POST /orders under Idempotency-Key, reads, and orders meeting webhooks.

use std::process::Command;

use futures_util::future::join_all;
use sekali::config::parse_api_tokens;

use crate::helpers::*;

const SHOP: &str = "tok-shop-4f1c9a";
const BILLING: &str = "tok-billing-77d2e0";

async fn spawn_api() -> TestApp {
    spawn_app_with(|s| {
        s.api_tokens = parse_api_tokens(&format!("shop:{SHOP},billing:{BILLING}")).unwrap()
    })
    .await
}

/// Status, headers we care about, and the raw body.
#[derive(Debug)]
struct Reply {
    status: u16,
    content_type: String,
    replayed: bool,
    retry_after: bool,
    location: Option<String>,
    allow: Option<String>,
    body: String,
}

impl Reply {
    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or(serde_json::Value::Null)
    }
    fn problem_type(&self) -> String {
        self.json()["type"].as_str().unwrap_or("").to_owned()
    }
}

async fn send(
    app: &TestApp,
    method: &str,
    path: &str,
    token: Option<&str>,
    key: Option<&str>,
    body: Option<&str>,
) -> Reply {
    let url = format!("{}{path}", app.address);
    let mut request = app.client.request(method.parse().expect("a method"), url);
    if let Some(token) = token {
        request = request.insert_header(("Authorization", format!("Bearer {token}")));
    }
    if let Some(key) = key {
        request = request.insert_header(("Idempotency-Key", key));
    }
    let mut response = match body {
        Some(body) => {
            request
                .insert_header(("Content-Type", "application/json"))
                .send_body(body.to_owned())
                .await
        }
        None => request.send().await,
    }
    .unwrap();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let (content_type, replayed, retry_after, location, allow) = (
        header("content-type").unwrap_or_default(),
        header("idempotent-replayed").as_deref() == Some("true"),
        header("retry-after").is_some(),
        header("location"),
        header("allow"),
    );
    let body = String::from_utf8(response.body().await.unwrap().to_vec()).unwrap();
    Reply {
        status: response.status().as_u16(),
        content_type,
        replayed,
        retry_after,
        location,
        allow,
        body,
    }
}

async fn create(app: &TestApp, token: &str, key: &str, body: &str) -> Reply {
    send(app, "POST", "/orders", Some(token), Some(key), Some(body)).await
}

const ORDER: &str = r#"{"order_id": "ord_api_1", "amount": 150000, "currency": "IDR", "provider": "midtrans", "customer_email": "sari@example.com", "metadata": {"locale": "id", "cart": [1, 2]}}"#;

#[actix_web::test]
async fn a_new_order_is_created_pending_and_described() {
    let app = spawn_api().await;
    let reply = create(&app, SHOP, "k-1", ORDER).await;
    assert_eq!(reply.status, 201, "{}", reply.body);
    assert_eq!(reply.content_type, "application/json");
    assert!(!reply.replayed);
    let order = reply.json();
    assert_eq!(order["order_id"], "ord_api_1");
    assert_eq!(order["status"], "pending");
    assert_eq!(order["amount"], 150000);
    assert_eq!(order["currency"], "IDR");
    assert_eq!(order["source"], "api");
    assert_eq!(order["metadata"]["locale"], "id");
    assert_eq!(
        app.one_row("SELECT source, status FROM orders WHERE order_id = 'ord_api_1'"),
        ["api", "pending"]
    );
    let stored = app
        .one_row("SELECT client, response_status, status FROM idempotency_keys WHERE key = 'k-1'");
    assert_eq!(stored, ["shop", "201", "completed"]);
}

#[actix_web::test]
async fn a_retry_with_the_same_key_replays_the_stored_response_byte_for_byte_and_creates_nothing() {
    let app = spawn_api().await;
    let first = create(&app, SHOP, "k-1", ORDER).await;
    // The same request with other whitespace and key order is the same request.
    let reordered = r#"{"provider":"midtrans","metadata":{"cart":[1,2],"locale":"id"},"currency":"IDR","customer_email":"sari@example.com","amount":150000,"order_id":"ord_api_1"}"#;
    for (key, body) in [("k-1", ORDER), ("\"k-1\"", reordered)] {
        let retry = create(&app, SHOP, key, body).await;
        assert_eq!(retry.status, 201);
        assert!(retry.replayed, "Idempotent-Replayed: true");
        assert_eq!(retry.body, first.body, "byte for byte");
        assert_eq!(retry.content_type, first.content_type);
    }
    assert_eq!(app.count("SELECT count(*) FROM orders"), 1);
}

#[actix_web::test]
async fn the_same_key_with_a_different_request_is_a_422() {
    let app = spawn_api().await;
    create(&app, SHOP, "k-1", ORDER).await;
    let other = ORDER.replace("150000", "150001");
    let reply = create(&app, SHOP, "k-1", &other).await;
    assert_eq!(reply.status, 422);
    assert_eq!(reply.content_type, "application/problem+json");
    assert_eq!(
        reply.problem_type(),
        "urn:sekali:problem:idempotency-key-reused"
    );
    assert_eq!(app.count("SELECT count(*) FROM orders"), 1);
}

#[actix_web::test]
async fn a_missing_or_malformed_key_is_a_400() {
    let app = spawn_api().await;
    let missing = send(&app, "POST", "/orders", Some(SHOP), None, Some(ORDER)).await;
    assert_eq!(missing.status, 400);
    assert_eq!(
        missing.problem_type(),
        "urn:sekali:problem:missing-idempotency-key"
    );
    for bad in ["two words", "\"unterminated", "\"\"", &"k".repeat(256)] {
        let reply = create(&app, SHOP, bad, ORDER).await;
        assert_eq!(reply.status, 400, "{bad:?}");
        assert_eq!(
            reply.problem_type(),
            "urn:sekali:problem:malformed-idempotency-key"
        );
        assert!(!reply.json()["detail"].as_str().unwrap().is_empty());
    }
    assert_eq!(app.count("SELECT count(*) FROM orders"), 0);
}

#[actix_web::test]
async fn checks_come_in_order_authentication_then_key_then_request() {
    let app = spawn_api().await;
    let no_token = send(&app, "POST", "/orders", None, None, Some("not json")).await;
    assert_eq!(no_token.status, 401);
    assert_eq!(no_token.problem_type(), "urn:sekali:problem:unauthorized");
    let wrong_token = send(
        &app,
        "POST",
        "/orders",
        Some("tok-nope"),
        Some("k"),
        Some(ORDER),
    )
    .await;
    assert_eq!(wrong_token.status, 401);
    let no_key = send(&app, "POST", "/orders", Some(SHOP), None, Some("not json")).await;
    assert_eq!(
        no_key.problem_type(),
        "urn:sekali:problem:missing-idempotency-key"
    );
    let bad_body = create(&app, SHOP, "k-1", "not json").await;
    assert_eq!(
        bad_body.problem_type(),
        "urn:sekali:problem:invalid-request"
    );
}

#[actix_web::test]
async fn a_validation_failure_is_not_stored_and_the_fixed_request_succeeds_with_the_same_key() {
    let app = spawn_api().await;
    for (bad, detail_mentions) in [
        (ORDER.replace("150000", "-5"), "positive integer"),
        (ORDER.replace("150000", "10.5"), "amount"),
        (ORDER.replace("\"IDR\"", "\"RUPIAH\""), "three-letter"),
        (ORDER.replace("midtrans", "paypal"), "provider"),
        (
            ORDER.replace("sari@example.com", "not an email"),
            "customer_email",
        ),
        (ORDER.replace("\"amount\"", "\"amonut\""), "amonut"),
    ] {
        let reply = create(&app, SHOP, "k-fix", &bad).await;
        assert_eq!(reply.status, 400, "{bad}");
        assert_eq!(reply.problem_type(), "urn:sekali:problem:invalid-request");
        let detail = reply.json()["detail"].as_str().unwrap().to_owned();
        assert!(detail.contains(detail_mentions), "{detail}");
    }
    assert_eq!(
        app.count("SELECT count(*) FROM idempotency_keys"),
        0,
        "validation failures are never stored"
    );
    let fixed = create(&app, SHOP, "k-fix", ORDER).await;
    assert_eq!((fixed.status, fixed.replayed), (201, false));
}

#[actix_web::test]
async fn keys_are_scoped_per_client() {
    let app = spawn_api().await;
    let body = r#"{"amount": 2500, "currency": "usd", "provider": "stripe"}"#;
    let shop = create(&app, SHOP, "same-key", body).await;
    let billing = create(&app, BILLING, "same-key", body).await;
    assert_eq!((shop.status, billing.status), (201, 201));
    assert!(
        !billing.replayed,
        "one client never sees another's stored response"
    );
    assert_ne!(shop.json()["order_id"], billing.json()["order_id"]);
    assert_eq!(app.count("SELECT count(*) FROM orders"), 2);
}

#[actix_web::test]
async fn a_hundred_parallel_identical_requests_create_exactly_one_order() {
    let app = spawn_api().await;
    let body = r#"{"amount": 2500, "currency": "usd", "provider": "stripe", "customer_email": "x@example.com"}"#;
    let replies = join_all((0..100).map(|_| create(&app, SHOP, "parallel-key", body))).await;
    let created: Vec<&Reply> = replies
        .iter()
        .filter(|r| r.status == 201 && !r.replayed)
        .collect();
    assert_eq!(
        created.len(),
        1,
        "{:?}",
        replies
            .iter()
            .map(|r| (r.status, r.replayed))
            .collect::<Vec<_>>()
    );
    for reply in &replies {
        match reply.status {
            201 => assert_eq!(reply.body, created[0].body),
            409 => {
                assert_eq!(reply.problem_type(), "urn:sekali:problem:request-in-flight");
                assert!(reply.retry_after, "409 in flight carries Retry-After");
            }
            other => panic!("unexpected {other}: {}", reply.body),
        }
    }
    assert_eq!(app.count("SELECT count(*) FROM orders"), 1);
}

#[actix_web::test]
async fn an_existing_order_id_is_a_stored_409_that_is_replayed() {
    let app = spawn_api().await;
    app.deliver_midtrans("settlement").await; // creates ORDER-2001 through a webhook
    let body = r#"{"order_id": "ORDER-2001", "amount": 15000000, "currency": "IDR", "provider": "midtrans"}"#;
    let first = create(&app, SHOP, "k-exists", body).await;
    assert_eq!(first.status, 409);
    assert_eq!(first.problem_type(), "urn:sekali:problem:order-exists");
    let again = create(&app, SHOP, "k-exists", body).await;
    assert_eq!((again.status, again.replayed), (409, true));
    assert_eq!(again.body, first.body);
    assert_ne!(
        first.problem_type(),
        "urn:sekali:problem:request-in-flight",
        "the two 409s differ"
    );
}

#[actix_web::test]
async fn a_key_past_its_retention_counts_as_absent() {
    let app = spawn_api().await;
    create(&app, SHOP, "k-old", ORDER).await;
    app.clock
        .advance(std::time::Duration::from_secs(24 * 3600 - 1));
    assert_eq!(
        create(
            &app,
            SHOP,
            "k-old",
            &ORDER.replace("ord_api_1", "ord_api_2")
        )
        .await
        .status,
        422
    );
    app.clock.advance(std::time::Duration::from_secs(1));
    let reused = create(
        &app,
        SHOP,
        "k-old",
        &ORDER.replace("ord_api_1", "ord_api_2"),
    )
    .await;
    assert_eq!(
        (reused.status, reused.replayed),
        (201, false),
        "{}",
        reused.body
    );
    assert_eq!(
        app.count("SELECT count(*) FROM idempotency_keys"),
        1,
        "the expired record was replaced"
    );
}

#[actix_web::test]
async fn the_purge_removes_expired_keys() {
    let app = spawn_api().await;
    let now = app.clock.now_unix();
    app.clock.set(now - 25 * 3600);
    create(&app, SHOP, "k-expired", ORDER).await;
    app.clock.set(now);
    create(
        &app,
        SHOP,
        "k-live",
        &ORDER.replace("ord_api_1", "ord_api_2"),
    )
    .await;
    app.stop().await;
    let output = Command::new(sekali_bin())
        .args(["purge", "--db"])
        .arg(app.db_arg())
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "purged 0 expired event ids\npurged 1 expired idempotency keys\n"
    );
    assert_eq!(app.count("SELECT count(*) FROM orders"), 2, "orders stay");
}

#[actix_web::test]
async fn without_tokens_the_orders_api_is_off_and_webhooks_still_work() {
    let app = spawn_app().await;
    let reply = create(&app, SHOP, "k-1", ORDER).await;
    assert_eq!(reply.status, 404);
    assert_eq!(reply.problem_type(), "urn:sekali:problem:api-disabled");
    assert_eq!(
        app.deliver_midtrans("settlement").await.outcome(),
        "processed"
    );
}

#[actix_web::test]
async fn orders_are_read_one_by_one_and_by_page() {
    let app = spawn_api().await;
    for i in 0..5 {
        let body = format!(
            r#"{{"order_id": "ord_page_{i}", "amount": 100, "currency": "usd", "provider": "stripe"}}"#
        );
        create(&app, SHOP, &format!("k-page-{i}"), &body).await;
    }
    app.deliver_midtrans("settlement").await;
    let one = send(&app, "GET", "/orders/ord_page_3", Some(BILLING), None, None).await;
    assert_eq!(
        (one.status, one.json()["order_id"].as_str()),
        (200, Some("ord_page_3"))
    );
    let missing = send(&app, "GET", "/orders/nope", Some(SHOP), None, None).await;
    assert_eq!(
        (missing.status, missing.problem_type().as_str()),
        (404, "urn:sekali:problem:not-found")
    );
    assert_eq!(
        send(&app, "GET", "/orders/ord_page_3", None, None, None)
            .await
            .status,
        401
    );

    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let path = match &after {
            Some(cursor) => format!("/orders?status=pending&limit=2&after={cursor}"),
            None => "/orders?status=pending&limit=2".to_owned(),
        };
        let page = send(&app, "GET", &path, Some(SHOP), None, None)
            .await
            .json();
        seen.extend(
            page["orders"]
                .as_array()
                .unwrap()
                .iter()
                .map(|o| o["order_id"].as_str().unwrap().to_owned()),
        );
        match page["next_after"].as_str() {
            Some(cursor) => after = Some(cursor.to_owned()),
            None => break,
        }
    }
    assert_eq!(
        seen,
        [
            "ord_page_0",
            "ord_page_1",
            "ord_page_2",
            "ord_page_3",
            "ord_page_4"
        ],
        "pending only, each once"
    );
    let bad = send(
        &app,
        "GET",
        "/orders?status=settled",
        Some(SHOP),
        None,
        None,
    )
    .await;
    assert_eq!(bad.status, 400);
}

#[actix_web::test]
async fn a_payment_that_does_not_match_an_api_order_moves_it_to_needs_review() {
    let app = spawn_api().await;
    // The shop asked for 30.00 USD; Stripe reports 25.00 received.
    let body =
        r#"{"order_id": "ord_1001", "amount": 3000, "currency": "usd", "provider": "stripe"}"#;
    assert_eq!(create(&app, SHOP, "k-mismatch", body).await.status, 201);
    let answer = app.deliver_stripe("payment_intent.succeeded").await;
    assert_eq!((answer.status, answer.outcome()), (200, "amount_mismatch"));
    assert_eq!(
        app.order_status("ord_1001").as_deref(),
        Some("needs_review")
    );
    let outcome = app.texts(
        "SELECT outcome FROM processed_events WHERE event_id = 'evt_1QA0002succeeded000001'",
    );
    assert_eq!(outcome, ["amount_mismatch"]);
    // The money was taken all the same: the customer's receipt says what.
    assert_eq!(app.outbox_templates("ord_1001"), ["receipt"]);
    // Money given back while the order is in review is money given back: recorded and told to
    // the customer; the order stays in review until an operator decides.
    assert_eq!(
        app.deliver_stripe("charge.refunded.partial")
            .await
            .outcome(),
        "processed"
    );
    assert_eq!(
        app.order_status("ord_1001").as_deref(),
        Some("needs_review")
    );

    app.stop().await;
    let output = Command::new(sekali_bin())
        .args(["orders", "set-status", "ord_1001", "paid", "--db"])
        .arg(app.db_arg())
        .args([
            "--reason",
            "the customer paid the rest by bank transfer",
            "--by",
            "ana",
        ])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "order ord_1001: needs_review -> paid (by ana)\n"
    );
    assert_eq!(app.order_status("ord_1001").as_deref(), Some("paid"));
    assert_eq!(
        app.outbox_templates("ord_1001"),
        ["receipt", "refund_notice"]
    );
}

#[actix_web::test]
async fn a_matching_payment_marks_an_api_order_paid_whatever_the_currency_case() {
    let app = spawn_api().await;
    let body =
        r#"{"order_id": "ord_1001", "amount": 2500, "currency": "USD", "provider": "stripe"}"#;
    create(&app, SHOP, "k-match", body).await;
    assert_eq!(
        app.deliver_stripe("payment_intent.succeeded")
            .await
            .outcome(),
        "processed"
    );
    assert_eq!(app.order_status("ord_1001").as_deref(), Some("paid"));
    // Midtrans: gross_amount "150000.00" is 15000000 minor units.
    let body = r#"{"order_id": "ORDER-2001", "amount": 15000000, "currency": "idr", "provider": "midtrans"}"#;
    create(&app, SHOP, "k-match-2", body).await;
    assert_eq!(
        app.deliver_midtrans("settlement").await.outcome(),
        "processed"
    );
    assert_eq!(app.order_status("ORDER-2001").as_deref(), Some("paid"));
}

/// Fails on the version that took `a@x.example,b@y.example` (and a CR/LF after the address) as
/// one customer_email, which every transport then received as it was.
#[actix_web::test]
async fn a_customer_email_that_is_not_exactly_one_address_is_refused() {
    let app = spawn_api().await;
    for bad in [
        "sari@example.com,attacker@evil.example",
        "sari@example.com\\r\\nBcc: attacker@evil.example",
        "Sari <sari@example.com>",
        "sari@example.com attacker@evil.example",
    ] {
        let reply = create(
            &app,
            SHOP,
            "k-email",
            &ORDER.replace("sari@example.com", bad),
        )
        .await;
        assert_eq!(reply.status, 400, "{bad}: {}", reply.body);
        let detail = reply.json()["detail"].as_str().unwrap().to_owned();
        assert!(detail.contains("one email address"), "{detail}");
    }
    assert_eq!(app.count("SELECT count(*) FROM orders"), 0);
}

/// Fails on the version that stored any metadata: a `"locale": 5` was accepted, and once the
/// order was paid it failed the relay's claim of every email on every poll.
#[actix_web::test]
async fn a_metadata_locale_that_is_not_a_language_tag_is_refused() {
    let app = spawn_api().await;
    for bad in [
        "5",
        "[\"id\"]",
        "\"i\"",
        "\"id\\r\\n\"",
        &format!("\"{}\"", "x".repeat(36)),
    ] {
        let body = ORDER.replace("\"locale\": \"id\"", &format!("\"locale\": {bad}"));
        let reply = create(&app, SHOP, "k-locale", &body).await;
        assert_eq!(reply.status, 400, "{bad}: {}", reply.body);
        assert!(reply.json()["detail"]
            .as_str()
            .unwrap()
            .contains("metadata.locale"));
    }
    let good = ORDER.replace("\"locale\": \"id\"", "\"locale\": \"en-US\"");
    assert_eq!(create(&app, SHOP, "k-locale", &good).await.status, 201);
}

/// Fails on the version whose orders API kept actix's own 256 KiB limit: a 300 KiB order was a
/// `413 text/plain payload reached size limit`, and the limit was written nowhere.
#[actix_web::test]
async fn the_orders_api_takes_bodies_up_to_max_body_bytes_and_refuses_larger_ones_as_problems() {
    let app = spawn_api().await;
    let notes = "n".repeat(300 * 1024);
    let big = ORDER.replace("\"cart\": [1, 2]", &format!("\"notes\": \"{notes}\""));
    let reply = create(&app, SHOP, "k-big", &big).await;
    assert_eq!(reply.status, 201, "300 KiB is under the 1 MiB default");

    let too_big = ORDER.replace(
        "\"cart\": [1, 2]",
        &format!("\"notes\": \"{}\"", "n".repeat(1024 * 1024)),
    );
    let reply = create(&app, SHOP, "k-too-big", &too_big).await;
    assert_eq!(reply.status, 413);
    assert_eq!(reply.content_type, "application/problem+json");
    assert_eq!(reply.problem_type(), "urn:sekali:problem:too-large");
    let detail = reply.json()["detail"].as_str().unwrap().to_owned();
    assert!(
        detail.contains("1048576 bytes") && detail.contains("--max-body-bytes"),
        "{detail}"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM idempotency_keys WHERE key = 'k-too-big'"),
        0
    );
}

/// Fails on the version that took any three letters as a currency: `XYZ` was stored, and every
/// payment then mismatched it.
#[actix_web::test]
async fn a_currency_iso_4217_does_not_know_is_refused_naming_the_field() {
    let app = spawn_api().await;
    let body = r#"{"amount": 1500, "currency": "XYZ", "provider": "stripe"}"#;
    let reply = create(&app, SHOP, "k-xyz", body).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert_eq!(reply.content_type, "application/problem+json");
    assert_eq!(
        reply.json()["detail"],
        "currency: `XYZ` is not an ISO 4217 currency code (such as usd, IDR, JPY)"
    );
    assert_eq!(
        app.texts("SELECT order_id FROM orders"),
        Vec::<String>::new()
    );
    let fixed = r#"{"amount": 1500, "currency": "xts", "provider": "stripe"}"#;
    assert_eq!(create(&app, SHOP, "k-xyz", fixed).await.status, 201);
}

/// Fails on the version whose answer was serde's "invalid type: floating point `15.5`,
/// expected i64".
#[actix_web::test]
async fn a_fractional_amount_is_told_that_amounts_are_integers_in_minor_units() {
    let app = spawn_api().await;
    for amount in ["15.5", "\"1500\""] {
        let body = format!(r#"{{"amount": {amount}, "currency": "usd", "provider": "stripe"}}"#);
        let reply = create(&app, SHOP, "k-float", &body).await;
        assert_eq!(reply.status, 400, "{}", reply.body);
        let detail = reply.json()["detail"].as_str().unwrap().to_owned();
        assert!(
            detail.starts_with(&format!("amount: {amount} is not an integer"))
                && detail.contains("integers in the currency's minor units (1500 for $15.00"),
            "{detail}"
        );
    }
}

/// An order is read at `/orders/{order_id}`: an id that a client's URL resolution would remove
/// from that path ("." and "..") is refused, naming why, and nothing is stored; an id with dots
/// in it is fine.
#[actix_web::test]
async fn an_order_id_that_is_a_path_step_is_refused_naming_why() {
    let app = spawn_api().await;
    for id in [".", ".."] {
        let body = format!(
            r#"{{"order_id": "{id}", "amount": 1500, "currency": "usd", "provider": "stripe"}}"#
        );
        let reply = create(&app, SHOP, &format!("k-dots-{}", id.len()), &body).await;
        assert_eq!(reply.status, 400, "{id}: {}", reply.body);
        let detail = reply.json()["detail"].as_str().unwrap().to_owned();
        assert!(detail.contains("/orders/{order_id}"), "{detail}");
    }
    assert_eq!(app.count("SELECT count(*) FROM orders"), 0);
    let body = r#"{"order_id": "...", "amount": 1500, "currency": "usd", "provider": "stripe"}"#;
    let dots = create(&app, SHOP, "k-dots-3", body).await;
    assert_eq!(dots.status, 201, "{}", dots.body);
    assert_eq!(dots.location.as_deref(), Some("/orders/..."));
}

/// Fails on the version whose 201 had no `Location`.
#[actix_web::test]
async fn a_created_order_says_where_it_is_read_and_its_replay_says_the_same() {
    let app = spawn_api().await;
    let body =
        r#"{"order_id": "ord:7.a", "amount": 1500, "currency": "usd", "provider": "stripe"}"#;
    let first = create(&app, SHOP, "k-loc", body).await;
    assert_eq!(first.status, 201, "{}", first.body);
    assert_eq!(first.location.as_deref(), Some("/orders/ord%3A7.a"));
    let generated = create(
        &app,
        SHOP,
        "k-loc-2",
        r#"{"amount": 1500, "currency": "usd", "provider": "stripe"}"#,
    )
    .await;
    let id = generated.json()["order_id"].as_str().unwrap().to_owned();
    assert_eq!(generated.location, Some(format!("/orders/{id}")));
    let replay = create(
        &app,
        SHOP,
        "k-loc-2",
        r#"{"amount": 1500, "currency": "usd", "provider": "stripe"}"#,
    )
    .await;
    assert!(replay.replayed);
    assert_eq!(replay.location, Some(format!("/orders/{id}")));
    let read = send(
        &app,
        "GET",
        &format!("/orders/{id}"),
        Some(SHOP),
        None,
        None,
    )
    .await;
    assert_eq!(read.status, 200);
}

/// Fails on the version whose answer was "unknown order status `bogus`" alone.
#[actix_web::test]
async fn an_unknown_status_filter_lists_the_valid_statuses() {
    let app = spawn_api().await;
    let reply = send(&app, "GET", "/orders?status=bogus", Some(SHOP), None, None).await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.content_type, "application/problem+json");
    assert_eq!(
        reply.json()["detail"],
        "status: unknown order status `bogus`; it is one of pending, paid, failed, cancelled, \
         expired, partially_refunded, refunded, disputed, needs_review"
    );
}

/// Fails on the version that answered these with sekali's webhook JSON (`{"error": …}`), not
/// problem+json.
#[actix_web::test]
async fn every_error_under_orders_is_problem_json() {
    let app = spawn_api().await;
    for (method, path, status, allow) in [
        ("DELETE", "/orders", 405, Some("GET, HEAD, POST")),
        ("PUT", "/orders/ord_1", 405, Some("GET, HEAD")),
        ("GET", "/orders/ord_1/refund", 404, None),
        ("GET", "/orders/", 404, None),
        ("GET", "/orders?limit=many", 400, None),
        ("GET", "/orders?colour=red", 400, None),
    ] {
        let reply = send(&app, method, path, Some(SHOP), None, None).await;
        assert_eq!(
            (reply.status, reply.content_type.as_str()),
            (status, "application/problem+json"),
            "{method} {path}: {}",
            reply.body
        );
        assert_eq!(reply.json()["status"], status, "{method} {path}");
        assert_eq!(reply.allow.as_deref(), allow, "{method} {path}");
    }
    // A webhook path keeps its own JSON.
    let webhook = send(&app, "GET", "/webhooks/stripe", None, None, None).await;
    assert_eq!(
        (webhook.status, webhook.content_type.as_str()),
        (405, "application/json")
    );
}

/// Fails on the version whose list came through `json!`, whose map sorts keys: an order in a
/// page listed its fields alphabetically, and one read alone in declaration order.
#[actix_web::test]
async fn an_order_lists_its_fields_in_the_same_order_alone_and_in_a_page() {
    let app = spawn_api().await;
    create(&app, SHOP, "k-order", ORDER).await;
    let keys = |text: &str, prefix: &str| -> Vec<String> {
        // The keys of the first object after `prefix`, in the order they were sent.
        let start = text.find(prefix).unwrap() + prefix.len();
        let value: serde_json::Value = serde_json::Deserializer::from_str(&text[start..])
            .into_iter()
            .next()
            .unwrap()
            .unwrap();
        let mut found: Vec<(usize, String)> = value
            .as_object()
            .unwrap()
            .keys()
            .map(|k| (text[start..].find(&format!("\"{k}\":")).unwrap(), k.clone()))
            .collect();
        found.sort();
        found.into_iter().map(|(_, k)| k).collect()
    };
    let one = send(&app, "GET", "/orders/ord_api_1", Some(SHOP), None, None).await;
    let page = send(&app, "GET", "/orders", Some(SHOP), None, None).await;
    let mut alone = keys(&one.body, "");
    assert_eq!(alone.pop().as_deref(), Some("history"), "{}", one.body);
    assert_eq!(alone.pop().as_deref(), Some("payments"), "{}", one.body);
    assert_eq!(keys(&page.body, "\"orders\":["), alone, "{}", page.body);
    assert_eq!(&alone[..3], ["order_id", "status", "review_reason"]);
}

/// Fails on the version that fingerprinted the raw path: `/%6frders` is routed as `/orders`, and
/// the same key and body sent to each got 422.
#[actix_web::test]
async fn the_same_key_and_body_to_one_route_spelled_two_ways_is_one_request() {
    let app = spawn_api().await;
    let first = send(
        &app,
        "POST",
        "/%6frders",
        Some(SHOP),
        Some("k-spelled"),
        Some(ORDER),
    )
    .await;
    assert_eq!(first.status, 201, "{}", first.body);
    let second = create(&app, SHOP, "k-spelled", ORDER).await;
    assert_eq!(
        (second.status, second.replayed),
        (201, true),
        "{}",
        second.body
    );
    assert_eq!(second.body, first.body);
}

/// An order read alone shows its history, and what was paid when it differs from what the
/// shop asked for. Fails on the version that showed neither.
#[actix_web::test]
async fn an_order_read_alone_shows_what_was_paid_and_its_history() {
    let app = spawn_api().await;
    let body =
        r#"{"order_id": "ord_1001", "amount": 3000, "currency": "usd", "provider": "stripe"}"#;
    create(&app, SHOP, "k-hist", body).await;
    assert_eq!(
        app.deliver_stripe("payment_intent.succeeded")
            .await
            .outcome(),
        "amount_mismatch"
    );
    let order = send(&app, "GET", "/orders/ord_1001", Some(SHOP), None, None)
        .await
        .json();
    assert_eq!(
        (order["amount"].as_i64(), order["paid_amount"].as_i64()),
        (Some(3000), Some(2500))
    );
    assert_eq!(order["paid_currency"], "USD");
    let history: Vec<(String, String, String, String)> = order["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            let text = |k: &str| h[k].as_str().unwrap_or("-").to_owned();
            (
                text("from_status"),
                text("to_status"),
                text("provider"),
                text("event_id"),
            )
        })
        .collect();
    assert_eq!(
        history,
        [
            (
                "-".into(),
                "pending".into(),
                "api".into(),
                "api:shop".into()
            ),
            (
                "pending".into(),
                "needs_review".into(),
                "stripe".into(),
                "evt_1QA0002succeeded000001".into()
            ),
        ]
    );
    assert!(order["history"][0]["changed_at"]
        .as_str()
        .unwrap()
        .ends_with('Z'));
    // A matching payment shows no separate paid amount.
    create(
        &app,
        SHOP,
        "k-hist-2",
        r#"{"order_id": "ORDER-2001", "amount": 15000000, "currency": "idr", "provider": "midtrans"}"#,
    )
    .await;
    app.deliver_midtrans("settlement").await;
    let paid = send(&app, "GET", "/orders/ORDER-2001", Some(SHOP), None, None)
        .await
        .json();
    assert_eq!(paid["status"], "paid");
    assert!(paid.get("paid_amount").is_none(), "{paid}");
}

/// The shop's own address is where the customer's emails go: a webhook reporting the payer's
/// address does not overwrite it, and the payer's stays visible. Fails on the version where the
/// newest address won, so the receipt went to the payer's.
#[actix_web::test]
async fn a_webhook_does_not_overwrite_the_shops_customer_email() {
    let app = spawn_api().await;
    let body = r#"{"order_id": "ord_1001", "amount": 2500, "currency": "usd", "provider": "stripe", "customer_email": "buyer@shop.example"}"#;
    create(&app, SHOP, "k-mail", body).await;
    assert_eq!(
        app.deliver_stripe("payment_intent.succeeded")
            .await
            .outcome(),
        "processed"
    );
    let order = send(&app, "GET", "/orders/ord_1001", Some(SHOP), None, None)
        .await
        .json();
    assert_eq!(
        (
            order["customer_email"].as_str(),
            order["payer_email"].as_str()
        ),
        (Some("buyer@shop.example"), Some("ana@example.com"))
    );
    assert_eq!(
        app.texts("SELECT recipient FROM email_outbox WHERE order_id = 'ord_1001'"),
        ["buyer@shop.example"]
    );
    // An order first seen in a webhook takes the payer's address.
    app.deliver_stripe("payment_intent.payment_failed").await;
    assert_eq!(
        app.texts(
            "SELECT customer_email || ' ' || payer_email FROM orders WHERE order_id = 'ord_1002'"
        ),
        ["citra@example.com citra@example.com"]
    );
}

/// `sekali orders set-status` with `args` on `app`'s database: its exit status, stdout and
/// stderr.
fn set_status(app: &TestApp, args: &[&str], env_user: Option<&str>) -> (bool, String, String) {
    let mut command = Command::new(sekali_bin());
    command
        .args(["orders", "set-status"])
        .args(args)
        .arg("--db")
        .arg(app.db_arg());
    if let Some(user) = env_user {
        command
            .env_remove("SUDO_USER")
            .env("USER", user)
            .env("LOGNAME", user);
    }
    let output = command.output().unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// An operator's change needs a reason, is recorded with who made it (`--by`, else the OS
/// user) and why, and a change to the status the order has is refused. Fails on the version that
/// took no reason, recorded no one, and "changed" paid to paid.
#[actix_web::test]
async fn an_operators_change_needs_a_reason_and_records_who_and_why() {
    let app = spawn_api().await;
    app.deliver_stripe("payment_intent.succeeded").await;

    let (ok, _, stderr) = set_status(&app, &["ord_1001", "refunded"], None);
    assert!(!ok);
    assert!(stderr.contains("--reason <REASON>"), "{stderr}");
    let (ok, _, stderr) = set_status(&app, &["ord_1001", "paid", "--reason", "again"], None);
    assert!(!ok);
    assert_eq!(
        stderr,
        "error: order ord_1001 is paid already; nothing was changed\n"
    );
    let (ok, stdout, stderr) = set_status(
        &app,
        &[
            "ord_1001",
            "refunded",
            "--reason",
            "refunded in cash at the shop",
        ],
        Some("budi"),
    );
    assert!(ok, "{stderr}");
    assert_eq!(stdout, "order ord_1001: paid -> refunded (by budi)\n");
    let (ok, _, stderr) = set_status(
        &app,
        &[
            "ord_1001",
            "needs_review",
            "--reason",
            "the bank says otherwise",
            "--by",
            "ana",
        ],
        Some("budi"),
    );
    assert!(ok, "{stderr}");

    let history = send(&app, "GET", "/orders/ord_1001", Some(SHOP), None, None)
        .await
        .json()["history"]
        .clone();
    let operators: Vec<(String, String, String)> = history
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["provider"] == "operator")
        .map(|h| {
            let text = |k: &str| h[k].as_str().unwrap().to_owned();
            (text("to_status"), text("actor"), text("reason"))
        })
        .collect();
    assert_eq!(
        operators,
        [
            (
                "refunded".into(),
                "budi".into(),
                "refunded in cash at the shop".into()
            ),
            (
                "needs_review".into(),
                "ana".into(),
                "the bank says otherwise".into()
            ),
        ]
    );
    assert_eq!(
        app.texts("SELECT actor || ': ' || reason FROM order_transitions WHERE provider = 'operator' ORDER BY id"),
        ["budi: refunded in cash at the shop", "ana: the bank says otherwise"]
    );
}
