//! Prometheus metrics: `GET /metrics` in the Prometheus text format (docs/operations.md#metrics),
//! through `prometheus-client`, the official Rust client.
//!
//! Every metric has the `sekali_` prefix, base units, `_total` on counters, and no label that
//! grows with the traffic (no order or event id, no address): a provider's name, an outcome, a
//! status code, a reason kind, an outbox. Every series a label set can take is made at startup,
//! so a counter is 0 before its first event rather than missing (an alert on `rate()` of a
//! missing series never fires).
//!
//! What the routes count is counted on the request's path at the cost of an atomic add; what
//! the store knows (its writer's work, the outboxes' backlog) is read when Prometheus scrapes.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::domain::Outcome;
use crate::store::{OutboxBacklog, SendOutcome, SendResult, Store};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderOutcome {
    provider: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderCode {
    provider: String,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderReason {
    provider: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderLabel {
    provider: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutboxLabel {
    outbox: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransportResult {
    transport: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TableLabel {
    table: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabel {
    version: String,
}

/// Why a delivery was refused, as a label: a kind, never the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefusalReason {
    /// 400: not a delivery the provider could have sent.
    Malformed,
    /// 401: not proven to come from the provider (a rotated secret shows here).
    Unauthorized,
    /// 503: could not be confirmed with the provider now.
    NotConfirmed,
    /// 413: over `--max-body-bytes`.
    TooLarge,
    /// 408: the body did not arrive in time, or could not be read.
    BodyNotRead,
    /// 503: too many deliveries waiting for the writer.
    Overloaded,
    /// 503: the store could not commit.
    Unavailable,
    /// 404: the provider's secret is not set on this server.
    NotConfigured,
}

impl RefusalReason {
    pub const ALL: [RefusalReason; 8] = [
        RefusalReason::Malformed,
        RefusalReason::Unauthorized,
        RefusalReason::NotConfirmed,
        RefusalReason::TooLarge,
        RefusalReason::BodyNotRead,
        RefusalReason::Overloaded,
        RefusalReason::Unavailable,
        RefusalReason::NotConfigured,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::Malformed => "malformed",
            RefusalReason::Unauthorized => "unauthorized",
            RefusalReason::NotConfirmed => "not_confirmed",
            RefusalReason::TooLarge => "too_large",
            RefusalReason::BodyNotRead => "body_not_read",
            RefusalReason::Overloaded => "overloaded",
            RefusalReason::Unavailable => "unavailable",
            RefusalReason::NotConfigured => "not_configured",
        }
    }
}

/// What `POST /orders` answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrdersApiResult {
    Created,
    Replayed,
    /// 401: no token, or one that is not an API client's.
    Unauthorized,
    /// 409: the key in flight, or the order id taken.
    Conflict,
    /// 422: the key reused with another request.
    KeyReused,
    /// 400: the request itself.
    Invalid,
    Unavailable,
}

impl OrdersApiResult {
    pub const ALL: [OrdersApiResult; 7] = [
        OrdersApiResult::Created,
        OrdersApiResult::Replayed,
        OrdersApiResult::Unauthorized,
        OrdersApiResult::Conflict,
        OrdersApiResult::KeyReused,
        OrdersApiResult::Invalid,
        OrdersApiResult::Unavailable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OrdersApiResult::Created => "created",
            OrdersApiResult::Replayed => "replayed",
            OrdersApiResult::Unauthorized => "unauthorized",
            OrdersApiResult::Conflict => "conflict",
            OrdersApiResult::KeyReused => "key_reused",
            OrdersApiResult::Invalid => "invalid",
            OrdersApiResult::Unavailable => "unavailable",
        }
    }

    /// The result a response of `status` stands for (`replayed` apart).
    pub fn of_status(status: u16) -> OrdersApiResult {
        match status {
            200..=299 => OrdersApiResult::Created,
            401 => OrdersApiResult::Unauthorized,
            409 => OrdersApiResult::Conflict,
            422 => OrdersApiResult::KeyReused,
            400..=499 => OrdersApiResult::Invalid,
            _ => OrdersApiResult::Unavailable,
        }
    }
}

/// The status codes a webhook is answered with, made at startup for every provider.
const WEBHOOK_CODES: [u16; 8] = [200, 400, 401, 404, 408, 413, 500, 503];

type LatencyFamily = Family<ProviderLabel, Histogram, fn() -> Histogram>;

/// The metrics of one `serve` process.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    deliveries: Family<ProviderOutcome, Counter>,
    responses: Family<ProviderCode, Counter>,
    refusals: Family<ProviderReason, Counter>,
    latency: LatencyFamily,
    orders_api: Family<ResultLabel, Counter>,
    outbox_pending: Family<OutboxLabel, Gauge>,
    outbox_dead: Family<OutboxLabel, Gauge>,
    outbox_oldest_due: Family<OutboxLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    relay_attempts: Family<TransportResult, Counter>,
    purge_runs: Counter,
    purge_deleted: Family<TableLabel, Counter>,
    /// The configured providers' names, in the registry's order.
    providers: Vec<String>,
    /// Refusals per minute, for the console's "last hour".
    recent_refusals: RecentRefusals,
    /// When this process's counters started.
    started: std::time::SystemTime,
}

/// Refusals counted per minute over the last hour, by provider and reason: what the console's
/// overview shows without a Prometheus to compute rates. Refusals are the rare path (a flood of
/// them takes this lock briefly each), so deliveries that are answered 2xx never touch it.
#[derive(Debug, Default)]
struct RecentRefusals(
    std::sync::Mutex<std::collections::VecDeque<(i64, String, &'static str, u64)>>,
);

impl RecentRefusals {
    const MINUTES: i64 = 60;

    /// One refusal of `provider` for `reason` in `minute` (minutes since the epoch).
    fn add(&self, minute: i64, provider: &str, reason: &'static str) {
        let mut recent = self.0.lock().unwrap_or_else(|e| e.into_inner());
        while recent
            .front()
            .is_some_and(|(m, ..)| *m <= minute - Self::MINUTES)
        {
            recent.pop_front();
        }
        match recent
            .iter_mut()
            .rev()
            .take_while(|(m, ..)| *m == minute)
            .find(|(_, p, r, _)| p == provider && *r == reason)
        {
            Some((.., count)) => *count += 1,
            None => recent.push_back((minute, provider.to_owned(), reason, 1)),
        }
    }

    /// The refusals of the hour up to `minute`, by provider and reason.
    fn last_hour(&self, minute: i64) -> Vec<Tally> {
        let recent = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut tallies: Vec<Tally> = Vec::new();
        for (_, provider, reason, count) in
            recent.iter().filter(|(m, ..)| *m > minute - Self::MINUTES)
        {
            match tallies
                .iter_mut()
                .find(|t| &t.provider == provider && t.what == *reason)
            {
                Some(tally) => tally.count += count,
                None => tallies.push(Tally {
                    provider: provider.clone(),
                    what: reason,
                    count: *count,
                }),
            }
        }
        tallies.sort_by(|a, b| (&a.provider, a.what).cmp(&(&b.provider, b.what)));
        tallies
    }
}

/// Minutes since the epoch, now.
fn this_minute() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| (d.as_secs() / 60) as i64)
}

/// One counter of [`SinceStart`]: a provider's deliveries with one outcome or refusal reason.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Tally {
    pub provider: String,
    /// The outcome (`processed`, `duplicate`, ...) or the refusal's reason kind.
    pub what: &'static str,
    pub count: u64,
}

