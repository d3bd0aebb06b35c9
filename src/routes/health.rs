use actix_web::{web, HttpResponse};

use super::AppState;
use crate::store::reads::check_health;

/// 200 when the database answers a read, 503 otherwise. The body also says how many times the
/// writer has replaced its connection since start (a panic or an I/O fault each count one):
/// a number that keeps climbing means the disk or the database file needs a look. And what the
/// writer has done (transactions, deliveries, the relay's claims and results), with the write
/// connections the process has opened: one, however much the relay sends.
pub async fn healthz(state: web::Data<AppState>) -> HttpResponse {
    let pool = state.reads.clone();
    let result = web::block(move || -> Result<(), crate::store::StoreError> {
        let conn = pool.get()?;
        check_health(&conn)?;
        Ok(())
    })
    .await;
    match result {
        Ok(Ok(())) => HttpResponse::Ok().json(serde_json::json!({
            "status": "ok",
            "writer_reopens": state.writer.reopens(),
            "writer": state.writer.stats(),
            "write_connections_opened": crate::store::write_connections_opened(),
        })),
        Ok(Err(e)) => {
            tracing::error!(error = ?e, "health check failed");
            HttpResponse::ServiceUnavailable().json(serde_json::json!({ "status": "unavailable" }))
        }
        Err(e) => {
            tracing::error!(error = ?e, "health check could not run");
            HttpResponse::ServiceUnavailable().json(serde_json::json!({ "status": "unavailable" }))
        }
    }
}
