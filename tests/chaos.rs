//! Crash chaos: "nothing lost, nothing twice" with the real `sekali serve` binary.
//!
//! Several concurrent senders deliver N signed Stripe and Midtrans events across many orders
//! (full lifecycles, shuffled, so most arrive out of order), a third of the requests being
//! redeliveries. The server is killed with SIGKILL at K random moments spread over the run and
//! restarted each time. Then everything that was not acknowledged is redelivered, then
//! everything once more, and the database is checked with SQL:
//!
//! - lost (acknowledged but missing) and unexpected rows: none; recovered (committed but the
//!   answer was lost to a kill) are counted and reported;
//! - each event id has exactly one `processed_events` row;
//! - each order ends in the status in-order processing gives;
//! - the order's transitions form one chain and `email_outbox` holds exactly one row per
//!   transition that has a notice;
//! - `PRAGMA integrity_check` is ok, and the WAL stayed bounded;
//! - the outbox relay, which runs inside the server as it does by default and is killed with
//!   it, sends every email: no row ends pending or dead, and each `sent` row's `.eml` file is
//!   whole and carries the row's key in its Message-ID (a kill between a file and its row's
//!   `sent` means the file is written again: the documented at-least-once resend).
//!
//! Sizes: `SEKALI_CHAOS_EVENTS` (default 3000) and `SEKALI_CHAOS_KILLS` (default 10); the large
//! run in docs/reliability.md ("Crash chaos") uses 20000 and 100 on a release build.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusqlite::Connection;
use serde_json::json;

#[allow(dead_code)]
#[path = "api/helpers.rs"]
mod helpers;

const STRIPE_SECRET: &str = "whsec_chaos_c2VrYWxpLWNoYW9zLXNlY3JldA";
const MIDTRANS_KEY: &str = "SB-Mid-server-chaos-key";
const SENDERS: usize = 8;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

// ---------------------------------------------------------------------------------------------
// The workload

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Provider {
    Stripe,
    Midtrans,
}

struct Event {
    provider: Provider,
    id: String,
    /// Stripe bodies are signed at send time (every delivery has a fresh `t`); Midtrans bodies
    /// carry their signature_key, identical across retries as with the real provider.
    body: Vec<u8>,
}

struct ExpectedOrder {
    id: String,
    status: &'static str,
    refunded: i64,
}

struct Workload {
    events: Vec<Event>,
    orders: Vec<ExpectedOrder>,
}

fn stripe_event(id: &str, kind: &str, object: serde_json::Value) -> Event {
    let body = json!({
        "id": id, "object": "event", "api_version": "2024-06-20", "created": 1_732_870_000,
        "livemode": false, "pending_webhooks": 1,
        "request": {"id": null, "idempotency_key": null},
        "type": kind, "data": {"object": object},
    });
    Event {
        provider: Provider::Stripe,
        id: id.to_owned(),
        body: serde_json::to_vec_pretty(&body).unwrap(),
    }
}

fn payment_intent(
    pi: &str,
    order: &str,
    amount: i64,
    status: &str,
    email: &str,
) -> serde_json::Value {
    json!({"id": pi, "object": "payment_intent", "amount": amount,
           "amount_received": if status == "succeeded" { amount } else { 0 },
           "currency": "usd", "status": status, "metadata": {"order_id": order}, "receipt_email": email})
}

fn charge(pi: &str, n: usize, amount: i64, refunded: i64, email: &str) -> serde_json::Value {
    json!({"id": format!("ch_chaos_{n}"), "object": "charge", "amount": amount, "amount_captured": amount,
           "amount_refunded": refunded, "refunded": refunded >= amount, "currency": "usd",
           "payment_intent": pi, "metadata": {}, "billing_details": {"email": email}})
}

