//! The outbox relay: sends `email_outbox` rows at least once, with backoff and full jitter.
//!
//! Each pass claims a batch of due rows under a lease, renders and sends each, and records the
//! result while the lease is still held. Transient failures are retried after
//! `random(0, min(max_delay, base_delay · 2^(n−1)))` following failure n (or the server's
//! `Retry-After`, capped at `max_delay`); permanent failures and rows that reach `max_attempts`
//! become `dead`, the error kept in `last_error`; rows without a recipient become `skipped`.
//! A transport that is down or refuses sekali's credentials ([`SendError::Unavailable`]) counts
//! against no row. The relay stops instead: it waits the same backoff, growing with each probe
//! that finds the transport unavailable, then probes with a single row, and sends the backlog
//! at once when the probe goes through. With the HTTP email API, a row whose first try may have
//! reached the API more than the downstream key's lifetime ago is not sent again (it becomes
//! dead, saying why): the API would no longer recognise the resend.
//! Every attempt of a row carries the same idempotency key (file name, `Idempotency-Key`
//! header, Message-ID), so a downstream can recognise a resend.
//!
//! Where it claims and records ([`Queue`]): inside `serve`, through the single writer, whose
//! group commits carry its claims and each batch's results (no second write connection, no
//! fight for SQLite's write lock, no fsync per email); as `sekali relay`, on a connection of its
//! own, one transaction per claim and one per batch of results.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::domain::text::third_party_for_log;
use crate::mail::transport::{MailConfig, SendError, Transport, TransportError};
use crate::mail::{render, RenderedEmail, Sender};
use crate::store::{
    ClaimRequest, ClaimedEmail, SendOutcome, SendResult, Store, StoreError, WriteError,
};

pub const DEFAULT_BASE_DELAY: Duration = Duration::from_secs(30);
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(3600);
pub const DEFAULT_MAX_ATTEMPTS: u32 = 10;
pub const DEFAULT_LEASE: Duration = Duration::from_secs(300);
/// A downstream email API keeps an idempotency key this long (Resend: 24 h); every retry of a
/// row must happen inside it.
pub const DOWNSTREAM_KEY_LIFETIME: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// The database, for `sekali relay` (the relay inside `serve` writes through the writer).
    pub db: crate::store::Location,
    pub busy_timeout: Duration,
    pub base_delay: Duration,
    pub max_delay: Duration,
    pub max_attempts: u32,
    pub lease: Duration,
    /// Longest one transport attempt may take; must be shorter than the lease.
    pub transport_timeout: Duration,
    pub batch: usize,
    /// How often to look for due rows when there were none.
    pub poll_interval: Duration,
    /// This relay's name in `lease_owner`.
    pub owner: String,
    pub from: String,
    /// Seeds the jitter (tests); `None`: random.
    pub seed: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Write(#[from] WriteError),
}

/// Where the relay claims rows and records their results: a store, whose claims and result
/// batches each commit in one transaction.
#[derive(Clone)]
pub struct Queue {
    store: Arc<dyn Store>,
    /// How it writes, for the relay's start line.
    writes: &'static str,
    /// Where its attempts are counted (`serve`'s `/metrics`); `None` for `sekali relay`.
    metrics: Option<Arc<crate::metrics::Metrics>>,
}

impl Queue {
    /// Inside `serve`: the server's store, whose single writer carries the relay's claims and
    /// results in the deliveries' transactions.
    pub fn server(store: Arc<dyn Store>) -> Queue {
        Queue {
            store,
            writes: "through the server's writer",
            metrics: None,
        }
    }

    /// Counts the relay's attempts in `metrics`.
    pub fn with_metrics(self, metrics: Arc<crate::metrics::Metrics>) -> Queue {
        Queue {
            metrics: Some(metrics),
            ..self
        }
    }

    /// `sekali relay`: a store opened by the relay, with a write connection of its own.
    pub fn own(store: Arc<dyn Store>) -> Queue {
        Queue {
            store,
            writes: "on its own connection",
            metrics: None,
        }
    }

    async fn claim(&self, request: ClaimRequest) -> Result<Vec<ClaimedEmail>, RelayError> {
        Ok(self.store.claim_outbox(request).await?)
    }

