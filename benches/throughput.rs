//! `cargo bench --bench throughput`: durable throughput of the real server as shops run it
//! (`sekali serve`: the outbox relay on, writing `.eml` files), against `--no-relay`, and group
//! commit against one transaction per delivery, in one run on this machine (the load generator
//! shares the cores).
//!
//! Each configuration gets a fresh database and mail directory and a fresh `sekali serve` child
//! process; the load is `sekali bench`'s generator (signed at send time, 20 % racing
//! redeliveries), and afterwards the relay's backlog is timed until every email is `sent`. Peak
//! RSS is the server's VmHWM. Sizes: SEKALI_BENCH_EVENTS (default 200000: long enough that the
//! relay is really working), SEKALI_BENCH_CONCURRENCY (default 64).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sekali::bench::{run_bench, BenchConfig, BenchReport};
use sekali::providers::stripe::Stripe;

const SECRET: &str = "whsec_bench_c2VrYWxpLWJlbmNo";

struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start(db: &Path, extra: &[&str]) -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(env!("CARGO_BIN_EXE_sekali"))
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--db"])
            .arg(db)
            .arg("--mail-dir")
            .arg(db.with_file_name("mail"))
            .args(extra)
            .env("STRIPE_WEBHOOK_SECRET", SECRET)
            // The default log level (info), as a deployment would run it; the lines themselves
            // would only bury the figures.
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "the server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Server { child, port }
    }

    /// Peak resident set size in KiB (VmHWM).
    fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    fn stop(mut self) {
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        self.child.wait().unwrap();
    }
}

/// Every run's files, deleted when the benchmark ends.
static RUNS: std::sync::LazyLock<tempfile::TempDir> =
    std::sync::LazyLock::new(|| tempfile::tempdir().unwrap());

/// What the relay did with the emails of a run.
struct Relay {
    /// Emails not sent yet when the load ended.
    backlog: i64,
    /// From the end of the load until every email was sent.
    drained_in: Duration,
}

fn count(db: &Path, sql: &str) -> i64 {
    rusqlite::Connection::open(db)
        .unwrap()
        .query_row(sql, [], |r| r.get(0))
        .unwrap()
}

fn measure(label: &str, extra: &[&str], events: usize, concurrency: usize) -> (BenchReport, u64) {
    let (report, rss, _) = measure_with_relay(label, extra, events, concurrency);
    (report, rss)
}

