//! The confirmation of Midtrans notifications by Midtrans's status API, against a stand-in of
//! that API: an HTTP server on a free loopback port serving `GET /v2/{id}/status` (a
//! `transaction_id`, or an `order_id` for the order's latest transaction) the way Midtrans
//! documents it (Basic auth with the server key as user and an empty password; the
//! documented 401 body for any other key; the documented 404 body for an unknown transaction,
//! under HTTP 200 as Midtrans's OpenAPI lists it or under HTTP 404), answering for each order
//! what the test says Midtrans reports now, and recording every request it gets.
//!
//! The signature of a notification covers `order_id + status_code + gross_amount` only: a
//! `refund` can be sent with the signature of the order's `settlement`. Every test here says, in
//! a comment, which of its assertions a server that does not ask the API (or does not check the
//! status code) would fail.

use std::collections::{HashMap, VecDeque};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::dev::ServerHandle;
use actix_web::http::StatusCode;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use secrecy::SecretString;
use sekali::clients::midtrans_status::StatusApi;
use sekali::config::Settings;
use sekali::providers::midtrans::Midtrans as MidtransProvider;
use sekali::providers::stripe::Stripe;
use sekali::providers::Providers;
use serde_json::{json, Value};

use crate::helpers::*;

/// What a notification the API did not confirm is answered with (a 503).
use sekali::routes::NOT_CONFIRMED;

/// `Basic base64(MIDTRANS_KEY + ":")`, computed with coreutils:
/// `printf '%s:' SB-Mid-server-sekali-test-key | base64`.
const MIDTRANS_KEY_BASIC_AUTH: &str = "Basic U0ItTWlkLXNlcnZlci1zZWthbGktdGVzdC1rZXk6";

// ---------------------------------------------------------------------------------------------
// The stand-in of Midtrans's status API.
// ---------------------------------------------------------------------------------------------

/// One request the stand-in received.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    /// The path as sent (percent-encoded).
    path: String,
    /// The id the path names, percent-decoded: a transaction id or an order id.
    id: String,
    /// The order that id is of (the id itself when the stand-in knows no such transaction).
    order_id: String,
    authorization: Option<String>,
    accept: Option<String>,
}

/// An answer that takes precedence over the reports: a fault of the API itself (an HTTP 500, a
/// gateway's HTML page, an answer slower than sekali waits, a redirect elsewhere).
#[derive(Debug, Clone, Default)]
struct Fault {
    status: u16,
    content_type: &'static str,
    body: String,
    delay: Duration,
    location: Option<String>,
}

/// What the stand-in knows.
struct Midtrans {
    /// What Midtrans reports now, by the id it is asked with: for each order its latest
    /// transaction, and for each transaction its own status (the body of `GET /v2/{id}/status`).
    reports: HashMap<String, Value>,
    /// The server key it accepts as Basic auth user.
    accepted_key: String,
    /// The HTTP status the documented 404 body comes with (200 per Midtrans's OpenAPI, or 404).
    not_found_http: u16,
    faults: VecDeque<Fault>,
    seen: Vec<Seen>,
}

struct StandIn {
    url: String,
    state: Arc<Mutex<Midtrans>>,
    handle: ServerHandle,
}

impl StandIn {
    /// On a free port.
    fn start() -> Self {
        Self::start_listening(TcpListener::bind("127.0.0.1:0").unwrap())
    }

    /// On `port` (one a server was already told about while nothing listened there).
    fn start_on(port: u16) -> Self {
        Self::start_listening(TcpListener::bind(("127.0.0.1", port)).unwrap())
    }

    /// Runs on a thread of its own with its own runtime, so that it answers whether the test
    /// awaits (an in-process app) or blocks (a `sekali serve` child driven with ureq).
    fn start_listening(listener: TcpListener) -> Self {
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(Midtrans {
            reports: HashMap::new(),
            accepted_key: MIDTRANS_KEY.to_owned(),
            not_found_http: 200,
            faults: VecDeque::new(),
            seen: Vec::new(),
        }));
        let data = web::Data::from(state.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                let server = HttpServer::new(move || {
                    App::new()
                        .app_data(data.clone())
                        .route("/v2/{order_id}/status", web::get().to(transaction_status))
                        .default_service(web::to(|| async {
                            HttpResponse::NotFound()
                                .content_type("text/html")
                                .body("<html><body><h1>404 Not Found</h1></body></html>")
                        }))
                })
                .workers(1)
                .disable_signals()
                .listen(listener)
                .unwrap()
                .run();
                tx.send(server.handle()).unwrap();
                let _ = server.await;
            });
        });
        StandIn {
            url: format!("http://127.0.0.1:{port}"),
            state,
            handle: rx.recv().unwrap(),
        }
    }

    /// From now on Midtrans reports for `order_id` the answer in
    /// `fixtures/midtrans/status/{name}.json`.
    fn reports(&self, order_id: &str, name: &str) {
        let answer: Value =
            serde_json::from_slice(&fixture(&format!("midtrans/status/{name}.json"))).unwrap();
        assert_eq!(answer["order_id"], order_id, "status/{name}.json");
        self.reports_value(order_id, answer);
    }

    /// From now on Midtrans reports `answer` for `order_id` (its latest transaction) and for the
    /// transaction the answer names.
    fn reports_value(&self, order_id: &str, answer: Value) {
        let mut midtrans = self.state.lock().unwrap();
        if let Some(transaction) = answer["transaction_id"].as_str() {
            midtrans
                .reports
                .insert(transaction.to_owned(), answer.clone());
        }
        midtrans.reports.insert(order_id.to_owned(), answer);
    }

    /// From now on Midtrans reports `answer` for the transaction it names only: an earlier
    /// attempt of an order whose latest transaction is another.
    fn reports_transaction(&self, answer: Value) {
        let transaction = answer["transaction_id"].as_str().unwrap().to_owned();
        self.state
            .lock()
            .unwrap()
            .reports
            .insert(transaction, answer);
    }

    /// Accepts only `key` (another environment's server key) from now on.
    fn accepts_only(&self, key: &str) {
        self.state.lock().unwrap().accepted_key = key.to_owned();
    }

    fn not_found_with_http(&self, status: u16) {
        self.state.lock().unwrap().not_found_http = status;
    }

    /// The next request is answered with `fault`, whatever it asks.
    fn then_fails(&self, fault: Fault) {
        self.state.lock().unwrap().faults.push_back(fault);
    }

    fn seen(&self) -> Vec<Seen> {
        self.state.lock().unwrap().seen.clone()
    }

    /// How many requests asked about `id`: by that id, or by a transaction of that order.
    fn asked_about(&self, id: &str) -> usize {
        self.seen()
            .iter()
            .filter(|s| s.id == id || s.order_id == id)
            .count()
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        // The command is sent when `stop` is called, not when its future is awaited; the
        // thread ends when the server has stopped.
        drop(self.handle.stop(false));
    }
}

