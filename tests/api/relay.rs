//! The outbox relay against a recording HTTP email API mock, a real SMTP sink (aiosmtpd) and
//! the real `sekali relay` binary.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use futures_util::future::join_all;
use secrecy::SecretString;
use sekali::jobs::relay::{spawn_relay, Queue, RelayConfig};
use sekali::mail::transport::MailConfig;
use tokio_util::sync::CancellationToken;

use crate::helpers::*;

const FROM: &str = "shop@sekali.test";
const API_KEY: &str = "re_test_key_123";

/// One request the mock email API received.
#[derive(Debug, Clone)]
struct Seen {
    key: String,
    to: String,
    /// Every recipient the request named.
    recipients: usize,
    subject: String,
    text: String,
    message_id: String,
    authorization: String,
}

/// What the mock answers to the `attempt`th request (1-based) for a key: status, Retry-After,
/// and a delay before answering.
type Script = Arc<dyn Fn(&Seen, usize) -> (u16, Option<u64>, Duration) + Send + Sync>;

struct Mock {
    url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    _handle: actix_web::dev::ServerHandle,
}

impl Mock {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

async fn spawn_mock(script: Script) -> Mock {
    let seen: Arc<Mutex<Vec<Seen>>> = Default::default();
    let state = (seen.clone(), script);
    let server = HttpServer::new(move || {
        let (seen, script) = state.clone();
        App::new().route(
            "/emails",
            web::post().to(
                move |req: HttpRequest, body: web::Json<serde_json::Value>| {
                    let (seen, script) = (seen.clone(), script.clone());
                    async move {
                        let header = |name: &str| {
                            req.headers()
                                .get(name)
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or("")
                                .to_owned()
                        };
                        let request = Seen {
                            key: header("idempotency-key"),
                            to: body["to"][0].as_str().unwrap_or("").to_owned(),
                            recipients: body["to"].as_array().map_or(0, Vec::len),
                            subject: body["subject"].as_str().unwrap_or("").to_owned(),
                            text: body["text"].as_str().unwrap_or("").to_owned(),
                            message_id: body["headers"]["Message-ID"]
                                .as_str()
                                .unwrap_or("")
                                .to_owned(),
                            authorization: header("authorization"),
                        };
                        let attempt = {
                            let mut seen = seen.lock().unwrap();
                            seen.push(request.clone());
                            seen.iter().filter(|s| s.key == request.key).count()
                        };
                        let (status, retry_after, delay) = script(&request, attempt);
                        if !delay.is_zero() {
                            actix_web::rt::time::sleep(delay).await;
                        }
                        let mut response = HttpResponse::build(
                            actix_web::http::StatusCode::from_u16(status).unwrap(),
                        );
                        if let Some(seconds) = retry_after {
                            response.insert_header(("Retry-After", seconds.to_string()));
                        }
                        response.json(serde_json::json!({"id": format!("email_{attempt}")}))
                    }
                },
            ),
        )
    })
    .workers(2)
    .disable_signals()
    .bind("127.0.0.1:0")
    .unwrap();
    let port = server.addrs()[0].port();
    let server = server.run();
    let handle = server.handle();
    actix_web::rt::spawn(server);
    Mock {
        url: format!("http://127.0.0.1:{port}/emails"),
        seen,
        _handle: handle,
    }
}

fn relay_config(db: &Database) -> RelayConfig {
    RelayConfig {
        db: db.location(),
        busy_timeout: Duration::from_secs(5),
        base_delay: Duration::from_secs(1),
        max_delay: Duration::from_secs(8),
        max_attempts: 5,
        lease: Duration::from_secs(30),
        transport_timeout: Duration::from_secs(5),
        batch: 8,
        poll_interval: Duration::from_millis(20),
        owner: "relay-under-test".into(),
        from: FROM.into(),
        seed: Some(20261129),
    }
}

/// While the transport is unavailable the relay pauses (real time, not the test's clock)
/// between probes, with this config's backoff: milliseconds here, so a test can watch many.
fn quick_probes(mut config: RelayConfig) -> RelayConfig {
    config.base_delay = Duration::from_millis(5);
    config.max_delay = Duration::from_millis(40);
    config
}

fn http_mail(url: &str) -> MailConfig {
    MailConfig {
        smtp_url: None,
        http_url: Some(url.to_owned()),
        http_api_key: Some(SecretString::from(API_KEY.to_owned())),
        mail_dir: std::env::temp_dir(),
        from: FROM.into(),
        timeout: Duration::from_secs(5),
    }
}

/// The relay, in this process, on the app's manual clock.
struct RunningRelay {
    stop: CancellationToken,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for RunningRelay {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A relay that writes through the app's writer, as the one inside `serve` does.
fn start_relay(app: &TestApp, config: RelayConfig, mail: MailConfig) -> RunningRelay {
    let stop = CancellationToken::new();
    let queue = Queue::server(app.store.clone());
    let thread = spawn_relay(config, mail, app.clock.clone(), stop.clone(), queue);
    RunningRelay {
        stop,
        thread: Some(thread),
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Row {
    status: String,
    attempts: i64,
    next_attempt_ms: Option<i64>,
    last_error: Option<String>,
    key: String,
}

fn row(app: &TestApp, id: i64) -> Row {
    let rows = app.query(&format!(
        "SELECT status, attempts, next_attempt_at, last_error, idempotency_key FROM email_outbox WHERE id = {id}"
    ));
    let [r] = &rows[..] else {
        panic!("outbox row {id}: {rows:?}")
    };
    Row {
        status: r[0].clone().unwrap(),
        attempts: r[1].as_deref().unwrap().parse().unwrap(),
        next_attempt_ms: r[2].as_deref().map(|t| {
            humantime::parse_rfc3339(t)
                .unwrap()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as i64
        }),
        last_error: r[3].clone(),
        key: r[4].clone().unwrap(),
    }
}

/// Polls until `ready` holds (the relay runs on its own thread), at most 15 s.
async fn wait_for(what: &str, mut ready: impl FnMut() -> bool) {
    for _ in 0..750 {
        if ready() {
            return;
        }
        actix_web::rt::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

fn always(status: u16) -> Script {
    Arc::new(move |_, _| (status, None, Duration::ZERO))
}

#[actix_web::test]
async fn transient_failures_are_retried_with_the_same_key_until_sent() {
    let app = spawn_app().await;
    let mock = spawn_mock(Arc::new(|_, attempt| {
        (if attempt < 3 { 503 } else { 200 }, None, Duration::ZERO)
    }))
    .await;
    app.deliver_stripe("payment_intent.succeeded").await;
    let _relay = start_relay(&app, relay_config(&app.database), http_mail(&mock.url));

    for failures in 1..=2 {
        wait_for("a failed try", || row(&app, 1).attempts == failures).await;
        let r = row(&app, 1);
        assert_eq!(r.status, "pending");
        assert!(r.last_error.as_deref().unwrap().contains("503"), "{r:?}");
        app.clock.advance(Duration::from_secs(8)); // past any backoff (max 8 s)
    }
    wait_for("the row to be sent", || row(&app, 1).status == "sent").await;
    let r = row(&app, 1);
    assert_eq!(
        (r.attempts, r.next_attempt_ms, r.last_error),
        (3, None, None)
    );

    let seen = mock.seen();
    assert_eq!(seen.len(), 3);
    for request in &seen {
        assert_eq!(request.key, r.key, "every attempt carries the row's key");
        assert_eq!(request.message_id, format!("<{}@sekali.test>", r.key));
        assert_eq!(request.to, "ana@example.com");
        assert_eq!(request.subject, "Payment received for order ord_1001");
        assert_eq!(request.authorization, format!("Bearer {API_KEY}"));
    }
}

#[actix_web::test]
async fn a_refused_key_or_a_down_api_counts_no_try_so_the_row_outlives_the_attempt_limit() {
    let app = spawn_app().await;
    // The API refuses the key seven times (the operator fixing it meanwhile), then accepts.
    let mock = spawn_mock(Arc::new(|_, attempt| {
        (if attempt <= 7 { 401 } else { 200 }, None, Duration::ZERO)
    }))
    .await;
    app.deliver_stripe("payment_intent.succeeded").await;
    let config = quick_probes(relay_config(&app.database));
    assert!(
        config.max_attempts < 7,
        "more refusals than the limit allows tries"
    );
    let relay = start_relay(&app, config, http_mail(&mock.url));

    // Seven refusals, more than the attempt limit allows tries, then the accepted send.
    wait_for("the row to be sent", || row(&app, 1).status == "sent").await;
    assert_eq!(mock.seen().len(), 8, "seven refusals, then the send");
    let r = row(&app, 1);
    assert_eq!(
        (r.attempts, r.last_error),
        (1, None),
        "only the send counts"
    );
    drop(relay);

    // A server that does not answer at all is the same: nothing listens on this port.
    app.deliver_stripe("payment_intent.payment_failed").await;
    let nowhere = format!("http://127.0.0.1:{}/emails", free_port());
    let mut config = quick_probes(relay_config(&app.database));
    config.owner = "relay-to-nowhere".into();
    let _lost = start_relay(&app, config, http_mail(&nowhere));
    let second = app.count("SELECT max(id) FROM email_outbox");
    wait_for("a connection failure", || {
        row(&app, second).last_error.is_some()
    })
    .await;
    // Dozens of probes at these millisecond pauses: none is a try of the row.
    actix_web::rt::time::sleep(Duration::from_secs(1)).await;
    let r = row(&app, second);
    assert_eq!((r.status.as_str(), r.attempts), ("pending", 0), "{r:?}");
    assert!(
        r.last_error
            .as_deref()
            .unwrap()
            .contains("connecting to the email API"),
        "{r:?}"
    );
}

#[actix_web::test]
async fn a_row_is_not_sent_again_past_the_downstream_keys_lifetime_after_a_try_that_may_have_arrived(
) {
    let app = spawn_app().await;
    // The first try fails on the API's side (a 500): it may or may not have gone through.
    let mock = spawn_mock(always(500)).await;
    app.deliver_stripe("payment_intent.succeeded").await;
    let relay = start_relay(&app, relay_config(&app.database), http_mail(&mock.url));
    wait_for("the first try", || row(&app, 1).attempts == 1).await;
    drop(relay);
    // Then the API is unreachable for a day (waits that count no try); now it is back.
    app.clock.advance(Duration::from_secs(25 * 3600));
    let _relay = start_relay(&app, relay_config(&app.database), http_mail(&mock.url));
    wait_for("the row to die", || row(&app, 1).status == "dead").await;
    let r = row(&app, 1);
    assert!(
        r.last_error
            .as_deref()
            .unwrap()
            .contains("past its idempotency key's lifetime"),
        "{r:?}"
    );
    assert_eq!(
        mock.seen().len(),
        1,
        "no resend the API could not recognise"
    );
    assert_eq!(r.attempts, 1, "withholding it is not a try");
}

#[actix_web::test]
async fn a_day_long_outage_before_the_first_try_does_not_shorten_the_keys_lifetime() {
    let app = spawn_app().await;
    app.deliver_stripe("payment_intent.succeeded").await;
    // The API is unreachable for more than a day: waits that count no try.
    let nowhere = format!("http://127.0.0.1:{}/emails", free_port());
    let lost = start_relay(
        &app,
        quick_probes(relay_config(&app.database)),
        http_mail(&nowhere),
    );
    wait_for("the API to be found unavailable", || {
        row(&app, 1).last_error.is_some()
    })
    .await;
    drop(lost);
    app.clock.advance(Duration::from_secs(25 * 3600));
    // Back, it is busy at first (a 503), as after any outage; then it accepts.
    let mock = spawn_mock(Arc::new(|_, attempt| {
        (if attempt == 1 { 503 } else { 200 }, None, Duration::ZERO)
    }))
    .await;
    let _relay = start_relay(&app, relay_config(&app.database), http_mail(&mock.url));
    wait_for("the first try", || row(&app, 1).attempts == 1).await;
    app.clock.advance(Duration::from_secs(8)); // past any backoff (max 8 s)
    wait_for("the row to be sent", || row(&app, 1).status == "sent").await;
    assert_eq!(mock.seen().len(), 2);
}

#[actix_web::test]
async fn backoff_delays_stay_within_their_bounds_and_the_attempt_limit_makes_a_row_dead() {
    let app = spawn_app().await;
    let mock = spawn_mock(always(500)).await;
    app.deliver_stripe("payment_intent.succeeded").await;
    let mut config = relay_config(&app.database);
    config.max_attempts = 6;
    config.max_delay = Duration::from_secs(4);
    let _relay = start_relay(&app, config, http_mail(&mock.url));

    for n in 1..=5i64 {
        wait_for("a failed try", || row(&app, 1).attempts == n).await;
        let now_ms = app.clock.now_unix() * 1000;
        let delay = row(&app, 1).next_attempt_ms.unwrap() - now_ms;
        let cap = 4000.min(1000 * (1 << (n - 1)));
        assert!(
            (0..=cap).contains(&delay),
            "after failure {n}: {delay} ms not in [0, {cap}]"
        );
        app.clock.advance(Duration::from_secs(5));
    }
    wait_for("the row to die", || row(&app, 1).status == "dead").await;
    let r = row(&app, 1);
    assert_eq!((r.attempts, r.next_attempt_ms), (6, None));
    assert!(r.last_error.unwrap().contains("gave up after 6 attempts"));
    assert_eq!(mock.seen().len(), 6);
}

#[actix_web::test]
async fn retry_after_is_honoured_and_capped_at_the_max_delay() {
    let app = spawn_app().await;
    let mock = spawn_mock(Arc::new(|_, attempt| match attempt {
        1 => (429, Some(3), Duration::ZERO),
        2 => (503, Some(999), Duration::ZERO),
        _ => (200, None, Duration::ZERO),
    }))
    .await;
    app.deliver_stripe("payment_intent.succeeded").await;
    let _relay = start_relay(&app, relay_config(&app.database), http_mail(&mock.url));

    wait_for("the 429", || row(&app, 1).attempts == 1).await;
    assert_eq!(
        row(&app, 1).next_attempt_ms.unwrap() - app.clock.now_unix() * 1000,
        3000,
        "Retry-After: 3"
    );
    app.clock.advance(Duration::from_secs(3));
    wait_for("the 503", || row(&app, 1).attempts == 2).await;
    assert_eq!(
        row(&app, 1).next_attempt_ms.unwrap() - app.clock.now_unix() * 1000,
        8000,
        "999 s capped at 8 s"
    );
    app.clock.advance(Duration::from_secs(8));
    wait_for("the row to be sent", || row(&app, 1).status == "sent").await;
}

#[actix_web::test]
async fn a_permanent_failure_makes_the_row_dead_at_once_and_outbox_retry_revives_it() {
    let app = spawn_app().await;
    let mock = spawn_mock(Arc::new(|_, attempt| {
        (if attempt == 1 { 422 } else { 200 }, None, Duration::ZERO)
    }))
    .await;
    app.deliver_stripe("payment_intent.succeeded").await;
    let relay = start_relay(&app, relay_config(&app.database), http_mail(&mock.url));
    wait_for("the row to die", || row(&app, 1).status == "dead").await;
    let r = row(&app, 1);
    assert_eq!((r.attempts, r.next_attempt_ms), (1, None));
    assert!(r.last_error.unwrap().contains("422"));

    let list = Command::new(sekali_bin())
        .args(["outbox", "list", "--status", "dead", "--db"])
        .arg(app.db_arg())
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&list.stdout).contains("receipt"),
        "{list:?}"
    );
    // A status no row can have is a mistake to point out, not an empty list.
    let misspelt = Command::new(sekali_bin())
        .args(["outbox", "list", "--status", "daed", "--db"])
        .arg(app.db_arg())
        .output()
        .unwrap();
    assert!(!misspelt.status.success());
    let stderr = String::from_utf8_lossy(&misspelt.stderr);
    assert!(
        stderr.contains("invalid value 'daed'") && stderr.contains("dead"),
        "{stderr}"
    );
    drop(relay);
    let retry = Command::new(sekali_bin())
        .args(["outbox", "retry", "1", "--db"])
        .arg(app.db_arg())
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&retry.stdout),
        "outbox row 1: dead -> pending\n"
    );
    // Pending now, and already due: a second retry keeps it so, its attempts reset once.
    let again = Command::new(sekali_bin())
        .args(["outbox", "retry", "1", "--db"])
        .arg(app.db_arg())
        .output()
        .unwrap();
    assert!(again.status.success(), "{again:?}");
    assert!(
        String::from_utf8_lossy(&again.stdout)
            .starts_with("outbox row 1: pending, due now (was due at "),
        "{again:?}"
    );
    assert_eq!(row(&app, 1).attempts, 0);
    let missing = Command::new(sekali_bin())
        .args(["outbox", "retry", "99999", "--db"])
        .arg(app.db_arg())
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("no outbox row with id 99999"),
        "{missing:?}"
    );

    // The revived row is due at the real time of the retry; the relay's clock must reach it.
    app.clock.set(sekali::clock::SystemClock.now_unix() + 1);
    let _relay = start_relay(&app, relay_config(&app.database), http_mail(&mock.url));
    wait_for("the revived row to be sent", || {
        row(&app, 1).status == "sent"
    })
    .await;
    let show = Command::new(sekali_bin())
        .args(["outbox", "show", "1", "--db"])
        .arg(app.db_arg())
        .output()
        .unwrap();
    let shown: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(shown["status"], "sent");
    assert!(
        shown["first_tried_at"].as_str().is_some(),
        "when the key's lifetime began: {shown}"
    );
}

#[actix_web::test]
async fn a_row_without_a_recipient_is_skipped_visibly() {
    let app = spawn_app().await;
    let mock = spawn_mock(always(200)).await;
    app.deliver_midtrans("settlement").await; // Midtrans notifications carry no email
    let _relay = start_relay(&app, relay_config(&app.database), http_mail(&mock.url));
    wait_for("the row to be skipped", || row(&app, 1).status == "skipped").await;
    assert_eq!(
        row(&app, 1).last_error.as_deref(),
        Some("no recipient address")
    );
    assert!(mock.seen().is_empty());
}

#[actix_web::test]
async fn emails_are_indonesian_for_rupiah_and_english_otherwise() {
    let app = spawn_app().await;
    let mock = spawn_mock(always(200)).await;
    app.deliver_stripe("checkout.session.completed.unpaid")
        .await; // ord_1004, IDR
    app.deliver_stripe("checkout.session.async_payment_succeeded")
        .await;
    app.deliver_stripe("payment_intent.succeeded").await; // ord_1001, USD
    let _relay = start_relay(&app, relay_config(&app.database), http_mail(&mock.url));
    wait_for("both receipts", || mock.seen().len() == 2).await;
    let subjects: Vec<String> = mock.seen().into_iter().map(|s| s.subject).collect();
    assert!(
        subjects.contains(&"Pembayaran diterima untuk pesanan ord_1004".to_owned()),
        "{subjects:?}"
    );
    assert!(
        subjects.contains(&"Payment received for order ord_1001".to_owned()),
        "{subjects:?}"
    );
}

/// A Stripe `payment_intent.succeeded` for `order_id` paying `amount` in `currency`.
fn succeeded_in(order_id: &str, amount: i64, currency: &str) -> Vec<u8> {
    let mut event: serde_json::Value =
        serde_json::from_slice(&fixture("stripe/payment_intent.succeeded.json")).unwrap();
    event["id"] = format!("evt_money_{order_id}").into();
    let object = &mut event["data"]["object"];
    object["id"] = format!("pi_money_{order_id}").into();
    object["metadata"]["order_id"] = order_id.into();
    object["amount"] = amount.into();
    object["amount_received"] = amount.into();
    object["currency"] = currency.into();
    serde_json::to_vec_pretty(&event).unwrap()
}

/// Fails on the version that wrote every amount with two decimals: ¥5,000 read `JPY 50.00`.
#[actix_web::test]
async fn emails_show_each_amount_with_its_currencys_own_decimals() {
    let app = spawn_app().await;
    let mock = spawn_mock(always(200)).await;
    for (order, amount, currency) in [
        ("ord_jpy", 5000, "jpy"),
        ("ord_usd", 2500, "usd"),
        ("ord_bhd", 1500, "bhd"),
    ] {
        let answer = app
            .deliver_stripe_body(&succeeded_in(order, amount, currency))
            .await;
        assert_eq!(answer.outcome(), "processed");
    }
    let _relay = start_relay(&app, relay_config(&app.database), http_mail(&mock.url));
    wait_for("three receipts", || mock.seen().len() == 3).await;
    let text_of = |order: &str| {
        mock.seen()
            .into_iter()
            .find(|s| s.subject.ends_with(order))
            .unwrap()
            .text
    };
    assert!(
        text_of("ord_jpy").contains("payment of ¥5,000\nfor order"),
        "{}",
        text_of("ord_jpy")
    );
    assert!(
        text_of("ord_usd").contains("payment of $25.00\nfor order"),
        "{}",
        text_of("ord_usd")
    );
    assert!(
        text_of("ord_bhd").contains("payment of BHD\u{a0}1.500\nfor order"),
        "{}",
        text_of("ord_bhd")
    );
}

/// Fails on the version whose receipt showed the order's expected amount: the customer paid
/// Rp 100.000 of an order of Rp 150.000, an operator settled it as paid, and the receipt said
/// Rp 150.000.
#[actix_web::test]
async fn a_receipt_after_an_operator_settles_a_mismatch_shows_what_the_customer_paid() {
    let app = spawn_app_with(|s| {
        s.api_tokens = sekali::config::parse_api_tokens("shop:tok-shop-1").unwrap()
    })
    .await;
    let created = app
        .client
        .post(format!("{}/orders", app.address))
        .insert_header(("Authorization", "Bearer tok-shop-1"))
        .insert_header(("Idempotency-Key", "k-paid-less"))
        .insert_header(("Content-Type", "application/json"))
        .send_body(
            r#"{"order_id":"ORDER-2001","amount":15000000,"currency":"IDR","provider":"midtrans","customer_email":"sari@example.com"}"#,
        )
        .await
        .unwrap();
    assert_eq!(created.status().as_u16(), 201);
    let settlement = String::from_utf8(fixture("midtrans/settlement.json"))
        .unwrap()
        .replace("150000.00", "100000.00");
    let answer = app
        .post(
            "/webhooks/midtrans",
            sign_midtrans(settlement.as_bytes()),
            &[],
        )
        .await;
    assert_eq!(answer.outcome(), "amount_mismatch");
    let output = Command::new(sekali_bin())
        .args(["orders", "set-status", "ORDER-2001", "paid", "--db"])
        .arg(app.db_arg())
        .args(["--reason", "the shortfall was paid at the counter"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    // The command queued the receipt at the real time, which a loaded machine can put seconds
    // after the test's clock (frozen at the server's start): the relay sees it due only from
    // then.
    app.clock
        .set(sekali::clock::Clock::now_unix(&sekali::clock::SystemClock) + 1);
    let mock = spawn_mock(always(200)).await;
    let _relay = start_relay(&app, relay_config(&app.database), http_mail(&mock.url));
    wait_for("the receipt", || mock.seen().len() == 1).await;
    let text = &mock.seen()[0].text;
    assert!(text.contains("sebesar Rp\u{a0}100.000 telah"), "{text}");
}

/// Fails on the version that sent the stored address as it was, and subjects with the order
/// id's line breaks: an address list reached the email API as one recipient string, and a
/// CR/LF in a subject is a header of its own to some APIs. The other control characters (TAB,
/// ESC, NEL U+0085) and the Unicode line separator U+2028 go too (that last one failed on the
/// version that stripped only control characters).
#[actix_web::test]
async fn the_email_api_gets_one_address_and_a_subject_without_line_breaks() {
    let app = spawn_app().await;
    let mock = spawn_mock(always(200)).await;
    let mut event: serde_json::Value =
        serde_json::from_slice(&fixture("stripe/payment_intent.succeeded.json")).unwrap();
    event["data"]["object"]["metadata"]["order_id"] =
        "ord_1\r\n\t\u{1b}[2J\u{85}\u{2028}Bcc: attacker@evil.example".into();
    event["data"]["object"]["receipt_email"] = "ana@example.com".into();
    app.deliver_stripe_body(&serde_json::to_vec(&event).unwrap())
        .await;
    // An address that is not exactly one address is no address at all: no email goes out.
    event["id"] = "evt_two_addresses".into();
    event["data"]["object"]["id"] = "pi_two_addresses".into();
    event["data"]["object"]["metadata"]["order_id"] = "ord_two".into();
    event["data"]["object"]["receipt_email"] = "ana@example.com,attacker@evil.example".into();
    app.deliver_stripe_body(&serde_json::to_vec(&event).unwrap())
        .await;
    let _relay = start_relay(&app, relay_config(&app.database), http_mail(&mock.url));
    wait_for("the first receipt and the skipped row", || {
        mock.seen().len() == 1
            && app.count("SELECT count(*) FROM email_outbox WHERE status = 'skipped'") == 1
    })
    .await;
    let seen = &mock.seen()[0];
    assert_eq!((seen.to.as_str(), seen.recipients), ("ana@example.com", 1));
    assert_eq!(
        seen.subject,
        "Payment received for order ord_1[2JBcc: attacker@evil.example"
    );
    assert!(!seen.subject.contains(['\r', '\n']));
}

/// Fails on the version that logged an email API's error text as it came (`%`): a line break in
/// it forged a log line, and the recipient's address it named reached the log.
#[actix_web::test]
async fn an_email_apis_error_text_is_logged_escaped_and_without_addresses() {
    let app = spawn_app().await;
    let server = HttpServer::new(|| {
        App::new().route(
            "/emails",
            web::post().to(|| async {
                HttpResponse::UnprocessableEntity().body(
                    "recipient ana@example.com refused\n2026-12-01T00:00:00Z  INFO forged line",
                )
            }),
        )
    })
    .workers(1)
    .disable_signals()
    .bind("127.0.0.1:0")
    .unwrap();
    let url = format!("http://127.0.0.1:{}/emails", server.addrs()[0].port());
    let server = server.run();
    let handle = server.handle();
    actix_web::rt::spawn(server);
    app.deliver_stripe("payment_intent.succeeded").await;
    let db = app.database.clone();
    let logs = actix_web::rt::task::spawn_blocking(move || {
        let relay = Command::new(sekali_bin())
            .args(["relay", "--relay-poll-interval", "20ms", "--db"])
            .arg(db.arg())
            .env("SEKALI_MAIL_API_URL", &url)
            .env("SEKALI_MAIL_API_KEY", API_KEY)
            .env("SEKALI_MAIL_FROM", FROM)
            .env("RUST_LOG", "info")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        for _ in 0..500 {
            let status = db.texts("SELECT status FROM email_outbox WHERE id = 1");
            if status == ["dead"] {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = Command::new("kill")
            .args(["-TERM", &relay.id().to_string()])
            .status();
        let output = relay.wait_with_output().unwrap();
        String::from_utf8_lossy(&output.stderr).into_owned()
    })
    .await
    .unwrap();
    handle.stop(false).await;
    let failure = logs
        .lines()
        .find(|l| l.contains("failed permanently"))
        .unwrap_or_else(|| panic!("{logs}"));
    assert!(failure.contains("<address> refused\\n2026"), "{failure}");
    assert!(!logs.contains("ana@example.com"), "{logs}");
    assert!(
        !logs.lines().any(|l| l.starts_with("2026-12-01T00:00:00Z")),
        "a forged line: {logs}"
    );
}

/// Fails on the version that read `metadata.locale` as text inside the claim: one order whose
/// locale was a number (an older sekali accepted it) failed every claim, and every email after it
/// stayed pending while the log repeated the error.
#[actix_web::test]
async fn an_order_with_a_locale_that_is_not_text_does_not_stop_anyones_email() {
    let app = spawn_app().await;
    let mock = spawn_mock(always(200)).await;
    // Written as an older version stored it, before POST /orders checked the locale.
    app.database.execute(
        "INSERT INTO orders (order_id, provider, status, amount, currency, created_at,
                             updated_at, last_event_id, source, metadata)
         VALUES ('ord_relay_00000', 'stripe', 'pending', 2500, 'usd', '2026-11-01T10:00:00Z',
                 '2026-11-01T10:00:00Z', 'api:shop', 'api', '{\"locale\": 5}')",
    );
    for n in 0..3 {
        let answer = app
            .deliver_stripe_body(&succeeded_for(n, &format!("c{n}@example.com")))
            .await;
        assert_eq!(answer.outcome(), "processed", "{:?}", answer.body);
    }
    let _relay = start_relay(&app, relay_config(&app.database), http_mail(&mock.url));
    wait_for("every receipt", || mock.seen().len() == 3).await;
    // Recorded once the API answered (the relay records a batch while it sends the next).
    wait_for("every row sent", || {
        app.count("SELECT count(*) FROM email_outbox WHERE status = 'sent'") == 3
    })
    .await;
}

/// A body for order `n` with this receipt email.
fn succeeded_for(n: usize, email: &str) -> Vec<u8> {
    String::from_utf8(fixture("stripe/payment_intent.succeeded.json"))
        .unwrap()
        .replace("evt_1QA0002succeeded000001", &format!("evt_relay_{n:05}"))
        .replace("ord_1001", &format!("ord_relay_{n:05}"))
        .replace("pi_3QA0001Order1001", &format!("pi_relay_{n:05}"))
        .replace("ana@example.com", email)
        .into_bytes()
}

struct SmtpSink {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Drop for SmtpSink {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_smtp_sink() -> SmtpSink {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = Command::new("python3")
        .arg(format!("{}/tests/smtp_sink.py", env!("CARGO_MANIFEST_DIR")))
        .arg(port.to_string())
        .arg(dir.path())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs the SMTP sink");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(
        line.trim(),
        "ready",
        "the SMTP sink starts (aiosmtpd: .ci/test installs it)"
    );
    SmtpSink { child, port, dir }
}

fn smtp_mail(port: u16) -> MailConfig {
    MailConfig {
        smtp_url: Some(SecretString::from(format!("smtp://127.0.0.1:{port}"))),
        http_url: None,
        http_api_key: None,
        mail_dir: std::env::temp_dir(),
        from: FROM.into(),
        timeout: Duration::from_secs(5),
    }
}

#[actix_web::test]
async fn an_smtp_server_that_accepts_but_never_answers_counts_no_try() {
    // It takes the connection and never sends its greeting. The connect, EHLO and AUTH step
    // gives up at half the send timeout, before the relay's own timeout would count a try.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let held = std::thread::spawn(move || {
        let mut connections = Vec::new();
        for stream in silent.incoming().take(3) {
            connections.push(stream);
        }
        std::thread::sleep(Duration::from_secs(10));
    });
    let app = spawn_app().await;
    app.deliver_stripe("payment_intent.succeeded").await;
    let mut config = quick_probes(relay_config(&app.database));
    config.transport_timeout = Duration::from_secs(1);
    let mut mail = smtp_mail(port);
    mail.timeout = Duration::from_secs(1);
    let _relay = start_relay(&app, config, mail);
    wait_for("the silent server to be given up on", || {
        row(&app, 1).last_error.is_some()
    })
    .await;
    let r = row(&app, 1);
    assert_eq!((r.status.as_str(), r.attempts), ("pending", 0), "{r:?}");
    assert!(
        r.last_error
            .as_deref()
            .unwrap()
            .contains("no answer within"),
        "{r:?}"
    );
    drop(held);
}

#[actix_web::test]
async fn smtp_delivery_to_a_real_server_with_a_deterministic_message_id() {
    let app = spawn_app().await;
    let sink = actix_web::rt::task::spawn_blocking(start_smtp_sink)
        .await
        .unwrap();
    app.deliver_stripe_body(&succeeded_for(1, "ana@example.com"))
        .await;
    app.deliver_stripe_body(&succeeded_for(2, "reject@example.com"))
        .await;
    app.deliver_stripe_body(&succeeded_for(3, "tempfail@example.com"))
        .await;
    let _relay = start_relay(&app, relay_config(&app.database), smtp_mail(sink.port));

    wait_for("the first to be sent", || row(&app, 1).status == "sent").await;
    wait_for("the rejected one to die", || row(&app, 2).status == "dead").await;
    let rejected = row(&app, 2);
    assert_eq!(rejected.attempts, 1, "SMTP 5xx to RCPT is permanent");
    assert!(rejected.last_error.unwrap().contains("550"));
    for failures in 1..=2 {
        wait_for("a 451", || row(&app, 3).attempts == failures).await;
        app.clock.advance(Duration::from_secs(8));
    }
    wait_for("the tempfail one to be sent", || {
        row(&app, 3).status == "sent"
    })
    .await;
    assert_eq!(row(&app, 3).attempts, 3);

    let received: Vec<String> = std::fs::read_dir(sink.dir.path())
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect();
    assert_eq!(received.len(), 2);
    let first = received
        .iter()
        .find(|m| m.contains("To: ana@example.com"))
        .expect("ana's receipt");
    assert!(
        first.contains(&format!("Message-ID: <{}@sekali.test>", row(&app, 1).key)),
        "{first}"
    );
    assert!(first.contains("Payment received for order ord_relay_00001"));
    assert!(first.contains("$25.00"));
}

#[actix_web::test]
async fn an_smtp_server_that_cannot_be_reached_never_kills_a_row() {
    let app = spawn_app().await;
    let closed = free_port();
    app.deliver_stripe("payment_intent.succeeded").await;
    let config = quick_probes(relay_config(&app.database));
    let limit = config.max_attempts;
    let _relay = start_relay(&app, config, smtp_mail(closed));
    wait_for("a connection failure", || row(&app, 1).last_error.is_some()).await;
    // Dozens of probes at these millisecond pauses, more than the attempt limit: none is a try.
    actix_web::rt::time::sleep(Duration::from_secs(1)).await;
    let r = row(&app, 1);
    assert_eq!((r.status.as_str(), r.attempts), ("pending", 0), "{r:?}");
    assert!(r.attempts < i64::from(limit));
    assert!(r
        .last_error
        .unwrap()
        .contains("connecting to the SMTP server"));
}

#[actix_web::test]
async fn a_wrong_smtp_password_counts_against_no_row() {
    let app = spawn_app().await;
    let sink = actix_web::rt::task::spawn_blocking(start_smtp_sink)
        .await
        .unwrap();
    app.deliver_stripe("payment_intent.succeeded").await;
    let mut mail = smtp_mail(sink.port);
    mail.smtp_url = Some(SecretString::from(format!(
        "smtp://sekali:wrong-password@127.0.0.1:{}",
        sink.port
    )));
    let relay = start_relay(&app, relay_config(&app.database), mail);
    wait_for("a refused login", || row(&app, 1).last_error.is_some()).await;
    let r = row(&app, 1);
    assert_eq!(
        (r.status.as_str(), r.attempts),
        ("pending", 0),
        "an authentication failure is not a try of the row, and must not kill it"
    );
    let error = r.last_error.unwrap();
    assert!(
        error.contains("connecting to the SMTP server") && error.contains("535"),
        "{error}"
    );
    assert!(
        !error.contains("wrong-password"),
        "the password is never recorded"
    );
    drop(relay);

    let mut mail = smtp_mail(sink.port);
    mail.smtp_url = Some(SecretString::from(format!(
        "smtp://sekali:right-password@127.0.0.1:{}",
        sink.port
    )));
    app.clock.advance(Duration::from_secs(8));
    let _relay = start_relay(&app, relay_config(&app.database), mail);
    wait_for("the row to be sent", || row(&app, 1).status == "sent").await;
}

#[test]
fn serve_refuses_relay_settings_that_outlive_the_downstream_key() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::fresh(dir.path().join("s.db"));
    let output = Command::new(sekali_bin())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--relay-max-attempts",
            "40",
            "--db",
        ])
        .arg(db.arg())
        .env("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET)
        .env("SEKALI_MAIL_API_URL", "http://127.0.0.1:9/emails")
        .env("SEKALI_MAIL_API_KEY", API_KEY)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("24 h lifetime"), "{stderr}");
}

/// `sekali relay` as a child process against the mock.
fn spawn_relay_process(db: &Database, mock_url: &str) -> Child {
    Command::new(sekali_bin())
        .args([
            "relay",
            "--relay-base-delay",
            "20ms",
            "--relay-max-delay",
            "200ms",
            "--relay-lease",
            "3s",
            "--relay-timeout",
            "2s",
            "--relay-poll-interval",
            "20ms",
            "--relay-max-attempts",
            "25",
            "--db",
        ])
        .arg(db.arg())
        .env("SEKALI_MAIL_API_URL", mock_url)
        .env("SEKALI_MAIL_API_KEY", API_KEY)
        .env("SEKALI_MAIL_FROM", FROM)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

async fn deliver_many(app: &TestApp, count: usize) {
    for chunk in (0..count).collect::<Vec<_>>().chunks(200) {
        let bodies: Vec<Vec<u8>> = chunk
            .iter()
            .map(|n| succeeded_for(*n, &format!("c{n}@example.com")))
            .collect();
        let answers = join_all(bodies.iter().map(|b| app.deliver_stripe_body(b))).await;
        assert!(answers.iter().all(|a| a.status == 200));
    }
}

fn counts_by_status(app: &TestApp) -> HashMap<String, i64> {
    let rows = app.query("SELECT status, count(*) FROM email_outbox GROUP BY status");
    rows.into_iter()
        .map(|r| {
            (
                r[0].clone().unwrap(),
                r[1].as_deref().unwrap().parse().unwrap(),
            )
        })
        .collect()
}

fn all_keys(app: &TestApp) -> Vec<String> {
    app.texts("SELECT idempotency_key FROM email_outbox")
}

#[actix_web::test]
async fn relay_chaos_every_row_ends_sent_or_dead_and_resends_carry_the_same_key() {
    let rows = 3000;
    let app = spawn_app().await;
    deliver_many(&app, rows).await;
    // A fifth of requests fail with 503; one in seven answers slowly.
    let mock = spawn_mock(Arc::new(|seen: &Seen, attempt| {
        let h = seen.key.bytes().fold(attempt as u64, |h, b| {
            h.wrapping_mul(31).wrapping_add(b as u64)
        });
        let status = if h % 5 == 0 { 503 } else { 200 };
        let delay = if h % 7 == 0 {
            Duration::from_millis(150)
        } else {
            Duration::ZERO
        };
        (status, None, delay)
    }))
    .await;
    let mut rng = fastrand::Rng::with_seed(7);
    let mut relay = spawn_relay_process(&app.database, &mock.url);
    for _ in 0..6 {
        actix_web::rt::time::sleep(Duration::from_millis(rng.u64(150..600))).await;
        relay.kill().unwrap(); // SIGKILL
        relay.wait().unwrap();
        relay = spawn_relay_process(&app.database, &mock.url);
    }
    let mut done = false;
    for _ in 0..600 {
        let counts = counts_by_status(&app);
        if counts.get("pending").copied().unwrap_or(0) == 0 {
            done = true;
            break;
        }
        actix_web::rt::time::sleep(Duration::from_millis(100)).await;
    }
    relay.kill().unwrap();
    relay.wait().unwrap();
    let counts = counts_by_status(&app);
    assert!(done, "rows still pending: {counts:?}");
    assert_eq!(
        counts.get("sent").copied().unwrap_or(0) + counts.get("dead").copied().unwrap_or(0),
        rows as i64
    );

    let seen = mock.seen();
    let mut by_key: HashMap<&str, Vec<&Seen>> = HashMap::new();
    for s in &seen {
        by_key.entry(s.key.as_str()).or_default().push(s);
    }
    for key in all_keys(&app) {
        let requests = by_key
            .get(key.as_str())
            .unwrap_or_else(|| panic!("the mock never saw {key}"));
        for request in requests {
            assert_eq!(
                request.message_id,
                format!("<{key}@sekali.test>"),
                "a resend is recognisable by its key"
            );
            assert_eq!(
                (&request.to, &request.subject),
                (&requests[0].to, &requests[0].subject)
            );
        }
    }
    println!(
        "relay chaos: {rows} rows, {} requests, {counts:?}",
        seen.len()
    );
}

#[actix_web::test]
async fn two_relays_on_one_database_never_send_a_row_twice() {
    let rows = 400;
    let app = spawn_app().await;
    deliver_many(&app, rows).await;
    let mock = spawn_mock(Arc::new(|_, _| (200, None, Duration::from_millis(5)))).await;
    let mut first = spawn_relay_process(&app.database, &mock.url);
    let mut second = spawn_relay_process(&app.database, &mock.url);
    wait_for("every row to be sent", || {
        counts_by_status(&app).get("sent").copied() == Some(rows as i64)
    })
    .await;
    for relay in [&mut first, &mut second] {
        relay.kill().unwrap();
        relay.wait().unwrap();
    }
    let seen = mock.seen();
    let mut per_key: HashMap<&str, usize> = HashMap::new();
    for s in &seen {
        *per_key.entry(s.key.as_str()).or_default() += 1;
    }
    assert_eq!(per_key.len(), rows);
    assert!(
        per_key.values().all(|n| *n == 1),
        "a row was sent by both relays"
    );
}

/// Delivers `count` distinct Stripe payments through `base` (a served URL), 32 at a time.
fn deliver_over_http(base: &str, count: usize) {
    let url = format!("{base}/webhooks/stripe");
    for chunk in (0..count).collect::<Vec<_>>().chunks(32) {
        let threads: Vec<_> = chunk
            .iter()
            .map(|&n| {
                let url = url.clone();
                std::thread::spawn(move || {
                    let body = succeeded_for(n, &format!("c{n}@example.com"));
                    let header = stripe_header(&body, sekali::clock::SystemClock.now_unix());
                    ureq::post(&url)
                        .set("Stripe-Signature", &header)
                        .set("Content-Type", "application/json")
                        .send_bytes(&body)
                        .unwrap()
                        .status()
                })
            })
            .collect();
        for thread in threads {
            assert_eq!(thread.join().unwrap(), 200);
        }
    }
}

/// Waits up to 30 s until `count` emails in `db` are `sent`.
fn wait_until_sent(db: &Database, count: i64) {
    let sent = || db.count("SELECT count(*) FROM email_outbox WHERE status = 'sent'");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while sent() < count {
        assert!(std::time::Instant::now() < deadline, "only {} sent", sent());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Fails on the version whose relay opened a write connection of its own and recorded each
/// row in a transaction of its own: it fought the writer for SQLite's lock and paid an fsync
/// per email.
#[test]
fn serve_sends_every_email_through_its_one_write_connection_recording_results_in_batches() {
    let server = ServeProcess::start(&[("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET)], "info");
    deliver_over_http(&server.base_url(), 300);
    wait_until_sent(server.db(), 300);
    let health: serde_json::Value = serde_json::from_str(
        &ureq::get(&format!("{}/healthz", server.base_url()))
            .call()
            .unwrap()
            .into_string()
            .unwrap(),
    )
    .unwrap();
    // One per writer: SQLite's one, or each of an instance's PostgreSQL writers.
    let writers = match server.db() {
        Database::File(_) => 1,
        Database::Server(_) => sekali::store::postgres::writer::DEFAULT_WRITERS,
    };
    assert_eq!(health["write_connections_opened"], writers, "{health}");
    let writer = &health["writer"];
    assert_eq!(writer["deliveries"], 300, "{health}");
    assert_eq!(writer["outbox_results"], 300, "{health}");
    assert_eq!(writer["outbox_claimed_rows"], 300, "{health}");
    let batches = writer["outbox_result_batches"].as_u64().unwrap();
    assert!(
        (1..=30).contains(&batches),
        "300 results in {batches} batches: {health}"
    );
    let emails = std::fs::read_dir(server.mail_dir())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".eml"))
        .count();
    assert_eq!(emails, 300);
}

/// Watches `sent` rows rise while a relay sends 64 pending rows: every count a reader sees.
fn counts_seen_while_sending(db: &Database, until: i64) -> std::collections::BTreeSet<i64> {
    let mut seen = std::collections::BTreeSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let sent = db.count("SELECT count(*) FROM email_outbox WHERE status = 'sent'");
        seen.insert(sent);
        if sent == until {
            return seen;
        }
        assert!(std::time::Instant::now() < deadline, "{seen:?}");
    }
}

/// Fails on the version that committed each row's result alone: a reader saw the batch's rows
/// turn `sent` one by one (one fsync each). `sekali relay`, on its own connection, records a
/// batch in one transaction too. With the HTTP API a batch is 32 rows, so a reader sees 0, 32
/// and 64 sent, and nothing in between.
#[actix_web::test]
async fn a_reader_sees_a_batch_of_results_commit_at_once_for_sekali_relay_and_for_serve() {
    for through_the_writer in [false, true] {
        let app = spawn_app().await;
        deliver_many(&app, 64).await;
        let mock = spawn_mock(always(200)).await;
        let db = app.database.clone();
        let watcher = std::thread::spawn(move || counts_seen_while_sending(&db, 64));
        let mut child = None;
        let _relay = if through_the_writer {
            let mut config = relay_config(&app.database);
            config.batch = sekali::jobs::relay::NETWORK_BATCH;
            Some(start_relay(&app, config, http_mail(&mock.url)))
        } else {
            child = Some(spawn_relay_process(&app.database, &mock.url));
            None
        };
        let seen = actix_web::rt::task::spawn_blocking(move || watcher.join().unwrap())
            .await
            .unwrap();
        if let Some(mut child) = child {
            let _ = child.kill();
            let _ = child.wait();
        }
        // (Through the writer, two batches' results can share a commit: 0 and 64 only.)
        assert!(
            seen.iter().all(|sent| sent % 32 == 0),
            "through the writer: {through_the_writer}: {seen:?}"
        );
    }
}

/// Runs `sekali relay` on `db` under `limit` (a `ulimit` option and value, e.g. `-Sn 128`)
/// until its backlog is gone or a row fails; returns (rows sent on their first try, all rows,
/// `.eml` files, the relay's log).
fn relay_under_open_file_limit(
    db: &Database,
    mail: &Path,
    limit: &str,
) -> (i64, i64, usize, String) {
    let log = mail.with_extension("relay.log");
    let mut relay = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit {limit} && exec \"$0\" \"$@\""))
        .arg(sekali_bin())
        .args(["relay", "--relay-poll-interval", "20ms", "--db"])
        .arg(db.arg())
        .arg("--mail-dir")
        .arg(mail)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let count = |sql: &str| db.count(sql);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    // Done when nothing is pending, or when a row failed (its retry would come 30 s later).
    while count("SELECT count(*) FROM email_outbox WHERE status = 'pending' AND last_error IS NULL")
        > 0
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = Command::new("kill").arg(relay.id().to_string()).status();
    let _ = relay.wait();
    let files = std::fs::read_dir(mail)
        .map(|d| d.filter_map(Result::ok).count())
        .unwrap_or(0);
    (
        count("SELECT count(*) FROM email_outbox WHERE status = 'sent' AND attempts = 1"),
        count("SELECT count(*) FROM email_outbox"),
        files,
        std::fs::read_to_string(&log).unwrap(),
    )
}

/// A mail directory keeps a file open per email of a batch until it is named, and `sekali
/// relay` writes 4,096 at once. Fails on the version that took the open-file limit as it came:
/// under the usual soft limit of 1,024, most of each batch failed with "Too many open files"
/// and waited for a retry. The relay now raises the soft limit to the hard one, and where the
/// hard limit is low too, it claims fewer rows per batch.
#[actix_web::test]
async fn sekali_relay_sends_a_large_backlog_under_a_low_open_file_limit() {
    for limit in ["-Sn 128", "-n 128"] {
        let app = spawn_app().await;
        deliver_many(&app, 1500).await;
        let mail = app.dir().join(format!("mail{}", limit.len()));
        let db = app.database.clone();
        let (first_try, rows, files, log) = actix_web::rt::task::spawn_blocking(move || {
            relay_under_open_file_limit(&db, &mail, limit)
        })
        .await
        .unwrap();
        assert_eq!(rows, 1500);
        assert_eq!(
            (first_try, files),
            (1500, 1500),
            "ulimit {limit}: every email sent on its first try, each one file; the relay's log:\n{}",
            log.lines().take(5).collect::<Vec<_>>().join("\n")
        );
        // Raised to the hard limit (which the relay inherits from this test) where it can be;
        // a quarter of it per batch, and at most 4,096.
        let hard = hard_open_file_limit();
        let batch = match limit {
            "-n 128" => 32,
            _ => (hard / 4).min(4096),
        };
        assert!(
            log.contains(&format!("batch={batch}")),
            "ulimit {limit}: {log}"
        );
    }
}

/// This process's hard limit on open files, which the servers it starts inherit.
fn hard_open_file_limit() -> u64 {
    rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .maximum
        .unwrap_or(u64::MAX)
}

/// `serve` takes the open files the system allows it too: its relay writes a file per email of a
/// batch, and each connection is a socket. Fails on the version that kept the soft limit it was
/// started with.
#[test]
fn serve_raises_its_open_file_limit_to_the_hard_limit() {
    let hard = hard_open_file_limit();
    let soft = (hard / 2).min(256);
    let dir = tempfile::tempdir().unwrap();
    let db = Database::fresh(dir.path().join("s.db"));
    let mut server = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -Sn {soft} && exec \"$0\" \"$@\""))
        .arg(sekali_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--db"])
        .arg(db.arg())
        .arg("--mail-dir")
        .arg(dir.path().join("mail"))
        .env("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // `exec`: the shell's process is the server's. (soft, hard) as /proc shows them.
    let limits = || -> Option<(u64, u64)> {
        let text = std::fs::read_to_string(format!("/proc/{}/limits", server.id())).ok()?;
        let line = text.lines().find(|l| l.starts_with("Max open files"))?;
        let mut numbers = line
            .split_whitespace()
            .filter_map(|word| word.parse::<u64>().ok());
        Some((numbers.next()?, numbers.next()?))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut seen = limits();
    while seen != Some((hard, hard)) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        seen = limits();
    }
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(
        seen,
        Some((hard, hard)),
        "started with a soft limit of {soft}"
    );
}

/// A thread's name and nice value, from its `stat` file in /proc.
fn name_and_nice(task: &Path) -> Option<(String, i32)> {
    let stat = std::fs::read_to_string(task.join("stat")).ok()?;
    // "tid (name) state ppid …": the name may hold spaces and parentheses; the nice value is
    // the 19th field, the 17th after the name.
    let (head, rest) = stat.rsplit_once(')')?;
    let name = head.split_once('(')?.1.to_string();
    let nice = rest.split_whitespace().nth(16)?.parse().ok()?;
    Some((name, nice))
}

/// Each thread of process `pid`: its name and its nice value.
fn threads_with_nice(pid: u32) -> Vec<(String, i32)> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|task| name_and_nice(&task.ok()?.path()))
        .collect()
}