fn midtrans_event(
    order: &str,
    status: &str,
    code: &str,
    gross: i64,
    fraud: Option<&str>,
    refunds: &[(&str, i64, &str)],
) -> Event {
    let money = |minor: i64| format!("{}.{:02}", minor / 100, minor % 100);
    let mut body = json!({
        "transaction_time": "2026-11-29 10:00:00", "transaction_status": status,
        "transaction_id": format!("tx-{order}"), "status_message": "midtrans payment notification",
        "status_code": code, "signature_key": "", "payment_type": "bank_transfer", "order_id": order,
        "merchant_id": "G141532850", "gross_amount": money(gross), "currency": "IDR",
    });
    if let Some(fraud) = fraud {
        body["fraud_status"] = json!(fraud);
    }
    if !refunds.is_empty() {
        body["refunds"] = refunds
            .iter()
            .map(|(key, amount, at)| json!({"refund_key": key, "refund_amount": money(*amount), "created_at": at}))
            .collect();
        body["refund_amount"] = json!(money(refunds.iter().map(|r| r.1).sum()));
    }
    let raw = serde_json::to_vec(&body).unwrap();
    let signed = sekali::providers::midtrans::with_signature_key(&raw, MIDTRANS_KEY).unwrap();
    let notification = sekali::providers::midtrans::parse_notification(&signed).unwrap();
    Event {
        provider: Provider::Midtrans,
        id: notification.derived_event_id(),
        body: signed,
    }
}

/// Lifecycles of eight shapes, each with the status and refund in-order processing gives.
fn lifecycle(n: usize) -> (Vec<Event>, ExpectedOrder) {
    let email = format!("customer{n}@example.com");
    let amount = 1000 + (n as i64 % 50) * 100;
    let (order, pi) = (format!("ord_chaos_{n}"), format!("pi_chaos_{n}"));
    let evt = |step: &str| format!("evt_chaos_{n}_{step}");
    let expect = |status, refunded| ExpectedOrder {
        id: order.clone(),
        status,
        refunded,
    };
    match n % 8 {
        0 => (
            vec![
                stripe_event(
                    &evt("processing"),
                    "payment_intent.processing",
                    payment_intent(&pi, &order, amount, "processing", &email),
                ),
                stripe_event(
                    &evt("succeeded"),
                    "payment_intent.succeeded",
                    payment_intent(&pi, &order, amount, "succeeded", &email),
                ),
                stripe_event(
                    &evt("refund1"),
                    "charge.refunded",
                    charge(&pi, n, amount, amount / 2, &email),
                ),
                stripe_event(
                    &evt("refund2"),
                    "charge.refunded",
                    charge(&pi, n, amount, amount, &email),
                ),
            ],
            expect("refunded", amount),
        ),
        1 => (
            vec![
                stripe_event(
                    &evt("processing"),
                    "payment_intent.processing",
                    payment_intent(&pi, &order, amount, "processing", &email),
                ),
                stripe_event(
                    &evt("failed"),
                    "payment_intent.payment_failed",
                    payment_intent(&pi, &order, amount, "requires_payment_method", &email),
                ),
                stripe_event(
                    &evt("succeeded"),
                    "payment_intent.succeeded",
                    payment_intent(&pi, &order, amount, "succeeded", &email),
                ),
            ],
            expect("paid", 0),
        ),
        2 => {
            let session = |status: &str| {
                json!({"id": format!("cs_chaos_{n}"), "object": "checkout.session", "client_reference_id": order,
                       "payment_status": status, "amount_total": amount, "currency": "usd", "payment_intent": pi,
                       "metadata": {}, "customer_details": {"email": email}})
            };
            let dispute = json!({"id": format!("dp_chaos_{n}"), "object": "dispute", "amount": amount, "currency": "usd",
                                 "payment_intent": pi, "charge": format!("ch_chaos_{n}"), "metadata": {}, "status": "needs_response"});
            (
                vec![
                    stripe_event(
                        &evt("unpaid"),
                        "checkout.session.completed",
                        session("unpaid"),
                    ),
                    stripe_event(
                        &evt("async_paid"),
                        "checkout.session.async_payment_succeeded",
                        session("paid"),
                    ),
                    stripe_event(&evt("dispute"), "charge.dispute.created", dispute),
                ],
                expect("disputed", 0),
            )
        }
        3 => (
            vec![
                stripe_event(
                    &evt("succeeded"),
                    "payment_intent.succeeded",
                    payment_intent(&pi, &order, amount, "succeeded", &email),
                ),
                stripe_event(
                    &evt("refund1"),
                    "charge.refunded",
                    charge(&pi, n, amount, amount / 4, &email),
                ),
            ],
            expect("partially_refunded", amount / 4),
        ),
        4 => {
            let gross = amount * 100;
            let (q1, q2) = (gross / 4, gross / 4);
            (
                vec![
                    midtrans_event(&order, "pending", "201", gross, Some("accept"), &[]),
                    midtrans_event(&order, "settlement", "200", gross, Some("accept"), &[]),
                    midtrans_event(
                        &order,
                        "partial_refund",
                        "200",
                        gross,
                        Some("accept"),
                        &[("rf-1", q1, "2026-11-29 11:00:00")],
                    ),
                    midtrans_event(
                        &order,
                        "partial_refund",
                        "200",
                        gross,
                        Some("accept"),
                        &[
                            ("rf-1", q1, "2026-11-29 11:00:00"),
                            ("rf-2", q2, "2026-11-29 12:00:00"),
                        ],
                    ),
                ],
                expect("partially_refunded", q1 + q2),
            )
        }
        5 => {
            let gross = amount * 100;
            (
                vec![
                    midtrans_event(&order, "capture", "201", gross, Some("challenge"), &[]),
                    midtrans_event(&order, "capture", "200", gross, Some("accept"), &[]),
                    midtrans_event(
                        &order,
                        "refund",
                        "200",
                        gross,
                        Some("accept"),
                        &[("rf-1", gross, "2026-11-29 13:00:00")],
                    ),
                ],
                expect("refunded", gross),
            )
        }
        6 => (
            vec![
                midtrans_event(&order, "pending", "201", amount * 100, None, &[]),
                midtrans_event(&order, "expire", "202", amount * 100, None, &[]),
            ],
            expect("expired", 0),
        ),
        _ => (
            vec![
                midtrans_event(&order, "pending", "201", amount * 100, None, &[]),
                midtrans_event(&order, "deny", "202", amount * 100, Some("deny"), &[]),
            ],
            // A denied card: an attempt that failed.
            expect("failed", 0),
        ),
    }
}