/// `GET /v2/{order_id}/status`, as Midtrans answers it.
async fn transaction_status(req: HttpRequest, state: web::Data<Mutex<Midtrans>>) -> HttpResponse {
    let path = req.uri().path().to_owned();
    let raw = path
        .strip_prefix("/v2/")
        .and_then(|p| p.strip_suffix("/status"))
        .unwrap_or_default();
    let id = percent_encoding::percent_decode_str(raw)
        .decode_utf8_lossy()
        .into_owned();
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let authorization = header("authorization");
    let (status, content_type, body, delay, location) = {
        let mut midtrans = state.lock().unwrap();
        let order_id = midtrans
            .reports
            .get(&id)
            .and_then(|report| report["order_id"].as_str())
            .unwrap_or(&id)
            .to_owned();
        midtrans.seen.push(Seen {
            method: req.method().to_string(),
            path: path.clone(),
            id: id.clone(),
            order_id,
            authorization: authorization.clone(),
            accept: header("accept"),
        });
        if let Some(fault) = midtrans.faults.pop_front() {
            let Fault {
                status,
                content_type,
                body,
                delay,
                location,
            } = fault;
            (status, content_type, body, delay, location)
        } else if authorization.as_deref() != Some(basic_auth(&midtrans.accepted_key).as_str()) {
            let body = status_fixture("unauthorized");
            (401, "application/json", body, Duration::ZERO, None)
        } else if let Some(report) = midtrans.reports.get(&id) {
            (
                200,
                "application/json",
                report.to_string(),
                Duration::ZERO,
                None,
            )
        } else {
            let body = status_fixture("not_found");
            let status = midtrans.not_found_http;
            (status, "application/json", body, Duration::ZERO, None)
        }
    };
    if !delay.is_zero() {
        actix_web::rt::time::sleep(delay).await;
    }
    let mut response = HttpResponse::build(StatusCode::from_u16(status).unwrap());
    if let Some(location) = location {
        response.insert_header(("Location", location));
    }
    response.content_type(content_type).body(body)
}

fn status_fixture(name: &str) -> String {
    String::from_utf8(fixture(&format!("midtrans/status/{name}.json"))).unwrap()
}

/// `Basic base64(key + ":")`: Midtrans's AUTH_STRING, the server key as user, no password.
fn basic_auth(key: &str) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes = format!("{key}:").into_bytes();
    let mut encoded = String::from("Basic ");
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                encoded.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                encoded.push('=');
            }
        }
    }
    encoded
}

// ---------------------------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------------------------

/// Settings that turn the check on against `base_url`, with a short timeout.
fn checking(base_url: &str, timeout: Duration) -> impl FnOnce(&mut Settings) {
    let base_url = base_url.to_owned();
    move |settings| {
        settings.providers = Providers::from_list(vec![
            Arc::new(Stripe::with_secrets(&[STRIPE_SECRET])),
            Arc::new(MidtransProvider::with_key(
                MIDTRANS_KEY,
                Some(StatusApi {
                    base_url,
                    server_key: SecretString::from(MIDTRANS_KEY),
                    timeout,
                    metrics: Default::default(),
                }),
            )),
        ])
    }
}

/// An in-process server that asks `stand_in` about every Midtrans notification.
async fn spawn_checking_app(stand_in: &StandIn) -> TestApp {
    spawn_app_with(checking(&stand_in.url, Duration::from_secs(2))).await
}

/// A notification fixture, as JSON to change.
fn notification(name: &str) -> Value {
    serde_json::from_slice(&fixture(&format!("midtrans/{name}.json"))).unwrap()
}

/// `value` signed with the test key, as Midtrans would send it.
fn signed(value: &Value) -> Vec<u8> {
    sign_midtrans(&serde_json::to_vec(value).unwrap())
}

fn signature_of(body: &[u8]) -> String {
    let value: Value = serde_json::from_slice(body).unwrap();
    value["signature_key"].as_str().unwrap().to_owned()
}

/// `value` carrying the signature of `signed_body` (which verifies when order_id, status_code
/// and gross_amount are the same: nothing else is signed).
fn with_signature_of(mut value: Value, signed_body: &[u8]) -> Vec<u8> {
    value["signature_key"] = signature_of(signed_body).into();
    serde_json::to_vec(&value).unwrap()
}

impl TestApp {
    async fn notify(&self, body: &[u8]) -> Answer {
        self.post("/webhooks/midtrans", body.to_vec(), &[]).await
    }
}

/// POSTs a notification to a `sekali serve` child.
fn notify_serve(server: &ServeProcess, body: &[u8]) -> Answer {
    let response = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(15))
        .build()
        .post(&format!("{}/webhooks/midtrans", server.base_url()))
        .set("Content-Type", "application/json")
        .send_bytes(body);
    let response = match response {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{e}"),
    };
    let status = response.status();
    let body = serde_json::from_str(&response.into_string().unwrap()).unwrap_or(Value::Null);
    Answer { status, body }
}

/// `sekali serve` with the check on (the override ServeProcess sets turned back) against
/// `stand_in`.
fn serve_checking(stand_in: &StandIn, rust_log: &str) -> ServeProcess {
    ServeProcess::start(
        &[
            ("MIDTRANS_SERVER_KEY", MIDTRANS_KEY),
            ("SEKALI_MIDTRANS_STATUS_CHECK", "on"),
            ("MIDTRANS_API_URL", &stand_in.url),
        ],
        rust_log,
    )
}

/// A refund of all of ORDER-2001 that Midtrans never made, carrying the signature of the
/// order's real settlement (same order_id, status_code 200 and gross_amount, so it verifies).
fn forged_refund_of_order_2001() -> Vec<u8> {
    let settlement = sign_midtrans(&fixture("midtrans/settlement.json"));
    let mut refund = notification("settlement");
    refund["transaction_status"] = "refund".into();
    refund["refund_amount"] = "150000.00".into();
    refund["refunds"] = json!([{
        "refund_chargeback_id": 3999,
        "refund_amount": "150000.00",
        "created_at": "2026-11-29 12:30:00",
        "reason": "forged",
        "refund_key": "rf-forged-1",
        "refund_method": ""
    }]);
    let forged = with_signature_of(refund, &settlement);
    // It is, byte for byte, what signing it properly gives: the signature cannot tell.
    assert_eq!(signature_of(&forged), signature_of(&sign_midtrans(&forged)));
    forged
}

// ---------------------------------------------------------------------------------------------
// The tests.
// ---------------------------------------------------------------------------------------------

