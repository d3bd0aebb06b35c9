//! `sekali bench`: a load generator that ships with sekali, as pgbench ships with PostgreSQL.
//!
//! It sends `events` unique signed deliveries plus `dup_ratio × events` redeliveries over
//! `concurrency` keep-alive connections. Every request is signed at send time, as the provider
//! would (a Stripe redelivery gets a fresh `t` and signature), and each redelivery is sent right
//! next to its original, so the two race on different connections. The report is one JSON line
//! and a table. `--check-db` then verifies that every unique event has exactly one row and one
//! effect, and `--cleanup` removes the run's rows and files (see [`cleanup`]).
//!
//! It writes real orders: thousands of paid orders `bench_{run_id}_{i}`, each with its receipt
//! in the outbox, which the server's relay sends. So with `--check-db` it first looks in the
//! database, and refuses to send anything there beside orders that are not its own unless
//! `--force`; without it, it cannot look, and warns (see [`guard_database`]).
//!
//! By default each connection sends its next request as soon as the previous answer arrives (a
//! closed loop: the server's speed sets the rate). `--rate` offers a fixed rate instead, spread
//! evenly over the connections; a request that goes out late is timed from when it was due
//! (see `Pacing`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub mod cleanup;
mod cpu;
mod report;
mod server_metrics;

pub use cleanup::{CleanedUp, CleanupError};
pub use report::{BenchReport, Cleanup, SlowDelivery};
pub use server_metrics::ServerMetrics;

use crate::clock::{Clock, SystemClock};
use crate::providers::Provider;
use crate::store::RunMarker;

#[derive(Clone)]
pub struct BenchConfig {
    /// The webhook URL of each instance (one or more, on one database).
    pub urls: Vec<String>,
    /// Whose deliveries to imitate, configured with the server's secret.
    pub provider: Arc<dyn Provider>,
    pub events: usize,
    pub dup_ratio: f64,
    pub concurrency: usize,
    pub max_seconds: f64,
    /// Client threads, each with its own event loop (default: 1).
    pub threads: usize,
    /// Requests per second across all connections; `None`: as fast as answers come.
    pub rate: Option<f64>,
    /// Ids in no particular order instead of ascending with the event number (see
    /// [`EventTemplate::with_random_ids`]).
    pub random_ids: bool,
    /// Send a delivery answered 5xx again after its `Retry-After` (1 s without one), re-signed,
    /// as the providers do, until it is answered otherwise or its next try could fall after
    /// `max_seconds`.
    pub retry: bool,
    pub check_db: Option<PathBuf>,
    /// Send even when `check_db` holds orders that are not the load generator's.
    pub force: bool,
    /// After the run and its check, remove its rows from `check_db` and its `.eml` files from
    /// this mail directory (see [`cleanup`]).
    pub cleanup: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("cannot sign a {provider} delivery: {reason}")]
    Sign { provider: String, reason: String },
    #[error("--url {0}")]
    Url(String),
    #[error("--check-db: {0}")]
    Check(String),
    #[error(
        "--check-db {db} holds {count} {orders} not the load generator's ({examples}): \
         bench would add up to {events} paid orders beside them, each with a receipt that the \
         server's relay sends. Run it against a copy instead: `sekali backup --db {db} COPY`, \
         serve COPY on another address, and point bench at that server with --check-db COPY. \
         Or pass --force to write into this database anyway",
        orders = orders_that_are(*.count)
    )]
    RealOrders {
        db: String,
        count: i64,
        examples: String,
        events: usize,
    },
}

fn orders_that_are(count: i64) -> &'static str {
    if count == 1 {
        "order that is"
    } else {
        "orders that are"
    }
}

/// Marks where the event number goes in a rendered template.
const N: &str = "@@N@@";

/// The events of one run, rendered once as a template (the provider's sample payment, about
/// 1.5 KB for Stripe, like a real event) and completed per request by splicing in the event
/// number: the load generator shares the cores with the server, so it should spend as little as
/// it can. `benches/writer.rs` uses it too.
#[derive(Clone)]
pub struct EventTemplate {
    /// The body split at each `@@N@@`.
    pieces: Vec<String>,
    random_ids: bool,
}

