use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};

use crate::providers::{PayloadError, Rejection, RejectionKind};
use crate::store::WriteError;

/// Everything that can stop a delivery, each with the status its provider should see.
#[derive(thiserror::Error)]
pub enum WebhookError {
    /// A registered provider whose secret is not set on this server.
    #[error("{0} webhooks are not configured on this server")]
    NotConfigured(String),
    #[error("request body exceeds the limit of {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("could not read the request body")]
    BodyRead(#[source] actix_web::Error),
    /// The body did not arrive in time: 408, and the connection is closed.
    #[error("the request body did not arrive within {} s", deadline.as_secs_f64())]
    BodyTimedOut { deadline: std::time::Duration },
    /// The provider refused the delivery; its kind is the status.
    #[error(transparent)]
    Rejected(#[from] Rejection),
    /// The writer's queue is full: back off and retry (backpressure instead of unbounded memory).
    #[error("too many deliveries in flight; retry later")]
    Overloaded,
    /// Our own fault; the body stays opaque and the cause goes to the log.
    #[error("temporarily unable to record the event; retry later")]
    Unavailable(#[source] WriteError),
}

impl WebhookError {
    /// Its reason as metrics count it: a kind, never the message.
    pub fn refusal_reason(&self) -> crate::metrics::RefusalReason {
        use crate::metrics::RefusalReason;
        match self {
            WebhookError::NotConfigured(_) => RefusalReason::NotConfigured,
            WebhookError::PayloadTooLarge { .. } => RefusalReason::TooLarge,
            WebhookError::BodyRead(_) | WebhookError::BodyTimedOut { .. } => {
                RefusalReason::BodyNotRead
            }
            WebhookError::Rejected(rejection) => match rejection.kind {
                RejectionKind::Malformed => RefusalReason::Malformed,
                RejectionKind::Unauthorized => RefusalReason::Unauthorized,
                RejectionKind::NotConfirmed => RefusalReason::NotConfirmed,
            },
            WebhookError::Overloaded => RefusalReason::Overloaded,
            WebhookError::Unavailable(_) => RefusalReason::Unavailable,
        }
    }
}

impl From<PayloadError> for WebhookError {
    fn from(error: PayloadError) -> Self {
        WebhookError::Rejected(error.into())
    }
}

/// What the sender of a delivery that could not be confirmed reads: the reason is for the log.
pub const NOT_CONFIRMED: &str = "not confirmed with the provider yet; retry later";

impl std::fmt::Debug for WebhookError {
    /// The whole cause chain, so a log line says why.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", crate::telemetry::ErrorChain(self))
    }
}

impl ResponseError for WebhookError {
    fn status_code(&self) -> StatusCode {
        use WebhookError::*;
        match self {
            NotConfigured(_) => StatusCode::NOT_FOUND,
            PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            BodyTimedOut { .. } => StatusCode::REQUEST_TIMEOUT,
            BodyRead(_) => StatusCode::BAD_REQUEST,
            Rejected(rejection) => match rejection.kind {
                RejectionKind::Malformed => StatusCode::BAD_REQUEST,
                RejectionKind::Unauthorized => StatusCode::UNAUTHORIZED,
                RejectionKind::NotConfirmed => StatusCode::SERVICE_UNAVAILABLE,
            },
            Overloaded | Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status_code());
        if self.status_code() == StatusCode::SERVICE_UNAVAILABLE {
            response.insert_header((header::RETRY_AFTER, "1"));
        }
        if let WebhookError::Rejected(Rejection {
            kind: RejectionKind::NotConfirmed,
            ..
        }) = self
        {
            // The reason is for the log: the sender learns only to come back.
            return response.json(serde_json::json!({ "error": NOT_CONFIRMED }));
        }
        if let WebhookError::PayloadTooLarge { .. } | WebhookError::BodyTimedOut { .. } = self {
            // The rest of the body is not read: close so the client is not left sending it
            // into a connection that will never be reused.
            response.force_close();
        }
        response.json(serde_json::json!({ "error": self.to_string() }))
    }
}