#[test]
fn the_stand_in_expects_midtrans_documented_auth_string() {
    assert_eq!(basic_auth(MIDTRANS_KEY), MIDTRANS_KEY_BASIC_AUTH);
    assert_eq!(basic_auth("a"), "Basic YTo=");
    assert_eq!(basic_auth("ab"), "Basic YWI6");
}

#[actix_web::test]
async fn a_settlement_the_api_confirms_is_applied_after_one_authenticated_status_request() {
    let midtrans = StandIn::start();
    midtrans.reports("ORDER-2001", "settlement");
    let app = spawn_checking_app(&midtrans).await;

    let answer = app.deliver_midtrans("settlement").await;
    assert_eq!(
        (answer.status, answer.outcome()),
        (200, "processed"),
        "{answer:?}"
    );
    // Confirmed, it keeps the id it would have had unconfirmed.
    assert_eq!(answer.body["event_id"], "ORDER-2001:settlement:200:accept");
    assert_eq!(app.order("ORDER-2001"), ("paid".into(), 15_000_000, 0));
    assert_eq!(app.outbox_templates("ORDER-2001"), ["receipt"]);

    // Without the check, the stand-in is never asked: this fails (0 requests).
    let seen = midtrans.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let request = &seen[0];
    assert_eq!(request.method, "GET");
    assert_eq!(request.order_id, "ORDER-2001", "{request:?}");
    assert!(
        request.path.starts_with("/v2/") && request.path.ends_with("/status"),
        "{request:?}"
    );
    assert_eq!(
        request.authorization.as_deref(),
        Some(MIDTRANS_KEY_BASIC_AUTH)
    );
    assert_eq!(request.accept.as_deref(), Some("application/json"));

    // Midtrans's retry is asked about again and is a duplicate: no second receipt.
    let retry = app.deliver_midtrans("settlement").await;
    assert_eq!((retry.status, retry.outcome()), (200, "duplicate"));
    assert_eq!(midtrans.asked_about("ORDER-2001"), 2);
    assert_eq!(app.row_counts(), (1, 1, 1));
}

#[actix_web::test]
async fn a_refund_carrying_a_settlements_signature_is_not_applied_while_the_api_reports_settlement()
{
    let midtrans = StandIn::start();
    midtrans.reports("ORDER-2001", "settlement");
    let app = spawn_checking_app(&midtrans).await;
    assert_eq!(
        app.deliver_midtrans("settlement").await.outcome(),
        "processed"
    );

    let answer = app.notify(&forged_refund_of_order_2001()).await;
    // Without the check the forged refund verifies and is applied: this fails (200 processed,
    // the order refunded and a refund notice queued to the customer).
    assert_eq!(answer.status, 503, "{answer:?}");
    assert_eq!(answer.error(), NOT_CONFIRMED);
    assert_eq!(app.order("ORDER-2001"), ("paid".into(), 15_000_000, 0));
    assert_eq!(app.outbox_templates("ORDER-2001"), ["receipt"]);
    assert_eq!(app.count("SELECT count(*) FROM processed_events"), 1);
    assert_eq!(midtrans.asked_about("ORDER-2001"), 2);

    // Midtrans's retries of the forgery (by whoever sends it) fare no better.
    let again = app.notify(&forged_refund_of_order_2001()).await;
    assert_eq!(again.status, 503);
    assert_eq!(app.row_counts(), (1, 1, 1));
}

#[actix_web::test]
async fn a_settlement_signed_with_a_pending_or_deny_status_code_is_refused_before_the_api_is_asked()
{
    let midtrans = StandIn::start();
    // What Midtrans reports now: ORDER-2001 still pending, ORDER-2003 denied.
    midtrans.reports("ORDER-2001", "pending");
    midtrans.reports("ORDER-2003", "deny");
    let app = spawn_checking_app(&midtrans).await;

    // The pending notification's signature (status_code 201) on a settlement.
    let pending = sign_midtrans(&fixture("midtrans/pending.json"));
    let mut settlement = notification("pending");
    settlement["transaction_status"] = "settlement".into();
    let answer = app.notify(&with_signature_of(settlement, &pending)).await;
    // Without the status-code check, the API is asked (it says pending: 503), so the status and
    // the empty request log below fail.
    assert_eq!(answer.status, 401, "{answer:?}");
    assert!(
        answer
            .error()
            .contains("transaction_status `settlement` comes with status_code 200, not 201"),
        "{answer:?}"
    );

    // The deny's signature (status_code 202) on a settlement.
    let deny = sign_midtrans(&fixture("midtrans/deny.json"));
    let mut settlement = notification("deny");
    settlement["transaction_status"] = "settlement".into();
    settlement["fraud_status"] = "accept".into();
    let answer = app.notify(&with_signature_of(settlement, &deny)).await;
    assert_eq!(answer.status, 401, "{answer:?}");
    assert!(
        answer
            .error()
            .contains("transaction_status `settlement` comes with status_code 200, not 202"),
        "{answer:?}"
    );

    // And a notification whose signature is not ours at all is not worth a request either.
    let foreign = sekali::providers::midtrans::with_signature_key(
        &fixture("midtrans/pending.json"),
        "SB-Mid-server-not-ours",
    )
    .unwrap();
    let answer = app.notify(&foreign).await;
    assert_eq!(answer.status, 401, "{answer:?}");
    assert_eq!(answer.error(), "signature_key does not match");

    assert!(midtrans.seen().is_empty(), "{:?}", midtrans.seen());
    assert_eq!(app.row_counts(), (0, 0, 0));
}

#[actix_web::test]
async fn an_unreachable_status_api_is_answered_503_and_midtrans_retry_is_applied_once_it_answers() {
    // Nothing listens on this port yet.
    let port = free_port();
    let app = spawn_app_with(checking(
        &format!("http://127.0.0.1:{port}"),
        Duration::from_secs(2),
    ))
    .await;
    let body = sign_midtrans(&fixture("midtrans/settlement.json"));

    let answer = app.notify(&body).await;
    // Without the check the settlement is applied at once: this fails (200 processed).
    assert_eq!(answer.status, 503, "{answer:?}");
    assert_eq!(answer.error(), NOT_CONFIRMED);
    assert_eq!(app.row_counts(), (0, 0, 0));

    // The API comes back on that port; Midtrans retries the same body.
    let midtrans = StandIn::start_on(port);
    midtrans.reports("ORDER-2001", "settlement");
    let retry = app.notify(&body).await;
    assert_eq!(
        (retry.status, retry.outcome()),
        (200, "processed"),
        "{retry:?}"
    );
    assert_eq!(app.order_status("ORDER-2001").as_deref(), Some("paid"));
    assert_eq!(app.row_counts(), (1, 1, 1));
    assert_eq!(midtrans.asked_about("ORDER-2001"), 1);
    // /metrics counts both calls by what came of them, and the refusal as not confirmed.
    let metrics = String::from_utf8(
        app.client
            .get(format!("{}/metrics", app.address))
            .send()
            .await
            .unwrap()
            .body()
            .await
            .unwrap()
            .to_vec(),
    )
    .unwrap();
    for line in [
        r#"sekali_midtrans_status_api_requests_total{result="unreachable"} 1"#,
        r#"sekali_midtrans_status_api_requests_total{result="answered"} 1"#,
        r#"sekali_midtrans_status_api_requests_total{result="failed"} 0"#,
        r#"sekali_midtrans_status_api_duration_seconds_count 2"#,
        r#"sekali_refusals_total{provider="midtrans",reason="not_confirmed"} 1"#,
        r#"sekali_deliveries_total{provider="midtrans",outcome="processed"} 1"#,
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in:\n{metrics}");
    }
}