impl EventTemplate {
    /// `provider`'s sample payment for the orders `bench_{run_id}_{i}`, its other ids ending in
    /// `{run_id}_{i}`.
    pub fn new(provider: &dyn Provider, run_id: &str) -> Self {
        let body =
            provider.sample_payment(&format!("bench_{run_id}_{N}"), &format!("{run_id}_{N}"));
        let body = String::from_utf8(body).expect("a sample payment is JSON text");
        EventTemplate {
            pieces: body.split(N).map(str::to_owned).collect(),
            random_ids: false,
        }
    }

    /// By default the `i`th event's ids (event, PaymentIntent, order) end in `i` in decimal,
    /// so they arrive roughly in key order, as time-ordered ids do: each batch's inserts land
    /// on a few B-tree pages. With `random`, they end in a 16-hex-digit scramble of `i` (still
    /// one distinct id per event), so each insert lands on a page of its own, as random order
    /// ids (UUIDv4) would: the write path then writes several times the bytes.
    pub fn with_random_ids(mut self, random: bool) -> Self {
        self.random_ids = random;
        self
    }

    /// The body of the `i`th unique event of this run, unsigned.
    pub fn render(&self, i: usize) -> Vec<u8> {
        let n = if self.random_ids {
            // Multiplying by an odd constant is a bijection on u64: no two events share ids.
            format!("{:016x}", (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
        } else {
            i.to_string()
        };
        self.pieces.join(&n).into_bytes()
    }
}

/// Runs the benchmark; blocking (it starts its own client event loops).
pub fn run_bench(config: &BenchConfig) -> Result<BenchReport, BenchError> {
    let run_id = format!(
        "{:x}",
        SystemClock.now_unix() * 1000 + std::process::id() as i64 % 1000
    );
    let marker = RunMarker::new(&run_id).expect("a run id is lower-case hex");
    if let Some(warning) = guard_database(config, &run_id)? {
        eprintln!("warning: {warning}");
    }

    // The plan: every unique event, and after every 1/dup_ratio-th one a redelivery of it, sent
    // next so the two race on different connections.
    let mut plan: Vec<usize> =
        Vec::with_capacity(config.events + (config.events as f64 * config.dup_ratio) as usize);
    let mut owed = 0.0;
    for i in 0..config.events {
        plan.push(i);
        owed += config.dup_ratio;
        while owed >= 1.0 {
            plan.push(i);
            owed -= 1.0;
        }
    }
    let plan = Arc::new(plan);
    let next = Arc::new(AtomicUsize::new(0));
    let targets: Vec<Target> = config
        .urls
        .iter()
        .map(|url| Target::parse(url))
        .collect::<Result<_, _>>()?;
    if targets.is_empty() {
        return Err(BenchError::Url("give at least one --url".into()));
    }
    let targets = Arc::new(targets);
    let deadline = Instant::now() + Duration::from_secs_f64(config.max_seconds);
    // A thread without a connection of its own would still open one.
    let threads = config.threads.clamp(1, config.concurrency.max(1));
    let template =
        EventTemplate::new(config.provider.as_ref(), &run_id).with_random_ids(config.random_ids);
    // Signed once up front, so a provider that cannot sign fails before any load.
    config
        .provider
        .sign(&template.render(0), SystemClock.now_unix())
        .map_err(|reason| BenchError::Sign {
            provider: config.provider.name().to_string(),
            reason,
        })?;
    let before = scrape_instances(&targets);
    let cpu_before = cpu::CpuSample::take();
    let started = Instant::now();
    let pacing = config
        .rate
        .map(|rate| Pacing::new(started, rate, config.concurrency));

    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let per_thread =
                config.concurrency / threads + usize::from(t < config.concurrency % threads);
            let (plan, next, targets) = (plan.clone(), next.clone(), targets.clone());
            let template = template.clone();
            let signer = config.provider.clone();
            // Connections are numbered across threads, so the paced schedule interleaves them
            // all.
            let first = t * (config.concurrency / threads) + t.min(config.concurrency % threads);
            let pacing = pacing.map(|p| (p, first));
            let retry = config.retry;
            std::thread::spawn(move || {
                actix_web::rt::System::new().block_on(client_loop(
                    per_thread, first, plan, next, targets, template, signer, deadline, pacing,
                    retry, started,
                ))
            })
        })
        .collect();
    let mut outcome = ThreadOutcome::default();
    for handle in handles {
        outcome.absorb(handle.join().expect("a bench client thread panicked"));
    }
    let seconds = started.elapsed().as_secs_f64();
    let machine_cpu = cpu_before
        .zip(cpu::CpuSample::take())
        .map(|(before, after)| after.since(&before));
    let server_metrics = before
        .into_iter()
        .zip(scrape_instances(&targets))
        .filter_map(|((instance, before), (_, after))| match (before, after) {
            (Ok(before), Ok(after)) => Some(ServerMetrics::between(instance, &before, &after)),
            (Err(why), _) | (_, Err(why)) => {
                eprintln!("note: no server metrics from {instance}: {why}");
                None
            }
        })
        .collect();
    outcome.latencies_us.sort_unstable();
    let ok = outcome.latencies_us.len();
    let percentile = |p: f64| -> Option<f64> {
        let last = ok.checked_sub(1)?;
        let rank = ((p / 100.0) * ok as f64).ceil() as usize;
        Some(outcome.latencies_us[rank.saturating_sub(1).min(last)] as f64 / 1000.0)
    };
    let sent = ok + outcome.non_2xx.values().sum::<usize>() + outcome.errors;
    let unique_sent = {
        let reached = next.load(Ordering::SeqCst).min(plan.len());
        plan[..reached].iter().copied().max().map_or(0, |m| m + 1)
    };
    let mut report = BenchReport {
        provider: config.provider.name().to_string(),
        run_id: run_id.clone(),
        ids: if config.random_ids {
            "random"
        } else {
            "ascending"
        },
        concurrency: config.concurrency,
        rate: config.rate,
        sent,
        unique: unique_sent,
        ok_2xx: ok,
        non_2xx: outcome.non_2xx,
        errors: outcome.errors,
        retried: outcome.retried,
        seconds,
        deliveries_per_sec: ok as f64 / seconds,
        p50_ms: percentile(50.0),
        p90_ms: percentile(90.0),
        p99_ms: percentile(99.0),
        max_ms: percentile(100.0),
        slowest: outcome.slowest,
        server_metrics,
        machine_cpu,
        check_db: None,
        cleanup: None,
    };
    if let Some(db) = &config.check_db {
        report.check_db = Some(check_db(db, &run_id, unique_sent)?);
        if let Some(mail_dir) = &config.cleanup {
            report.cleanup = Some(match cleanup::clean_up(db, &marker, mail_dir) {
                Ok(cleaned) => Cleanup::Done(cleaned),
                Err(e) => Cleanup::Failed(e.to_string()),
            });
        }
    }
    Ok(report)
}

