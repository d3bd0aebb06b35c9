//! Thin HTTP handlers. Each maps its errors onto the provider's retry protocol: bad input 4xx
//! (the provider stops or gives up), our own transient fault 503 (the provider retries),
//! duplicates 2xx.

pub mod api;
mod error;
mod health;
mod orders;
pub mod problem;
mod webhooks;

use actix_web::{web, HttpResponse};
use secrecy::SecretString;

pub use error::WebhookError;

use crate::clock::SharedClock;
use crate::config::Secrets;
use crate::store::{ReadPool, Writer};

/// Shared by every worker.
pub struct AppState {
    pub secrets: Secrets,
    pub stripe_tolerance_secs: u64,
    pub max_body_bytes: usize,
    pub clock: SharedClock,
    pub writer: Writer,
    pub reads: ReadPool,
    pub idempotency_retention_secs: i64,
    /// Idempotency-Keys whose first request is being processed now.
    pub in_flight: api::InFlightKeys,
}

impl AppState {
    fn stripe_secrets(&self) -> Option<&[SecretString]> {
        (!self.secrets.stripe.is_empty()).then_some(self.secrets.stripe.as_slice())
    }
}

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/webhooks/stripe", web::post().to(webhooks::stripe_webhook))
        .route(
            "/webhooks/midtrans",
            web::post().to(webhooks::midtrans_webhook),
        )
        .route("/healthz", web::get().to(health::healthz))
        .route("/orders", web::post().to(orders::create_order))
        .route("/orders", web::get().to(orders::list_orders))
        .route("/orders/{order_id}", web::get().to(orders::get_order))
        .default_service(web::to(not_found));
}

async fn not_found() -> HttpResponse {
    HttpResponse::NotFound().json(serde_json::json!({ "error": "not found" }))
}
