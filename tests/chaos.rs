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
//!
//! The same on PostgreSQL, with two instances: two `sekali serve --db postgres://...` share one
//! fresh database of the tests' private server (tests/support/postgres.rs), each with its own
//! mail directory and its own relay. The senders spread the deliveries over both (an event's
//! redeliveries go to the instance its first delivery did not, and every other delivery that fails
//! is sent at once to the other one); instance A is killed with SIGKILL at K random moments and
//! restarted while B keeps running. Then the same redelivery and the same checks, in SQL both
//! engines run, against PostgreSQL (not the SQLite file's own: integrity_check and the WAL). The
//! emails: every row sent, and the `.eml` files of both mail directories together hold each
//! sent row's key, each whole; a key is in both directories only where the row was claimed again
//! after a lease ran out: its copy in A's directory written before a SIGKILL of A and its copy in
//! B's after it, or a relay's log saying its lease ran out on it. Sizes: `SEKALI_CHAOS_PG_EVENTS`
//! (default 2000) and `SEKALI_CHAOS_PG_KILLS` (default 6). Without PostgreSQL installed the test
//! passes after one line saying so (with `SEKALI_REQUIRE_POSTGRES=1`, as in CI, it fails).

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
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
    /// What `--db` names: the SQLite file, or a PostgreSQL URL.
    db: OsString,
    mail: PathBuf,
    log: PathBuf,
}