fn measure_with_relay(
    label: &str,
    extra: &[&str],
    events: usize,
    concurrency: usize,
) -> (BenchReport, u64, Option<Relay>) {
    // Kept until the end of the run (see `RUNS`): on ext4 without a journal, deleting the last
    // run's 200,000 files slows the file creation of the runs after it for minutes (see
    // make_work_dir in benches/lib.sh).
    let dir = tempfile::tempdir_in(RUNS.path()).unwrap().keep();
    let db = dir.join("bench.db");
    // Each configuration starts with nothing dirty in the page cache. The relay's syncfs (one
    // per file batch) writes out everything dirty on the file system, and the commits of
    // deliveries wait for it: the first configuration after `cargo bench`'s build paid for the
    // build's output (a first syncfs of 117 ms with 136 MB dirty, commits of 68 and 43 ms
    // behind it; 3-6 ms per syncfs once nothing else was dirty).
    Command::new("sync").status().unwrap();
    let server = Server::start(&db, extra);
    let config = BenchConfig {
        urls: vec![format!("http://127.0.0.1:{}/webhooks/stripe", server.port)],
        provider: std::sync::Arc::new(Stripe::with_secrets(&[SECRET])),
        events,
        dup_ratio: 0.2,
        concurrency,
        max_seconds: 300.0,
        threads: 1,
        rate: None,
        random_ids: false,
        retry: false,
        // Checked once the relay has drained: four scans of the run's rows beside the relay
        // slowed its drain about fivefold (16,000 emails/s alone, 3,000/s beside the check).
        check_db: None,
        force: false,
        cleanup: None,
    };
    let mut report = run_bench(&config).expect("bench runs");
    let load_ended = Instant::now();
    let relay = (!extra.contains(&"--no-relay")).then(|| {
        let backlog = count(
            &db,
            "SELECT count(*) FROM email_outbox WHERE status = 'pending'",
        );
        // One index entry a poll: counting 200,000 pending rows every 20 ms took a tenth of a
        // core from the relay it was timing, and its read transactions held back checkpoints.
        let any_pending = "SELECT EXISTS (SELECT 1 FROM email_outbox WHERE status = 'pending')";
        while count(&db, any_pending) > 0 {
            assert!(
                load_ended.elapsed() < Duration::from_secs(300),
                "{label}: the relay did not drain its backlog"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Relay {
            backlog,
            drained_in: load_ended.elapsed(),
        }
    });
    report.check_db =
        Some(sekali::bench::check_db(&db, &report.run_id, report.unique).expect("checks the run"));
    let rss = server.peak_rss_kib();
    server.stop();
    // A figure is only worth printing when the server accepted every delivery.
    if let Some(why) = report.failure() {
        panic!("{label}: {why}");
    }
    let ms = |v: Option<f64>| v.expect("every delivery was answered 2xx");
    println!(
        "{label:<44} {:>9.0}/s  p50 {:>6.2} ms  p99 {:>7.2} ms  max {:>7.2} ms  peak RSS {:>5.1} MiB  check {}",
        report.deliveries_per_sec,
        ms(report.p50_ms),
        ms(report.p99_ms),
        ms(report.max_ms),
        rss as f64 / 1024.0,
        report.check_db.as_deref().unwrap_or("-"),
    );
    if let Some(relay) = &relay {
        let sent = count(
            &db,
            "SELECT count(*) FROM email_outbox WHERE status = 'sent'",
        );
        println!(
            "{:<44} {} emails sent, {} of them after the load: backlog drained in {:.1} s ({:.0}/s)",
            "  relay",
            sent,
            relay.backlog,
            relay.drained_in.as_secs_f64(),
            relay.backlog as f64 / relay.drained_in.as_secs_f64().max(1e-9),
        );
    }
    (report, rss, relay)
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` would run us too: do nothing then.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let events: usize = std::env::var("SEKALI_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let concurrency: usize = std::env::var("SEKALI_BENCH_CONCURRENCY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    println!(
        "sekali throughput: {events} unique Stripe deliveries + 20 % redeliveries, {} cores shared with the load generator",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    // What shops run, then the same without the relay, then without the relay or batching:
    // the first ratio is the relay's cost, the second the group commit's gain.
    let (default, default_rss, relay) = measure_with_relay(
        &format!("sekali serve (default: relay on), {concurrency} conns"),
        &[],
        events,
        concurrency,
    );
    let (batched, _) = measure(
        &format!("--no-relay, {concurrency} conns"),
        &["--no-relay"],
        events,
        concurrency,
    );
    // One transaction per delivery is several times slower: a tenth of the events lasts as
    // long.
    let (single, _) = measure(
        &format!("--no-relay --batch-max 1, {concurrency} conns"),
        &["--no-relay", "--batch-max", "1"],
        events / 10,
        concurrency,
    );
    let relay = relay.expect("the default runs the relay");
    let checked = "measure() checked that every delivery was answered 2xx";
    println!(
        "ratios: default / --no-relay: throughput {:.2}, p99 {:.2}, max {:.1} ms; every email sent {:.1} s after the load; peak RSS {:.1} MiB",
        default.deliveries_per_sec / batched.deliveries_per_sec,
        default.p99_ms.expect(checked) / batched.p99_ms.expect(checked),
        default.max_ms.expect(checked),
        relay.drained_in.as_secs_f64(),
        default_rss as f64 / 1024.0,
    );
    // At one connection both settings run the same code (batches of one: there is no batching
    // timer), so their p50s differ only by the machine's noise. Alternate short runs and compare
    // medians, so that one noisy run does not decide the comparison.
    let lone = events.min(2000);
    let (mut batched_p50s, mut single_p50s) = (Vec::new(), Vec::new());
    for round in 1..=LONE_ROUNDS {
        let (batched_one, _) = measure(
            &format!("--no-relay, 1 conn, #{round}"),
            &["--no-relay"],
            lone,
            1,
        );
        let (single_one, _) = measure(
            &format!("--no-relay --batch-max 1, 1 conn, #{round}"),
            &["--no-relay", "--batch-max", "1"],
            lone,
            1,
        );
        batched_p50s.push(batched_one.p50_ms.expect(checked));
        single_p50s.push(single_one.p50_ms.expect(checked));
    }
    let (batched_p50, single_p50) = (median(batched_p50s), median(single_p50s));
    println!(
        "ratios: group commit / batch-max-1 (both --no-relay) = {:.1}x at {concurrency} conns; p50 at 1 conn (median of {LONE_ROUNDS} alternating runs) {batched_p50:.2} ms / {single_p50:.2} ms = {:.2}",
        batched.deliveries_per_sec / single.deliveries_per_sec,
        batched_p50 / single_p50,
    );
    // Statics are not dropped: the runs' files go here, after the last figure, unless they are
    // to be kept for a benchmark that follows (SEKALI_BENCH_KEEP=1, as the scripts in benches/).
    if std::env::var_os("SEKALI_BENCH_KEEP").is_some_and(|keep| keep == "1") {
        eprintln!("the runs' files are kept in {}", RUNS.path().display());
    } else {
        let _ = std::fs::remove_dir_all(RUNS.path());
    }
}

/// Runs of each setting at one connection, alternating.
const LONE_ROUNDS: usize = 5;

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
