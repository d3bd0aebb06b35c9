//! `cargo bench --bench writer`: the write path alone, without HTTP or a load generator.
//!
//! It feeds the real [`Writer`] rounds of `SEKALI_BENCH_ROUND` (default 64) deliveries at once,
//! as 64 waiting connections would, and reports deliveries per second and the process's CPU
//! time per delivery, for the default batch size and for `--batch-max 1`. Every delivery is a
//! new Stripe `payment_intent.succeeded`: a new order, its transition, its PaymentIntent link
//! and its receipt in the outbox. This isolates what the writer thread, the one serial part of
//! the server, pays per delivery.
//!
//! Settings: SEKALI_BENCH_EVENTS (default 20000), SEKALI_BENCH_ROUND, and SEKALI_BENCH_BATCH_MAX
//! (default `256,1`), which picks the configurations. Instruction counts that repeat exactly
//! from run to run, for comparing two builds on a noisy machine:
//!
//! ```sh
//! SEKALI_BENCH_BATCH_MAX=256 SEKALI_BENCH_EVENTS=3000 \
//!     valgrind --tool=callgrind target/release/deps/writer-<hash> --bench
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use sekali::bench::EventTemplate;
use sekali::clock::{SharedClock, SystemClock};
use sekali::providers::stripe::{self, Stripe};
use sekali::store::sqlite::{Writer, WriterConfig, DEFAULT_BUSY_TIMEOUT};
use sekali::store::Outcome;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// User plus system CPU time of this process (the writer thread and the submitting thread).
fn cpu_time() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

#[derive(Clone, Copy)]
struct Figures {
    per_sec: f64,
    cpu_us_per_delivery: f64,
}

fn run(batch_max: usize, events: usize, round: usize) -> Figures {
    let dir = tempfile::tempdir().unwrap();
    let clock: SharedClock = Arc::new(SystemClock);
    let writer = Writer::start(
        WriterConfig {
            db_path: dir.path().join("writer-bench.db"),
            batch_max,
            queue_capacity: 4096,
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
            max_page_count: None,
            reread: None,
            commit_faults: Default::default(),
        },
        clock,
    )
    .unwrap();
    let template = EventTemplate::new(
        &Stripe::with_secrets(&["whsec_bench"]),
        &format!("w{batch_max}"),
    );
    // Parsing is the HTTP workers' job: done before the clock starts.
    let deliveries: Vec<_> = (0..events)
        .map(|i| {
            let body = template.render(i);
            let event = stripe::parse_event(&body).unwrap();
            (event, String::from_utf8(body).unwrap())
        })
        .collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let cpu_start = cpu_time();
    let start = Instant::now();
    runtime.block_on(async {
        let mut deliveries = deliveries.into_iter();
        loop {
            let round: Vec<_> = deliveries.by_ref().take(round).collect();
            if round.is_empty() {
                break;
            }
            let answers = futures_util::future::join_all(
                round
                    .into_iter()
                    .map(|(event, payload)| writer.record(event, payload)),
            )
            .await;
            for answer in answers {
                assert_eq!(answer.unwrap(), Outcome::Processed);
            }
        }
    });
    let elapsed = start.elapsed();
    let cpu = cpu_time() - cpu_start;
    writer.shutdown();
    Figures {
        per_sec: events as f64 / elapsed.as_secs_f64(),
        cpu_us_per_delivery: cpu.as_secs_f64() * 1e6 / events as f64,
    }
}

fn main() {
    // `cargo test --benches` runs bench targets with --bench absent: keep that quick.
    let quick = !std::env::args().any(|a| a == "--bench");
    let events = env_usize("SEKALI_BENCH_EVENTS", if quick { 512 } else { 20_000 });
    let round = env_usize("SEKALI_BENCH_ROUND", 64);
    println!("writer alone: {events} new-order deliveries, {round} submitted at a time");
    println!("| batch-max | deliveries/s | CPU µs per delivery |");
    println!("|---|---|---|");
    // SEKALI_BENCH_BATCH_MAX=256 measures one configuration (e.g. under callgrind).
    let configurations: Vec<usize> = std::env::var("SEKALI_BENCH_BATCH_MAX")
        .ok()
        .map(|v| v.split(',').filter_map(|b| b.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![256, 1]);
    let mut results = Vec::new();
    for &batch_max in &configurations {
        let f = run(batch_max, events, round);
        println!(
            "| {batch_max} | {:.0} | {:.1} |",
            f.per_sec, f.cpu_us_per_delivery
        );
        results.push(f);
    }
    if let [grouped, single] = results[..] {
        println!(
            "ratio: {:.1}x the deliveries/s of one transaction per delivery",
            grouped.per_sec / single.per_sec
        );
    }
}