    /// Records a batch's results in one transaction; per result, whether this relay still held
    /// the row's lease.
    async fn record(&self, owner: &str, results: Vec<SendResult>) -> Result<Vec<bool>, RelayError> {
        Ok(self
            .store
            .record_outbox_results(owner.to_owned(), results)
            .await?)
    }
}

/// The relay's rows per claim: a file batch shares its two syncs, so it is large; SMTP and the
/// HTTP API send a batch concurrently, so it is what one server should take at once.
pub const FILE_BATCH: usize = 256;
/// `sekali relay`'s file batch: alone, its claims delay no delivery, and four thousand files
/// share each sync (measured draining 200,000 rows: about 1.5 times the rows/s of 256).
pub const ALONE_FILE_BATCH: usize = 4096;
pub const NETWORK_BATCH: usize = 32;

/// Where a relay runs, which sets how many rows it claims at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayHost {
    /// Inside `serve`: its claims ride in the deliveries' transactions, so they stay short.
    Serve,
    /// `sekali relay`, a process of its own.
    Alone,
}

impl RelayHost {
    /// Rows per claim, for a transport that writes files or one that sends over the network.
    pub fn batch(self, network: bool) -> usize {
        match (self, network) {
            (_, true) => NETWORK_BATCH,
            (RelayHost::Serve, false) => FILE_BATCH,
            (RelayHost::Alone, false) => ALONE_FILE_BATCH,
        }
    }
}

/// After a batch that was not full, the relay waits this long (or its poll interval, if
/// shorter) before it claims again, so that under a steady load it sends a few full batches a
/// second rather than many small ones: each `.eml` batch costs two syncs of the disk the
/// deliveries' commits share.
pub const LINGER: Duration = Duration::from_millis(250);

/// How much lower than the server's the CPU priority of `serve`'s relay is (nice steps).
pub const RELAY_NICE_STEPS: i32 = 10;

/// Starts the relay on a thread of its own with its own event loop (the transports need one).
///
/// Webhooks first on the CPU too: the thread runs at a lower priority than the server's
/// ([`RELAY_NICE_STEPS`] nice steps), and so do the threads its event loop starts to render and
/// write emails, which inherit it. While deliveries keep the cores busy, the scheduler gives them
/// the CPU first; on idle cores (a backlog after a load) the relay runs at full speed all the
/// same. `sekali relay`, a process of its own, keeps the priority it was started with.
pub fn spawn_relay(
    config: RelayConfig,
    mail: MailConfig,
    clock: SharedClock,
    shutdown: CancellationToken,
    queue: Queue,
) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("sekali-relay".into())
        .spawn(move || {
            lower_this_threads_priority(RELAY_NICE_STEPS);
            if let Err(e) = actix_web::rt::System::new()
                .block_on(run_relay(config, mail, clock, shutdown, queue))
            {
                tracing::error!(error = %crate::telemetry::ErrorChain(&e), "the outbox relay stopped");
            }
        })
        .expect("spawning the relay thread")
}

/// Lowers the calling thread's CPU priority by `steps` nice steps (to at most 19). On Linux a
/// thread's nice value is its own (`setpriority` with no id applies to the calling thread),
/// and threads it starts inherit it.
pub(crate) fn lower_this_threads_priority(steps: i32) {
    use rustix::process::{getpriority_process, setpriority_process};

    let lowered = getpriority_process(None)
        .and_then(|nice| setpriority_process(None, nice.saturating_add(steps).min(19)));
    if let Err(e) = lowered {
        tracing::warn!(error = %e, "could not lower the relay's CPU priority; it competes with deliveries for the CPU as an equal");
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RelayConfigError {
    #[error("--relay-lease ({lease:?}) must be longer than the transport timeout ({timeout:?}), or two relays could send one row at once")]
    LeaseTooShort { lease: Duration, timeout: Duration },
    #[error(
        "with the HTTP email API, every retry must fall inside the downstream key's 24 h lifetime, \
         but these settings allow up to {horizon:?} between a row's first and last attempt; lower \
         --relay-max-attempts, --relay-max-delay or --relay-lease"
    )]
    HorizonTooLong { horizon: Duration },
    #[error("--relay-max-attempts must be at least 1")]
    NoAttempts,
    #[error("--relay-base-delay ({base:?}) must not be longer than --relay-max-delay ({max:?})")]
    BaseOverMax { base: Duration, max: Duration },
}