impl Server {
    /// Starts the server on a port of the system's choosing, which `port` then holds.
    fn start(db: &OsStr, mail: &Path, log: &Path) -> Server {
        let mut server = Server {
            child: None,
            port: 0,
            db: db.to_owned(),
            mail: mail.to_owned(),
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
            .arg(&self.mail)
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

    /// Returns when the killed process was gone: every file it wrote is older.
    fn kill9_and_restart(&mut self) -> SystemTime {
        let mut child = self.child.take().unwrap();
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let dead = SystemTime::now();
        self.spawn();
        dead
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
    let server = Server::start(db.as_os_str(), &dir.path().join("mail"), &log);
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
    let acked_phase1: Vec<bool> = acked.iter().map(|a| a.load(Ordering::SeqCst)).collect();
    let stored = stored_event_ids(&helpers::Database::File(db.clone()));
    let Damage {
        lost,
        recovered,
        unacked,
        unexpected,
    } = kill_damage(&events, &acked_phase1, &stored);

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
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    let database = helpers::Database::File(db.clone());
    let report = check_invariants(&database, &events, &orders);
    let emails = check_emails(&database, &dir.path().join("mail"));
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

// ---------------------------------------------------------------------------------------------
// The same run on PostgreSQL: two instances, one of them killed

#[test]
fn crash_chaos_on_postgres_with_two_instances_loses_nothing_and_applies_nothing_twice() {
    let Some(cluster) = helpers::pg_cluster::shared() else {
        println!("{}", helpers::pg_cluster::skip_note());
        return;
    };
    let events_wanted = env_usize("SEKALI_CHAOS_PG_EVENTS", 2000);
    let kills = env_usize("SEKALI_CHAOS_PG_KILLS", 6);
    let seed = env_usize("SEKALI_CHAOS_SEED", 0x5e_ca11) as u64;
    let mut rng = fastrand::Rng::with_seed(seed);
    let started = Instant::now();

    let Workload { events, orders } = workload(events_wanted);
    let events = Arc::new(events);
    // Every event once, plus redeliveries making up a third of all requests, shuffled. Each
    // event's first delivery goes to either instance; its redeliveries go to the other one.
    let mut deliveries: Vec<usize> = (0..events.len()).collect();
    deliveries.extend((0..events.len() / 2).map(|_| rng.usize(..events.len())));
    rng.shuffle(&mut deliveries);
    let mut first_to: Vec<Option<usize>> = vec![None; events.len()];
    let targets: Vec<usize> = deliveries
        .iter()
        .map(|&event| match first_to[event] {
            Some(first) => 1 - first,
            None => *first_to[event].insert(rng.usize(0..2)),
        })
        .collect();
    let first_to: Vec<usize> = first_to.into_iter().map(Option::unwrap).collect();
    let (deliveries, targets) = (Arc::new(deliveries), Arc::new(targets));

    let database = cluster.fresh_database();
    let url = cluster.url(&database);
    let dir = tempfile::tempdir().unwrap();
    let (mail_a, mail_b) = (dir.path().join("mail-a"), dir.path().join("mail-b"));
    let (log_a, log_b) = (dir.path().join("a.log"), dir.path().join("b.log"));
    // One after the other: the first creates the schema.
    let a = Server::start(OsStr::new(&url), &mail_a, &log_a);
    let mut b = Server::start(OsStr::new(&url), &mail_b, &log_b);
    let ports = [a.port, b.port];
    let a = Arc::new(Mutex::new(a));

    // Phase 1: concurrent senders over both instances; a killer thread kills and restarts A K
    // times, while B keeps running. Every other delivery that fails is sent at once to the other
    // instance.
    let acked: Arc<Vec<AtomicBool>> =
        Arc::new((0..events.len()).map(|_| AtomicBool::new(false)).collect());
    let next = Arc::new(AtomicUsize::new(0));
    let sent_on = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    let failed_over = Arc::new(AtomicUsize::new(0));
    let senders: Vec<_> = (0..SENDERS)
        .map(|_| {
            let (events, deliveries, targets, acked, next, sent_on, failed_over) = (
                events.clone(),
                deliveries.clone(),
                targets.clone(),
                acked.clone(),
                next.clone(),
                sent_on.clone(),
                failed_over.clone(),
            );
            std::thread::spawn(move || {
                let agent = agent();
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(&event) = deliveries.get(i) else {
                        break;
                    };
                    let to = targets[i];
                    sent_on[to].fetch_add(1, Ordering::Relaxed);
                    let mut answered = deliver(&agent, ports[to], &events[event]);
                    // Every other failed delivery: the rest wait for phase 2.
                    if answered.is_none() && i % 2 == 0 {
                        failed_over.fetch_add(1, Ordering::Relaxed);
                        sent_on[1 - to].fetch_add(1, Ordering::Relaxed);
                        answered = deliver(&agent, ports[1 - to], &events[event]);
                    }
                    match answered {
                        Some(_) => acked[event].store(true, Ordering::SeqCst),
                        None => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })
        })
        .collect();
    let killer = {
        let (a, next, total) = (a.clone(), next.clone(), deliveries.len());
        let jitter: Vec<u64> = (0..kills).map(|_| rng.u64(0..4000)).collect();
        std::thread::spawn(move || {
            let mut deaths = Vec::new();
            for (k, jitter_us) in jitter.into_iter().enumerate() {
                let threshold = (k + 1) * total / (kills + 1);
                while next.load(Ordering::SeqCst) < threshold {
                    std::thread::sleep(Duration::from_micros(200));
                }
                std::thread::sleep(Duration::from_micros(jitter_us));
                deaths.push(a.lock().unwrap().kill9_and_restart());
            }
            deaths
        })
    };
    for sender in senders {
        sender.join().unwrap();
    }
    let deaths_of_a = killer.join().unwrap();
    let phase1 = started.elapsed();

    // Before any redelivery: what the kills did.
    let pg = helpers::Database::Server(url.clone());
    let acked_phase1: Vec<bool> = acked.iter().map(|a| a.load(Ordering::SeqCst)).collect();
    let damage = kill_damage(&events, &acked_phase1, &stored_event_ids(&pg));

    // Phase 2: redeliver everything not acknowledged, until it is: first to the instance its
    // first delivery did not go to, then to each in turn.
    let agent = agent();
    for (i, event) in events.iter().enumerate() {
        if acked_phase1[i] {
            continue;
        }
        let mut answered = None;
        for attempt in 0..50 {
            answered = deliver(&agent, ports[(1 - first_to[i] + attempt) % 2], event);
            if answered.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(answered.is_some(), "{} was never acknowledged", event.id);
    }
    // Phase 3: everything once more, to both instances in turn: every answer is a duplicate.
    let mut not_duplicate = Vec::new();
    for (i, event) in events.iter().enumerate() {
        let status = deliver(&agent, ports[i % 2], event);
        if status.as_deref() != Some("duplicate") {
            not_duplicate.push((event.id.clone(), status));
        }
    }
    // The relays finish their work: rows a killed relay held wait out their lease.
    let drain_deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let pending = count(
            &pg,
            "SELECT count(*) FROM email_outbox WHERE status = 'pending'",
        );
        if pending == 0 {
            break;
        }
        assert!(
            Instant::now() < drain_deadline,
            "{pending} emails still pending a minute after the load"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    a.lock().unwrap().stop();
    b.stop();

    let report = check_invariants(&pg, &events, &orders);
    let logs = [&log_a, &log_b]
        .map(|log| std::fs::read_to_string(log).unwrap())
        .join("");
    let emails = check_emails_in_two_dirs(&pg, [&mail_a, &mail_b], &deaths_of_a, &logs);
    println!(
        "crash chaos on PostgreSQL: {} events ({} orders), {} deliveries from {SENDERS} senders to two instances \
         ({} to A, {} to B, {} of them sent again to the other after a failure), {kills} SIGKILLs of A, seed {seed:#x}\n\
         phase 1: {:.1}s, {} acknowledged, {} not acknowledged\n\
         lost (acked, missing): {}   recovered (unacked, present): {}   unexpected rows: {}\n\
         after redelivery: {} event rows, {} transitions, {} outbox rows, total {:.1}s\n\
         emails: {} sent, each a whole .eml file: {} files in A's mail directory, {} in B's, \
         {} keys in both (claimed again after A's SIGKILL; {} of them after a lease that ran out otherwise)",
        events.len(),
        orders.len(),
        deliveries.len(),
        sent_on[0].load(Ordering::Relaxed),
        sent_on[1].load(Ordering::Relaxed),
        failed_over.load(Ordering::Relaxed),
        phase1.as_secs_f64(),
        events.len() - damage.unacked,
        damage.unacked,
        damage.lost.len(),
        damage.recovered,
        damage.unexpected.len(),
        report.events,
        report.transitions,
        report.outbox,
        started.elapsed().as_secs_f64(),
        emails.sent,
        emails.files[0],
        emails.files[1],
        emails.in_both,
        emails.leases_ran_out,
    );
    assert!(
        damage.lost.is_empty(),
        "acknowledged but missing: {:?}",
        damage.lost
    );
    assert!(
        damage.unexpected.is_empty(),
        "rows nobody sent: {:?}",
        damage.unexpected
    );
    assert!(
        not_duplicate.is_empty(),
        "the final redelivery changed something: {:?}",
        &not_duplicate[..not_duplicate.len().min(10)]
    );
}

// ---------------------------------------------------------------------------------------------
// The checks, on either engine

/// A value that is not NULL.
fn text(value: &Option<String>) -> String {
    value.clone().expect("a value, not NULL")
}

/// An integer value (not NULL).
fn int(value: &Option<String>) -> i64 {
    let value = value.as_deref().expect("an integer, not NULL");
    value.parse().unwrap_or_else(|e| panic!("{value:?}: {e}"))
}

/// The one number `sql` answers (`count(*)`: an integer in SQLite, a bigint in PostgreSQL).
fn count(db: &helpers::Database, sql: &str) -> i64 {
    let rows = db.query(sql);
    assert_eq!(rows.len(), 1, "{sql}: {rows:?}");
    int(&rows[0][0])
}

/// What the kills did, before any redelivery.
struct Damage {
    /// Acknowledged, yet missing.
    lost: Vec<String>,
    /// Not acknowledged (the answer was lost to a kill), yet committed.
    recovered: usize,
    unacked: usize,
    /// Rows of events nobody sent.
    unexpected: Vec<(Provider, String)>,
}

fn kill_damage(events: &[Event], acked: &[bool], stored: &HashSet<(Provider, String)>) -> Damage {
    let ids: HashSet<(Provider, &str)> =
        events.iter().map(|e| (e.provider, e.id.as_str())).collect();
    let present = |i: usize| stored.contains(&(events[i].provider, events[i].id.clone()));
    Damage {
        lost: (0..events.len())
            .filter(|&i| acked[i] && !present(i))
            .map(|i| events[i].id.clone())
            .collect(),
        recovered: (0..events.len())
            .filter(|&i| !acked[i] && present(i))
            .count(),
        unacked: acked.iter().filter(|a| !**a).count(),
        unexpected: stored
            .iter()
            .filter(|(p, id)| !ids.contains(&(*p, id.as_str())))
            .cloned()
            .collect(),
    }
}

/// Every outbox row with a recipient ends `sent` (the others `skipped`: the Midtrans events carry
/// no address). Their keys.
fn sent_email_keys(db: &helpers::Database) -> Vec<String> {
    let rows = db.query(
        "SELECT idempotency_key, status, attempts FROM email_outbox
         WHERE status <> 'skipped' OR recipient IS NOT NULL",
    );
    rows.iter()
        .map(|row| {
            let (key, status, attempts) = (text(&row[0]), text(&row[1]), int(&row[2]));
            assert_eq!(
                status, "sent",
                "email {key} ended {status} after {attempts} attempts"
            );
            key
        })
        .collect()
}

/// The `.eml` file of the row `key`: whole (the MIME message ends with its closing boundary)
/// and naming the key in its Message-ID.
fn check_eml(path: &Path, key: &str) {
    let text = std::fs::read_to_string(path)
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

/// The `.eml` files in `mail` by the key they are named after (none if it does not exist).
fn eml_files(mail: &Path) -> HashMap<String, PathBuf> {
    let Ok(entries) = std::fs::read_dir(mail) else {
        return HashMap::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            Some((name.strip_suffix(".eml")?.to_owned(), e.path()))
        })
        .collect()
}

/// Every outbox row with a recipient ends `sent`, and each sent row has its file, whole and
/// naming the row's key (a kill between a file and its row's `sent` means the file is written
/// again: the documented at-least-once resend). Returns how many were sent.
fn check_emails(db: &helpers::Database, mail: &Path) -> usize {
    let keys = sent_email_keys(db);
    for key in &keys {
        check_eml(&mail.join(format!("{key}.eml")), key);
    }
    // No stray temporary file is left behind as if it were an email.
    let files = std::fs::read_dir(mail)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".eml"))
        .count();
    assert_eq!(files, keys.len(), "one .eml file per row");
    keys.len()
}

struct Emails {
    sent: usize,
    /// `.eml` files in A's mail directory and in B's.
    files: [usize; 2],
    /// Keys with a file in both.
    in_both: usize,
    /// Of those, the keys with no SIGKILL of A between the two files (a lease that ran out).
    leases_ran_out: usize,
}

/// [`check_emails`] for two instances, A (killed at `deaths_of_a`) and B, each writing into its
/// own mail directory: together they hold a whole file of every sent row, and nothing else. A
/// row's email is in both only where the row was claimed again after a lease ran out, the file
/// of the first claim left behind: A's copy written before a SIGKILL of A and B's after it, or
/// a relay's log (`logs`) saying its lease on the row ran out before it recorded the result.
/// Anything else is one email sent by two relays.
fn check_emails_in_two_dirs(
    db: &helpers::Database,
    mail: [&Path; 2],
    deaths_of_a: &[SystemTime],
    logs: &str,
) -> Emails {
    let keys = sent_email_keys(db);
    let sent: HashSet<&str> = keys.iter().map(String::as_str).collect();
    let files = mail.map(eml_files);
    for file in files.iter().flat_map(HashMap::values) {
        // No stray temporary file is left behind as if it were an email, nor anything else.
        let key = file.file_stem().unwrap().to_string_lossy();
        assert!(
            sent.contains(key.as_ref()),
            "{} is no sent row's email",
            file.display()
        );
    }
    let written = |path: &Path| std::fs::metadata(path).unwrap().modified().unwrap();
    let (mut in_both, mut leases_ran_out) = (0, 0);
    for key in &keys {
        let copies = [files[0].get(key), files[1].get(key)];
        assert!(
            copies.iter().any(Option::is_some),
            "the sent row {key} has no .eml file in either mail directory"
        );
        for path in copies.iter().flatten() {
            check_eml(path, key);
        }
        if let [Some(in_a), Some(in_b)] = copies {
            in_both += 1;
            let (at_a, at_b) = (written(in_a), written(in_b));
            let a_died_between = deaths_of_a.iter().any(|d| at_a <= *d && *d <= at_b);
            let lease_ran_out = logs
                .lines()
                .any(|line| line.contains(key.as_str()) && line.contains("lease ran out"));
            if !a_died_between {
                leases_ran_out += 1;
            }
            assert!(
                a_died_between || lease_ran_out,
                "{key} was sent by both instances (A wrote it at {at_a:?}, B at {at_b:?}), with \
                 no SIGKILL of A between the two and no relay whose lease on it ran out \
                 (A died at {deaths_of_a:?})"
            );
        }
    }
    Emails {
        sent: keys.len(),
        files: [files[0].len(), files[1].len()],
        in_both,
        leases_ran_out,
    }
}

/// (order_id, from_status, to_status, refunded_amount, event_id)
type Transition = (String, Option<String>, String, i64, String);

struct Report {
    events: usize,
    transitions: usize,
    outbox: usize,
}

fn check_invariants(db: &helpers::Database, events: &[Event], orders: &[ExpectedOrder]) -> Report {
    // Exactly one row per event id (the primary key forbids more; none may be missing).
    let stored = stored_event_ids(db);
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
    let parked = count(
        db,
        "SELECT count(*) FROM processed_events WHERE outcome = 'parked'",
    );
    assert_eq!(parked, 0, "every parked event found its order");

    // Final state equals in-order processing.
    let stored_orders: HashMap<String, (String, i64)> = db
        .query("SELECT order_id, status, refunded_amount FROM orders")
        .iter()
        .map(|row| (text(&row[0]), (text(&row[1]), int(&row[2]))))
        .collect();
    for order in orders {
        let (status, refunded) = stored_orders
            .get(&order.id)
            .unwrap_or_else(|| panic!("order {}: no row", order.id));
        assert_eq!(
            (status.as_str(), *refunded),
            (order.status, order.refunded),
            "order {}",
            order.id
        );
    }

    // Transitions form one chain per order, ending in the order's status.
    let transitions: Vec<Transition> = db
        .query(
            "SELECT order_id, from_status, to_status, refunded_amount, event_id
             FROM order_transitions ORDER BY order_id, id",
        )
        .iter()
        .map(|r| {
            (
                text(&r[0]),
                r[1].clone(),
                text(&r[2]),
                int(&r[3]),
                text(&r[4]),
            )
        })
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
    // payment-failed notice when the order failed; nothing else, and nothing twice. (The
    // params are JSON text on both engines, read here rather than with an engine's function.)
    let outbox: Vec<(String, String, i64)> = db
        .query("SELECT order_id, template, params FROM email_outbox ORDER BY id")
        .iter()
        .map(|r| {
            let params: serde_json::Value = serde_json::from_str(&text(&r[2])).unwrap();
            let refunded = params["refunded_amount"]
                .as_i64()
                .unwrap_or_else(|| panic!("params without refunded_amount: {params}"));
            (text(&r[0]), text(&r[1]), refunded)
        })
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

fn stored_event_ids(db: &helpers::Database) -> HashSet<(Provider, String)> {
    db.query("SELECT provider, event_id FROM processed_events")
        .iter()
        .map(|row| {
            let provider = if text(&row[0]) == "stripe" {
                Provider::Stripe
            } else {
                Provider::Midtrans
            };
            (provider, text(&row[1]))
        })
        .collect()
}
