use actix_web::{web, HttpResponse};

use super::AppState;
use crate::store::reads::check_health;

/// 200 when the database answers a read, 503 otherwise.
pub async fn healthz(state: web::Data<AppState>) -> HttpResponse {
    let pool = state.reads.clone();
    let result = web::block(move || -> Result<(), crate::store::StoreError> {
        let conn = pool.get()?;
        check_health(&conn)?;
        Ok(())
    })
    .await;
    match result {
        Ok(Ok(())) => HttpResponse::Ok().json(serde_json::json!({ "status": "ok" })),
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
