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

use std::path::PathBuf;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::domain::text::third_party_for_log;
use crate::mail::transport::{MailConfig, SendError, Transport, TransportError};
use crate::mail::{render, RenderedEmail};
use crate::store::outbox::{self, ClaimedEmail};
use crate::store::{open_existing, StoreError};

pub const DEFAULT_BASE_DELAY: Duration = Duration::from_secs(30);
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(3600);
pub const DEFAULT_MAX_ATTEMPTS: u32 = 10;
pub const DEFAULT_LEASE: Duration = Duration::from_secs(300);
/// A downstream email API keeps an idempotency key this long (Resend: 24 h); every retry of a
/// row must happen inside it.
pub const DOWNSTREAM_KEY_LIFETIME: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug, Clone)]
pub struct RelayConfig {
    pub db_path: PathBuf,
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
}

/// Starts the relay on a thread of its own with its own event loop (the transports need one).
pub fn spawn_relay(
    config: RelayConfig,
    mail: MailConfig,
    clock: SharedClock,
    shutdown: CancellationToken,
) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("sekali-relay".into())
        .spawn(move || {
            if let Err(e) =
                actix_web::rt::System::new().block_on(run_relay(config, mail, clock, shutdown))
            {
                tracing::error!(error = %e, "the outbox relay stopped");
            }
        })
        .expect("spawning the relay thread")
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
) -> Result<(), RelayError> {
    let transport = Transport::from_config(&mail)?;
    let conn = open_existing(&config.db_path, true, config.busy_timeout)?;
    let mut rng = config
        .seed
        .map_or_else(fastrand::Rng::new, fastrand::Rng::with_seed);
    tracing::info!(
        owner = %config.owner,
        transport = transport.kind(),
        mail_dir = %transport.mail_dir().map(|d| d.display().to_string()).unwrap_or_default(),
        "outbox relay started"
    );
    // Batches in a row that found the transport unavailable.
    let mut outage = 0u32;
    while !shutdown.is_cancelled() {
        // While the transport is unavailable, one row probes it.
        let limit = if outage > 0 { 1 } else { config.batch };
        let claimed = match outbox::claim_due(
            &conn,
            &config.owner,
            clock.now_millis(),
            config.lease.as_millis() as i64,
            limit,
        ) {
            Ok(claimed) => claimed,
            Err(e) => {
                tracing::warn!(error = ?e, "claiming outbox rows failed; trying again");
                Vec::new()
            }
        };
        if claimed.is_empty() {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(config.poll_interval) => continue,
            }
        }
        // The batch is sent concurrently (each send bounded by the transport timeout, which is
        // shorter than the lease), then the results are recorded one by one.
        let now = clock.now_millis();
        let attempts = futures_util::future::join_all(
            claimed
                .iter()
                .map(|email| attempt(&config, &transport, now, email)),
        )
        .await;
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
        for (email, result) in claimed.into_iter().zip(attempts) {
            if let Err(e) = record_result(&conn, &config, &clock, &mut rng, email, result) {
                tracing::warn!(error = ?e, "recording an outbox result failed; the row will be retried after its lease");
            }
        }
        if was_unavailable {
            // Equal jitter: at least half the backoff, so probes do not come back at once.
            let upper = config.max_backoff(outage).as_millis() as u64;
            let pause = Duration::from_millis(upper / 2 + rng.u64(0..=upper / 2));
            tracing::warn!(
                probes_in_a_row = outage,
                retry_in_ms = pause.as_millis() as u64,
                reason = %third_party_for_log(&reason),
                "the email transport is unavailable; no row's try is counted, and the relay waits before probing it again"
            );
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }
    tracing::info!(owner = %config.owner, "outbox relay stopped");
    Ok(())
}