#[actix_web::test]
async fn a_status_api_server_error_or_timeout_is_answered_503_and_the_retry_is_applied() {
    let midtrans = StandIn::start();
    midtrans.reports("ORDER-2001", "settlement");
    let app = spawn_app_with(checking(&midtrans.url, Duration::from_secs(1))).await;
    let body = sign_midtrans(&fixture("midtrans/settlement.json"));

    midtrans.then_fails(Fault {
        status: 500,
        content_type: "application/json",
        body: r#"{"status_code":"500","status_message":"Sorry, we encountered internal server error. We will fix this soon."}"#.into(),
        delay: Duration::ZERO,
        ..Fault::default()
    });
    let answer = app.notify(&body).await;
    // Without the check the settlement is applied at once: this fails (200 processed).
    assert_eq!(answer.status, 503, "{answer:?}");
    assert_eq!(answer.error(), NOT_CONFIRMED);
    assert_eq!(app.row_counts(), (0, 0, 0));

    // Slower than sekali waits (1 s here): not confirmed either.
    midtrans.then_fails(Fault {
        status: 200,
        content_type: "application/json",
        body: status_fixture("settlement"),
        delay: Duration::from_secs(3),
        ..Fault::default()
    });
    let answer = app.notify(&body).await;
    assert_eq!(answer.status, 503, "{answer:?}");
    assert_eq!(app.row_counts(), (0, 0, 0));

    let retry = app.notify(&body).await;
    assert_eq!(
        (retry.status, retry.outcome()),
        (200, "processed"),
        "{retry:?}"
    );
    assert_eq!(app.order_status("ORDER-2001").as_deref(), Some("paid"));
    assert_eq!(app.row_counts(), (1, 1, 1));
    assert_eq!(midtrans.asked_about("ORDER-2001"), 3);
}

#[actix_web::test]
async fn an_unknown_transaction_is_not_applied_whether_the_api_answers_http_200_or_404() {
    // The stand-in knows no order at all (a sandbox key's notification checked against the
    // production API, say).
    let midtrans = StandIn::start();
    let app = spawn_checking_app(&midtrans).await;
    let body = sign_midtrans(&fixture("midtrans/settlement.json"));

    for http in [200, 404] {
        midtrans.not_found_with_http(http);
        let answer = app.notify(&body).await;
        // Without the check the settlement is applied: this fails (200 processed).
        assert_eq!(answer.status, 503, "HTTP {http}: {answer:?}");
        assert_eq!(answer.error(), NOT_CONFIRMED, "HTTP {http}");
        assert_eq!(app.row_counts(), (0, 0, 0), "HTTP {http}");
    }

    // A gateway's HTML 404 page, not JSON at all.
    midtrans.then_fails(Fault {
        status: 404,
        content_type: "text/html",
        body: "<html><body><h1>404 Not Found</h1></body></html>".into(),
        delay: Duration::ZERO,
        ..Fault::default()
    });
    let answer = app.notify(&body).await;
    assert_eq!(answer.status, 503, "{answer:?}");
    assert_eq!(app.row_counts(), (0, 0, 0));
    // Asked about the notification's transaction each time (the stand-in knows no order of it).
    assert_eq!(midtrans.asked_about(ORDER_2001_PAID_BY), 3);
}

#[actix_web::test]
async fn a_server_key_the_api_refuses_is_answered_503_and_stores_nothing() {
    let midtrans = StandIn::start();
    midtrans.reports("ORDER-2001", "settlement");
    // The API knows another key (the production one, while sekali has the sandbox key).
    midtrans.accepts_only("Mid-server-the-production-key");
    let app = spawn_checking_app(&midtrans).await;
    let body = sign_midtrans(&fixture("midtrans/settlement.json"));

    let answer = app.notify(&body).await;
    // Without the check the settlement is applied: this fails (200 processed).
    assert_eq!(answer.status, 503, "{answer:?}");
    assert_eq!(answer.error(), NOT_CONFIRMED);
    assert_eq!(app.row_counts(), (0, 0, 0));
    assert_eq!(midtrans.asked_about("ORDER-2001"), 1);

    // The operator fixes the key (here: the API accepts ours); Midtrans's retry is applied.
    midtrans.accepts_only(MIDTRANS_KEY);
    let retry = app.notify(&body).await;
    assert_eq!((retry.status, retry.outcome()), (200, "processed"));
    assert_eq!(app.row_counts(), (1, 1, 1));
}

#[actix_web::test]
async fn an_answer_about_another_order_confirms_nothing() {
    // A proxy or cache in front of the API that mixes its answers up.
    let midtrans = StandIn::start();
    let mut other = serde_json::from_str::<Value>(&status_fixture("echannel.settlement")).unwrap();
    other["gross_amount"] = "150000.00".into();
    // Asked about ORDER-2001's transaction, it answers about ORDER-2007.
    other["transaction_id"] = ORDER_2001_PAID_BY.into();
    midtrans.reports_value("ORDER-2001", other);
    let app = spawn_checking_app(&midtrans).await;

    let answer = app.deliver_midtrans("settlement").await;
    // Without the check the settlement is applied: this fails (200 processed).
    assert_eq!(answer.status, 503, "{answer:?}");
    assert_eq!(answer.error(), NOT_CONFIRMED);
    assert_eq!(app.row_counts(), (0, 0, 0));
    assert_eq!(midtrans.asked_about(ORDER_2001_PAID_BY), 1);
}

