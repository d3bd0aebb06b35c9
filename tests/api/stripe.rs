use crate::helpers::*;

#[actix_web::test]
async fn every_fixture_is_processed_once_and_redeliveries_change_nothing() {
    let app = spawn_app().await;
    for (name, expected) in STRIPE_IN_ORDER {
        let answer = app.deliver_stripe(name).await;
        assert_eq!(answer.status, 200, "{name}: {:?}", answer.body);
        assert_eq!(answer.outcome(), expected, "{name}");
    }
    for name in MIDTRANS_IN_ORDER {
        let answer = app.deliver_midtrans(name).await;
        assert_eq!(
            (answer.status, answer.outcome()),
            (200, "processed"),
            "{name}: {:?}",
            answer.body
        );
    }
    let before = app.row_counts();
    assert_eq!(before.0, 22, "one processed_events row per fixture");

    for (name, _) in STRIPE_IN_ORDER {
        let answer = app.deliver_stripe(name).await;
        assert_eq!(
            (answer.status, answer.outcome()),
            (200, "duplicate"),
            "{name}"
        );
    }
    for name in MIDTRANS_IN_ORDER {
        let answer = app.deliver_midtrans(name).await;
        assert_eq!(
            (answer.status, answer.outcome()),
            (200, "duplicate"),
            "{name}"
        );
    }
    assert_eq!(app.row_counts(), before, "redeliveries add no rows");

    assert_eq!(app.order("ord_1001"), ("refunded".into(), 2500, 2500));
    assert_eq!(app.order_status("ord_1002").as_deref(), Some("failed"));
    assert_eq!(app.order_status("ord_1003").as_deref(), Some("disputed"));
    assert_eq!(app.order("ord_1004"), ("paid".into(), 150_000_000, 0));
    assert_eq!(app.order_status("ord_1005").as_deref(), Some("failed"));
    assert_eq!(
        app.outbox_templates("ord_1001"),
        ["receipt", "refund_notice", "refund_notice"],
        "a receipt, then one notice per refund"
    );
}

#[actix_web::test]
async fn a_duplicate_answer_names_the_event() {
    let app = spawn_app().await;
    app.deliver_stripe("payment_intent.succeeded").await;
    let answer = app.deliver_stripe("payment_intent.succeeded").await;
    assert_eq!(answer.body["event_id"], "evt_1QA0002succeeded000001");
    assert_eq!(answer.outcome(), "duplicate");
}

#[actix_web::test]
async fn outbox_rows_are_complete_enough_to_send() {
    let app = spawn_app().await;
    app.deliver_stripe("payment_intent.succeeded").await;
    let row = app.one_row(
        "SELECT recipient, template, params, idempotency_key, status, attempts, created_at FROM email_outbox",
    );
    let [recipient, template, params, key, status, attempts, created_at] = &row[..] else {
        panic!("{row:?}")
    };
    assert_eq!(recipient, "ana@example.com");
    assert_eq!(template, "receipt");
    assert_eq!((status.as_str(), attempts.as_str()), ("pending", "0"));
    assert!(
        key.len() >= 32
            && key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)),
        "{key}"
    );
    assert_eq!(created_at.len(), "2026-01-01T00:00:00Z".len());
    let params: serde_json::Value = serde_json::from_str(params).unwrap();
    assert_eq!(params["order_id"], "ord_1001");
    assert_eq!(params["amount"], 2500);
    assert_eq!(params["currency"], "USD");
}

#[actix_web::test]
async fn a_second_event_id_for_the_same_change_queues_no_second_email() {
    let app = spawn_app().await;
    let body = fixture("stripe/payment_intent.succeeded.json");
    app.deliver_stripe_body(&body).await;
    let twin = String::from_utf8(body)
        .unwrap()
        .replace("evt_1QA0002succeeded000001", "evt_1QA0002succeededTWIN01");
    let answer = app.deliver_stripe_body(twin.as_bytes()).await;
    assert_eq!((answer.status, answer.outcome()), (200, "processed"));
    assert_eq!(app.count("SELECT count(*) FROM processed_events"), 2);
    assert_eq!(app.outbox_templates("ord_1001"), ["receipt"]);
}

#[actix_web::test]
async fn every_configured_secret_is_accepted_during_rotation() {
    let app = spawn_app_with(|s| {
        s.providers = providers_from(
            &[(
                "STRIPE_WEBHOOK_SECRET",
                &format!("{STRIPE_SECRET_NEXT}, {STRIPE_SECRET}"),
            )],
            &[],
        )
    })
    .await;
    let now = app.clock.now_unix();
    // Stripe signs with both secrets while one is rolled: two v1 values, only one of them ours.
    let body = fixture("stripe/payment_intent.processing.json");
    let two = sekali::providers::stripe::signature_header(
        &["whsec_unknown_other", STRIPE_SECRET_NEXT],
        now,
        &body,
    );
    assert_eq!(
        app.post_stripe(&body, Some(&two)).await.outcome(),
        "processed"
    );
    // The old secret alone still works.
    let body = fixture("stripe/payment_intent.succeeded.json");
    let old = sekali::providers::stripe::signature_header(&[STRIPE_SECRET], now, &body);
    assert_eq!(
        app.post_stripe(&body, Some(&old)).await.outcome(),
        "processed"
    );
}