impl RelayConfig {
    /// The longest possible time between a row's first and last attempt: every backoff at its
    /// maximum, plus a lease running out before every attempt.
    pub fn retry_horizon(&self) -> Duration {
        let delays: Duration = (1..self.max_attempts).map(|n| self.max_backoff(n)).sum();
        delays + self.lease * self.max_attempts
    }

    /// `min(max_delay, base_delay · 2^(n−1))` after failure `n`.
    pub fn max_backoff(&self, failures: u32) -> Duration {
        let factor = 1u32
            .checked_shl(failures.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.base_delay
            .checked_mul(factor)
            .unwrap_or(self.max_delay)
            .min(self.max_delay)
    }

    pub fn validate(&self, http_transport: bool) -> Result<(), RelayConfigError> {
        if self.max_attempts == 0 {
            return Err(RelayConfigError::NoAttempts);
        }
        if self.base_delay > self.max_delay {
            return Err(RelayConfigError::BaseOverMax {
                base: self.base_delay,
                max: self.max_delay,
            });
        }
        if self.lease <= self.transport_timeout {
            return Err(RelayConfigError::LeaseTooShort {
                lease: self.lease,
                timeout: self.transport_timeout,
            });
        }
        if http_transport && self.retry_horizon() >= DOWNSTREAM_KEY_LIFETIME {
            return Err(RelayConfigError::HorizonTooLong {
                horizon: self.retry_horizon(),
            });
        }
        Ok(())
    }
}

/// How long a relay waits after its `outage`-th probe in a row found the transport (or the
/// shop's endpoint) unavailable: equal jitter, at least half the backoff, so that probes do not
/// come back at once.
pub(crate) fn probe_pause(config: &RelayConfig, rng: &mut fastrand::Rng, outage: u32) -> Duration {
    let upper = config.max_backoff(outage).as_millis() as u64;
    Duration::from_millis(upper / 2 + rng.u64(0..=upper / 2))
}

/// Sleeps `pause`, or less if `shutdown` comes first.
pub(crate) async fn sleep_unless_stopped(shutdown: &CancellationToken, pause: Duration) {
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = tokio::time::sleep(pause) => {}
    }
}

/// Full jitter: a uniform delay in `[0, min(max_delay, base·2^(n−1))]` after failure `n`.
pub fn backoff_delay(config: &RelayConfig, rng: &mut fastrand::Rng, failures: u32) -> Duration {
    let upper = config.max_backoff(failures).as_millis() as u64;
    Duration::from_millis(rng.u64(0..=upper))
}

