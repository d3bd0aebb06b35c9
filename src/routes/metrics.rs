//! `GET /metrics`: Prometheus's scrape (docs/operations.md#metrics).

use actix_web::{web, HttpResponse};

use super::AppState;
use crate::telemetry::ErrorChain;

/// The metrics in the Prometheus text format, the outboxes' backlog read now. If the database
/// cannot be read, the backlog keeps its last values and the rest is answered all the same (a
/// scrape that fails would hide the metrics that say why).
pub async fn metrics(req: actix_web::HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    if !state.serves_metrics {
        return super::not_found(req).await;
    }
    let backlog = match state.store.outbox_backlog(state.clock.now_millis()).await {
        Ok(backlog) => backlog.iter().map(|(kind, b)| (kind.label(), *b)).collect(),
        Err(e) => {
            tracing::warn!(error = %ErrorChain(&e), "reading the outboxes' backlog for /metrics failed");
            Vec::new()
        }
    };
    HttpResponse::Ok()
        .content_type(crate::metrics::CONTENT_TYPE)
        .body(state.metrics.encode(&backlog))
}

/// The app of `--metrics-listen`: `/metrics` alone.
pub fn configure_alone(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource("/metrics")
            .route(web::get().to(metrics))
            .route(web::head().to(metrics)),
    );
}