/// What this process answered since it started (the operator console's overview).
#[derive(Debug, Clone)]
pub struct SinceStart {
    pub started: std::time::SystemTime,
    /// Outcomes with at least one delivery.
    pub answered: Vec<Tally>,
    /// Every refusal reason of every provider, zeros included.
    pub refusals: Vec<Tally>,
    /// The refusals of the last hour (this process's), by provider and reason, those with any.
    pub refusals_last_hour: Vec<Tally>,
}

/// The transports a relay sends through, as the `transport` label: the email relay's three, and
/// forwarding.
pub const TRANSPORTS: [&str; 4] = ["file", "smtp", "http", "forward"];

/// What became of one attempt to send an outbox row, as the `result` label.
pub fn attempt_result(outcome: &SendOutcome) -> &'static str {
    match outcome {
        SendOutcome::Sent => "sent",
        SendOutcome::Failed {
            retry_at_ms: Some(_),
            ..
        } => "retry",
        SendOutcome::Failed {
            retry_at_ms: None, ..
        } => "dead",
        SendOutcome::Untried {
            retry_at_ms: Some(_),
            ..
        } => "unavailable",
        SendOutcome::Untried {
            retry_at_ms: None, ..
        } => "withheld",
        SendOutcome::Skipped => "skipped",
    }
}

