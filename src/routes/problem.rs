//! RFC 7807 `application/problem+json` errors for sekali's own API.

use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;

use crate::store::StoredResponse;

pub const PROBLEM_CONTENT_TYPE: &str = "application/problem+json";

/// A problem document. `type` is a stable URI per kind of problem, so clients can branch on it;
/// `detail` tells the caller what to change.
#[derive(Debug, Clone, Serialize)]
pub struct Problem {
    #[serde(rename = "type")]
    pub kind: String,
    pub title: &'static str,
    pub status: u16,
    pub detail: String,
    #[serde(skip)]
    retry_after: Option<u32>,
    #[serde(skip)]
    bearer_challenge: bool,
    /// The methods a path takes, for a 405's `Allow`.
    #[serde(skip)]
    allow: Option<&'static str>,
}

fn problem_type(slug: &str) -> String {
    format!("urn:sekali:problem:{slug}")
}

impl Problem {
    fn new(slug: &str, title: &'static str, status: StatusCode, detail: impl Into<String>) -> Self {
        Problem {
            kind: problem_type(slug),
            title,
            status: status.as_u16(),
            detail: detail.into(),
            retry_after: None,
            bearer_challenge: false,
            allow: None,
        }
    }

    pub fn unauthorized() -> Self {
        let mut p = Self::new(
            "unauthorized",
            "Unauthorized",
            StatusCode::UNAUTHORIZED,
            "send `Authorization: Bearer <token>` with a token listed in SEKALI_API_TOKENS",
        );
        p.bearer_challenge = true;
        p
    }

    pub fn api_disabled() -> Self {
        Self::new(
            "api-disabled",
            "Orders API not enabled",
            StatusCode::NOT_FOUND,
            "the orders API is off on this server: set SEKALI_API_TOKENS to enable it",
        )
    }

    pub fn missing_idempotency_key() -> Self {
        Self::new(
            "missing-idempotency-key",
            "Idempotency-Key required",
            StatusCode::BAD_REQUEST,
            "send an Idempotency-Key header (1-255 characters, e.g. a UUID) and reuse it when you retry",
        )
    }

    pub fn malformed_idempotency_key(why: &str) -> Self {
        Self::new(
            "malformed-idempotency-key",
            "Malformed Idempotency-Key",
            StatusCode::BAD_REQUEST,
            why,
        )
    }

    pub fn invalid_request(detail: impl Into<String>) -> Self {
        Self::new(
            "invalid-request",
            "Invalid request",
            StatusCode::BAD_REQUEST,
            detail,
        )
    }

    pub fn key_reused() -> Self {
        Self::new(
            "idempotency-key-reused",
            "Idempotency-Key reused for a different request",
            StatusCode::UNPROCESSABLE_ENTITY,
            "this Idempotency-Key was used with a different request; use a new key for a new request",
        )
    }

    /// A business rejection: stored under the key and replayed like a success.
    pub fn order_exists(order_id: &str) -> Self {
        Self::new(
            "order-exists",
            "Order already exists",
            StatusCode::CONFLICT,
            format!("an order with order_id `{order_id}` already exists; choose another order_id or omit it"),
        )
    }

    /// Not stored: the first request with this key is still being processed.
    pub fn request_in_flight() -> Self {
        let mut p = Self::new(
            "request-in-flight",
            "Request with this Idempotency-Key in progress",
            StatusCode::CONFLICT,
            "a request with this Idempotency-Key is still being processed; retry after a moment to get its result",
        );
        p.retry_after = Some(1);
        p
    }

    /// The body is over `--max-body-bytes`; nothing was read further or stored.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            "too-large",
            "Request body too large",
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body exceeds the limit of {limit} bytes (--max-body-bytes)"),
        )
    }

    /// Another method on a path of the orders API: `Allow` lists the ones it takes.
    pub fn method_not_allowed(allow: &'static str) -> Self {
        let mut p = Self::new(
            "method-not-allowed",
            "Method not allowed",
            StatusCode::METHOD_NOT_ALLOWED,
            format!("this path takes {allow}"),
        );
        p.allow = Some(allow);
        p
    }

    /// A path under `/orders` that the orders API does not have.
    pub fn no_such_path(path: &str) -> Self {
        Self::new(
            "no-such-path",
            "No such path",
            StatusCode::NOT_FOUND,
            format!(
                "the orders API has no path {path}: it has POST /orders, GET /orders and GET /orders/{{order_id}}"
            ),
        )
    }

    /// The body did not arrive within `--body-timeout`; the connection is closed.
    pub fn body_timed_out(deadline: std::time::Duration) -> Self {
        Self::new(
            "request-timeout",
            "Request body timed out",
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body did not arrive within {} s (--body-timeout); nothing was stored",
                deadline.as_secs_f64()
            ),
        )
    }

    pub fn not_found(order_id: &str) -> Self {
        Self::new(
            "not-found",
            "Order not found",
            StatusCode::NOT_FOUND,
            format!("no order with order_id `{order_id}`"),
        )
    }

    pub fn unavailable() -> Self {
        let mut p = Self::new(
            "unavailable",
            "Temporarily unavailable",
            StatusCode::SERVICE_UNAVAILABLE,
            "the request was not carried out; retry with the same Idempotency-Key",
        );
        p.retry_after = Some(1);
        p
    }

    pub fn body(&self) -> String {
        serde_json::to_string(self).expect("a problem serialises")
    }

    /// The problem as a response to store under an Idempotency-Key.
    pub fn stored(&self) -> StoredResponse {
        StoredResponse {
            status: self.status,
            content_type: PROBLEM_CONTENT_TYPE.into(),
            body: self.body(),
        }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.title, self.detail)
    }
}

impl ResponseError for Problem {
    fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    fn error_response(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status_code());
        response.content_type(PROBLEM_CONTENT_TYPE);
        if let Some(seconds) = self.retry_after {
            response.insert_header((header::RETRY_AFTER, seconds.to_string()));
        }
        if self.bearer_challenge {
            response.insert_header((header::WWW_AUTHENTICATE, "Bearer"));
        }
        if let Some(allow) = self.allow {
            response.insert_header((header::ALLOW, allow));
        }
        if self.status == StatusCode::PAYLOAD_TOO_LARGE.as_u16()
            || self.status == StatusCode::REQUEST_TIMEOUT.as_u16()
        {
            // The rest of the body is not read: close so the client is not left sending it
            // into a connection that will never be reused.
            response.force_close();
        }
        response.body(self.body())
    }
}