/// Runs until `shutdown` is cancelled.
pub async fn run_relay(
    config: RelayConfig,
    mail: MailConfig,
    clock: SharedClock,
    shutdown: CancellationToken,
    queue: Queue,
) -> Result<(), RelayError> {
    let transport = std::rc::Rc::new(Transport::from_config(&mail)?);
    let batch = config.batch.min(transport.batch_limit());
    let mut rng = config
        .seed
        .map_or_else(fastrand::Rng::new, fastrand::Rng::with_seed);
    tracing::info!(
        owner = %config.owner,
        transport = transport.kind(),
        // Absent (not `mail_dir=` with nothing after it) for SMTP and the email API.
        mail_dir = transport.mail_dir().map(|d| tracing::field::display(d.display())),
        writes = queue.writes,
        batch,
        "outbox relay started"
    );
    // Batches in a row that found the transport unavailable.
    let mut outage = 0u32;
    // A pipeline two batches deep: while one batch is being sent, the next is claimed and
    // rendered, and the one before has its results recorded. Through the writer, one batch's
    // results and the next claim then share a commit; with files, rendering overlaps the
    // writing.
    let mut sending: Option<InFlight> = None;
    let mut recording: Option<actix_web::rt::task::JoinHandle<()>> = None;
    loop {
        // While the transport is unavailable, one row probes it, alone. Rows claimed are never
        // abandoned on shutdown: they would wait out their lease (the writer stops only after
        // the relay).
        let claim_now = !shutdown.is_cancelled() && (outage == 0 || sending.is_none());
        let next = if claim_now {
            let request = ClaimRequest {
                owner: config.owner.clone(),
                lease_ms: config.lease.as_millis() as i64,
                limit: if outage > 0 { 1 } else { batch },
                outbox: crate::store::OutboxKind::Email,
            };
            match queue.claim(request).await {
                Ok(claimed) => claimed,
                Err(e) => {
                    tracing::warn!(error = %crate::telemetry::ErrorChain(&e), "claiming outbox rows failed; trying again");
                    Vec::new()
                }
            }
        } else {
            Vec::new()
        };
        let lingers = !next.is_empty() && next.len() < batch;
        let next = (!next.is_empty()).then(|| InFlight::start(&config, &transport, &clock, next));
        let linger = config.poll_interval.min(LINGER);
        let Some(previous) = std::mem::replace(&mut sending, next) else {
            if sending.is_none() {
                // Nothing in flight and nothing due.
                if shutdown.is_cancelled() {
                    break;
                }
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = tokio::time::sleep(config.poll_interval) => {}
                }
            } else if lingers {
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = tokio::time::sleep(linger) => {}
                }
            }
            continue;
        };
        let InFlight { claimed, attempts } = previous;
        let attempts = attempts.await.unwrap_or_else(|_| {
            claimed
                .iter()
                .map(|_| Some(Err(SendError::transient("the send task failed"))))
                .collect()
        });
        let unavailable = attempts
            .iter()
            .filter(|a| matches!(a, Some(Err(SendError::Unavailable(_)))))
            .count();
        // Any answer from the transport, even a refusal of one email, shows it is up.
        let answered = attempts.iter().any(|a| {
            matches!(
                a,
                Some(Ok(())) | Some(Err(SendError::Transient { .. } | SendError::Permanent(_)))
            )
        });
        let was_unavailable = unavailable > 0 && !answered;
        if was_unavailable {
            outage += 1;
        } else if answered {
            outage = 0;
        }
        let reason = attempts
            .iter()
            .find_map(|a| match a {
                Some(Err(SendError::Unavailable(reason))) => Some(reason.clone()),
                _ => None,
            })
            .unwrap_or_default();
        let now = clock.now_millis();
        let results: Vec<SendResult> = claimed
            .iter()
            .zip(attempts)
            .map(|(email, attempt)| SendResult {
                id: email.id,
                outcome: outcome_of(&config, &mut rng, email.attempts, attempt, now),
            })
            .collect();
        if let Some(metrics) = &queue.metrics {
            metrics.relay_results(transport.label(), &results);
        }
        // At most one batch's results in flight: they are recorded in order.
        if let Some(previous) = recording.take() {
            let _ = previous.await;
        }
        let (queue_for_record, owner) = (queue.clone(), config.owner.clone());
        recording = Some(actix_web::rt::spawn(async move {
            match queue_for_record.record(&owner, results.clone()).await {
                Ok(owned) => {
                    for ((email, result), owned) in claimed.iter().zip(&results).zip(owned) {
                        log_result(email, &result.outcome, owned);
                    }
                }
                Err(e) => tracing::warn!(
                    error = %crate::telemetry::ErrorChain(&e),
                    rows = results.len(),
                    "recording a batch of outbox results failed; its rows will be sent again after their lease"
                ),
            }
        }));
        if was_unavailable {
            let pause = probe_pause(&config, &mut rng, outage);
            tracing::warn!(
                probes_in_a_row = outage,
                retry_in_ms = pause.as_millis() as u64,
                reason = %third_party_for_log(&reason),
                "the email transport is unavailable; no row's try is counted, and the relay waits before probing it again"
            );
            sleep_unless_stopped(&shutdown, pause).await;
        } else if lingers {
            sleep_unless_stopped(&shutdown, linger).await;
        }
    }
    if let Some(last) = recording.take() {
        let _ = last.await;
    }
    tracing::info!(owner = %config.owner, "outbox relay stopped");
    Ok(())
}

/// A claimed batch being sent: the rows, and what became of each (`None` for a row without a
/// recipient), once the task ends.
struct InFlight {
    claimed: Arc<Vec<ClaimedEmail>>,
    attempts: actix_web::rt::task::JoinHandle<Vec<Option<Result<(), SendError>>>>,
}

