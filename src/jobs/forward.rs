//! The forwarding relay: sends `forward_outbox` rows (order changes) to the shop's endpoint, at
//! least once, in order per order.
//!
//! The same machinery as the email relay ([`super::relay`]): claims under a lease and results
//! recorded while the lease holds, both through the store's writer; full-jitter backoff, the
//! endpoint's `Retry-After` honoured (capped at the maximum delay); an endpoint that cannot be
//! reached counts against no row, and is probed with one row before the backlog goes; `dead`
//! after the attempt limit, the reason kept. The claim itself keeps the order: it takes only
//! the oldest unfinished change of each order (see the engines' `forward::claim_due`), so a
//! change is never sent while an earlier one of its order is pending, and a dead one holds its
//! order's later changes until an operator retries or skips it.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::relay::{outcome_of, probe_pause, sleep_unless_stopped, RelayConfig, LINGER};
use crate::clock::SharedClock;
use crate::domain::text::third_party_for_log;
use crate::forward::{ForwardConfig, Forwarder, Message};
use crate::mail::transport::SendError;
use crate::store::{ClaimRequest, ClaimedForward, OutboxKind, SendOutcome, SendResult, Store};

/// Rows per claim: sent at once, one request each (over at most the client's 100 connections).
pub const FORWARD_BATCH: usize = 256;

/// Starts forwarding on a thread of its own with its own event loop, at the email relay's lower
/// CPU priority: webhook deliveries keep the cores first.
pub fn spawn_forwarder(
    config: RelayConfig,
    forward: ForwardConfig,
    clock: SharedClock,
    shutdown: CancellationToken,
    store: Arc<dyn Store>,
    metrics: Option<Arc<crate::metrics::Metrics>>,
) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("sekali-forward".into())
        .spawn(move || {
            super::relay::lower_this_threads_priority(super::relay::RELAY_NICE_STEPS);
            let timeout = config.transport_timeout;
            actix_web::rt::System::new().block_on(run_forwarder(
                config,
                Forwarder::new(forward, timeout),
                clock,
                shutdown,
                store,
                metrics,
            ))
        })
        .expect("spawning the forwarding thread")
}

/// Runs until `shutdown` is cancelled; claims and records through `store`.
pub async fn run_forwarder(
    config: RelayConfig,
    forwarder: Forwarder,
    clock: SharedClock,
    shutdown: CancellationToken,
    store: Arc<dyn Store>,
    metrics: Option<Arc<crate::metrics::Metrics>>,
) {
    let mut rng = config
        .seed
        .map_or_else(fastrand::Rng::new, fastrand::Rng::with_seed);
    tracing::info!(owner = %config.owner, url = %forwarder.url(), "forwarding started");
    // Batches in a row that found the endpoint unreachable.
    let mut outage = 0u32;
    let mut recording: Option<actix_web::rt::task::JoinHandle<()>> = None;
    while !shutdown.is_cancelled() {
        let request = ClaimRequest {
            owner: config.owner.clone(),
            lease_ms: config.lease.as_millis() as i64,
            limit: if outage > 0 { 1 } else { FORWARD_BATCH },
            outbox: OutboxKind::Forward,
        };
        let claimed = match store.claim_forwards(request).await {
            Ok(claimed) => claimed,
            Err(e) => {
                tracing::warn!(error = %crate::telemetry::ErrorChain(&e), "claiming changes to forward failed; trying again");
                Vec::new()
            }
        };
        if claimed.is_empty() {
            sleep_unless_stopped(&shutdown, config.poll_interval).await;
            continue;
        }
        let messages: Vec<Message> = claimed
            .iter()
            .map(|row| Message {
                id: row.message_id.clone(),
                body: row.body.clone(),
            })
            .collect();
        let attempts = forwarder.send_batch(&messages, clock.now_unix()).await;
        let answered = attempts.iter().any(|a| {
            matches!(
                a,
                Ok(()) | Err(SendError::Transient { .. } | SendError::Permanent(_))
            )
        });
        let unreachable = attempts.iter().find_map(|a| match a {
            Err(SendError::Unavailable(reason)) => Some(reason.clone()),
            _ => None,
        });
        let was_unavailable = unreachable.is_some() && !answered;
        if was_unavailable {
            outage += 1;
        } else if answered {
            outage = 0;
        }
        let now = clock.now_millis();
        let results: Vec<SendResult> = claimed
            .iter()
            .zip(attempts)
            .map(|(row, attempt)| SendResult {
                id: row.id,
                outcome: outcome_of(&config, &mut rng, row.attempts, Some(attempt), now),
            })
            .collect();
        if let Some(metrics) = &metrics {
            metrics.relay_results("forward", &results);
        }
        // Recorded while the next batch is claimed and sent (the two share the writer's
        // commits); at most one batch's results in flight, so they are recorded in order.
        if let Some(previous) = recording.take() {
            let _ = previous.await;
        }
        let (store_for_record, owner) = (store.clone(), config.owner.clone());
        let batch_full = claimed.len() == FORWARD_BATCH;
        recording = Some(actix_web::rt::spawn(async move {
            match store_for_record
                .record_forward_results(owner, results.clone())
                .await
            {
                Ok(owned) => {
                    for ((row, result), owned) in claimed.iter().zip(&results).zip(owned) {
                        log_result(row, &result.outcome, owned);
                    }
                }
                Err(e) => tracing::warn!(
                    error = %crate::telemetry::ErrorChain(&e),
                    rows = results.len(),
                    "recording forwarding results failed; those changes will be sent again after their lease"
                ),
            }
        }));
        if was_unavailable {
            let pause = probe_pause(&config, &mut rng, outage);
            tracing::warn!(
                probes_in_a_row = outage,
                retry_in_ms = pause.as_millis() as u64,
                reason = %third_party_for_log(&unreachable.unwrap_or_default()),
                "the shop's endpoint cannot be reached; no change's try is counted, and forwarding waits before probing it again"
            );
            sleep_unless_stopped(&shutdown, pause).await;
        } else if !batch_full {
            sleep_unless_stopped(&shutdown, config.poll_interval.min(LINGER)).await;
        }
    }
    if let Some(last) = recording.take() {
        let _ = last.await;
    }
    tracing::info!(owner = %config.owner, "forwarding stopped");
}

/// One line per row whose result is worth an operator's eye; the endpoint's text in it is made
/// fit for a log line.
fn log_result(row: &ClaimedForward, outcome: &SendOutcome, owned: bool) {
    let (id, change) = (row.id, row.message_id.as_str());
    let order = crate::domain::text::Escaped(&row.order_id);
    match outcome {
        SendOutcome::Sent => tracing::debug!(id, change, "change forwarded"),
        SendOutcome::Skipped => {}
        SendOutcome::Untried { .. } => {
            tracing::debug!(id, change, "change waits for the shop's endpoint")
        }
        SendOutcome::Failed {
            error,
            retry_at_ms: None,
        } => tracing::warn!(
            id,
            change,
            order_id = %order,
            attempts = row.attempts + 1,
            reason = %third_party_for_log(error),
            "forwarding a change failed for good; the row is dead, and the order's later changes wait until it is retried or skipped (sekali forward retry|skip {id})"
        ),
        SendOutcome::Failed {
            error,
            retry_at_ms: Some(at),
        } => tracing::info!(
            id,
            change,
            attempts = row.attempts + 1,
            retry_at_ms = at,
            reason = %third_party_for_log(error),
            "forwarding a change will be retried"
        ),
    }
    if !owned {
        tracing::warn!(id, change, "the lease ran out before the result was recorded; the change will be sent again with the same webhook-id");
    }
}