fn workload(events_wanted: usize) -> Workload {
    let mut events = Vec::with_capacity(events_wanted + 4);
    let mut orders = Vec::new();
    let mut n = 0;
    while events.len() < events_wanted {
        let (mut lifecycle_events, order) = lifecycle(n);
        events.append(&mut lifecycle_events);
        orders.push(order);
        n += 1;
    }
    Workload { events, orders }
}

// ---------------------------------------------------------------------------------------------
// The server under test

struct Server {
    child: Option<Child>,
    /// The port the server reported; 0 until it first started.
    port: u16,
    db: PathBuf,
    log: PathBuf,
}

impl Server {
    /// Starts the server on a port of the system's choosing, which `port` then holds.
    fn start(db: &Path, log: &Path) -> Server {
        let mut server = Server {
            child: None,
            port: 0,
            db: db.to_owned(),
            log: log.to_owned(),
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let log_start = log.metadata().unwrap().len();
        let mail = self.db.parent().unwrap().join("mail");
        let child = Command::new(env!("CARGO_BIN_EXE_sekali"))
            .args([
                "serve",
                // First any free port (0), which the server reports; a restart asks for that
                // same port again, as the senders keep sending to it.
                "--listen",
                &format!("127.0.0.1:{}", self.port),
                // A killed relay's rows are claimed again once their lease runs out: seconds
                // here, minutes by default.
                "--relay-lease",
                "3s",
                "--relay-timeout",
                "2s",
                "--relay-poll-interval",
                "20ms",
                "--db",
            ])
            .arg(&self.db)
            .arg("--mail-dir")
            .arg(&mail)
            .env("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET)
            .env("MIDTRANS_SERVER_KEY", MIDTRANS_KEY)
            // Notifications applied as sent: the chaos is the server's, not Midtrans's API.
            .env("SEKALI_MIDTRANS_STATUS_CHECK", "off")
            .env("RUST_LOG", helpers::rust_log_with_listening_line("warn"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let child = self.child.insert(child);
        let port = helpers::port_from_log(&self.log, log_start, child, Duration::from_secs(20));
        assert!(
            self.port == 0 || port == self.port,
            "restarted on {port}, not on {}",
            self.port
        );
        self.port = port;
        assert!(
            helpers::wait_until_healthy(&agent(), port, Duration::from_secs(20)),
            "the server did not become healthy; see {}",
            self.log.display()
        );
    }

    fn kill9_and_restart(&mut self) {
        let mut child = self.child.take().unwrap();
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        self.spawn();
    }

    fn stop(&mut self) {
        if let Some(child) = self.child.take() {
            Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status()
                .unwrap();
            let status = child.wait_with_output().unwrap().status;
            assert!(status.success(), "graceful stop: {status:?}");
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(2))
        .timeout(Duration::from_secs(30))
        .build()
}

fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// One delivery; `Some(status field)` on a 2xx, `None` on anything else.
fn deliver(agent: &ureq::Agent, port: u16, event: &Event) -> Option<String> {
    let request = match event.provider {
        Provider::Stripe => {
            let header = sekali::providers::stripe::signature_header(
                &[STRIPE_SECRET],
                now_unix(),
                &event.body,
            );
            agent
                .post(&format!("http://127.0.0.1:{port}/webhooks/stripe"))
                .set("Stripe-Signature", &header)
        }
        Provider::Midtrans => agent.post(&format!("http://127.0.0.1:{port}/webhooks/midtrans")),
    };
    match request
        .set("Content-Type", "application/json")
        .send_bytes(&event.body)
    {
        Ok(response) => {
            let body: serde_json::Value =
                serde_json::from_str(&response.into_string().ok()?).ok()?;
            Some(body["status"].as_str()?.to_owned())
        }
        Err(ureq::Error::Status(code, response)) => {
            assert!(
                code == 503,
                "only our own transient faults may fail a valid delivery: {code} {:?}",
                response.into_string()
            );
            None
        }
        Err(_) => None, // connection refused or reset: the server was killed
    }
}

// ---------------------------------------------------------------------------------------------
// The run

#[test]
fn crash_chaos_loses_nothing_and_applies_nothing_twice() {
    let events_wanted = env_usize("SEKALI_CHAOS_EVENTS", 3000);
    let kills = env_usize("SEKALI_CHAOS_KILLS", 10);
    let seed = env_usize("SEKALI_CHAOS_SEED", 0x5e_ca11) as u64;
    let mut rng = fastrand::Rng::with_seed(seed);
    let started = Instant::now();

    let Workload { events, orders } = workload(events_wanted);
    let events = Arc::new(events);
    // Every event once, plus redeliveries making up a third of all requests, shuffled.
    let mut deliveries: Vec<usize> = (0..events.len()).collect();
    deliveries.extend((0..events.len() / 2).map(|_| rng.usize(..events.len())));
    rng.shuffle(&mut deliveries);
    let deliveries = Arc::new(deliveries);

    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("chaos.db");
    let log = dir.path().join("server.log");
    let server = Server::start(&db, &log);
    let port = server.port;
    let server = Arc::new(Mutex::new(server));

    // Phase 1: concurrent senders; a killer thread kills and restarts the server K times.
    let acked: Arc<Vec<AtomicBool>> =
        Arc::new((0..events.len()).map(|_| AtomicBool::new(false)).collect());
    let next = Arc::new(AtomicUsize::new(0));
    let max_wal = Arc::new(AtomicUsize::new(0));
    let senders: Vec<_> = (0..SENDERS)
        .map(|_| {
            let (events, deliveries, acked, next) = (
                events.clone(),
                deliveries.clone(),
                acked.clone(),
                next.clone(),
            );
            std::thread::spawn(move || {
                let agent = agent();
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(&event) = deliveries.get(i) else {
                        break;
                    };
                    match deliver(&agent, port, &events[event]) {
                        Some(_) => acked[event].store(true, Ordering::SeqCst),
                        None => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })
        })
        .collect();
    let killer = {
        let (server, next, total, max_wal) = (
            server.clone(),
            next.clone(),
            deliveries.len(),
            max_wal.clone(),
        );
        let wal = PathBuf::from(format!("{}-wal", db.display()));
        let jitter: Vec<u64> = (0..kills).map(|_| rng.u64(0..4000)).collect();
        std::thread::spawn(move || {
            for (k, jitter_us) in jitter.into_iter().enumerate() {
                let threshold = (k + 1) * total / (kills + 1);
                while next.load(Ordering::SeqCst) < threshold {
                    std::thread::sleep(Duration::from_micros(200));
                }
                std::thread::sleep(Duration::from_micros(jitter_us));
                if let Ok(meta) = std::fs::metadata(&wal) {
                    max_wal.fetch_max(meta.len() as usize, Ordering::SeqCst);
                }
                server.lock().unwrap().kill9_and_restart();
            }
        })
    };
    for sender in senders {
        sender.join().unwrap();
    }
    killer.join().unwrap();
    let phase1 = started.elapsed();

    // Before any redelivery: what the kills did.
    let ids: HashMap<(Provider, &str), usize> = events
        .iter()
        .enumerate()
        .map(|(i, e)| ((e.provider, e.id.as_str()), i))
        .collect();
    let stored = stored_event_ids(&db);
    let acked_phase1: Vec<bool> = acked.iter().map(|a| a.load(Ordering::SeqCst)).collect();
    let present = |i: usize| stored.contains(&(events[i].provider, events[i].id.clone()));
    let lost: Vec<&str> = (0..events.len())
        .filter(|&i| acked_phase1[i] && !present(i))
        .map(|i| events[i].id.as_str())
        .collect();
    let recovered = (0..events.len())
        .filter(|&i| !acked_phase1[i] && present(i))
        .count();
    let unacked = acked_phase1.iter().filter(|a| !**a).count();
    let unexpected: Vec<_> = stored
        .iter()
        .filter(|(p, id)| !ids.contains_key(&(*p, id.as_str())))
        .collect();

    // Phase 2: redeliver everything not acknowledged, until it is.
    let agent = agent();
    for (i, event) in events.iter().enumerate() {
        if acked_phase1[i] {
            continue;
        }
        let mut answered = None;
        for _ in 0..50 {
            answered = deliver(&agent, port, event);
            if answered.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(answered.is_some(), "{} was never acknowledged", event.id);
    }
    // Phase 3: everything once more: every answer is a duplicate.
    let mut not_duplicate = Vec::new();
    for event in events.iter() {
        let status = deliver(&agent, port, event);
        if status.as_deref() != Some("duplicate") {
            not_duplicate.push((event.id.clone(), status));
        }
    }
    if let Ok(meta) = std::fs::metadata(format!("{}-wal", db.display())) {
        max_wal.fetch_max(meta.len() as usize, Ordering::SeqCst);
    }
    // The relay finishes its work: rows a killed relay held wait out their lease.
    let drain_deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let pending: i64 = Connection::open(&db)
            .unwrap()
            .query_row(
                "SELECT count(*) FROM email_outbox WHERE status = 'pending'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        if pending == 0 {
            break;
        }
        assert!(
            Instant::now() < drain_deadline,
            "{pending} emails still pending a minute after the load"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    server.lock().unwrap().stop();

    let conn = Connection::open(&db).unwrap();
    let report = check_invariants(&conn, &events, &orders);
    let emails = check_emails(&conn, &dir.path().join("mail"));
    println!(
        "crash chaos: {} events ({} orders), {} deliveries from {SENDERS} senders, {kills} SIGKILLs, seed {seed:#x}\n\
         phase 1: {:.1}s, {} acknowledged, {unacked} not acknowledged\n\
         lost (acked, missing): {}   recovered (unacked, present): {recovered}   unexpected rows: {}\n\
         after redelivery: {} event rows, {} transitions, {} outbox rows, largest WAL seen {:.1} MiB, total {:.1}s\n\
         emails: {} sent, each a whole .eml file",
        events.len(),
        orders.len(),
        deliveries.len(),
        phase1.as_secs_f64(),
        events.len() - unacked,
        lost.len(),
        unexpected.len(),
        report.events,
        report.transitions,
        report.outbox,
        max_wal.load(Ordering::SeqCst) as f64 / (1024.0 * 1024.0),
        started.elapsed().as_secs_f64(),
        emails,
    );
    assert!(lost.is_empty(), "acknowledged but missing: {lost:?}");
    assert!(unexpected.is_empty(), "rows nobody sent: {unexpected:?}");
    assert!(
        not_duplicate.is_empty(),
        "the final redelivery changed something: {:?}",
        &not_duplicate[..not_duplicate.len().min(10)]
    );
    assert!(
        max_wal.load(Ordering::SeqCst) <= 64 * 1024 * 1024,
        "the WAL grew without bound: {} bytes",
        max_wal.load(Ordering::SeqCst)
    );
}

/// Every outbox row with a recipient ends `sent` (the others `skipped`: the Midtrans events carry
/// no address), and each sent row has its file: whole (the MIME message ends with its closing
/// boundary) and naming the row's key in its Message-ID. Returns how many were sent.
fn check_emails(conn: &Connection, mail: &Path) -> usize {
    let mut stmt = conn
        .prepare(
            "SELECT idempotency_key, status, attempts FROM email_outbox
             WHERE status <> 'skipped' OR recipient IS NOT NULL",
        )
        .unwrap();
    let rows: Vec<(String, String, i64)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    for (key, status, attempts) in &rows {
        assert_eq!(
            status, "sent",
            "email {key} ended {status} after {attempts} attempts"
        );
        let path = mail.join(format!("{key}.eml"));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{} of a sent row: {e}", path.display()));
        assert!(
            text.contains(&format!("Message-ID: <{key}@")),
            "{}",
            path.display()
        );
        let boundary = text
            .split("boundary=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap_or_else(|| panic!("{} has no MIME boundary", path.display()));
        assert!(
            text.trim_end().ends_with(&format!("--{boundary}--")),
            "{} is cut short",
            path.display()
        );
    }
    // No stray temporary file is left behind as if it were an email.
    let files = std::fs::read_dir(mail)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".eml"))
        .count();
    assert_eq!(files, rows.len(), "one .eml file per row");
    rows.len()
}

fn stored_event_ids(db: &Path) -> HashSet<(Provider, String)> {
    stored_event_ids_conn(&Connection::open(db).unwrap())
}

/// (order_id, from_status, to_status, refunded_amount, event_id)
type Transition = (String, Option<String>, String, i64, String);

struct Report {
    events: usize,
    transitions: usize,
    outbox: usize,
}

fn check_invariants(conn: &Connection, events: &[Event], orders: &[ExpectedOrder]) -> Report {
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");

    // Exactly one row per event id (the primary key forbids more; none may be missing).
    let stored = stored_event_ids_conn(conn);
    assert_eq!(
        stored.len(),
        events.len(),
        "one processed_events row per event"
    );
    for event in events {
        assert!(
            stored.contains(&(event.provider, event.id.clone())),
            "{} is missing",
            event.id
        );
    }
    let parked: i64 = conn
        .query_row(
            "SELECT count(*) FROM processed_events WHERE outcome = 'parked'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(parked, 0, "every parked event found its order");

    // Final state equals in-order processing.
    for order in orders {
        let (status, refunded): (String, i64) = conn
            .query_row(
                "SELECT status, refunded_amount FROM orders WHERE order_id = ?1",
                [&order.id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap_or_else(|e| panic!("order {}: {e}", order.id));
        assert_eq!(
            (status.as_str(), refunded),
            (order.status, order.refunded),
            "order {}",
            order.id
        );
    }

    // Transitions form one chain per order, ending in the order's status.
    let mut stmt = conn
        .prepare("SELECT order_id, from_status, to_status, refunded_amount, event_id FROM order_transitions ORDER BY order_id, id")
        .unwrap();
    let transitions: Vec<Transition> = stmt
        .query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let mut by_order: HashMap<&str, Vec<&Transition>> = HashMap::new();
    for t in &transitions {
        by_order.entry(t.0.as_str()).or_default().push(t);
    }
    for order in orders {
        let chain = by_order
            .get(order.id.as_str())
            .unwrap_or_else(|| panic!("{} has no transitions", order.id));
        assert_eq!(
            chain[0].1, None,
            "{}: the first transition creates the order",
            order.id
        );
        for pair in chain.windows(2) {
            assert_eq!(
                pair[1].1.as_deref(),
                Some(pair[0].2.as_str()),
                "{}: broken chain",
                order.id
            );
            assert!(
                pair[1].3 >= pair[0].3,
                "{}: refunded money went down",
                order.id
            );
        }
        let last = chain.last().unwrap();
        assert_eq!(
            (last.2.as_str(), last.3),
            (order.status, order.refunded),
            "{}",
            order.id
        );
    }

    // The emails follow the money, one per change of it: a receipt once the order held money,
    // one refund notice per total given back (rising to the order's refunded amount), and a
    // payment-failed notice when the order failed; nothing else, and nothing twice.
    let mut stmt = conn
        .prepare(
            "SELECT order_id, template, json_extract(params, '$.refunded_amount')
             FROM email_outbox ORDER BY id",
        )
        .unwrap();
    let outbox: Vec<(String, String, i64)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    for order in orders {
        let of_order: Vec<&(String, String, i64)> =
            outbox.iter().filter(|row| row.0 == order.id).collect();
        let count = |template: &str| of_order.iter().filter(|row| row.1 == template).count();
        let held_money = matches!(
            order.status,
            "paid" | "partially_refunded" | "refunded" | "disputed"
        );
        assert_eq!(
            count("receipt"),
            usize::from(held_money),
            "{}: receipts",
            order.id
        );
        let failed = transitions
            .iter()
            .any(|t| t.0 == order.id && t.2 == "failed");
        assert_eq!(
            count("payment_failed"),
            usize::from(failed),
            "{}: payment-failed notices",
            order.id
        );
        let totals: Vec<i64> = of_order
            .iter()
            .filter(|row| row.1 == "refund_notice")
            .map(|row| row.2)
            .collect();
        assert!(
            totals.windows(2).all(|w| w[0] < w[1]),
            "{}: refund notices {totals:?}, each for more given back",
            order.id
        );
        assert_eq!(
            totals.last().copied().unwrap_or(0),
            order.refunded,
            "{}: the last refund notice tells all that was given back",
            order.id
        );
    }

    Report {
        events: stored.len(),
        transitions: transitions.len(),
        outbox: outbox.len(),
    }
}

fn stored_event_ids_conn(conn: &Connection) -> HashSet<(Provider, String)> {
    let mut stmt = conn
        .prepare("SELECT provider, event_id FROM processed_events")
        .unwrap();
    stmt.query_map([], |r| {
        let provider: String = r.get(0)?;
        let provider = if provider == "stripe" {
            Provider::Stripe
        } else {
            Provider::Midtrans
        };
        Ok((provider, r.get::<_, String>(1)?))
    })
    .unwrap()
    .map(Result::unwrap)
    .collect()
}