impl InFlight {
    /// Renders the rows that are to be sent, off the event loop (a batch costs milliseconds of
    /// CPU, which then overlap the batch before being sent), and hands them to the transport
    /// as one batch (see [`Transport::send_batch`]), on a task of the relay's event loop.
    fn start(
        config: &RelayConfig,
        transport: &std::rc::Rc<Transport>,
        clock: &SharedClock,
        claimed: Vec<ClaimedEmail>,
    ) -> InFlight {
        let now_ms = clock.now_millis();
        let (transport, timeout) = (transport.clone(), config.transport_timeout);
        let (from, checks_key_lifetime) = (config.from.clone(), transport.is_http());
        let claimed = Arc::new(claimed);
        let (rows, count) = (claimed.clone(), claimed.len());
        let attempts = actix_web::rt::spawn(async move {
            let rendered = actix_web::rt::task::spawn_blocking(move || {
                let mut attempts: Vec<Option<Result<(), SendError>>> =
                    Vec::with_capacity(rows.len());
                let mut to_send: Vec<(usize, RenderedEmail)> = Vec::new();
                let from = Sender::new(&from);
                for (index, email) in rows.iter().enumerate() {
                    attempts.push(match prepare(checks_key_lifetime, now_ms, email, &from) {
                        Prepared::Done(result) => result,
                        Prepared::Send(rendered) => {
                            to_send.push((index, *rendered));
                            None // replaced when it is sent
                        }
                    });
                }
                (attempts, to_send)
            })
            .await;
            let Ok((mut attempts, to_send)) = rendered else {
                let failed = Some(Err(SendError::transient("rendering the batch failed")));
                return vec![failed; count];
            };
            let (indexes, rendered): (Vec<usize>, Vec<RenderedEmail>) = to_send.into_iter().unzip();
            let sent = transport.send_batch(rendered, timeout).await;
            for (index, result) in indexes.into_iter().zip(sent) {
                attempts[index] = Some(result);
            }
            attempts
        });
        InFlight { claimed, attempts }
    }
}

enum Prepared {
    /// Decided without the transport: no recipient (`None`), withheld, or not renderable.
    Done(Option<Result<(), SendError>>),
    Send(Box<RenderedEmail>),
}

/// `checks_key_lifetime`: the transport is the HTTP email API, whose idempotency keys expire.
fn prepare(
    checks_key_lifetime: bool,
    now_ms: i64,
    email: &ClaimedEmail,
    from: &Sender,
) -> Prepared {
    if email.recipient.is_none() {
        return Prepared::Done(None);
    }
    // Past the key's lifetime after the first try that may have reached the API, a resend
    // could deliver the email twice. (Counted tries alone always fit, see `validate`; but waits
    // for an unavailable transport count no try and can last longer.)
    if checks_key_lifetime
        && email
            .first_tried_ms
            .is_some_and(|first| now_ms - first >= DOWNSTREAM_KEY_LIFETIME.as_millis() as i64)
    {
        return Prepared::Done(Some(Err(SendError::Withheld(format!(
            "not sent again: an earlier try may have reached the email API more than {} ago, \
             past its idempotency key's lifetime, so a resend could deliver it twice; check \
             whether it arrived, and `sekali outbox retry` it if not",
            humantime::format_duration(DOWNSTREAM_KEY_LIFETIME)
        )))));
    }
    match render(email, from) {
        Ok(rendered) => Prepared::Send(Box::new(rendered)),
        Err(e) => Prepared::Done(Some(Err(SendError::Permanent(e.to_string())))),
    }
}