#[actix_web::test]
async fn timestamps_outside_the_tolerance_are_rejected_on_both_sides() {
    let app = spawn_app().await;
    let body = fixture("stripe/payment_intent.processing.json");
    let now = app.clock.now_unix();
    for (offset, accepted) in [(-301, false), (301, false), (-300, true)] {
        let answer = app
            .post_stripe(&body, Some(&stripe_header(&body, now + offset)))
            .await;
        if accepted {
            assert_eq!(answer.status, 200, "offset {offset}");
        } else {
            assert_eq!(answer.status, 401, "offset {offset}");
            assert_eq!(
                answer.error(),
                "timestamp outside the tolerance of 300 seconds"
            );
        }
    }
    assert_eq!(app.count("SELECT count(*) FROM processed_events"), 1);
}

#[actix_web::test]
async fn the_tolerance_is_configurable() {
    let app =
        spawn_app_with(|s| s.providers = providers_with(&[("stripe", "tolerance", "10")])).await;
    let body = fixture("stripe/payment_intent.processing.json");
    let header = stripe_header(&body, app.clock.now_unix() - 11);
    assert_eq!(app.post_stripe(&body, Some(&header)).await.status, 401);
}

#[actix_web::test]
async fn forged_and_malformed_deliveries_are_rejected_and_store_nothing() {
    let app = spawn_app().await;
    let body = fixture("stripe/payment_intent.succeeded.json");
    let now = app.clock.now_unix();
    let good = stripe_header(&body, now);
    let good_v1 = good.split("v1=").nth(1).unwrap().to_owned();

    let mut tampered = body.clone();
    let at = tampered.iter().position(|&b| b == b'2').unwrap();
    tampered[at] = b'9';
    let wrong_secret = sekali::providers::stripe::signature_header(&["whsec_wrong"], now, &body);

    type Case<'a> = (&'a str, Vec<u8>, Option<String>, u16, &'a str);
    let cases: Vec<Case> = vec![
        ("tampered body", tampered, Some(good.clone()), 401, NO_MATCH),
        (
            "wrong secret",
            body.clone(),
            Some(wrong_secret),
            401,
            NO_MATCH,
        ),
        (
            "missing header",
            body.clone(),
            None,
            400,
            "missing Stripe-Signature header",
        ),
        (
            "empty header",
            body.clone(),
            Some(String::new()),
            400,
            "malformed Stripe-Signature header: empty",
        ),
        (
            "no timestamp",
            body.clone(),
            Some(format!("v1={good_v1}")),
            400,
            "malformed Stripe-Signature header: no timestamp",
        ),
        (
            "two timestamps",
            body.clone(),
            Some(format!("t={now},t={now},v1={good_v1}")),
            400,
            "malformed Stripe-Signature header: more than one timestamp",
        ),
        (
            "only v0",
            body.clone(),
            Some(format!("t={now},v0={good_v1}")),
            400,
            "malformed Stripe-Signature header: no v1 signature",
        ),
        (
            "not hex",
            body.clone(),
            Some(format!("t={now},v1=zz{}", &good_v1[2..])),
            401,
            NO_MATCH,
        ),
        (
            "truncated",
            body.clone(),
            Some(format!("t={now},v1={}", &good_v1[..32])),
            401,
            NO_MATCH,
        ),
        (
            "garbage",
            body.clone(),
            Some("hello".into()),
            400,
            "malformed Stripe-Signature header: expected key=value pairs",
        ),
    ];
    for (name, body, header, status, error) in cases {
        let answer = app.post_stripe(&body, header.as_deref()).await;
        assert_eq!(answer.status, status, "{name}: {:?}", answer.body);
        assert_eq!(answer.error(), error, "{name}");
        assert!(
            !answer.error().contains(&good_v1[..16]),
            "{name} echoes a signature"
        );
        assert!(!answer.error().contains("whsec_"), "{name} echoes a secret");
    }
    assert_eq!(app.row_counts(), (0, 0, 0));
}

#[actix_web::test]
async fn a_valid_signature_over_invalid_json_is_a_400_naming_the_problem() {
    let app = spawn_app().await;
    let answer = app.deliver_stripe_body(b"{\"id\": \"evt_1\", ").await;
    assert_eq!(answer.status, 400);
    assert!(
        answer.error().starts_with("invalid JSON"),
        "{}",
        answer.error()
    );

    let answer = app
        .deliver_stripe_body(
            br#"{"object": "event", "type": "payment_intent.succeeded", "data": {"object": {}}}"#,
        )
        .await;
    assert_eq!(answer.status, 400);
    assert_eq!(answer.error(), "invalid event: missing field `id`");
    assert_eq!(app.row_counts(), (0, 0, 0));
}