/// The status API is not followed elsewhere: a redirect's answer is no status (503), and the
/// server key goes to no other host.
#[actix_web::test]
async fn a_redirect_from_the_status_api_is_not_followed_and_carries_the_key_nowhere() {
    // Somewhere else, that would confirm anything asked with the key.
    let elsewhere = StandIn::start();
    elsewhere.reports("ORDER-2001", "settlement");
    let midtrans = StandIn::start();
    midtrans.then_fails(Fault {
        status: 302,
        content_type: "text/plain",
        location: Some(format!("{}/v2/ORDER-2001/status", elsewhere.url)),
        ..Fault::default()
    });
    let app = spawn_checking_app(&midtrans).await;

    let answer = app.deliver_midtrans("settlement").await;
    // Without the check the settlement is applied: this fails (200 processed).
    assert_eq!(answer.status, 503, "{answer:?}");
    assert_eq!(app.row_counts(), (0, 0, 0));
    assert_eq!(midtrans.asked_about(ORDER_2001_PAID_BY), 1);
    assert!(elsewhere.seen().is_empty(), "{:?}", elsewhere.seen());
}

/// The API is asked by the notification's transaction, or by its order when it names none;
/// either id reaches it as one path segment whatever it holds.
#[actix_web::test]
async fn an_id_with_reserved_characters_reaches_the_api_as_one_path_segment() {
    let order_id = "INV#7/2026 ä:1?x=y&z";
    let transaction_id = "tx#7/2026 ä:2?a=b&c";
    for names_a_transaction in [true, false] {
        let mut settlement = notification("settlement");
        settlement["order_id"] = order_id.into();
        let mut report: Value = serde_json::from_str(&status_fixture("settlement")).unwrap();
        report["order_id"] = order_id.into();
        report["transaction_id"] = transaction_id.into();
        let asked_by = if names_a_transaction {
            settlement["transaction_id"] = transaction_id.into();
            transaction_id
        } else {
            settlement.as_object_mut().unwrap().remove("transaction_id");
            order_id
        };
        let midtrans = StandIn::start();
        midtrans.reports_value(order_id, report);
        let app = spawn_checking_app(&midtrans).await;

        let answer = app.notify(&signed(&settlement)).await;
        assert_eq!(
            (answer.status, answer.outcome()),
            (200, "processed"),
            "{answer:?}"
        );
        assert_eq!(app.order_status(order_id).as_deref(), Some("paid"));
        // Without the check nothing is asked: this fails (no request).
        let seen = midtrans.seen();
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert_eq!(seen[0].id, asked_by);
        let segment = seen[0]
            .path
            .strip_prefix("/v2/")
            .and_then(|p| p.strip_suffix("/status"))
            .unwrap_or_else(|| panic!("{seen:?}"));
        assert!(
            !segment.contains(['/', '#', '?', '&', ' ']),
            "{segment} is not one path segment"
        );
    }
}

#[actix_web::test]
async fn a_lifecycle_the_api_confirms_step_by_step_ends_as_the_notifications_say() {
    // What Midtrans reports after the first partial refund: one refund of 50000.00.
    let mut one_refund: Value = serde_json::from_str(&status_fixture("partial_refund")).unwrap();
    one_refund["refunds"].as_array_mut().unwrap().truncate(1);
    one_refund["refund_amount"] = "50000.00".into();
    let midtrans = StandIn::start();
    let app = spawn_checking_app(&midtrans).await;

    for (name, report) in [
        (
            "pending",
            serde_json::from_str(&status_fixture("pending")).unwrap(),
        ),
        (
            "settlement",
            serde_json::from_str(&status_fixture("settlement")).unwrap(),
        ),
        ("partial_refund.1", one_refund),
        (
            "partial_refund.2",
            serde_json::from_str(&status_fixture("partial_refund")).unwrap(),
        ),
    ] {
        midtrans.reports_value("ORDER-2001", report);
        let answer = app.deliver_midtrans(name).await;
        assert_eq!(
            (answer.status, answer.outcome()),
            (200, "processed"),
            "{name}: {answer:?}"
        );
    }
    // The same ids, amounts and emails as without the check (midtrans.rs), so that turning it
    // on or off never makes a retry look new.
    assert_eq!(
        app.order("ORDER-2001"),
        ("partially_refunded".into(), 15_000_000, 7_500_000)
    );
    assert_eq!(
        app.outbox_templates("ORDER-2001"),
        ["receipt", "refund_notice", "refund_notice"]
    );
    assert_eq!(
        app.texts("SELECT event_id FROM processed_events ORDER BY rowid"),
        [
            "ORDER-2001:pending:201:accept",
            "ORDER-2001:settlement:200:accept",
            "ORDER-2001:partial_refund:200:accept:rf-ORDER-2001-1",
            "ORDER-2001:partial_refund:200:accept:rf-ORDER-2001-2",
        ]
    );
    // Without the check nothing is asked: this fails (0).
    assert_eq!(midtrans.asked_about("ORDER-2001"), 4);
}

#[actix_web::test]
async fn a_late_pending_after_the_api_reports_settlement_is_a_duplicate_of_the_settlement() {
    let midtrans = StandIn::start();
    midtrans.reports("ORDER-2001", "settlement");
    let app = spawn_checking_app(&midtrans).await;
    assert_eq!(
        app.deliver_midtrans("settlement").await.outcome(),
        "processed"
    );

    // The pending notification arrives (or is retried) after the settlement. The API says
    // settlement, so it is applied as the settlement it is now: the very event already applied.
    let answer = app.deliver_midtrans("pending").await;
    // Without the check it is a pending that would move the order backwards: this fails
    // ("stale", and a second processed_events row).
    assert_eq!(
        (answer.status, answer.outcome()),
        (200, "duplicate"),
        "{answer:?}"
    );
    assert_eq!(answer.body["event_id"], "ORDER-2001:settlement:200:accept");
    assert_eq!(app.order_status("ORDER-2001").as_deref(), Some("paid"));
    assert_eq!(app.outbox_templates("ORDER-2001"), ["receipt"]);
    assert_eq!(app.row_counts(), (1, 1, 1));
    assert_eq!(midtrans.asked_about("ORDER-2001"), 2);
}

#[actix_web::test]
async fn a_pending_the_api_already_reports_settled_pays_the_order_and_the_settlement_is_a_duplicate(
) {
    let midtrans = StandIn::start();
    // The customer paid before the pending notification got through.
    midtrans.reports("ORDER-2001", "settlement");
    let app = spawn_checking_app(&midtrans).await;

    let answer = app.deliver_midtrans("pending").await;
    assert_eq!(
        (answer.status, answer.outcome()),
        (200, "processed"),
        "{answer:?}"
    );
    // Without the check it is applied as the pending it says: this fails (its own id
    // ORDER-2001:pending:201:accept, and then the order pending).
    assert_eq!(answer.body["event_id"], "ORDER-2001:settlement:200:accept");
    assert_eq!(app.order("ORDER-2001"), ("paid".into(), 15_000_000, 0));
    assert_eq!(app.outbox_templates("ORDER-2001"), ["receipt"]);

    let settlement = app.deliver_midtrans("settlement").await;
    assert_eq!(
        (settlement.status, settlement.outcome()),
        (200, "duplicate")
    );
    assert_eq!(app.row_counts(), (1, 1, 1));
}

