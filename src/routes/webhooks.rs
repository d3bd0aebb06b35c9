use actix_web::web::{self, Bytes};
use actix_web::{HttpRequest, HttpResponse};
use tracing::field::Empty;

use super::{read_limited_body, AppState, BodyError, WebhookError};
use crate::domain::{NormalizedEvent, Provider};
use crate::providers::{midtrans, stripe, PayloadError};
use crate::store::{Outcome, WriteError};

/// What a recorded delivery is answered with.
pub(super) struct Recorded {
    outcome: Outcome,
    event_id: String,
    detail: Option<&'static str>,
}

pub async fn stripe_webhook(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> HttpResponse {
    // At `debug` only: at the default level a delivery that succeeds formats nothing. The
    // lines logged at `info` and above carry the provider (and the event id) themselves.
    let span = tracing::debug_span!(
        "delivery",
        provider = "stripe",
        event_id = Empty,
        outcome = Empty
    );
    let result =
        tracing::Instrument::instrument(handle_stripe(req, payload, &state), span.clone()).await;
    respond(Provider::Stripe, &span, result, &state.refused)
}

pub async fn midtrans_webhook(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> HttpResponse {
    // At `debug` only: at the default level a delivery that succeeds formats nothing. The
    // lines logged at `info` and above carry the provider (and the event id) themselves.
    let span = tracing::debug_span!(
        "delivery",
        provider = "midtrans",
        event_id = Empty,
        outcome = Empty
    );
    let result =
        tracing::Instrument::instrument(handle_midtrans(payload, req, &state), span.clone()).await;
    respond(Provider::Midtrans, &span, result, &state.refused)
}

async fn handle_stripe(
    req: HttpRequest,
    payload: web::Payload,
    state: &AppState,
) -> Result<Recorded, WebhookError> {
    let secrets = state
        .stripe_secrets()
        .ok_or(WebhookError::NotConfigured(Provider::Stripe))?;
    let body = read_body(&req, payload, state.max_body_bytes).await?;
    let header = match req.headers().get("Stripe-Signature") {
        Some(value) => Some(
            value
                .to_str()
                .map_err(|_| WebhookError::SignatureHeaderNotAscii)?,
        ),
        None => None,
    };
    stripe::verify_stripe_signature(
        header,
        &body,
        secrets,
        state.clock.now_unix(),
        state.stripe_tolerance_secs,
    )?;
    let event = stripe::parse_event(&body)?;
    record(state, event, body).await
}

async fn handle_midtrans(
    payload: web::Payload,
    req: HttpRequest,
    state: &AppState,
) -> Result<Recorded, WebhookError> {
    let server_key = state
        .secrets
        .midtrans
        .as_ref()
        .ok_or(WebhookError::NotConfigured(Provider::Midtrans))?;
    let body = read_body(&req, payload, state.max_body_bytes).await?;
    let mut notification = midtrans::parse_notification(&body)?;
    midtrans::verify_midtrans_signature(&notification, server_key)?;
    midtrans::check_status_code(&notification)?;
    if let Some(api) = &state.midtrans_status {
        let answer = api
            .fetch(&notification.order_id)
            .await
            .map_err(|e| WebhookError::NotConfirmed(e.to_string()))?;
        notification = notification
            .confirmed_by(&answer)
            .map_err(|e| WebhookError::NotConfirmed(e.to_string()))?;
    }
    record(state, notification.normalise(), body).await
}

async fn read_body(
    req: &HttpRequest,
    payload: web::Payload,
    limit: usize,
) -> Result<Bytes, WebhookError> {
    read_limited_body(req, payload, limit)
        .await
        .map_err(|e| match e {
            BodyError::TooLarge { limit } => WebhookError::PayloadTooLarge { limit },
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
    let (provider, event_id, detail) = (event.provider, event.event_id.clone(), event.detail);
    let outcome = state
        .writer
        .record(event, payload)
        .await
        .map_err(|e| match e {
            WriteError::QueueFull => WebhookError::Overloaded,
            other => {
                tracing::error!(
                    %provider,
                    event_id = %crate::domain::text::Escaped(&event_id),
                    error = ?other,
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
    provider: Provider,
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
            use actix_web::ResponseError;
            match error {
                // Logged where the event id is known, in `record`.
                WebhookError::Unavailable(_) => {}
                // Counted, and logged once a second (`Refused::report`): under overload there
                // can be tens of thousands a second, and a line each would bury the log.
                WebhookError::Overloaded => refused.add(provider),
                // Not our fault and not the sender's: Midtrans retries, and a real notification
                // is confirmed then. Said at warn, as the reasons that are settings (a key for
                // the wrong environment) keep it up until someone looks.
                WebhookError::NotConfirmed(_) => tracing::warn!(
                    %provider,
                    error = %crate::domain::text::Escaped(&error.to_string()),
                    "delivery not confirmed; answered 503 so that it is sent again"
                ),
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
