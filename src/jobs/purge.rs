//! The scheduled purge of expired event ids.

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::store::{Purged, Store};

/// Every `interval`, deletes expired event ids through the writer, `batch` rows per transaction,
/// looping while batches come back full. Returns when `shutdown` is cancelled.
///
/// A pass yields the writer to deliveries: after each full batch it waits as long as that batch
/// took (queueing included) before asking for the next. Deliveries queued behind a batch wait
/// for that one batch only, and during a long pass they get at least about half of the
/// writer's time. Back to back, a pass of 5,000-row batches let through at most about one
/// delivery per client connection per batch, and the p99 of a soak rose to 267 ms (see
/// docs/dev/history.md, "The purge and the soak").
pub async fn run_purge_job(
    store: std::sync::Arc<dyn Store>,
    interval: Duration,
    batch: usize,
    shutdown: CancellationToken,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(interval) => {}
        }
        let started = Instant::now();
        let mut total = Purged::default();
        let mut transactions = 0;
        loop {
            let asked = Instant::now();
            match store.purge_batch(batch).await {
                Ok(purged) => {
                    total += purged;
                    transactions += 1;
                    if !purged.was_full(batch) {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %crate::telemetry::ErrorChain(&e), "purge pass stopped early; the next one will continue");
                    break;
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(asked.elapsed()) => {}
            }
        }
        metrics.purge(total.events as u64, total.idempotency_keys as u64);
        tracing::info!(
            events = total.events,
            idempotency_keys = total.idempotency_keys,
            transactions,
            seconds = started.elapsed().as_secs_f64(),
            "purged {} expired event ids and {} expired idempotency keys",
            total.events,
            total.idempotency_keys
        );
    }
    tracing::debug!("purge job stopped");
}
