//! Hostile input: forged and mangled signatures, timestamps at the edge of the tolerance,
//! unusual but valid JSON formatting, slow clients, and mangled Midtrans notifications.

use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sekali::providers::{midtrans, stripe};

use crate::helpers::*;

const SUCCEEDED: &str = "stripe/payment_intent.succeeded.json";
const SUCCEEDED_ID: &str = "evt_1QA0002succeeded000001";

fn succeeded_text() -> String {
    String::from_utf8(fixture(SUCCEEDED)).unwrap()
}

/// The succeeded fixture with its own event id and order id, so each delivery is new.
fn succeeded_with(event_id: &str, order_id: &str) -> String {
    // Its own PaymentIntent too: a payment pays one order.
    succeeded_text()
        .replace(SUCCEEDED_ID, event_id)
        .replace(
            "\"order_id\": \"ord_1001\"",
            &format!("\"order_id\": \"{order_id}\""),
        )
        .replace("pi_3QA0001Order1001", &format!("pi_{order_id}"))
}

/// The `v1` hex value of a header made by [`stripe_header`].
fn v1_of(header: &str) -> String {
    header.split("v1=").nth(1).unwrap().to_owned()
}

/// Posts to the Stripe route and asserts a 4xx with `error` (when given) and that nothing at
/// all was stored.
async fn assert_rejected(
    app: &TestApp,
    case: &str,
    body: &[u8],
    header: Option<&str>,
    status: u16,
    error: Option<&str>,
) {
    let answer = app.post_stripe(body, header).await;
    assert_eq!(answer.status, status, "{case}: {:?}", answer.body);
    if let Some(error) = error {
        assert_eq!(answer.error(), error, "{case}");
    }
    assert_eq!(app.row_counts(), (0, 0, 0), "{case}: nothing is stored");
}

/// The untouched delivery still goes through: the rejections above were about the mangling,
/// not about a broken server.
async fn assert_the_original_is_accepted(app: &TestApp) {
    let answer = app.deliver_stripe("payment_intent.succeeded").await;
    assert_eq!(
        (answer.status, answer.outcome()),
        (200, "processed"),
        "{:?}",
        answer.body
    );
}

// ---------------------------------------------------------------------------------------------
// 1. Signature negatives
// ---------------------------------------------------------------------------------------------

#[actix_web::test]
async fn a_signature_made_with_any_other_secret_is_rejected_with_401() {
    let app = spawn_app().await;
    let body = fixture(SUCCEEDED);
    let now = app.clock.now_unix();
    let near_miss = format!("{}X", &STRIPE_SECRET[..STRIPE_SECRET.len() - 1]);
    // Stripe keys the HMAC with the whole `whsec_…` string, prefix included.
    let without_prefix = STRIPE_SECRET.strip_prefix("whsec_").unwrap();
    for secret in [
        "whsec_wrong",
        near_miss.as_str(),
        without_prefix,
        STRIPE_SECRET_NEXT,
    ] {
        let header = stripe::signature_header(&[secret], now, &body);
        assert_rejected(&app, secret, &body, Some(&header), 401, Some(NO_MATCH)).await;
    }
    assert_the_original_is_accepted(&app).await;
}

#[actix_web::test]
async fn a_body_with_one_flipped_bit_is_rejected_wherever_the_bit_is() {
    let app = spawn_app().await;
    let body = fixture(SUCCEEDED);
    let header = stripe_header(&body, app.clock.now_unix());
    let middle = body.len() / 2;
    let last = body.len() - 1;
    for (at, bit) in [
        (0, 0x01),
        (1, 0x20),
        (middle, 0x01),
        (middle, 0x20),
        (last - 1, 0x02),
        (last, 0x01),
        (last, 0x80),
    ] {
        let mut tampered = body.clone();
        tampered[at] ^= bit;
        let case = format!("byte {at} bit {bit:#04x}");
        assert_rejected(&app, &case, &tampered, Some(&header), 401, Some(NO_MATCH)).await;
    }
    assert_the_original_is_accepted(&app).await;
}