#[actix_web::test]
async fn an_expiry_and_a_cancel_the_api_reports_under_other_status_codes_are_applied() {
    // The status API answers an expired transaction with body status_code "407" and a cancelled
    // one with "200"; their notifications say "202".
    let midtrans = StandIn::start();
    midtrans.reports("ORDER-2005", "expire");
    midtrans.reports("ORDER-2004", "cancel");
    let app = spawn_checking_app(&midtrans).await;

    for (name, order, status, event_id) in [
        (
            "expire",
            "ORDER-2005",
            "expired",
            "ORDER-2005:expire:202:accept",
        ),
        (
            "cancel",
            "ORDER-2004",
            "cancelled",
            "ORDER-2004:cancel:202:accept:efb1accb-2e3d-41b5-8736-7b42b1587836",
        ),
    ] {
        let answer = app.deliver_midtrans(name).await;
        assert_eq!(
            (answer.status, answer.outcome()),
            (200, "processed"),
            "{name}: {answer:?}"
        );
        // The id the notification would have had unconfirmed.
        assert_eq!(answer.body["event_id"], event_id);
        assert_eq!(app.order_status(order).as_deref(), Some(status));
        // Without the check the stand-in is never asked: this fails (0).
        assert_eq!(midtrans.asked_about(order), 1, "{name}");
    }
}

#[actix_web::test]
async fn a_deny_the_api_does_not_report_yet_leaves_the_paid_order_alone() {
    let midtrans = StandIn::start();
    midtrans.reports("ORDER-2007", "echannel.settlement");
    let app = spawn_checking_app(&midtrans).await;
    assert_eq!(
        app.deliver_midtrans("echannel.settlement").await.outcome(),
        "processed"
    );

    // A deny (its own signature, status_code 202) while Midtrans still reports settlement.
    let answer = app.deliver_midtrans("echannel.deny").await;
    // Without the check it is applied as a reversal: this fails (200 reversed, needs_review).
    assert_eq!(answer.status, 503, "{answer:?}");
    assert_eq!(answer.error(), NOT_CONFIRMED);
    assert_eq!(app.order_status("ORDER-2007").as_deref(), Some("paid"));
    assert_eq!(app.row_counts(), (1, 1, 1));

    // Once Midtrans reports the deny, the retry is the reversal.
    midtrans.reports("ORDER-2007", "echannel.deny");
    let retry = app.deliver_midtrans("echannel.deny").await;
    assert_eq!((retry.status, retry.outcome()), (200, "reversed"));
    assert_eq!(
        app.order_status("ORDER-2007").as_deref(),
        Some("needs_review")
    );
}

/// What Midtrans reports for ORDER-2001 once `transaction_id`, another attempt than the bank
/// transfer that paid it, was denied (status_code 202).
fn order_2001_denied_for(transaction_id: &str) -> Value {
    let mut answer: Value = serde_json::from_str(&status_fixture("settlement")).unwrap();
    answer["transaction_status"] = "deny".into();
    answer["status_code"] = "202".into();
    answer["transaction_id"] = transaction_id.into();
    answer["payment_type"] = "credit_card".into();
    answer
}

/// A deny notification for ORDER-2001 naming `transaction_id`, with its own signature.
fn order_2001_deny_notification(transaction_id: &str) -> Vec<u8> {
    let mut deny = notification("settlement");
    deny["transaction_status"] = "deny".into();
    deny["status_code"] = "202".into();
    deny["transaction_id"] = transaction_id.into();
    deny["payment_type"] = "credit_card".into();
    signed(&deny)
}

/// The transaction that paid ORDER-2001 in `settlement.json`.
const ORDER_2001_PAID_BY: &str = "a14f85d4-30ed-4b6e-85f9-0e8ef5208578";
const ANOTHER_ATTEMPT: &str = "98bef542-10ab-4ef9-928f-fa9a4baff095";

/// Fails on the version that took any deny of a paid order for a reversal, and on the one that
/// asked the API by order id: asked so, the API reports the order's latest transaction (the
/// settlement that paid it), the deny of the earlier attempt is never confirmed, and it was
/// answered 503 on every retry until Midtrans gave up.
#[actix_web::test]
async fn a_deny_of_another_transaction_the_api_confirms_leaves_the_paid_order_paid() {
    let midtrans = StandIn::start();
    midtrans.reports("ORDER-2001", "settlement");
    let app = spawn_checking_app(&midtrans).await;
    assert_eq!(
        app.deliver_midtrans("settlement").await.outcome(),
        "processed"
    );

    // The order's latest transaction stays the settlement; the earlier attempt was denied.
    midtrans.reports_transaction(order_2001_denied_for(ANOTHER_ATTEMPT));
    let answer = app
        .notify(&order_2001_deny_notification(ANOTHER_ATTEMPT))
        .await;
    // The failed attempt is recorded; the order stays paid.
    assert_eq!(
        (answer.status, answer.outcome()),
        (200, "processed"),
        "{answer:?}"
    );
    assert_eq!(app.order_status("ORDER-2001").as_deref(), Some("paid"));
    assert_eq!(app.outbox_templates("ORDER-2001"), ["receipt"]);
    let asked: Vec<String> = midtrans.seen().into_iter().map(|s| s.id).collect();
    assert_eq!(asked, [ORDER_2001_PAID_BY, ANOTHER_ATTEMPT]);
}

/// The transaction a deny is for is the one the API confirms, not merely the one the
/// notification names (the signature does not cover `transaction_id`): a deny naming the paying
/// transaction, which the API reports settled, is not confirmed and reverses nothing; the deny
/// of the attempt the API did deny is stale.
#[actix_web::test]
async fn a_deny_naming_the_paying_transaction_the_api_reports_settled_reverses_nothing() {
    let midtrans = StandIn::start();
    midtrans.reports("ORDER-2001", "settlement");
    let app = spawn_checking_app(&midtrans).await;
    assert_eq!(
        app.deliver_midtrans("settlement").await.outcome(),
        "processed"
    );

    midtrans.reports_transaction(order_2001_denied_for(ANOTHER_ATTEMPT));
    let forged = app
        .notify(&order_2001_deny_notification(ORDER_2001_PAID_BY))
        .await;
    // Believing the notification's transaction_id, this is a reversal: this fails (reversed).
    assert_eq!(
        (forged.status, forged.error()),
        (503, NOT_CONFIRMED),
        "{forged:?}"
    );
    assert_eq!(app.order_status("ORDER-2001").as_deref(), Some("paid"));
    let genuine = app
        .notify(&order_2001_deny_notification(ANOTHER_ATTEMPT))
        .await;
    assert_eq!(
        (genuine.status, genuine.outcome()),
        (200, "processed"),
        "{genuine:?}"
    );
    assert_eq!(app.order_status("ORDER-2001").as_deref(), Some("paid"));
    assert_eq!(
        app.texts("SELECT payment_intent_id FROM processed_events ORDER BY rowid"),
        [ORDER_2001_PAID_BY, ANOTHER_ATTEMPT]
    );
}

