//! The one webhook handler: `/webhooks/{provider}` for every configured provider. The provider
//! verifies the delivery; this reads the body within its limit, hands the event to the writer,
//! and answers as the provider's retry protocol wants.

use actix_web::http::header::HeaderMap;
use actix_web::web::{self, Bytes};
use actix_web::{HttpRequest, HttpResponse, ResponseError};
use tracing::field::Empty;

use super::{read_limited_body, AppState, BodyError, WebhookError};
use crate::domain::{NormalizedEvent, ProviderName};
use crate::providers::{self, Headers, PayloadError, Provider};
use crate::store::{Outcome, WriteError};

/// What a recorded delivery is answered with.
pub(super) struct Recorded {
    outcome: Outcome,
    event_id: String,
    detail: Option<&'static str>,
}

/// A request's headers, as a provider reads them.
struct RequestHeaders<'a>(&'a HeaderMap);

impl Headers for RequestHeaders<'_> {
    fn get(&self, name: &str) -> Option<&[u8]> {
        self.0.get(name).map(|value| value.as_bytes())
    }
}

pub async fn webhook(
    req: HttpRequest,
    name: web::Path<String>,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> HttpResponse {
    let started = std::time::Instant::now();
    let Some(provider) = state.providers.get(&name).cloned() else {
        if providers::is_registered(&name) {
            let error = WebhookError::NotConfigured(name.into_inner());
            tracing::info!(status = 404, error = %error, "delivery rejected");
            let response = error.error_response();
            if let WebhookError::NotConfigured(provider) = &error {
                state.metrics.delivery(
                    provider,
                    Err(error.refusal_reason()),
                    response.status().as_u16(),
                    started.elapsed(),
                );
            }
            return response;
        }
        return super::no_such_webhook();
    };
    // At `debug` only: at the default level a delivery that succeeds formats nothing. The
    // lines logged at `info` and above carry the provider (and the event id) themselves.
    let span = tracing::debug_span!(
        "delivery",
        provider = provider.name().as_str(),
        event_id = Empty,
        outcome = Empty
    );
    let result = tracing::Instrument::instrument(
        handle(&req, payload, provider.as_ref(), &state),
        span.clone(),
    )
    .await;
    let counted = match &result {
        Ok(recorded) => Ok(recorded.outcome),
        Err(error) => Err(error.refusal_reason()),
    };
    let response = respond(provider.name(), &span, result, &state.refused);
    state.metrics.delivery(
        provider.name().as_str(),
        counted,
        response.status().as_u16(),
        started.elapsed(),
    );
    response
}

/// Another method on a webhook URL: 405 for a provider sekali knows (someone opening the URL in
/// a browser learns it is right), 404 for any other name.
pub async fn other_method(name: web::Path<String>) -> HttpResponse {
    if providers::is_registered(&name) {
        super::method_not_allowed("POST")
    } else {
        super::no_such_webhook()
    }
}

async fn handle(
    req: &HttpRequest,
    payload: web::Payload,
    provider: &dyn Provider,
    state: &AppState,
) -> Result<Recorded, WebhookError> {
    let body = read_body(req, payload, state.max_body_bytes, state.body_timeout).await?;
    let mut event = provider
        .verify(
            &RequestHeaders(req.headers()),
            &body,
            state.clock.now_unix(),
        )
        .await?;
    // How long this provider's ids are remembered: `--retention NAME=…` or its default.
    event.retention = provider.retention();
    event.headers = kept_headers(req.headers());
    record(state, event, body).await
}

/// The request headers kept with a stored event for an operator to look at (the console shows
/// them): only these, none that a provider signs or authenticates with (`Stripe-Signature`,
/// `webhook-signature`, Xendit's `x-callback-token`), each value cut to 512 characters; not
/// `content-length` either, which the stored body says.
pub const KEPT_HEADERS: [&str; 9] = [
    "content-type",
    "user-agent",
    "webhook-id",
    "webhook-timestamp",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-real-ip",
    "x-request-id",
    "traceparent",
];

/// [`KEPT_HEADERS`] of a request, as a JSON object; `None` when it has none of them.
fn kept_headers(headers: &actix_web::http::header::HeaderMap) -> Option<String> {
    let kept: serde_json::Map<String, serde_json::Value> = KEPT_HEADERS
        .iter()
        .filter_map(|name| {
            let value = headers.get(*name)?;
            let text: String = String::from_utf8_lossy(value.as_bytes())
                .chars()
                .take(512)
                .collect();
            Some(((*name).to_owned(), text.into()))
        })
        .collect();
    (!kept.is_empty()).then(|| serde_json::Value::Object(kept).to_string())
}

async fn read_body(
    req: &HttpRequest,
    payload: web::Payload,
    limit: usize,
    deadline: std::time::Duration,
) -> Result<Bytes, WebhookError> {
    read_limited_body(req, payload, limit, deadline)
        .await
        .map_err(|e| match e {
            BodyError::TooLarge { limit } => WebhookError::PayloadTooLarge { limit },
            BodyError::TimedOut { deadline } => WebhookError::BodyTimedOut { deadline },
            BodyError::Read(e) => WebhookError::BodyRead(e),
        })
}

async fn record(
    state: &AppState,
    event: NormalizedEvent,
    body: Bytes,
) -> Result<Recorded, WebhookError> {
    tracing::Span::current().record("event_id", event.event_id.as_str());
    // The verified body is stored as text; JSON that parsed is UTF-8 unless it hid invalid bytes
    // in skipped content, which is refused here rather than stored lossily.
    let payload = String::from_utf8(Vec::from(body))
        .map_err(|_| PayloadError::InvalidJson("the body is not valid UTF-8".into()))?;
    let (provider, event_id, detail) =
        (event.provider.clone(), event.event_id.clone(), event.detail);
    let outcome = state
        .store
        .record(event, payload)
        .await
        .map_err(|e| match e {
            WriteError::QueueFull => WebhookError::Overloaded,
            other => {
                tracing::error!(
                    %provider,
                    event_id = %crate::domain::text::Escaped(&event_id),
                    error = %crate::telemetry::ErrorChain(&other),
                    "delivery not recorded"
                );
                WebhookError::Unavailable(other)
            }
        })?;
    Ok(Recorded {
        outcome,
        event_id,
        detail,
    })
}

fn respond(
    provider: &ProviderName,
    span: &tracing::Span,
    result: Result<Recorded, WebhookError>,
    refused: &super::Refused,
) -> HttpResponse {
    let _entered = span.enter();
    match result {
        Ok(Recorded {
            outcome,
            event_id,
            detail,
        }) => {
            span.record("outcome", outcome.as_str());
            tracing::debug!(outcome = outcome.as_str(), "delivery recorded");
            let mut body = serde_json::json!({ "status": outcome.as_str(), "event_id": event_id });
            if let Some(detail) = detail {
                body["detail"] = detail.into();
            }
            HttpResponse::Ok().json(body)
        }
        Err(error) => {
            match &error {
                // Logged where the event id is known, in `record`.
                WebhookError::Unavailable(_) => {}
                // Counted, and logged once a second (`Refused::report`): under overload there
                // can be tens of thousands a second, and a line each would bury the log.
                WebhookError::Overloaded => refused.add(provider),
                // Not our fault and not the sender's: the provider retries, and a real delivery
                // is confirmed then. Said at warn, as the reasons that are settings (a key for
                // the wrong environment) keep it up until someone looks.
                WebhookError::Rejected(rejection)
                    if rejection.kind == providers::RejectionKind::NotConfirmed =>
                {
                    tracing::warn!(
                        %provider,
                        error = %crate::domain::text::Escaped(&error.to_string()),
                        "delivery not confirmed; answered 503 so that it is sent again"
                    )
                }
                // The message can quote the sender's input (serde names what it found), so it
                // is escaped: a stranger's text cannot start a line of its own.
                _ => tracing::info!(
                    %provider,
                    status = error.status_code().as_u16(),
                    error = %crate::domain::text::Escaped(&error.to_string()),
                    "delivery rejected"
                ),
            }
            error.error_response()
        }
    }
}