#[actix_web::test]
async fn a_signature_with_one_changed_hex_digit_is_rejected() {
    let app = spawn_app().await;
    let body = fixture(SUCCEEDED);
    let now = app.clock.now_unix();
    let v1 = v1_of(&stripe_header(&body, now));
    assert_eq!(v1.len(), 64);
    for at in [0, 1, 31, 32, 63] {
        let digit = u8::from_str_radix(&v1[at..=at], 16).unwrap();
        let changed = format!("{:x}", digit ^ 0x1);
        let forged = format!("{}{changed}{}", &v1[..at], &v1[at + 1..]);
        assert_ne!(forged, v1);
        let header = format!("t={now},v1={forged}");
        let case = format!("hex digit {at}");
        assert_rejected(&app, &case, &body, Some(&header), 401, Some(NO_MATCH)).await;
    }
    assert_the_original_is_accepted(&app).await;
}

#[actix_web::test]
async fn re_serialised_json_does_not_carry_the_original_signature() {
    let app = spawn_app().await;
    let body = fixture(SUCCEEDED);
    let header = stripe_header(&body, app.clock.now_unix());
    // The same event, as a JSON library would write it back: same meaning, other bytes.
    let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let compact = serde_json::to_vec(&value).unwrap();
    let pretty = serde_json::to_vec_pretty(&value).unwrap();
    for (case, reserialised) in [("compact", compact), ("pretty", pretty)] {
        assert_ne!(reserialised, body);
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&reserialised).unwrap(),
            value
        );
        assert_rejected(
            &app,
            case,
            &reserialised,
            Some(&header),
            401,
            Some(NO_MATCH),
        )
        .await;
    }
    assert_the_original_is_accepted(&app).await;
}

#[actix_web::test]
async fn malformed_signature_headers_are_rejected_with_a_reason() {
    let app = spawn_app().await;
    let body = fixture(SUCCEEDED);
    let now = app.clock.now_unix();
    let v1 = v1_of(&stripe_header(&body, now));
    let malformed = |reason: &str| format!("malformed Stripe-Signature header: {reason}");
    let cases: Vec<(&str, String, u16, String)> = vec![
        (
            "only v0",
            format!("t={now},v0={v1}"),
            400,
            malformed("no v1 signature"),
        ),
        (
            "only v0 and an unknown scheme",
            format!("t={now},v0={v1},v2={v1}"),
            400,
            malformed("no v1 signature"),
        ),
        (
            "missing t",
            format!("v1={v1}"),
            400,
            malformed("no timestamp"),
        ),
        (
            "t without a value",
            format!("t=,v1={v1}"),
            400,
            malformed("timestamp is not an integer"),
        ),
        (
            "repeated t",
            format!("t={now},t={now},v1={v1}"),
            400,
            malformed("more than one timestamp"),
        ),
        (
            "repeated t after v1",
            format!("t={now},v1={v1},t={}", now + 1),
            400,
            malformed("more than one timestamp"),
        ),
        (
            "truncated v1, half",
            format!("t={now},v1={}", &v1[..32]),
            401,
            NO_MATCH.into(),
        ),
        (
            "truncated v1, one digit short",
            format!("t={now},v1={}", &v1[..63]),
            401,
            NO_MATCH.into(),
        ),
        ("empty v1", format!("t={now},v1="), 401, NO_MATCH.into()),
        (
            "non-hex v1",
            format!("t={now},v1=g{}", &v1[1..]),
            401,
            NO_MATCH.into(),
        ),
        (
            "v1 with a 0x prefix",
            format!("t={now},v1=0x{v1}"),
            401,
            NO_MATCH.into(),
        ),
        ("empty header", String::new(), 400, malformed("empty")),
        ("blank header", "   ".into(), 400, malformed("empty")),
    ];
    for (case, header, status, error) in cases {
        let answer = app.post_stripe(&body, Some(&header)).await;
        assert_eq!(answer.status, status, "{case}: {:?}", answer.body);
        assert_eq!(answer.error(), error, "{case}");
        assert!(
            !answer.error().contains(&v1[..16]),
            "{case}: the answer echoes a signature"
        );
        assert_eq!(app.row_counts(), (0, 0, 0), "{case}: nothing is stored");
    }
    assert_the_original_is_accepted(&app).await;
}