const ATTEMPT_RESULTS: [&str; 6] = [
    "sent",
    "retry",
    "dead",
    "unavailable",
    "withheld",
    "skipped",
];

fn latency_histogram() -> Histogram {
    // 0.5 ms to about 16 s: a delivery's commit is milliseconds, a slow disk's hundreds.
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

impl Metrics {
    /// Every series of every metric, for `providers`, at 0; the store's own read at each scrape.
    pub fn new(providers: &crate::providers::Providers, store: Arc<dyn Store>) -> Metrics {
        // The process's own metrics keep their standard names (no prefix); everything else is
        // sekali's.
        let mut root = Registry::default();
        let registry = root.sub_registry_with_prefix("sekali");
        for provider in providers.iter() {
            provider.register_metrics(registry);
        }
        let providers: Vec<String> = providers
            .iter()
            .map(|p| p.name().as_str().to_owned())
            .collect();
        let deliveries = Family::<ProviderOutcome, Counter>::default();
        registry.register(
            "deliveries",
            "Webhook deliveries applied or recognised, by provider and outcome (duplicate: a delivery seen before)",
            deliveries.clone(),
        );
        let responses = Family::<ProviderCode, Counter>::default();
        registry.register(
            "webhook_responses",
            "Answers to webhook deliveries, by provider and HTTP status code",
            responses.clone(),
        );
        let refusals = Family::<ProviderReason, Counter>::default();
        registry.register(
            "refusals",
            "Webhook deliveries refused, by provider and reason (unauthorized: a signature or token that does not match)",
            refusals.clone(),
        );
        let latency: LatencyFamily = Family::new_with_constructor(latency_histogram);
        registry.register_with_unit(
            "delivery_duration",
            "Time from a webhook's arrival to its answer, by provider",
            prometheus_client::registry::Unit::Seconds,
            latency.clone(),
        );
        let orders_api = Family::<ResultLabel, Counter>::default();
        registry.register(
            "orders_api_requests",
            "POST /orders requests, by result",
            orders_api.clone(),
        );
        let outbox_pending = Family::<OutboxLabel, Gauge>::default();
        registry.register(
            "outbox_pending",
            "Rows waiting to be sent, by outbox (email, forward), as of the scrape",
            outbox_pending.clone(),
        );
        let outbox_dead = Family::<OutboxLabel, Gauge>::default();
        registry.register(
            "outbox_dead",
            "Rows that will not be sent unless an operator retries them, by outbox",
            outbox_dead.clone(),
        );
        let outbox_oldest_due =
            Family::<OutboxLabel, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        registry.register_with_unit(
            "outbox_oldest_due_age",
            "How long the oldest row that is due has waited for its send, by outbox (0: none due)",
            prometheus_client::registry::Unit::Seconds,
            outbox_oldest_due.clone(),
        );
        let relay_attempts = Family::<TransportResult, Counter>::default();
        registry.register(
            "relay_attempts",
            "Outbox rows the relays tried, by transport (file, smtp, http for emails; forward for changes) and result (retry: failed, tried again later; unavailable: the transport was down, no try counted)",
            relay_attempts.clone(),
        );
        let purge_runs = Counter::default();
        registry.register(
            "purge_runs",
            "Purge passes this process ran",
            purge_runs.clone(),
        );
        let purge_deleted = Family::<TableLabel, Counter>::default();
        registry.register(
            "purge_deleted_rows",
            "Expired rows the purge deleted, by table",
            purge_deleted.clone(),
        );
        let build_info = Family::<VersionLabel, Gauge>::default();
        registry.register(
            "build_info",
            "The running sekali's version (always 1)",
            build_info.clone(),
        );
        build_info
            .get_or_create(&VersionLabel {
                version: env!("CARGO_PKG_VERSION").to_owned(),
            })
            .set(1);
        let writer = store.writer_histograms();
        registry.register_with_unit(
            "writer_commit_duration",
            "How long each COMMIT of the writer took (the wait for the disk or the server's WAL flush)",
            prometheus_client::registry::Unit::Seconds,
            writer.commit_seconds,
        );
        registry.register(
            "writer_batch_units",
            "Units of work (deliveries, outbox claims and results, API requests) per committed transaction",
            writer.batch_units,
        );
        registry.register_collector(Box::new(WriterCollector { store }));
        root.register_collector(Box::new(ProcessCollector));

        for provider in &providers {
            let outcomes = Outcome::STORED
                .iter()
                .map(|o| o.as_str())
                .chain([Outcome::Duplicate.as_str()]);
            for outcome in outcomes {
                let _ = deliveries.get_or_create(&ProviderOutcome {
                    provider: provider.clone(),
                    outcome: outcome.to_owned(),
                });
            }
            for code in WEBHOOK_CODES {
                let _ = responses.get_or_create(&ProviderCode {
                    provider: provider.clone(),
                    code: code.to_string(),
                });
            }
            for reason in RefusalReason::ALL {
                let _ = refusals.get_or_create(&ProviderReason {
                    provider: provider.clone(),
                    reason: reason.as_str().to_owned(),
                });
            }
            let _ = latency.get_or_create(&ProviderLabel {
                provider: provider.clone(),
            });
        }
        for result in OrdersApiResult::ALL {
            let _ = orders_api.get_or_create(&ResultLabel {
                result: result.as_str().to_owned(),
            });
        }
        for transport in TRANSPORTS {
            for result in ATTEMPT_RESULTS {
                let _ = relay_attempts.get_or_create(&TransportResult {
                    transport: transport.to_owned(),
                    result: result.to_owned(),
                });
            }
        }
        for table in ["processed_events", "idempotency_keys"] {
            let _ = purge_deleted.get_or_create(&TableLabel {
                table: table.to_owned(),
            });
        }
        for outbox in ["email", "forward"] {
            let label = OutboxLabel {
                outbox: outbox.to_owned(),
            };
            let _ = outbox_pending.get_or_create(&label);
            let _ = outbox_dead.get_or_create(&label);
            let _ = outbox_oldest_due.get_or_create(&label);
        }
        Metrics {
            providers,
            recent_refusals: RecentRefusals::default(),
            started: std::time::SystemTime::now(),
            registry: root,
            deliveries,
            responses,
            refusals,
            latency,
            orders_api,
            outbox_pending,
            outbox_dead,
            outbox_oldest_due,
            relay_attempts,
            purge_runs,
            purge_deleted,
        }
    }

    /// A relay's batch of results through `transport` (one of [`TRANSPORTS`]).
    pub fn relay_results(&self, transport: &str, results: &[SendResult]) {
        for result in results {
            self.relay_attempts
                .get_or_create(&TransportResult {
                    transport: transport.to_owned(),
                    result: attempt_result(&result.outcome).to_owned(),
                })
                .inc();
        }
    }

    /// A purge pass that deleted `events` expired event ids and `keys` idempotency keys.
    pub fn purge(&self, events: u64, keys: u64) {
        self.purge_runs.inc();
        for (table, n) in [("processed_events", events), ("idempotency_keys", keys)] {
            self.purge_deleted
                .get_or_create(&TableLabel {
                    table: table.to_owned(),
                })
                .inc_by(n);
        }
    }

    /// A delivery answered after `took`: its outcome, or its refusal, and the status sent.
    pub fn delivery(
        &self,
        provider: &str,
        result: Result<Outcome, RefusalReason>,
        status: u16,
        took: Duration,
    ) {
        let provider = provider.to_owned();
        match result {
            Ok(outcome) => self.deliveries.get_or_create(&ProviderOutcome {
                provider: provider.clone(),
                outcome: outcome.as_str().to_owned(),
            }),
            Err(reason) => {
                self.recent_refusals
                    .add(this_minute(), &provider, reason.as_str());
                self.refusals.get_or_create(&ProviderReason {
                    provider: provider.clone(),
                    reason: reason.as_str().to_owned(),
                })
            }
        }
        .inc();
        self.responses
            .get_or_create(&ProviderCode {
                provider: provider.clone(),
                code: status.to_string(),
            })
            .inc();
        self.latency
            .get_or_create(&ProviderLabel { provider })
            .observe(took.as_secs_f64());
    }

    /// The deliveries this process answered, by provider and outcome or refusal reason.
    pub fn since_start(&self) -> SinceStart {
        let mut answered = Vec::new();
        let mut refusals = Vec::new();
        for provider in &self.providers {
            for outcome in Outcome::STORED.iter().chain([&Outcome::Duplicate]) {
                let count = self
                    .deliveries
                    .get_or_create(&ProviderOutcome {
                        provider: provider.clone(),
                        outcome: outcome.as_str().to_owned(),
                    })
                    .get();
                if count > 0 {
                    answered.push(Tally {
                        provider: provider.clone(),
                        what: outcome.as_str(),
                        count,
                    });
                }
            }
            for reason in RefusalReason::ALL {
                refusals.push(Tally {
                    provider: provider.clone(),
                    what: reason.as_str(),
                    count: self
                        .refusals
                        .get_or_create(&ProviderReason {
                            provider: provider.clone(),
                            reason: reason.as_str().to_owned(),
                        })
                        .get(),
                });
            }
        }
        SinceStart {
            started: self.started,
            answered,
            refusals,
            refusals_last_hour: self.recent_refusals.last_hour(this_minute()),
        }
    }

    /// A `POST /orders` answered.
    pub fn orders_api(&self, result: OrdersApiResult) {
        self.orders_api
            .get_or_create(&ResultLabel {
                result: result.as_str().to_owned(),
            })
            .inc();
    }

    /// The text Prometheus scrapes, with the outboxes' backlog as `backlog` read it.
    pub fn encode(&self, backlog: &[(&str, OutboxBacklog)]) -> String {
        for (outbox, b) in backlog {
            let label = OutboxLabel {
                outbox: (*outbox).to_owned(),
            };
            self.outbox_pending.get_or_create(&label).set(b.pending);
            self.outbox_dead.get_or_create(&label).set(b.dead);
            self.outbox_oldest_due
                .get_or_create(&label)
                .set(b.oldest_due_age.as_secs_f64());
        }
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        text
    }
}

/// `Content-Type` of [`Metrics::encode`].
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// The writer's counters, read at each scrape (per process: each instance reports its own).
struct WriterCollector {
    store: Arc<dyn Store>,
}

impl std::fmt::Debug for WriterCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WriterCollector")
    }
}

