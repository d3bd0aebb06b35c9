//! The scheduled purge of expired event ids.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::store::Writer;

/// Every `interval`, deletes expired event ids through the writer, `batch` rows per transaction,
/// looping while batches come back full. Deliveries queue between batches, so they keep flowing
/// during a large purge. Returns when `shutdown` is cancelled.
pub async fn run_purge_job(
    writer: Writer,
    interval: Duration,
    batch: usize,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(interval) => {}
        }
        let mut total = crate::store::purge::Purged::default();
        loop {
            if shutdown.is_cancelled() {
                break;
            }
            match writer.purge_batch(batch).await {
                Ok(purged) => {
                    total += purged;
                    if !purged.was_full(batch) {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = ?e, "purge pass stopped early; the next one will continue");
                    break;
                }
            }
        }
        tracing::info!(
            events = total.events,
            idempotency_keys = total.idempotency_keys,
            "purged {} expired event ids and {} expired idempotency keys",
            total.events,
            total.idempotency_keys
        );
    }
    tracing::debug!("purge job stopped");
}