#[actix_web::test]
async fn a_huge_signature_header_is_rejected_and_stores_nothing() {
    let app = spawn_app().await;
    let body = fixture(SUCCEEDED);
    let now = app.clock.now_unix();
    let good = stripe_header(&body, now);

    // Just over our own limit: the header parser names it.
    let padded = format!("{good},v0={}", "0".repeat(5000));
    assert!(padded.len() > stripe::MAX_SIGNATURE_HEADER_BYTES);
    let answer = app.post_stripe(&body, Some(&padded)).await;
    assert_eq!(answer.status, 400, "{:?}", answer.body);
    assert_eq!(
        answer.error(),
        "malformed Stripe-Signature header: too long",
        "a valid v1 inside an oversized header does not get it through"
    );

    // 64 KiB: either our parser (400) or actix's head limit (431) answers; any 4xx will do.
    let huge = format!("{good},v0={}", "a".repeat(64 * 1024));
    let answer = app.post_stripe(&body, Some(&huge)).await;
    assert!(
        (400..500).contains(&answer.status),
        "64 KiB header: {} {:?}",
        answer.status,
        answer.body
    );
    assert_eq!(app.row_counts(), (0, 0, 0));
    assert_the_original_is_accepted(&app).await;
}

// ---------------------------------------------------------------------------------------------
// 2. Tolerance boundaries, with the injected clock
// ---------------------------------------------------------------------------------------------

/// Signs fresh deliveries at `now + offset` for offsets just inside and just outside `tol`,
/// with the server's clock pinned far from the real time (so only the injected clock counts).
async fn assert_tolerance_edges(app: &TestApp, tol: i64) {
    let now = 1_900_000_000; // 2030-03-17, nowhere near the wall clock
    app.clock.set(now);
    let expected_error = format!("timestamp outside the tolerance of {tol} seconds");
    let cases = [
        (-(tol - 1), true),
        (tol - 1, true),
        (-tol, true),
        (tol, true),
        (-(tol + 1), false),
        (tol + 1, false),
    ];
    for (i, (offset, accepted)) in cases.into_iter().enumerate() {
        let event_id = format!("evt_tolerance_{tol}_{i}");
        let body = succeeded_with(&event_id, &format!("ord_tolerance_{tol}_{i}"));
        let header = stripe_header(body.as_bytes(), now + offset);
        let answer = app.post_stripe(body.as_bytes(), Some(&header)).await;
        let stored = app.count(&format!(
            "SELECT count(*) FROM processed_events WHERE event_id = '{event_id}'"
        ));
        if accepted {
            assert_eq!(
                (answer.status, answer.outcome()),
                (200, "processed"),
                "tolerance {tol}, offset {offset}: {:?}",
                answer.body
            );
            assert_eq!(stored, 1, "tolerance {tol}, offset {offset}");
        } else {
            assert_eq!(
                answer.status, 401,
                "tolerance {tol}, offset {offset}: {:?}",
                answer.body
            );
            assert_eq!(answer.error(), expected_error, "offset {offset}");
            assert_eq!(stored, 0, "tolerance {tol}, offset {offset}");
        }
    }
    assert_eq!(app.count("SELECT count(*) FROM processed_events"), 4);

    // A captured delivery replayed once the clock has moved past the tolerance is refused.
    let body = succeeded_with(
        &format!("evt_tolerance_{tol}_replayed"),
        &format!("ord_tolerance_{tol}_replayed"),
    );
    let header = stripe_header(body.as_bytes(), now);
    app.clock.advance(Duration::from_secs(tol as u64 + 1));
    let answer = app.post_stripe(body.as_bytes(), Some(&header)).await;
    assert_eq!(answer.status, 401, "{:?}", answer.body);
    assert_eq!(answer.error(), expected_error);
    assert_eq!(app.count("SELECT count(*) FROM processed_events"), 4);
}