impl Collector for WriterCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let writer = self.store.stats().writer;
        for (name, help, value) in [
            (
                "writer_transactions",
                "Write transactions the writer committed",
                writer.transactions,
            ),
            (
                "writer_deliveries",
                "Deliveries the writer committed (duplicates included)",
                writer.deliveries,
            ),
            (
                "writer_deliveries_together",
                "Deliveries applied side by side with others of their transaction, in a few statements for them all (PostgreSQL)",
                writer.deliveries_together,
            ),
            (
                "writer_outbox_claims",
                "Claims of outbox rows the writer committed (both outboxes)",
                writer.outbox_claims,
            ),
            (
                "writer_outbox_claimed_rows",
                "Outbox rows those claims took",
                writer.outbox_claimed_rows,
            ),
            (
                "writer_outbox_results",
                "Outbox results the writer recorded",
                writer.outbox_results,
            ),
            (
                "writer_reopens",
                "Times the writer replaced its connection after a fault",
                writer.reopens,
            ),
        ] {
            encode_one(&mut encoder, name, help, ConstCounter::new(value))?;
        }
        encode_one(
            &mut encoder,
            "writer_queue_depth",
            "Units of work (deliveries, outbox claims and results, API requests, purge batches) waiting for the writer now; deliveries get 503 once --queue-capacity wait",
            ConstGauge::new(writer.queued as i64),
        )
    }
}