/// What became of one claimed row; `None` when it has no recipient.
async fn attempt(
    config: &RelayConfig,
    transport: &Transport,
    now_ms: i64,
    email: &ClaimedEmail,
) -> Option<Result<(), SendError>> {
    email.recipient.as_ref()?;
    // Past the key's lifetime after the first try that may have reached the API, a resend
    // could deliver the email twice. (Counted tries alone always fit, see `validate`; but waits
    // for an unavailable transport count no try and can last longer.)
    if transport.is_http()
        && email
            .first_tried_ms
            .is_some_and(|first| now_ms - first >= DOWNSTREAM_KEY_LIFETIME.as_millis() as i64)
    {
        return Some(Err(SendError::Withheld(format!(
            "not sent again: an earlier try may have reached the email API more than {} ago, \
             past its idempotency key's lifetime, so a resend could deliver it twice; check \
             whether it arrived, and `sekali outbox retry` it if not",
            humantime::format_duration(DOWNSTREAM_KEY_LIFETIME)
        ))));
    }
    Some(match render(email, &config.from) {
        Ok(rendered) => send_with_timeout(transport, &rendered, config.transport_timeout).await,
        Err(e) => Err(SendError::Permanent(e.to_string())),
    })
}

fn record_result(
    conn: &rusqlite::Connection,
    config: &RelayConfig,
    clock: &SharedClock,
    rng: &mut fastrand::Rng,
    email: ClaimedEmail,
    result: Option<Result<(), SendError>>,
) -> Result<(), StoreError> {
    let (id, key) = (email.id, email.idempotency_key.clone());
    let Some(result) = result else {
        outbox::mark_skipped(conn, id, &config.owner, clock.now_millis())?;
        tracing::info!(id, "outbox row skipped: no recipient address");
        return Ok(());
    };
    let now = clock.now_millis();
    let failures = email.attempts as u32 + 1;
    let owned = match result {
        Ok(()) => {
            let owned = outbox::mark_sent(conn, id, &config.owner, now)?;
            tracing::debug!(id, key = %key, "email sent");
            owned
        }
        Err(SendError::Unavailable(reason)) => {
            // Due again at once: the relay's own pause spaces the probes (see `run_relay`).
            tracing::debug!(id, key = %key, "email waits for the transport");
            outbox::mark_untried(conn, id, &config.owner, now, &reason, Some(now))?
        }
        Err(SendError::Withheld(reason)) => {
            tracing::warn!(id, key = %key, reason = %third_party_for_log(&reason), "email withheld; row is dead");
            outbox::mark_untried(conn, id, &config.owner, now, &reason, None)?
        }
        Err(SendError::Permanent(reason)) => {
            tracing::warn!(id, key = %key, reason = %third_party_for_log(&reason), "email failed permanently; row is dead");
            outbox::mark_failed(conn, id, &config.owner, now, &reason, None)?
        }
        Err(SendError::Transient { reason, .. }) if failures >= config.max_attempts => {
            tracing::warn!(id, key = %key, attempts = failures, reason = %third_party_for_log(&reason), "email reached the attempt limit; row is dead");
            let reason = format!("{reason} (gave up after {failures} attempts)");
            outbox::mark_failed(conn, id, &config.owner, now, &reason, None)?
        }
        Err(SendError::Transient {
            reason,
            retry_after,
        }) => {
            let delay = match retry_after {
                Some(asked) => asked.min(config.max_delay),
                None => backoff_delay(config, rng, failures),
            };
            tracing::info!(id, key = %key, attempts = failures, retry_in_ms = delay.as_millis() as u64, reason = %third_party_for_log(&reason), "email will be retried");
            outbox::mark_failed(
                conn,
                id,
                &config.owner,
                now,
                &reason,
                Some(now + delay.as_millis() as i64),
            )?
        }
    };
    if !owned {
        tracing::warn!(id, key = %key, "this relay's lease ran out before the result was recorded; the row will be sent again with the same key");
    }
    Ok(())
}

async fn send_with_timeout(
    transport: &Transport,
    email: &RenderedEmail,
    timeout: Duration,
) -> Result<(), SendError> {
    match tokio::time::timeout(timeout, transport.send(email)).await {
        Ok(result) => result,
        Err(_) => Err(SendError::Transient {
            reason: format!("the transport timed out after {timeout:?}"),
            retry_after: None,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(base: u64, max: u64, attempts: u32) -> RelayConfig {
        RelayConfig {
            db_path: PathBuf::new(),
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