#[test]
fn an_echannel_deny_the_api_confirms_after_settlement_is_a_reversal_logged_at_warn() {
    let midtrans = StandIn::start();
    midtrans.reports("ORDER-2007", "echannel.settlement");
    let server = serve_checking(&midtrans, "info");

    let settlement = sign_midtrans(&fixture("midtrans/echannel.settlement.json"));
    let answer = notify_serve(&server, &settlement);
    assert_eq!(
        (answer.status, answer.outcome()),
        (200, "processed"),
        "{answer:?}"
    );

    // A minute later Mandiri takes the payment back, and Midtrans reports the deny.
    midtrans.reports("ORDER-2007", "echannel.deny");
    let deny = sign_midtrans(&fixture("midtrans/echannel.deny.json"));
    let answer = notify_serve(&server, &deny);
    assert_eq!(
        (answer.status, answer.outcome()),
        (200, "reversed"),
        "{answer:?}"
    );
    // A deny's id names its transaction.
    assert_eq!(
        answer.body["event_id"],
        "ORDER-2007:deny:202:accept:e7a46595-1e02-45e9-813f-be564bfd41eb"
    );

    let db = server.db();
    let status = db.texts("SELECT status FROM orders WHERE order_id = 'ORDER-2007'");
    assert_eq!(status, ["needs_review"]);
    assert_eq!(
        db.texts("SELECT template FROM email_outbox ORDER BY id"),
        ["receipt"],
        "the customer is told nothing about the reversal"
    );
    assert_eq!(
        db.texts("SELECT outcome FROM processed_events ORDER BY rowid"),
        ["processed", "reversed"]
    );
    // Without the check this server never asks: this fails (0).
    assert_eq!(midtrans.asked_about("ORDER-2007"), 2);

    let (exit, logs) = server.stop();
    assert!(exit.success(), "{logs}");
    let warning = logs
        .lines()
        .find(|line| line.contains("order moved to needs_review"))
        .unwrap_or_else(|| panic!("no needs_review line in: {logs}"));
    assert!(warning.contains("WARN"), "{warning}");
    assert!(
        warning.contains(
            "midtrans reversed the payment e7a46595-1e02-45e9-813f-be564bfd41eb after settling it"
        ),
        "{warning}"
    );
    assert!(warning.contains("ORDER-2007"), "{warning}");
    assert!(warning.contains("reversed"), "{warning}");
}

#[actix_web::test]
async fn a_partial_refund_and_a_settlement_whose_unescaped_ids_collide_are_two_events() {
    // With the check off: the ids are what is tested here.
    let app = spawn_app().await;
    let partial_refund = json!({
        "order_id": "A",
        "status_code": "200",
        "gross_amount": "100000.00",
        "currency": "IDR",
        "transaction_status": "partial_refund",
        "refund_amount": "10000.00",
        "refunds": [{
            "refund_key": "rk:settlement:200",
            "refund_amount": "10000.00",
            "created_at": "2026-11-29 11:00:00"
        }],
        "signature_key": ""
    });
    let settlement = json!({
        "order_id": "A:partial_refund:200:rk",
        "status_code": "200",
        "gross_amount": "100000.00",
        "currency": "IDR",
        "transaction_status": "settlement",
        "signature_key": ""
    });
    // Joined by ':' as they are, both would be A:partial_refund:200:rk:settlement:200, and the
    // second would be taken for a retry of the first.
    let first = app.notify(&signed(&partial_refund)).await;
    assert_eq!(
        (first.status, first.outcome()),
        (200, "processed"),
        "{first:?}"
    );
    let second = app.notify(&signed(&settlement)).await;
    assert_eq!(
        (second.status, second.outcome()),
        (200, "processed"),
        "{second:?}"
    );
    assert_ne!(first.body["event_id"], second.body["event_id"]);
    assert_eq!(
        app.texts("SELECT event_id FROM processed_events ORDER BY rowid"),
        [
            r"A:partial_refund:200:rk\:settlement\:200",
            r"A\:partial_refund\:200\:rk:settlement:200",
        ]
    );
    assert_eq!(app.order_status("A").as_deref(), Some("partially_refunded"));
    assert_eq!(
        app.order_status("A:partial_refund:200:rk").as_deref(),
        Some("paid")
    );
}

#[actix_web::test]
async fn an_id_stored_in_the_old_unescaped_form_makes_a_redelivery_a_duplicate() {
    let app = spawn_app().await;
    let body = signed(&json!({
        "order_id": "A:1",
        "status_code": "200",
        "gross_amount": "50000.00",
        "currency": "IDR",
        "transaction_status": "settlement",
        "signature_key": ""
    }));
    // What a version before escaping stored for this settlement an hour ago.
    let now = app.clock.now_unix();
    app.database.execute(&format!(
        "INSERT INTO processed_events
             (provider, event_id, event_type, order_id, outcome, received_at, expires_at, payload)
         VALUES ('midtrans', 'A:1:settlement:200', 'settlement', 'A:1', 'processed', {}, {}, {})",
        sql_text(&sekali::clock::iso_seconds(now - 3600)),
        sql_text(&sekali::clock::iso_seconds(now + 6 * 24 * 3600)),
        sql_text(std::str::from_utf8(&body).unwrap()),
    ));

    let answer = app.notify(&body).await;
    // Looking only under the escaped id (A\:1:settlement:200), this fails ("processed", and the
    // settlement's effects applied a second time).
    assert_eq!(
        (answer.status, answer.outcome()),
        (200, "duplicate"),
        "{answer:?}"
    );
    assert_eq!(app.row_counts(), (1, 0, 0));

    // Past the old claim's retention, a redelivery is new, under the escaped id.
    app.clock.advance(Duration::from_secs(7 * 24 * 3600));
    let later = app.notify(&body).await;
    assert_eq!(
        (later.status, later.outcome()),
        (200, "processed"),
        "{later:?}"
    );
    assert_eq!(later.body["event_id"], r"A\:1:settlement:200");
    assert_eq!(app.order_status("A:1").as_deref(), Some("paid"));
}