#[actix_web::test]
async fn the_default_tolerance_accepts_299_seconds_either_way_and_rejects_301() {
    let app = spawn_app().await;
    assert_tolerance_edges(&app, 300).await;
}

#[actix_web::test]
async fn a_configured_tolerance_of_60_seconds_is_enforced_at_its_edges() {
    let app =
        spawn_app_with(|s| s.providers = providers_with(&[("stripe", "tolerance", "60")])).await;
    assert_tolerance_edges(&app, 60).await;
}

// ---------------------------------------------------------------------------------------------
// 3. Raw-body fidelity
// ---------------------------------------------------------------------------------------------

/// The fixture rearranged so that `data` comes first and `id` last.
fn data_first_id_last(text: &str) -> String {
    let data_start = text.find("  \"data\": {").unwrap();
    let data_end = text.find("\n  },\n  \"livemode\"").unwrap() + "\n  }".len();
    let data = &text[data_start..data_end];
    let id_line = text[..data_start]
        .lines()
        .find(|line| line.trim_start().starts_with("\"id\""))
        .unwrap();
    let after_id = text.find(id_line).unwrap() + id_line.len() + 1;
    let middle = &text[after_id..data_start];
    let tail = text[data_end + 2..]
        .trim_end()
        .strip_suffix('}')
        .unwrap()
        .trim_end();
    let id_line = id_line.trim().trim_end_matches(',');
    format!("{{\n{data},\n{middle}{tail},\n  {id_line}\n}}\n")
}