/// Writes one series without labels whose value a collector read at the scrape.
fn encode_one(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    metric: impl EncodeMetric,
) -> Result<(), std::fmt::Error> {
    let series = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
    metric.encode(series)
}

/// The process's standard metrics, as every Prometheus client library names them
/// (`process_cpu_seconds_total`, `process_resident_memory_bytes`, …), read from `/proc/self` at
/// each scrape. On a system without `/proc` there are none.
#[derive(Debug)]
struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(process) = ProcessSample::read() else {
            return Ok(());
        };
        encode_one(
            &mut encoder,
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            ConstCounter::new(process.cpu_seconds),
        )?;
        for (name, help, value) in [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                process.resident_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                process.virtual_bytes,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                process.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                process.max_fds,
            ),
            (
                "process_threads",
                "Number of OS threads in the process",
                process.threads,
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch in seconds",
                process.start_time_seconds,
            ),
        ] {
            encode_one(&mut encoder, name, help, ConstGauge::new(value))?;
        }
        Ok(())
    }
}

/// What [`ProcessCollector`] reports, read at once.
struct ProcessSample {
    cpu_seconds: f64,
    resident_bytes: i64,
    virtual_bytes: i64,
    open_fds: i64,
    max_fds: i64,
    threads: i64,
    start_time_seconds: i64,
}

