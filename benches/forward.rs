//! `cargo bench --bench forward`: what forwarding costs the webhooks, and how fast it catches up.
//!
//! The real server as shops run it with forwarding on (`sekali serve`: the email relay writing
//! `.eml` files, and every order change forwarded to a local endpoint that answers 200 at once),
//! against the same without forwarding (forwarding's own cost) and against `sekali serve
//! --no-relay` without forwarding (the cost of both outboxes), interleaved round by round so that
//! the machine's drift falls on all three; then, for each forwarding run, the time from the end
//! of the load until every change was forwarded. The load is `sekali bench`'s generator (signed at send
//! time, 20 % racing redeliveries). Sizes: SEKALI_BENCH_EVENTS (default 200000),
//! SEKALI_BENCH_CONCURRENCY (default 64), SEKALI_BENCH_ROUNDS (default 3).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sekali::bench::{run_bench, BenchConfig, BenchReport};
use sekali::providers::stripe::Stripe;

const SECRET: &str = "whsec_bench_c2VrYWxpLWJlbmNo";
/// 32 bytes, base64: a forwarding secret for the runs.
const FORWARD_SECRET: &str = "whsec_c2VrYWxpLWZvcndhcmQtYmVuY2gtc2VjcmV0LTMyYg==";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The shop's endpoint: answers 200 at once to every POST, and counts them.
fn start_receiver() -> (u16, Arc<AtomicU64>) {
    let port = free_port();
    let received = Arc::new(AtomicU64::new(0));
    let counter = received.clone();
    std::thread::spawn(move || {
        actix_web::rt::System::new().block_on(async move {
            actix_web::HttpServer::new(move || {
                let counter = counter.clone();
                actix_web::App::new().default_service(actix_web::web::to(move || {
                    counter.fetch_add(1, Ordering::Relaxed);
                    async { actix_web::HttpResponse::Ok().finish() }
                }))
            })
            .workers(1)
            .bind(("127.0.0.1", port))
            .unwrap()
            .run()
            .await
            .unwrap()
        })
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the receiver did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    (port, received)
}

struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start(db: &Path, extra: &[&str], forward_to: Option<u16>) -> Server {
        let port = free_port();
        let mut command = Command::new(env!("CARGO_BIN_EXE_sekali"));
        command
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--db"])
            .arg(db)
            .arg("--mail-dir")
            .arg(db.with_file_name("mail"))
            .args(extra)
            .env("STRIPE_WEBHOOK_SECRET", SECRET)
            .env_remove("RUST_LOG")
            .env_remove("SEKALI_FORWARD_URL")
            .env_remove("SEKALI_FORWARD_SECRET")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(receiver) = forward_to {
            command
                .env(
                    "SEKALI_FORWARD_URL",
                    format!("http://127.0.0.1:{receiver}/hooks"),
                )
                .env("SEKALI_FORWARD_SECRET", FORWARD_SECRET);
        }
        let child = command.spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "the server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Server { child, port }
    }

    fn stop(mut self) {
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        self.child.wait().unwrap();
    }
}

fn count(db: &Path, sql: &str) -> i64 {
    rusqlite::Connection::open(db)
        .unwrap()
        .query_row(sql, [], |r| r.get(0))
        .unwrap()
}

/// One load against a fresh server; with `forward_to`, also the time from the end of the load
/// until no change waits to be forwarded, and how many were forwarded.
fn measure(
    label: &str,
    runs: &Path,
    extra: &[&str],
    forward_to: Option<u16>,
    events: usize,
    concurrency: usize,
) -> (BenchReport, Option<(Duration, i64, i64)>) {
    let dir = tempfile::tempdir_in(runs).unwrap().keep();
    let db = dir.join("bench.db");
    Command::new("sync").status().unwrap();
    let server = Server::start(&db, extra, forward_to);
    let config = BenchConfig {
        urls: vec![format!("http://127.0.0.1:{}/webhooks/stripe", server.port)],
        provider: Arc::new(Stripe::with_secrets(&[SECRET])),
        events,
        dup_ratio: 0.2,
        concurrency,
        max_seconds: 600.0,
        threads: 1,
        rate: None,
        random_ids: false,
        retry: false,
        check_db: None,
        force: false,
        cleanup: None,
    };
    let report = run_bench(&config).expect("bench runs");
    let load_ended = Instant::now();
    let forwarded = forward_to.map(|_| {
        let backlog = count(
            &db,
            "SELECT count(*) FROM forward_outbox WHERE status = 'pending'",
        );
        let any_pending = "SELECT EXISTS (SELECT 1 FROM forward_outbox WHERE status = 'pending')";
        while count(&db, any_pending) > 0 {
            assert!(
                load_ended.elapsed() < Duration::from_secs(600),
                "{label}: forwarding did not catch up"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let sent = count(
            &db,
            "SELECT count(*) FROM forward_outbox WHERE status = 'sent'",
        );
        let changes = count(&db, "SELECT count(*) FROM order_transitions");
        assert_eq!(sent, changes, "{label}: every change forwarded");
        (load_ended.elapsed(), backlog, sent)
    });
    server.stop();
    if let Some(why) = report.failure() {
        panic!("{label}: {why}");
    }
    let p99 = report.p99_ms.expect("every delivery was answered 2xx");
    print!(
        "{label:<48} {:>9.0}/s  p99 {p99:>7.2} ms",
        report.deliveries_per_sec
    );
    match &forwarded {
        Some((drained, backlog, sent)) => println!(
            "  {sent} changes forwarded, {backlog} after the load, all within {:.1} s of its end",
            drained.as_secs_f64()
        ),
        None => println!(),
    }
    (report, forwarded)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let setting = |name: &str, default: usize| -> usize {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let events = setting("SEKALI_BENCH_EVENTS", 200_000);
    let concurrency = setting("SEKALI_BENCH_CONCURRENCY", 64);
    let rounds = setting("SEKALI_BENCH_ROUNDS", 3);
    let runs = tempfile::tempdir().unwrap();
    let (receiver, received) = start_receiver();
    println!(
        "sekali forwarding: {events} unique Stripe deliveries + 20 % redeliveries, {concurrency} connections, {rounds} interleaved rounds, {} cores shared with the load generator and the receiver",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let (mut forwarding, mut emails_only, mut bare, mut drains) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut forwarding_p99, mut emails_only_p99) = (Vec::new(), Vec::new());
    let p99 = |report: &BenchReport| report.p99_ms.expect("every delivery was answered 2xx");
    for round in 1..=rounds {
        let (report, forwarded) = measure(
            &format!("serve + forwarding (default), #{round}"),
            runs.path(),
            &[],
            Some(receiver),
            events,
            concurrency,
        );
        forwarding.push(report.deliveries_per_sec);
        forwarding_p99.push(p99(&report));
        drains.push(forwarded.expect("forwarding measured").0.as_secs_f64());
        let (report, _) = measure(
            &format!("serve (default), no forwarding, #{round}"),
            runs.path(),
            &[],
            None,
            events,
            concurrency,
        );
        emails_only.push(report.deliveries_per_sec);
        emails_only_p99.push(p99(&report));
        let (report, _) = measure(
            &format!("serve --no-relay, no forwarding, #{round}"),
            runs.path(),
            &["--no-relay"],
            None,
            events,
            concurrency,
        );
        bare.push(report.deliveries_per_sec);
    }
    let (forwarding, emails_only, bare) = (median(forwarding), median(emails_only), median(bare));
    println!(
        "medians: forwarding {forwarding:.0}/s, without forwarding {emails_only:.0}/s, --no-relay {bare:.0}/s; forwarding / without: {:.2} (p99 {:.2}), forwarding / --no-relay: {:.2}; every change forwarded within {:.1} s of the load's end (median; worst {:.1} s); the receiver answered {} requests",
        forwarding / emails_only,
        median(forwarding_p99) / median(emails_only_p99),
        forwarding / bare,
        median(drains.clone()),
        drains.iter().copied().fold(0.0, f64::max),
        received.load(Ordering::Relaxed)
    );
}
