//! Thin HTTP handlers. Each maps its errors onto the provider's retry protocol: bad input 4xx
//! (the provider stops or gives up), our own transient fault 503 (the provider retries),
//! duplicates 2xx.

pub mod api;
mod changes;
mod error;
pub mod health;
pub mod metrics;
mod orders;
pub mod problem;
mod webhooks;

use std::sync::atomic::{AtomicU64, Ordering};

use actix_web::{web, HttpResponse};

pub use error::{WebhookError, NOT_CONFIRMED};

use crate::clock::SharedClock;
use crate::domain::ProviderName;
use crate::providers::Providers;
use crate::store::Store;

/// Shared by every worker.
pub struct AppState {
    /// The configured providers: `/webhooks/{name}` of any other answers 404.
    pub providers: Providers,
    /// Bearer tokens of the orders API; empty means it is off (404).
    pub api_tokens: Vec<crate::config::ApiToken>,
    pub max_body_bytes: usize,
    /// How long a request's body may take to arrive (see [`read_limited_body`]).
    pub body_timeout: std::time::Duration,
    pub clock: SharedClock,
    /// Where deliveries, API orders and reads go.
    pub store: std::sync::Arc<dyn Store>,
    pub idempotency_retention_secs: i64,
    /// Idempotency-Keys whose first request is being processed now.
    pub in_flight: api::InFlightKeys,
    /// Deliveries refused because the write queue was full, not yet logged.
    pub refused: std::sync::Arc<Refused>,
    /// What `GET /metrics` reports.
    pub metrics: std::sync::Arc<crate::metrics::Metrics>,
    /// Whether this server answers `/metrics` (false on `--listen` with `--metrics-listen`).
    pub serves_metrics: bool,
    /// Login tokens of the operator console (`/console`); empty means it is off (404).
    pub console_tokens: Vec<crate::config::ApiToken>,
    /// The database, for the console's reads and actions on connections of their own.
    pub db: crate::store::Location,
    /// `/healthz`'s last write probe, shared so that probes come at most once a second.
    pub health_probe: health::WriteProbe,
    /// The console's login tries left per client address.
    pub login_throttle: crate::console::LoginThrottle,
}

/// Deliveries answered 503 because the write queue was full, per provider, since the last
/// [`Refused::report`]: the log gets one line a second with a count, not one per refusal.
#[derive(Debug, Default)]
pub struct Refused(Vec<(ProviderName, AtomicU64)>);

impl Refused {
    /// A counter for each of `providers`.
    pub fn new(providers: &Providers) -> Self {
        Refused(
            providers
                .iter()
                .map(|p| (p.name().clone(), AtomicU64::new(0)))
                .collect(),
        )
    }

    fn add(&self, provider: &ProviderName) {
        if let Some((_, count)) = self.0.iter().find(|(name, _)| name == provider) {
            count.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Logs, per provider, the refusals since the last call, if any.
    pub fn report(&self) {
        for (provider, count) in &self.0 {
            let refused = count.swap(0, Ordering::Relaxed);
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

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource("/webhooks/{provider}")
            .route(web::post().to(webhooks::webhook))
            .default_service(web::to(webhooks::other_method)),
    )
    .service(
        resource("/healthz", "GET, HEAD")
            .route(web::get().to(health::healthz))
            .route(web::head().to(health::healthz)),
    )
    .service(
        api_resource("/orders", "GET, HEAD, POST")
            .route(web::post().to(orders::create_order))
            .route(web::get().to(orders::list_orders))
            .route(web::head().to(orders::list_orders)),
    )
    .service(
        resource("/metrics", "GET, HEAD")
            .route(web::get().to(metrics::metrics))
            .route(web::head().to(metrics::metrics)),
    )
    .service(
        api_resource("/changes", "GET, HEAD")
            .route(web::get().to(changes::list_changes))
            .route(web::head().to(changes::list_changes)),
    )
    .service(
        api_resource("/orders/{order_id}", "GET, HEAD")
            .route(web::get().to(orders::get_order))
            .route(web::head().to(orders::get_order)),
    )
    .configure(crate::console::configure)
    .default_service(web::to(not_found));
}

/// A path of the orders API, whose every error is problem+json: another method gets 405 as a
/// problem, with `Allow`.
fn api_resource(path: &str, allow: &'static str) -> actix_web::Resource {
    web::resource(path).default_service(web::to(move || async move {
        actix_web::ResponseError::error_response(&problem::Problem::method_not_allowed(allow))
    }))
}

/// A path sekali serves with the methods in `allow` (its routes, listed right after: HEAD
/// wherever GET, whose answer it is without the body). Another method gets 405 with `Allow`
/// (someone opening a webhook URL in a browser learns the URL is right), not the 404 of a path
/// that does not exist.
fn resource(path: &str, allow: &'static str) -> actix_web::Resource {
    web::resource(path).default_service(web::to(move || async move { method_not_allowed(allow) }))
}

fn method_not_allowed(allow: &'static str) -> HttpResponse {
    HttpResponse::MethodNotAllowed()
        .insert_header((actix_web::http::header::ALLOW, allow))
        .json(serde_json::json!({ "error": format!("method not allowed; use {allow}") }))
}

/// Why a request body was not read.
pub(crate) enum BodyError {
    TooLarge {
        limit: usize,
    },
    /// The whole body did not arrive within the deadline.
    TimedOut {
        deadline: std::time::Duration,
    },
    Read(actix_web::Error),
}

/// Reads the whole body, refusing it as soon as it is known to exceed `limit`: from
/// `Content-Length` before reading anything, or while counting a chunked body; and giving up on
/// it once `deadline` has passed, however much has come (a body that stalls, or arrives a byte at
/// a time, would otherwise hold its connection for as long as the client likes: the head has a
/// deadline of its own, actix's `client_request_timeout`). Nothing is verified or stored before
/// this returns.
pub(crate) async fn read_limited_body(
    req: &actix_web::HttpRequest,
    payload: web::Payload,
    limit: usize,
    deadline: std::time::Duration,
) -> Result<web::Bytes, BodyError> {
    let declared = req
        .headers()
        .get(actix_web::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(BodyError::TooLarge { limit });
    }
    match actix_web::rt::time::timeout(deadline, payload.to_bytes_limited(limit)).await {
        Ok(Ok(Ok(body))) => Ok(body),
        Ok(Ok(Err(e))) => Err(BodyError::Read(e)),
        Ok(Err(_)) => Err(BodyError::TooLarge { limit }),
        Err(_) => Err(BodyError::TimedOut { deadline }),
    }
}

/// Any path sekali does not serve: 404. Under `/orders`, a problem as the rest of the orders
/// API answers (`/orders/a/b`, `/orders/`).
pub(crate) async fn not_found(req: actix_web::HttpRequest) -> HttpResponse {
    let path = req.match_info().as_str();
    if path == "/orders" || path.starts_with("/orders/") {
        let escaped = crate::domain::text::Escaped(path).to_string();
        return actix_web::ResponseError::error_response(&problem::Problem::no_such_path(&escaped));
    }
    HttpResponse::NotFound().json(serde_json::json!({ "error": "not found" }))
}

/// 404 for a webhook path of a provider sekali does not know.
pub(crate) fn no_such_webhook() -> HttpResponse {
    HttpResponse::NotFound().json(serde_json::json!({ "error": "not found" }))
}