#[actix_web::test]
async fn an_old_form_id_of_one_order_does_not_make_another_orders_settlement_a_duplicate() {
    let app = spawn_app().await;
    // What a version before escaping stored, two days ago, for a partial refund of order `A`
    // whose newest refund has the key `rk:settlement:200`.
    let partial_refund = signed(&json!({
        "order_id": "A",
        "status_code": "200",
        "gross_amount": "100000.00",
        "currency": "IDR",
        "transaction_status": "partial_refund",
        "refund_amount": "10000.00",
        "refunds": [{
            "refund_key": "rk:settlement:200",
            "refund_amount": "10000.00",
            "created_at": "2026-11-29 11:00:00"
        }],
        "signature_key": ""
    }));
    let now = app.clock.now_unix();
    app.database.execute(&format!(
        "INSERT INTO processed_events
             (provider, event_id, event_type, order_id, outcome, received_at, expires_at, payload)
         VALUES ('midtrans', 'A:partial_refund:200:rk:settlement:200', 'partial_refund', 'A',
                 'processed', {}, {}, {})",
        sql_text(&sekali::clock::iso_seconds(now - 2 * 24 * 3600)),
        sql_text(&sekali::clock::iso_seconds(now + 5 * 24 * 3600)),
        sql_text(std::str::from_utf8(&partial_refund).unwrap()),
    ));

    // The first settlement of order `A:partial_refund:200:rk`: its old-form id is the same text,
    // but the row is another order's (its order_id column says `A`), so it is not this
    // notification, and the customer's payment must be applied.
    let answer = app
        .notify(&signed(&json!({
            "order_id": "A:partial_refund:200:rk",
            "status_code": "200",
            "gross_amount": "100000.00",
            "currency": "IDR",
            "transaction_status": "settlement",
            "signature_key": ""
        })))
        .await;
    assert_eq!(
        (answer.status, answer.outcome()),
        (200, "processed"),
        "{answer:?}"
    );
    assert_eq!(
        app.order_status("A:partial_refund:200:rk").as_deref(),
        Some("paid")
    );
    assert_eq!(app.outbox_templates("A:partial_refund:200:rk"), ["receipt"]);

    // While the old row's own redelivery is still its duplicate.
    let redelivery = app.notify(&partial_refund).await;
    assert_eq!(
        (redelivery.status, redelivery.outcome()),
        (200, "duplicate")
    );
}

#[test]
fn serve_asks_the_status_api_by_default_when_a_midtrans_key_is_set() {
    let midtrans = StandIn::start();
    midtrans.reports("ORDER-2001", "settlement");
    // No SEKALI_MIDTRANS_STATUS_CHECK at all: the binary's own default.
    let server = ServeProcess::start_unsetting(
        None,
        &[
            ("MIDTRANS_SERVER_KEY", MIDTRANS_KEY),
            ("MIDTRANS_API_URL", &midtrans.url),
        ],
        &["SEKALI_MIDTRANS_STATUS_CHECK"],
        "info",
        &[],
    );

    let answer = notify_serve(
        &server,
        &sign_midtrans(&fixture("midtrans/settlement.json")),
    );
    assert_eq!(
        (answer.status, answer.outcome()),
        (200, "processed"),
        "{answer:?}"
    );
    // A default of off would never ask: this fails (0 requests).
    let seen = midtrans.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].order_id, "ORDER-2001");
    assert_eq!(
        seen[0].authorization.as_deref(),
        Some(MIDTRANS_KEY_BASIC_AUTH)
    );

    let forged = notify_serve(&server, &forged_refund_of_order_2001());
    assert_eq!(forged.status, 503, "{forged:?}");
    assert_eq!(forged.error(), NOT_CONFIRMED);

    assert_eq!(
        server.db().count("SELECT count(*) FROM processed_events"),
        1
    );
    let (exit, logs) = server.stop();
    assert!(exit.success(), "{logs}");
    assert!(logs.contains("midtrans: status check on"), "{logs}");
}

#[test]
fn serve_with_the_check_off_applies_a_notification_without_asking() {
    let midtrans = StandIn::start();
    // Were it asked, Midtrans would say pending and the settlement would not be applied.
    midtrans.reports("ORDER-2001", "pending");
    let server = ServeProcess::start(
        &[
            ("MIDTRANS_SERVER_KEY", MIDTRANS_KEY),
            ("SEKALI_MIDTRANS_STATUS_CHECK", "off"),
            ("MIDTRANS_API_URL", &midtrans.url),
        ],
        "info",
    );

    let answer = notify_serve(
        &server,
        &sign_midtrans(&fixture("midtrans/settlement.json")),
    );
    assert_eq!(
        (answer.status, answer.outcome()),
        (200, "processed"),
        "{answer:?}"
    );
    assert!(midtrans.seen().is_empty(), "{:?}", midtrans.seen());
    let status = server
        .db()
        .texts("SELECT status FROM orders WHERE order_id = 'ORDER-2001'");
    assert_eq!(status, ["paid"]);
    let (exit, logs) = server.stop();
    assert!(exit.success(), "{logs}");
    assert!(logs.contains("midtrans: status check off"), "{logs}");
}

#[test]
fn serve_logs_neither_the_server_key_nor_its_basic_auth_form_at_trace_level() {
    let midtrans = StandIn::start();
    midtrans.reports("ORDER-2001", "settlement");
    let server = serve_checking(&midtrans, "trace");

    // Confirmed, not confirmed (a forgery), unknown to the API, and refused by the API.
    let settlement = sign_midtrans(&fixture("midtrans/settlement.json"));
    assert_eq!(notify_serve(&server, &settlement).status, 200);
    assert_eq!(
        notify_serve(&server, &forged_refund_of_order_2001()).status,
        503
    );
    let deny = sign_midtrans(&fixture("midtrans/deny.json"));
    assert_eq!(notify_serve(&server, &deny).status, 503);
    midtrans.accepts_only("Mid-server-the-production-key");
    let expire = sign_midtrans(&fixture("midtrans/expire.json"));
    assert_eq!(notify_serve(&server, &expire).status, 503);
    // Without the check nothing is asked, and nothing of the key could be sent: this fails.
    assert_eq!(midtrans.seen().len(), 4);

    let (exit, logs) = server.stop();
    assert!(exit.success(), "{logs}");
    assert!(
        logs.contains("delivery not confirmed"),
        "trace logging was on"
    );
    let encoded = MIDTRANS_KEY_BASIC_AUTH.trim_start_matches("Basic ");
    for needle in [
        MIDTRANS_KEY,
        encoded,
        // The base64 of the key alone, without the colon, starts the same way.
        &encoded[..32],
        MIDTRANS_KEY_BASIC_AUTH,
    ] {
        assert!(!logs.contains(needle), "the logs contain {needle}");
    }
    for body in [&settlement, &deny, &expire] {
        let signature = signature_of(body);
        assert!(!logs.contains(&signature), "the logs contain a signature");
    }
}