#[actix_web::test]
async fn another_method_on_a_served_path_gets_405_with_allow_and_an_unknown_path_404() {
    let app = spawn_app().await;
    let send = |method: actix_web::http::Method, path: &str| {
        app.client
            .request(method, format!("{}{path}", app.address))
            .send()
    };
    use actix_web::http::Method;
    // Opening the registered URL in a browser: the URL is right, the method is not.
    for (method, path, allow) in [
        (Method::GET, "/webhooks/stripe", "POST"),
        (Method::PUT, "/webhooks/midtrans", "POST"),
        (Method::DELETE, "/orders", "GET, HEAD, POST"),
        (Method::PUT, "/orders/ord_1", "GET, HEAD"),
        (Method::POST, "/healthz", "GET, HEAD"),
    ] {
        let mut response = send(method.clone(), path).await.unwrap();
        assert_eq!(response.status(), 405, "{method} {path}");
        assert_eq!(
            response.headers().get("allow").unwrap(),
            allow,
            "{method} {path}"
        );
        let body: serde_json::Value = response.json().await.unwrap();
        if path.starts_with("/orders") {
            // The orders API answers every error as a problem (orders.rs).
            assert_eq!(body["detail"], format!("this path takes {allow}"));
        } else {
            assert_eq!(body["error"], format!("method not allowed; use {allow}"));
        }
    }
    let head = send(Method::HEAD, "/healthz").await.unwrap();
    assert_eq!(
        head.status(),
        200,
        "load balancers may check health with HEAD"
    );
    // A provider sekali does not know is a path that does not exist, whatever the method.
    for method in [Method::POST, Method::GET] {
        let mut unknown = send(method, "/webhooks/paypal").await.unwrap();
        assert_eq!(unknown.status(), 404);
        let body: serde_json::Value = unknown.json().await.unwrap();
        assert_eq!(body["error"], "not found");
    }
    assert_eq!(app.row_counts(), (0, 0, 0));
}

#[actix_web::test]
async fn a_provider_without_a_secret_answers_404_not_configured() {
    let app = spawn_app_with(|s| {
        s.providers = providers_from(
            &[
                ("MIDTRANS_SERVER_KEY", MIDTRANS_KEY),
                ("SEKALI_MIDTRANS_STATUS_CHECK", "off"),
            ],
            &[],
        )
    })
    .await;
    let answer = app.deliver_stripe("payment_intent.succeeded").await;
    assert_eq!(answer.status, 404);
    assert_eq!(
        answer.error(),
        "stripe webhooks are not configured on this server"
    );
    assert_eq!(app.deliver_midtrans("settlement").await.status, 200);
}

#[actix_web::test]
async fn healthz_reports_a_working_database() {
    let app = spawn_app().await;
    let (status, body) = app.healthz().await;
    assert_eq!(status, 200);
    assert_eq!(body["status"], "ok");
    assert_eq!(body["writer_reopens"], 0);
    // Nothing written yet: the schema's own transaction is not the writer's, and the write
    // probe's writes nothing.
    assert_eq!(body["writer"]["transactions"], 0);
    assert_eq!(body["writer"]["deliveries"], 0);
    let components = &body["components"];
    assert_eq!(
        components["database"],
        serde_json::json!({ "status": "ok" })
    );
    assert_eq!(components["writer"]["status"], "ok");
    assert_eq!(components["writer"]["queued"], 0);
    for outbox in ["outbox_email", "outbox_forward"] {
        assert_eq!(
            components[outbox],
            serde_json::json!({
                "status": "ok", "pending": 0, "dead": 0, "oldest_due_age_seconds": 0
            }),
            "{outbox}"
        );
    }
    assert!(
        components.get("midtrans_status_api").is_none(),
        "no status check configured: {components}"
    );
}

#[actix_web::test]
async fn healthz_says_which_outbox_is_behind_without_failing_the_instance() {
    // The test server runs no relay: the receipt stays pending and due, and its age grows
    // with the clock.
    let app = spawn_app().await;
    app.deliver_stripe("payment_intent.succeeded").await;
    app.clock.advance(std::time::Duration::from_secs(6 * 60));
    let (status, body) = app.healthz().await;
    assert_eq!(status, 200, "an email backlog is not an outage");
    let email = &body["components"]["outbox_email"];
    assert_eq!(email["status"], "behind", "{body}");
    assert_eq!(email["pending"], 1);
    assert!(
        email["oldest_due_age_seconds"].as_u64().unwrap() >= 6 * 60,
        "{email}"
    );
    assert_eq!(body["components"]["outbox_forward"]["status"], "ok");
}

#[actix_web::test]
async fn timestamps_in_the_database_are_iso_8601_utc_text() {
    let app = spawn_app().await;
    app.clock.set(1_764_400_000); // 2025-11-29T07:06:40Z
    app.deliver_stripe("payment_intent.succeeded").await;
    let times = app.one_row("SELECT received_at, expires_at FROM processed_events");
    assert_eq!(times[0], "2025-11-29T07:06:40Z");
    assert_eq!(
        times[1], "2025-12-29T07:06:40Z",
        "30 days of Stripe retention"
    );
    let updated = app.one_row("SELECT updated_at FROM orders");
    assert_eq!(updated, ["2025-11-29T07:06:40Z"]);
}