#[actix_web::test]
async fn validly_signed_bodies_with_unusual_formatting_are_processed_and_stored_byte_for_byte() {
    let app = spawn_app().await;
    let base = |n: usize| succeeded_with(&format!("evt_fidelity_{n}"), &format!("ord_fid_{n}"));

    let mut variants: Vec<(&str, String, String)> = Vec::new();
    // Escapes: the order id is written with an escaped slash and decodes to "ord_fid/0".
    variants.push((
        "unicode escapes",
        base(0)
            .replace("\"ord_fid_0\"", r#""ord_fid\u002f0""#)
            .replace(
                "\"Order ord_1001\"",
                r#""Caf\u00e9 \u2615 \ud83d\ude00 caf\u00c3 \"quoted\" back\\slash \/ Café ☕""#,
            ),
        "ord_fid/0".into(),
    ));
    variants.push((
        "data first, id last",
        data_first_id_last(&base(1)),
        "ord_fid_1".into(),
    ));
    variants.push((
        "trailing whitespace",
        format!("{}\n \t\r\n\n", base(2)),
        "ord_fid_2".into(),
    ));
    variants.push((
        "no trailing newline",
        base(3).trim_end().to_owned(),
        "ord_fid_3".into(),
    ));
    variants.push((
        "CRLF line endings",
        base(4).replace('\n', "\r\n"),
        "ord_fid_4".into(),
    ));
    variants.push((
        "big numbers in unrelated fields",
        base(5).replace(
            "\"amount_capturable\": 0,",
            "\"amount_capturable\": 0,\n      \"big\": 123456789012345678901234567890,\n      \
             \"negative_big\": -98765432109876543210987654321,\n      \"huge\": 1.5e300,\n      \
             \"tiny\": -2.5E-300,\n      \"precise\": 0.1000000000000000055511151231257827,",
        ),
        "ord_fid_5".into(),
    ));
    variants.push((
        "extra unknown nested fields",
        base(6)
            .replace(
                "\"object\": \"event\",",
                "\"object\": \"event\",\n  \"x_unknown\": {\"deep\": [{\"a\": {\"b\": [1, [2, [3, [4, {\"c\": null}]]], {}]}}], \"flag\": true, \"text\": \"}{][\"},",
            )
            .replace(
                "\"amount_received\": 2500,",
                "\"amount_received\": 2500,\n      \"future_field\": {\"metadata\": {\"order_id\": \"ord_decoy\"}, \"list\": [[], [[]], {\"id\": \"decoy\"}]},",
            ),
        "ord_fid_6".into(),
    ));
    variants.push((
        "tabs and no indentation",
        base(7).replace("\n      ", "\n\t").replace("\n  ", "\n"),
        "ord_fid_7".into(),
    ));

    for (n, (case, body, order_id)) in variants.iter().enumerate() {
        let event_id = format!("evt_fidelity_{n}");
        assert!(body.contains(&event_id), "{case}: the edit kept the id");
        let answer = app.deliver_stripe_body(body.as_bytes()).await;
        assert_eq!(
            (answer.status, answer.outcome()),
            (200, "processed"),
            "{case}: {:?}",
            answer.body
        );
        assert_eq!(answer.body["event_id"], event_id.as_str(), "{case}");
        let stored = app.texts(&format!(
            "SELECT payload FROM processed_events WHERE event_id = {}",
            sql_text(&event_id)
        ));
        let [stored] = &stored[..] else {
            panic!("{case}: {stored:?}")
        };
        assert!(
            stored.as_bytes() == body.as_bytes(),
            "{case}: the stored payload differs from the bytes sent:\n sent {:?}\n kept {:?}",
            body,
            stored
        );
        assert_eq!(
            app.order(order_id),
            ("paid".into(), 2500, 0),
            "{case}: the event was read, not just stored"
        );
        assert_eq!(app.outbox_templates(order_id), ["receipt"], "{case}");
    }
    assert_eq!(app.order_status("ord_decoy"), None);
    assert_eq!(app.row_counts(), (8, 8, 8));
}

// ---------------------------------------------------------------------------------------------
// 4. Slow clients
// ---------------------------------------------------------------------------------------------

#[actix_web::test]
async fn a_client_that_never_finishes_its_headers_gets_408_after_the_configured_timeout() {
    let app = spawn_app_with(|s| s.client_request_timeout = Duration::from_secs(1)).await;
    let port = app.port;
    let answer = actix_web::rt::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        // 1 s is configured; actix's own default is 5 s. Waiting at most 4 s tells the two apart
        // while leaving the configured timeout plenty of slack.
        stream
            .set_read_timeout(Some(Duration::from_secs(4)))
            .unwrap();
        stream
            .write_all(b"POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\n")
            .unwrap();
        read_answer(&mut stream, |a| a.windows(2).any(|w| w == b"\r\n"))
    })
    .await
    .unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 408"),
        "expected a 408 within 4 s of a 1 s client_request_timeout, got {answer:?}"
    );
    assert_eq!(app.row_counts(), (0, 0, 0));
}