impl ProcessSample {
    #[cfg(target_os = "linux")]
    fn read() -> Option<ProcessSample> {
        use procfs::process::{LimitValue, Process};
        let read = || -> procfs::ProcResult<ProcessSample> {
            let me = Process::myself()?;
            let stat = me.stat()?;
            let ticks = procfs::ticks_per_second() as f64;
            let max_fds = match me.limits()?.max_open_files.soft_limit {
                LimitValue::Value(n) => i64::try_from(n).unwrap_or(i64::MAX),
                LimitValue::Unlimited => i64::MAX,
            };
            Ok(ProcessSample {
                cpu_seconds: (stat.utime + stat.stime) as f64 / ticks,
                resident_bytes: (stat.rss * procfs::page_size()) as i64,
                virtual_bytes: stat.vsize as i64,
                open_fds: me.fd_count()? as i64,
                max_fds,
                threads: stat.num_threads,
                start_time_seconds: (procfs::boot_time_secs()? as f64
                    + stat.starttime as f64 / ticks) as i64,
            })
        };
        read()
            .inspect_err(|e| tracing::debug!(error = %e, "the process metrics could not be read"))
            .ok()
    }

    #[cfg(not(target_os = "linux"))]
    fn read() -> Option<ProcessSample> {
        None
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn refusals_of_the_last_hour_are_summed_by_provider_and_reason_and_older_ones_dropped() {
        let recent = super::RecentRefusals::default();
        recent.add(100, "stripe", "unauthorized");
        recent.add(100, "stripe", "unauthorized");
        recent.add(130, "midtrans", "malformed");
        recent.add(159, "stripe", "unauthorized");
        let tally = |minute| -> Vec<(String, &str, u64)> {
            recent
                .last_hour(minute)
                .into_iter()
                .map(|t| (t.provider, t.what, t.count))
                .collect()
        };
        assert_eq!(
            tally(159),
            [
                ("midtrans".into(), "malformed", 1),
                ("stripe".into(), "unauthorized", 3)
            ]
        );
        assert_eq!(
            tally(160),
            [
                ("midtrans".into(), "malformed", 1),
                ("stripe".into(), "unauthorized", 1)
            ],
            "minute 100 is an hour old at 160"
        );
        recent.add(200, "stripe", "too_large");
        assert_eq!(
            tally(200),
            [
                ("stripe".into(), "too_large", 1),
                ("stripe".into(), "unauthorized", 1)
            ],
            "minute 130 dropped"
        );
        assert_eq!(tally(259), [("stripe".into(), "too_large", 1)]);
    }
}
