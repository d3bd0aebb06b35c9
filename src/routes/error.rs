use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};

use crate::domain::Provider;
use crate::providers::{midtrans, stripe, PayloadError};
use crate::store::WriteError;

/// Everything that can stop a delivery, each with the status its provider should see.
#[derive(thiserror::Error)]
pub enum WebhookError {
    #[error("{0} webhooks are not configured on this server")]
    NotConfigured(Provider),
    #[error("request body exceeds the limit of {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("could not read the request body")]
    BodyRead(#[source] actix_web::Error),
    #[error("malformed Stripe-Signature header: not visible ASCII")]
    SignatureHeaderNotAscii,
    #[error(transparent)]
    StripeSignature(#[from] stripe::SignatureError),
    #[error(transparent)]
    MidtransSignature(#[from] midtrans::SignatureError),
    #[error(transparent)]
    Payload(#[from] PayloadError),
    /// The writer's queue is full: back off and retry (backpressure instead of unbounded memory).
    #[error("too many deliveries in flight; retry later")]
    Overloaded,
    /// Our own fault; the body stays opaque and the cause goes to the log.
    #[error("temporarily unable to record the event; retry later")]
    Unavailable(#[source] WriteError),
    /// Midtrans's status API did not confirm the notification (it could not be reached, or does
    /// not report the status yet): answered 503, so that Midtrans sends it again.
    #[error("not confirmed by Midtrans's status API: {0}; retry later")]
    NotConfirmed(String),
}

impl std::fmt::Debug for WebhookError {
    /// The whole cause chain, so a log line says why.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")?;
        let mut source = std::error::Error::source(self);
        while let Some(cause) = source {
            write!(f, "\n  caused by: {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

impl ResponseError for WebhookError {
    fn status_code(&self) -> StatusCode {
        use WebhookError::*;
        match self {
            NotConfigured(_) => StatusCode::NOT_FOUND,
            PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            BodyRead(_) | SignatureHeaderNotAscii | Payload(_) => StatusCode::BAD_REQUEST,
            StripeSignature(e) => match e {
                stripe::SignatureError::MissingHeader
                | stripe::SignatureError::MalformedHeader(_) => StatusCode::BAD_REQUEST,
                stripe::SignatureError::TimestampOutsideTolerance { .. }
                | stripe::SignatureError::NoMatchingSignature => StatusCode::UNAUTHORIZED,
            },
            MidtransSignature(_) => StatusCode::UNAUTHORIZED,
            Overloaded | Unavailable(_) | NotConfirmed(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status_code());
        if let WebhookError::Unavailable(_) | WebhookError::Overloaded = self {
            response.insert_header((header::RETRY_AFTER, "1"));
        }
        if let WebhookError::NotConfirmed(_) = self {
            // The reason is for the log: the sender learns only to come back.
            return response.json(serde_json::json!({
                "error": "not confirmed by Midtrans's status API yet; retry later"
            }));
        }
        if let WebhookError::PayloadTooLarge { .. } = self {
            // The rest of the body is not read: close so the client is not left sending it
            // into a connection that will never be reused.
            response.force_close();
        }
        response.json(serde_json::json!({ "error": self.to_string() }))
    }
}
