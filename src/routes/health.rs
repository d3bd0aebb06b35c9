use actix_web::{web, HttpResponse};

use super::AppState;
use crate::telemetry::ErrorChain;

/// 200 when the database answers a read, 503 otherwise. The body also says how many times the
/// writer has replaced its connection since start (a panic or an I/O fault each count one):
/// a number that keeps climbing means the disk or the database file needs a look. And what the
/// writer has done (transactions, deliveries, the relay's claims and results), with the write
/// connections its store has opened: one, however much the relay sends.
pub async fn healthz(state: web::Data<AppState>) -> HttpResponse {
    match state.store.check_health().await {
        Ok(()) => {
            let stats = state.store.stats();
            HttpResponse::Ok().json(serde_json::json!({
                "status": "ok",
                "writer_reopens": stats.writer.reopens,
                "writer": stats.writer,
                "write_connections_opened": stats.writer.connections_opened,
            }))
        }
        Err(e) => {
            tracing::error!(error = %ErrorChain(&e), "health check failed");
            HttpResponse::ServiceUnavailable().json(serde_json::json!({ "status": "unavailable" }))
        }
    }
}