/// Before anything is sent: with `--check-db`, refuses a database that holds orders not the
/// load generator's unless `--force` (a warning then); without it, the warning that bench cannot
/// see the database and what it will write there. The warning to print, if any.
pub fn guard_database(config: &BenchConfig, run_id: &str) -> Result<Option<String>, BenchError> {
    let Some(db) = &config.check_db else {
        return Ok(Some(format!(
            "without --check-db, bench cannot see the database of the server at {url}, so it \
             cannot tell whether it holds real orders. It will write up to {events} paid orders \
             there (bench_{run_id}_0, bench_{run_id}_1, …) with their events, and a receipt for \
             each, which the server's relay sends (to customer…@example.com where the \
             provider's payment carries an address). Point it at a server of a copy (`sekali \
             backup`), and pass --check-db with the copy's file to have it looked at first",
            url = config.urls.join(" "),
            events = config.events,
        )));
    };
    let outside = crate::store::maintenance(&crate::store::Location::from(db.to_path_buf()), false)
        .and_then(|store| store.orders_outside_runs(3))
        .map_err(|e| BenchError::Check(e.to_string()))?;
    if outside.count == 0 {
        return Ok(None);
    }
    let mut examples = outside.examples.join(", ");
    if outside.count > outside.examples.len() as i64 {
        examples.push_str(", …");
    }
    if !config.force {
        return Err(BenchError::RealOrders {
            db: db.display().to_string(),
            count: outside.count,
            examples,
            events: config.events,
        });
    }
    Ok(Some(format!(
        "--force: writing up to {} paid orders and their receipts into {}, beside its {} {} \
         not the load generator's ({examples})",
        config.events,
        db.display(),
        outside.count,
        orders_that_are(outside.count)
    )))
}

