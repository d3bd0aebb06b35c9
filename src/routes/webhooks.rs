use actix_web::web::{self, Bytes};
use actix_web::{http::header, HttpRequest, HttpResponse};
use tracing::field::Empty;

use super::{AppState, WebhookError};
use crate::domain::{NormalizedEvent, Provider};
use crate::providers::{midtrans, stripe, PayloadError};
use crate::store::{Outcome, WriteError};

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
) -> Result<(Outcome, String), WebhookError> {
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
) -> Result<(Outcome, String), WebhookError> {
    let server_key = state
        .secrets
        .midtrans
        .as_ref()
        .ok_or(WebhookError::NotConfigured(Provider::Midtrans))?;
    let body = read_body(&req, payload, state.max_body_bytes).await?;
    let notification = midtrans::parse_notification(&body)?;
    midtrans::verify_midtrans_signature(&notification, server_key)?;
    record(state, notification.normalise(), body).await
}

/// Reads the whole body, refusing it with 413 as soon as it is known to exceed `limit`: from
/// `Content-Length` before reading anything, or while counting a chunked body. Nothing is
/// verified or stored before this returns.
async fn read_body(
    req: &HttpRequest,
    payload: web::Payload,
    limit: usize,
) -> Result<Bytes, WebhookError> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(WebhookError::PayloadTooLarge { limit });
    }
    match payload.to_bytes_limited(limit).await {
        Ok(Ok(body)) => Ok(body),
        Ok(Err(e)) => Err(WebhookError::BodyRead(e)),
        Err(_) => Err(WebhookError::PayloadTooLarge { limit }),
    }
}

async fn record(
    state: &AppState,
    event: NormalizedEvent,
    body: Bytes,
) -> Result<(Outcome, String), WebhookError> {
    tracing::Span::current().record("event_id", event.event_id.as_str());
    // The verified body is stored as text; JSON that parsed is UTF-8 unless it hid invalid bytes
    // in skipped content, which is refused here rather than stored lossily.
    let payload = String::from_utf8(Vec::from(body))
        .map_err(|_| PayloadError::InvalidJson("the body is not valid UTF-8".into()))?;
    let (provider, event_id) = (event.provider, event.event_id.clone());
    let outcome = state
        .writer
        .record(event, payload)
        .await
        .map_err(|e| match e {
            WriteError::QueueFull => WebhookError::Overloaded,
            other => {
                tracing::error!(%provider, event_id, error = ?other, "delivery not recorded");
                WebhookError::Unavailable(other)
            }
        })?;
    Ok((outcome, event_id))
}

fn respond(
    provider: Provider,
    span: &tracing::Span,
    result: Result<(Outcome, String), WebhookError>,
    refused: &super::Refused,
) -> HttpResponse {
    let _entered = span.enter();
    match result {
        Ok((outcome, event_id)) => {
            span.record("outcome", outcome.as_str());
            tracing::debug!(outcome = outcome.as_str(), "delivery recorded");
            HttpResponse::Ok()
                .json(serde_json::json!({ "status": outcome.as_str(), "event_id": event_id }))
        }
        Err(error) => {
            use actix_web::ResponseError;
            match error {
                // Logged where the event id is known, in `record`.
                WebhookError::Unavailable(_) => {}
                // Counted, and logged once a second (`Refused::report`): under overload there
                // can be tens of thousands a second, and a line each would bury the log.
                WebhookError::Overloaded => refused.add(provider),
                _ => tracing::info!(
                    %provider,
                    status = error.status_code().as_u16(),
                    error = %error,
                    "delivery rejected"
                ),
            }
            error.error_response()
        }
    }
}