#[actix_web::test]
async fn a_drip_fed_body_holds_up_no_other_delivery() {
    let app = spawn_app().await;
    let port = app.port;
    let body = succeeded_with("evt_drip", "ord_drip").into_bytes();
    let header = stripe_header(&body, app.clock.now_unix());

    let head_sent = Arc::new(AtomicBool::new(false));
    let others_done = Arc::new(AtomicBool::new(false));
    let last_byte_sent = Arc::new(AtomicBool::new(false));
    let drip = {
        let (head_sent, others_done, last_byte_sent) = (
            head_sent.clone(),
            others_done.clone(),
            last_byte_sent.clone(),
        );
        actix_web::rt::task::spawn_blocking(move || {
            let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(30)))
                .unwrap();
            stream.set_nodelay(true).unwrap();
            let head = format!(
                "POST /webhooks/stripe HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
                 Stripe-Signature: {header}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            stream.write_all(head.as_bytes()).unwrap();
            // All but the last byte, in 30 pieces about 100 ms apart (~3 s).
            let (most, last) = body.split_at(body.len() - 1);
            for (i, piece) in most.chunks(most.len().div_ceil(30)).enumerate() {
                stream.write_all(piece).unwrap();
                if i == 0 {
                    head_sent.store(true, Ordering::SeqCst);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            // The last byte only once the other deliveries are answered (or after a long
            // while, so a failing test does not hang).
            let give_up = Instant::now() + Duration::from_secs(45);
            while !others_done.load(Ordering::SeqCst) && Instant::now() < give_up {
                std::thread::sleep(Duration::from_millis(10));
            }
            stream.write_all(last).unwrap();
            last_byte_sent.store(true, Ordering::SeqCst);
            read_answer(&mut stream, |_| false)
        })
    };
    while !head_sent.load(Ordering::SeqCst) {
        actix_web::rt::time::sleep(Duration::from_millis(5)).await;
    }

    let template = succeeded_text();
    let bodies: Vec<Vec<u8>> = (0..20)
        .map(|i| {
            template
                .replace(SUCCEEDED_ID, &format!("evt_fast_{i}"))
                .into_bytes()
        })
        .collect();
    let answers =
        futures_util::future::join_all(bodies.iter().map(|b| app.deliver_stripe_body(b))).await;
    let dripping = !last_byte_sent.load(Ordering::SeqCst);
    others_done.store(true, Ordering::SeqCst);
    for (i, answer) in answers.iter().enumerate() {
        assert_eq!(answer.status, 200, "fast delivery {i}: {:?}", answer.body);
        assert_eq!(answer.body["event_id"], format!("evt_fast_{i}"));
    }
    assert!(
        dripping,
        "the 20 deliveries were answered while the dripped body was still incomplete"
    );

    let answer = drip.await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    assert!(
        answer.contains(r#""status":"processed""#) && answer.contains("evt_drip"),
        "{answer:?}"
    );
    assert_eq!(app.order("ord_drip"), ("paid".into(), 2500, 0));
    assert_eq!(app.count("SELECT count(*) FROM processed_events"), 21);
}

// ---------------------------------------------------------------------------------------------
// 5. Midtrans negatives
// ---------------------------------------------------------------------------------------------

const SETTLEMENT: &str = "midtrans/settlement.json";

fn settlement_text() -> String {
    String::from_utf8(fixture(SETTLEMENT)).unwrap()
}

/// The settlement fixture with its `signature_key` replaced by `key`, bytes otherwise as-is.
fn settlement_with_key(text: &str, key: &str) -> Vec<u8> {
    let value: serde_json::Value = serde_json::from_str(text).unwrap();
    let old = value["signature_key"].as_str().unwrap();
    assert_eq!(text.matches(old).count(), 1);
    text.replace(old, key).into_bytes()
}

fn correct_settlement_key(gross_amount: &str) -> String {
    midtrans::compute_signature_key("ORDER-2001", "200", gross_amount, MIDTRANS_KEY)
}

async fn post_midtrans(app: &TestApp, body: Vec<u8>) -> Answer {
    app.post("/webhooks/midtrans", body, &[]).await
}

#[actix_web::test]
async fn a_midtrans_key_of_the_right_length_but_wrong_is_rejected() {
    let app = spawn_app().await;
    let text = settlement_text();
    let good = correct_settlement_key("150000.00");
    let mut one_digit = good.clone().into_bytes();
    one_digit[100] = if one_digit[100] == b'0' { b'1' } else { b'0' };
    let one_digit = String::from_utf8(one_digit).unwrap();
    let other_server_key =
        midtrans::compute_signature_key("ORDER-2001", "200", "150000.00", "SB-Mid-server-other");
    let other_amount = correct_settlement_key("1.00");
    for (case, key) in [
        ("one digit changed", one_digit),
        ("another server key", other_server_key),
        ("signed over another amount", other_amount),
        ("all zeros", "0".repeat(128)),
    ] {
        assert_eq!(key.len(), 128, "{case}");
        let answer = post_midtrans(&app, settlement_with_key(&text, &key)).await;
        assert_eq!(answer.status, 401, "{case}: {:?}", answer.body);
        assert_eq!(answer.error(), "signature_key does not match", "{case}");
        assert!(!answer.error().contains(&good[..16]), "{case}");
        assert_eq!(app.row_counts(), (0, 0, 0), "{case}");
    }
    let answer = post_midtrans(&app, settlement_with_key(&text, &good)).await;
    assert_eq!((answer.status, answer.outcome()), (200, "processed"));
}

#[actix_web::test]
async fn a_correct_midtrans_key_in_uppercase_hex_is_accepted() {
    let app = spawn_app().await;
    let upper = correct_settlement_key("150000.00").to_ascii_uppercase();
    assert!(upper.bytes().any(|b| b.is_ascii_uppercase()));
    let answer = post_midtrans(&app, settlement_with_key(&settlement_text(), &upper)).await;
    assert_eq!(
        (answer.status, answer.outcome()),
        (200, "processed"),
        "{:?}",
        answer.body
    );
    assert_eq!(app.order("ORDER-2001"), ("paid".into(), 15_000_000, 0));
}

#[actix_web::test]
async fn a_gross_amount_sent_as_a_number_is_verified_over_its_digits_as_sent() {
    // Midtrans sends gross_amount as a string, but should it ever arrive as a JSON number the
    // signature still covers the digits exactly as sent: "150000.00", not serde's re-printed
    // "150000.0" (regression: it was re-printed before the field kept its raw text).
    let app = spawn_app().await;
    let text = settlement_text().replace(
        "\"gross_amount\": \"150000.00\",",
        "\"gross_amount\": 150000.00,",
    );
    assert!(text.contains("\"gross_amount\": 150000.00,"));

    let over_normalised_text = correct_settlement_key("150000.0");
    let answer = post_midtrans(&app, settlement_with_key(&text, &over_normalised_text)).await;
    assert_eq!(answer.status, 401, "{:?}", answer.body);
    assert_eq!(answer.error(), "signature_key does not match");
    assert_eq!(app.row_counts(), (0, 0, 0));

    let over_sent_text = correct_settlement_key("150000.00");
    let answer = post_midtrans(&app, settlement_with_key(&text, &over_sent_text)).await;
    assert_eq!(
        (answer.status, answer.outcome()),
        (200, "processed"),
        "{:?}",
        answer.body
    );
    assert_eq!(app.order("ORDER-2001"), ("paid".into(), 15_000_000, 0));
}

#[actix_web::test]
async fn a_midtrans_notification_without_an_order_id_is_a_400_naming_it() {
    let app = spawn_app().await;
    let text = String::from_utf8(sign_midtrans(&fixture(SETTLEMENT))).unwrap();
    let missing: String = text
        .lines()
        .filter(|line| !line.contains("\"order_id\""))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(!missing.contains("order_id"));
    let answer = post_midtrans(&app, missing.into_bytes()).await;
    assert_eq!(answer.status, 400, "{:?}", answer.body);
    assert_eq!(answer.error(), "invalid event: missing field `order_id`");

    let empty = text.replace("\"order_id\": \"ORDER-2001\"", "\"order_id\": \"\"");
    assert_ne!(empty, text);
    let answer = post_midtrans(&app, empty.into_bytes()).await;
    assert_eq!(answer.status, 400, "{:?}", answer.body);
    assert_eq!(answer.error(), "invalid event: field `order_id` is empty");
    assert_eq!(app.row_counts(), (0, 0, 0));
}