#[derive(Default)]
struct ThreadOutcome {
    /// One per request answered 2xx.
    latencies_us: Vec<u32>,
    /// The slowest of them, with when each was sent: at most [`SLOWEST`].
    slowest: Vec<SlowDelivery>,
    non_2xx: BTreeMap<u16, usize>,
    errors: usize,
    retried: usize,
}

/// How many of the slowest deliveries the report lists, with when each was sent.
pub const SLOWEST: usize = 5;

impl ThreadOutcome {
    /// Counts a 2xx answer that took `latency_us`, sent `sent_at_s` seconds into the run.
    fn answered(&mut self, latency_us: u32, sent_at_s: f64) {
        self.latencies_us.push(latency_us);
        let slow = SlowDelivery {
            ms: f64::from(latency_us) / 1000.0,
            sent_at_s,
        };
        if self.slowest.len() < SLOWEST {
            self.slowest.push(slow);
        } else if let Some(fastest) = self
            .slowest
            .iter_mut()
            .min_by(|a, b| a.ms.total_cmp(&b.ms))
            .filter(|fastest| fastest.ms < slow.ms)
        {
            *fastest = slow;
        }
    }

    fn absorb(&mut self, part: ThreadOutcome) {
        self.latencies_us.extend(part.latencies_us);
        self.slowest.extend(part.slowest);
        self.slowest.sort_by(|a, b| b.ms.total_cmp(&a.ms));
        self.slowest.truncate(SLOWEST);
        self.errors += part.errors;
        self.retried += part.retried;
        for (code, n) in part.non_2xx {
            *self.non_2xx.entry(code).or_default() += n;
        }
    }
}

/// Each instance's `/metrics` (on the address its webhooks are, once per instance), by
/// `host:port`, or why it could not be read (a server with `--metrics-listen` answers 404 there).
fn scrape_instances(targets: &[Target]) -> Vec<(String, Result<server_metrics::Scrape, String>)> {
    let mut instances: Vec<String> = targets.iter().map(|t| t.authority.clone()).collect();
    instances.sort();
    instances.dedup();
    actix_web::rt::System::new().block_on(async move {
        let client = awc::Client::builder()
            .timeout(Duration::from_secs(10))
            .finish();
        let mut scrapes = Vec::new();
        for instance in instances {
            let url = format!("http://{instance}/metrics");
            let scrape = async {
                let mut response = client.get(&url).send().await.map_err(|e| e.to_string())?;
                if !response.status().is_success() {
                    return Err(format!("GET {url} answered {}", response.status()));
                }
                let body = response
                    .body()
                    .limit(16 * 1024 * 1024)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(server_metrics::Scrape::parse(&String::from_utf8_lossy(
                    &body,
                )))
            }
            .await;
            scrapes.push((instance, scrape));
        }
        scrapes
    })
}

/// Where the requests go: the address to connect to, and the request line's path and `Host`.
#[derive(Debug, Clone)]
struct Target {
    authority: String,
    path_and_query: String,
}

impl Target {
    fn parse(url: &str) -> Result<Target, BenchError> {
        let uri: hyper::Uri = url
            .parse()
            .map_err(|e| BenchError::Url(format!("{url}: {e}")))?;
        if uri.scheme_str() != Some("http") {
            return Err(BenchError::Url(format!(
                "{url}: bench speaks plain http://; point it at the server itself, behind any TLS proxy"
            )));
        }
        let host = uri
            .host()
            .ok_or_else(|| BenchError::Url(format!("{url}: no host")))?;
        Ok(Target {
            authority: format!("{host}:{}", uri.port_u16().unwrap_or(80)),
            path_and_query: uri
                .path_and_query()
                .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned()),
        })
    }
}

/// `--rate`: an open schedule of send times. Connection `n` (numbered across all client threads)
/// sends its `k`-th request at `(n + k × connections) / rate` seconds into the run, so the
/// requests of all connections arrive evenly spread rather than in bursts of one per
/// connection. The times are absolute: a late timer or a slow answer does not shift the ones
/// after it, so the offered rate holds. Every request due before the deadline is sent, however
/// late, so a server that falls behind is measured on all of them.
#[derive(Debug, Clone, Copy)]
struct Pacing {
    start: Instant,
    rate: f64,
    connections: usize,
}