/// The next state of a row tried `attempts` times before, after `attempt` (`None`: nothing to
/// send); for both outboxes.
pub(crate) fn outcome_of(
    config: &RelayConfig,
    rng: &mut fastrand::Rng,
    attempts: i64,
    attempt: Option<Result<(), SendError>>,
    now: i64,
) -> SendOutcome {
    let failures = attempts as u32 + 1;
    let Some(result) = attempt else {
        return SendOutcome::Skipped;
    };
    match result {
        Ok(()) => SendOutcome::Sent,
        // Due again at once: the relay's own pause spaces the probes (see `run_relay`).
        Err(SendError::Unavailable(error)) => SendOutcome::Untried {
            error,
            retry_at_ms: Some(now),
        },
        Err(SendError::Withheld(error)) => SendOutcome::Untried {
            error,
            retry_at_ms: None,
        },
        Err(SendError::Permanent(error)) => SendOutcome::Failed {
            error,
            retry_at_ms: None,
        },
        Err(SendError::Transient { reason, .. }) if failures >= config.max_attempts => {
            SendOutcome::Failed {
                error: format!("{reason} (gave up after {failures} attempts)"),
                retry_at_ms: None,
            }
        }
        Err(SendError::Transient {
            reason,
            retry_after,
        }) => {
            let delay = match retry_after {
                Some(asked) => asked.min(config.max_delay),
                None => backoff_delay(config, rng, failures),
            };
            SendOutcome::Failed {
                error: reason,
                retry_at_ms: Some(now + delay.as_millis() as i64),
            }
        }
    }
}

/// One line per row whose result is worth an operator's eye; third-party text in it is made
/// fit for a log line.
fn log_result(email: &ClaimedEmail, outcome: &SendOutcome, owned: bool) {
    let (id, key) = (email.id, email.idempotency_key.as_str());
    match outcome {
        SendOutcome::Sent => tracing::debug!(id, key, "email sent"),
        SendOutcome::Skipped => tracing::info!(id, "outbox row skipped: no recipient address"),
        SendOutcome::Untried {
            retry_at_ms: Some(_),
            ..
        } => tracing::debug!(id, key, "email waits for the transport"),
        SendOutcome::Untried { error, .. } => tracing::warn!(
            id,
            key,
            reason = %third_party_for_log(error),
            "email withheld; row is dead"
        ),
        SendOutcome::Failed {
            error,
            retry_at_ms: None,
        } => tracing::warn!(
            id,
            key,
            attempts = email.attempts + 1,
            reason = %third_party_for_log(error),
            "{}",
            if error.ends_with(" attempts)") && error.contains("(gave up after ") {
                "email reached the attempt limit; row is dead"
            } else {
                "email failed permanently; row is dead"
            }
        ),
        SendOutcome::Failed {
            error,
            retry_at_ms: Some(at),
        } => tracing::info!(
            id,
            key,
            attempts = email.attempts + 1,
            retry_at_ms = at,
            reason = %third_party_for_log(error),
            "email will be retried"
        ),
    }
    if !owned {
        tracing::warn!(id, key, "this relay's lease ran out before the result was recorded; the row will be sent again with the same key");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(base: u64, max: u64, attempts: u32) -> RelayConfig {
        RelayConfig {
            db: crate::store::Location::File(std::path::PathBuf::new()),
            busy_timeout: Duration::from_secs(1),
            base_delay: Duration::from_secs(base),
            max_delay: Duration::from_secs(max),
            max_attempts: attempts,
            lease: Duration::from_secs(300),
            transport_timeout: Duration::from_secs(30),
            batch: 10,
            poll_interval: Duration::from_secs(1),
            owner: "test".into(),
            from: "sekali@localhost".into(),
            seed: Some(7),
        }
    }

    #[test]
    fn backoff_caps_grow_exponentially_up_to_the_max_delay() {
        let c = config(30, 3600, 10);
        let caps: Vec<u64> = (1..=9).map(|n| c.max_backoff(n).as_secs()).collect();
        assert_eq!(caps, [30, 60, 120, 240, 480, 960, 1920, 3600, 3600]);
        assert_eq!(c.max_backoff(200).as_secs(), 3600, "no overflow");
    }

    #[test]
    fn jittered_delays_stay_within_their_bounds() {
        let c = config(30, 3600, 10);
        let mut rng = fastrand::Rng::with_seed(42);
        for n in 1..=12 {
            for _ in 0..200 {
                assert!(backoff_delay(&c, &mut rng, n) <= c.max_backoff(n));
            }
        }
    }

    #[test]
    fn the_default_retry_horizon_fits_a_24_hour_downstream_key() {
        let c = config(30, 3600, 10);
        assert_eq!(c.retry_horizon(), Duration::from_secs(11_010 + 3000));
        assert!(c.retry_horizon() < DOWNSTREAM_KEY_LIFETIME);
        assert!(config(30, 3600, 40).retry_horizon() > DOWNSTREAM_KEY_LIFETIME);
    }
}