/// Webhooks first on the CPU too: `serve`'s relay thread, and the threads its event loop starts
/// to render and write emails, run ten nice steps below the server's own threads, which take
/// the deliveries. Fails on the version whose relay competed with them as an equal.
#[test]
fn serves_relay_renders_and_writes_emails_at_a_lower_cpu_priority_than_deliveries() {
    let server = ServeProcess::start(&[("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET)], "info");
    deliver_over_http(&server.base_url(), 40);
    wait_until_sent(server.db(), 40);
    let threads = threads_with_nice(server.pid());
    let nice_of = |name: &str| -> Vec<i32> {
        threads
            .iter()
            .filter(|(n, _)| n.starts_with(name))
            .map(|&(_, nice)| nice)
            .collect()
    };
    // The main thread keeps the nice value the server was started with.
    let pid = server.pid();
    let (_, base) = name_and_nice(Path::new(&format!("/proc/{pid}/task/{pid}"))).unwrap();
    let lowered = (base + sekali::jobs::relay::RELAY_NICE_STEPS).min(19);
    assert!(
        lowered > base,
        "started at nice {base}: nothing lower to test"
    );
    assert_eq!(nice_of("sekali-relay"), vec![lowered], "{threads:?}");
    // The writer: sekali-writer on SQLite, sekali-pg-writer on PostgreSQL (a thread's name is
    // cut to 15 bytes).
    let writer = match server.db() {
        Database::File(_) => "sekali-writer",
        Database::Server(_) => "sekali-pg-write",
    };
    // Each of them: SQLite has one writer, a PostgreSQL instance several.
    let writers = nice_of(writer);
    assert!(
        !writers.is_empty() && writers.iter().all(|&n| n == base),
        "{threads:?}"
    );
    let workers = nice_of("actix-rt");
    assert!(
        !workers.is_empty() && workers.iter().all(|&n| n == base),
        "the HTTP workers: {threads:?}"
    );
    // The relay's event loop rendered and wrote the 40 emails on threads it started.
    let relay_helpers = threads
        .iter()
        .filter(|(name, nice)| !name.starts_with("sekali-relay") && *nice == lowered)
        .count();
    assert!(relay_helpers >= 1, "{threads:?}");
}