impl Pacing {
    /// `rate` must be positive (the command line refuses anything else).
    fn new(start: Instant, rate: f64, connections: usize) -> Self {
        Pacing {
            start,
            rate,
            connections: connections.max(1),
        }
    }

    /// When connection `n` sends its `k`-th request; `None` past any representable time.
    fn due(&self, n: usize, k: usize) -> Option<Instant> {
        let seconds = (n as f64 + k as f64 * self.connections as f64) / self.rate;
        self.start
            .checked_add(Duration::try_from_secs_f64(seconds).ok()?)
    }
}

type Sender = hyper::client::conn::http1::SendRequest<http_body_util::Full<actix_web::web::Bytes>>;

/// One keep-alive connection. hyper's bare HTTP/1.1 connection, not a pooled client: the load
/// generator shares the cores with the server, and a pool, redirects and per-request timers
/// only cost it time.
async fn connect(target: &Target) -> Result<Sender, Box<dyn std::error::Error>> {
    let stream = tokio::net::TcpStream::connect(&target.authority).await?;
    stream.set_nodelay(true)?;
    let (sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    actix_web::rt::spawn(connection);
    Ok(sender)
}

/// The answer's status, and its `Retry-After` in whole seconds when it has one.
type Answered = (hyper::StatusCode, Option<Duration>);

/// How long `--retry` waits before sending a refused delivery again: the server's
/// `Retry-After` (1 s without one), at least 100 ms and at most 60 s, spread over half to one
/// and a half times that, so that connections refused together do not all come back together.
fn retry_wait(retry_after: Option<Duration>) -> Duration {
    retry_asked(retry_after).mul_f64(0.5 + fastrand::f64())
}

/// The longest [`retry_wait`] can be: a retry that might not be sent before `--max-seconds` is
/// not waited for, and the refusal is the delivery's final answer.
fn retry_wait_bound(retry_after: Option<Duration>) -> Duration {
    retry_asked(retry_after).mul_f64(1.5)
}

fn retry_asked(retry_after: Option<Duration>) -> Duration {
    retry_after
        .unwrap_or(Duration::from_secs(1))
        .clamp(Duration::from_millis(100), Duration::from_secs(60))
}

/// Sends one request on `connection`, (re)connecting first if it has none or it closed.
async fn send(
    connection: &mut Option<Sender>,
    target: &Target,
    request: hyper::Request<http_body_util::Full<actix_web::web::Bytes>>,
) -> Result<Answered, Box<dyn std::error::Error>> {
    use http_body_util::BodyExt;
    if connection.as_ref().is_none_or(|c| c.is_closed()) {
        *connection = Some(connect(target).await?);
    }
    let sender = connection.as_mut().expect("connected above");
    let sent = async {
        sender.ready().await?;
        let response = sender.send_request(request).await?;
        let status = response.status();
        let retry_after = response
            .headers()
            .get(hyper::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        response.into_body().collect().await?;
        Ok::<_, hyper::Error>((status, retry_after))
    }
    .await;
    if sent.is_err() {
        *connection = None;
    }
    Ok(sent?)
}

#[allow(clippy::too_many_arguments)]
async fn client_loop(
    connections: usize,
    first_connection: usize,
    plan: Arc<Vec<usize>>,
    next: Arc<AtomicUsize>,
    targets: Arc<Vec<Target>>,
    template: EventTemplate,
    signer: Arc<dyn Provider>,
    deadline: Instant,
    pacing: Option<(Pacing, usize)>,
    retry: bool,
    run_started: Instant,
) -> ThreadOutcome {
    let template = Rc::new(template);
    // A request still unanswered this long after the deadline counts as an error.
    let give_up = tokio::time::Instant::from_std(deadline + Duration::from_secs(30));
    let workers = (0..connections.max(1)).map(|i| {
        // Connections take the instances in turn, numbered across all client threads.
        let target = targets[(first_connection + i) % targets.len()].clone();
        let (plan, next, signer) = (plan.clone(), next.clone(), signer.clone());
        let template = template.clone();
        // Paced: this connection's number across all threads and its next request's index.
        let mut schedule = pacing.map(|(pacing, first)| (pacing, first + i, 0));
        async move {
            let mut out = ThreadOutcome::default();
            let mut connection: Option<Sender> = None;
            let give_up = tokio::time::sleep_until(give_up);
            tokio::pin!(give_up);
            loop {
                // Paced: wait for this connection's next slot. `late` when the previous answer
                // came after it: the server is behind the schedule.
                let due = schedule.map(|(pacing, n, k)| pacing.due(n, k).unwrap_or(deadline));
                let late = match due {
                    Some(at) if at >= deadline => break,
                    Some(at) if Instant::now() < at => {
                        actix_web::rt::time::sleep_until(at.into()).await;
                        None
                    }
                    Some(at) => Some(at),
                    None if Instant::now() >= deadline => break,
                    None => None,
                };
                let slot = next.fetch_add(1, Ordering::SeqCst);
                let Some(&event) = plan.get(slot) else { break };
                // Completed per request (about a microsecond) rather than kept for the whole run.
                let body = template.render(event);
                // Behind schedule, a latency counts from when the request was due, so a server
                // that cannot keep up shows its backlog instead of hiding it (no coordinated
                // omission). On time, it counts from the send: the timer's own lateness (up to
                // a millisecond) is the client's, not the server's. With --retry, it runs to the
                // final answer, waits included.
                let started = late.unwrap_or_else(Instant::now);
                let mut retries = 0;
                let deliver = async {
                    loop {
                        // Signed at each send, as the provider does (a Stripe retry gets a fresh
                        // timestamp); it signed once up front, so it signs now.
                        let signed = signer
                            .sign(&body, SystemClock.now_unix())
                            .expect("the provider signed before the run");
                        let mut request = hyper::Request::post(target.path_and_query.as_str())
                            .header(hyper::header::HOST, target.authority.as_str())
                            .header(hyper::header::CONTENT_TYPE, "application/json");
                        for (name, value) in &signed.headers {
                            request = request.header(*name, value.as_str());
                        }
                        let request = request
                            .body(http_body_util::Full::new(actix_web::web::Bytes::from(
                                signed.body,
                            )))
                            .expect("a request built from a parsed URL");
                        match send(&mut connection, &target, request).await {
                            // A refusal whose retry could not be sent before --max-seconds is
                            // final: it counts under non-2xx.
                            Ok((status, retry_after))
                                if retry
                                    && status.is_server_error()
                                    && Instant::now() + retry_wait_bound(retry_after)
                                        < deadline =>
                            {
                                retries += 1;
                                actix_web::rt::time::sleep(retry_wait(retry_after)).await;
                            }
                            answered => return answered.map(|(status, _)| status),
                        }
                    }
                };
                tokio::select! {
                    sent = deliver => match sent {
                        Ok(status) => {
                            if status.is_success() {
                                out.answered(
                                    started.elapsed().as_micros().min(u32::MAX as u128) as u32,
                                    started.saturating_duration_since(run_started).as_secs_f64(),
                                );
                            } else {
                                *out.non_2xx.entry(status.as_u16()).or_default() += 1;
                            }
                        }
                        Err(_) => out.errors += 1,
                    },
                    () = &mut give_up => {
                        out.errors += 1;
                        out.retried += retries;
                        break;
                    }
                }
                out.retried += retries;
                if let Some((_, _, k)) = &mut schedule {
                    *k += 1;
                }
            }
            out
        }
    });
    let parts = futures_util::future::join_all(workers).await;
    let mut total = ThreadOutcome::default();
    for part in parts {
        total.absorb(part);
    }
    total
}

/// Checks that every unique event of the run left exactly one `processed_events` row and
/// exactly one effect (its receipt in `email_outbox`) in `db`: `"ok"`, or what differs.
pub fn check_db(db: &std::path::Path, run_id: &str, unique: usize) -> Result<String, BenchError> {
    let counts = crate::store::maintenance(&crate::store::Location::from(db.to_path_buf()), false)
        .and_then(|store| store.run_counts(&format!("bench_{run_id}_")))
        .map_err(|e| BenchError::Check(e.to_string()))?;
    let unique = unique as i64;
    let crate::store::RunCounts {
        events,
        orders,
        emails,
        orders_emailed,
    } = counts;
    if events == unique && orders == unique && emails == unique && orders_emailed == unique {
        Ok("ok".to_owned())
    } else {
        Ok(format!(
            "MISMATCH: {unique} unique events sent, {events} event rows, {orders} orders, {emails} emails ({orders_emailed} orders with one)"
        ))
    }
}
