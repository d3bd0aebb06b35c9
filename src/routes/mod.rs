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
    /// Deliveries refused because the write queue was full, not yet logged.
    pub refused: std::sync::Arc<Refused>,
    /// Confirms each Midtrans notification before it is applied (`None`: off).
    pub midtrans_status: Option<crate::clients::midtrans_status::StatusApi>,
}

/// Deliveries answered 503 because the write queue was full, per provider, since the last
/// [`Refused::report`]: the log gets one line a second with a count, not one per refusal.
#[derive(Debug, Default)]
pub struct Refused {
    stripe: std::sync::atomic::AtomicU64,
    midtrans: std::sync::atomic::AtomicU64,
}

impl Refused {
    fn add(&self, provider: crate::domain::Provider) {
        let count = match provider {
            crate::domain::Provider::Stripe => &self.stripe,
            crate::domain::Provider::Midtrans => &self.midtrans,
        };
        count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Logs, per provider, the refusals since the last call, if any.
    pub fn report(&self) {
        use crate::domain::Provider;
        for (provider, count) in [
            (Provider::Stripe, &self.stripe),
            (Provider::Midtrans, &self.midtrans),
        ] {
            let refused = count.swap(0, std::sync::atomic::Ordering::Relaxed);
            if refused > 0 {
                tracing::warn!(
                    %provider,
                    refused,
                    "write queue full: answered 503 with Retry-After (count since the last such line)"
                );
            }
        }
    }
}

impl AppState {
    fn stripe_secrets(&self) -> Option<&[SecretString]> {
        (!self.secrets.stripe.is_empty()).then_some(self.secrets.stripe.as_slice())
    }
}

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(
        resource("/webhooks/stripe", "POST").route(web::post().to(webhooks::stripe_webhook)),
    )
    .service(
        resource("/webhooks/midtrans", "POST").route(web::post().to(webhooks::midtrans_webhook)),
    )
    .service(
        resource("/healthz", "GET, HEAD")
            .route(web::get().to(health::healthz))
            .route(web::head().to(health::healthz)),
    )
    .service(
        resource("/orders", "GET, HEAD, POST")
            .route(web::post().to(orders::create_order))
            .route(web::get().to(orders::list_orders))
            .route(web::head().to(orders::list_orders)),
    )
    .service(
        resource("/orders/{order_id}", "GET, HEAD")
            .route(web::get().to(orders::get_order))
            .route(web::head().to(orders::get_order)),
    )
    .default_service(web::to(not_found));
}

/// A path sekali serves with the methods in `allow` (its routes, listed right after: HEAD
/// wherever GET, whose answer it is without the body). Another method gets 405 with `Allow`
/// (someone opening a webhook URL in a browser learns the URL is right), not the 404 of a path
/// that does not exist.
fn resource(path: &str, allow: &'static str) -> actix_web::Resource {
    web::resource(path).default_service(web::to(move || async move {
        HttpResponse::MethodNotAllowed()
            .insert_header((actix_web::http::header::ALLOW, allow))
            .json(serde_json::json!({ "error": format!("method not allowed; use {allow}") }))
    }))
}

/// Why a request body was not read.
pub(crate) enum BodyError {
    TooLarge { limit: usize },
    Read(actix_web::Error),
}

/// Reads the whole body, refusing it as soon as it is known to exceed `limit`: from
/// `Content-Length` before reading anything, or while counting a chunked body. Nothing is
/// verified or stored before this returns.
pub(crate) async fn read_limited_body(
    req: &actix_web::HttpRequest,
    payload: web::Payload,
    limit: usize,
) -> Result<web::Bytes, BodyError> {
    let declared = req
        .headers()
        .get(actix_web::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(BodyError::TooLarge { limit });
    }
    match payload.to_bytes_limited(limit).await {
        Ok(Ok(body)) => Ok(body),
        Ok(Err(e)) => Err(BodyError::Read(e)),
        Err(_) => Err(BodyError::TooLarge { limit }),
    }
}

async fn not_found() -> HttpResponse {
    HttpResponse::NotFound().json(serde_json::json!({ "error": "not found" }))
}
