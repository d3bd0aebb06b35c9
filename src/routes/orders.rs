//! `POST /orders`, `GET /orders/{id}`, `GET /orders`: the shop's own API.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;

use super::api::{self, ApiClient, IdempotencyKey};
use super::problem::Problem;
use super::AppState;
use crate::domain::{text, EmailAddress, OrderStatus};
use crate::providers;
use crate::store::{NewOrder, OrderQuery, StoredResponse};
use crate::telemetry::ErrorChain;

/// The body of `POST /orders`. Unknown fields are refused, so a typo is not silently dropped.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateOrderRequest {
    order_id: Option<String>,
    amount: i64,
    currency: String,
    provider: String,
    customer_email: Option<String>,
    metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

/// Checks the request; returns it and its JSON value (for the fingerprint).
fn validate(body: &[u8]) -> Result<(CreateOrderRequest, serde_json::Value), Problem> {
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| Problem::invalid_request(format!("the body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(Problem::invalid_request("the body must be a JSON object"));
    }
    if let Some(amount) = value.get("amount").filter(|a| !(a.is_i64() || a.is_u64())) {
        // serde's own words ("invalid type: floating point `10.5`, expected i64") do not say
        // what an amount is.
        return Err(Problem::invalid_request(format!(
            "amount: {amount} is not an integer; amounts are integers in the currency's minor units \
             (1500 for $15.00, 150000 for Rp1.500,00, 5000 for ¥5,000)"
        )));
    }
    let request: CreateOrderRequest =
        serde_path_to_error::deserialize(value.clone()).map_err(|e| {
            // Name the field: "currency: invalid type: integer `5`, expected a string".
            match e.path().to_string().as_str() {
                "." => Problem::invalid_request(e.inner().to_string()),
                path => Problem::invalid_request(format!("{path}: {}", e.inner())),
            }
        })?;
    if let Some(id) = &request.order_id {
        let valid = (1..=64).contains(&id.len())
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b));
        if !valid {
            return Err(Problem::invalid_request(
                "order_id must be 1-64 characters of letters, digits, '-', '_', '.' or ':'",
            ));
        }
        // The order is read at /orders/{order_id}, and a URL's path segment "." or ".." is
        // removed by every client that resolves it (its Location would lead elsewhere).
        if text::is_path_step(id) {
            return Err(Problem::invalid_request(
                "order_id cannot be \".\" or \"..\": the order is read at /orders/{order_id}, where a client resolves those as the path itself",
            ));
        }
    }
    if request.amount <= 0 {
        return Err(Problem::invalid_request(
            "amount must be a positive integer in minor units (e.g. 1500 for $15.00)",
        ));
    }
    if request.currency.len() != 3 || !request.currency.bytes().all(|b| b.is_ascii_alphabetic()) {
        return Err(Problem::invalid_request(
            "currency must be a three-letter code such as usd or IDR",
        ));
    }
    if !crate::domain::money::is_iso_currency(&request.currency) {
        return Err(Problem::invalid_request(format!(
            "currency: `{}` is not an ISO 4217 currency code (such as usd, IDR, JPY)",
            request.currency
        )));
    }
    if !providers::is_registered(&request.provider) {
        return Err(Problem::invalid_request(format!(
            "provider must be one of {}",
            providers::known()
        )));
    }
    if let Some(email) = &request.customer_email {
        // Exactly one address: a list or a header smuggled after it would reach every transport.
        let parsed = EmailAddress::parse(email)
            .ok()
            .filter(|e| e.as_str().contains('.'));
        if parsed.is_none() {
            return Err(Problem::invalid_request(
                "customer_email must be one email address such as name@example.com",
            ));
        }
    }
    if let Some(locale) = request.metadata.as_ref().and_then(|m| m.get("locale")) {
        let valid = locale.as_str().is_some_and(|l| {
            (2..=35).contains(&l.len())
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
        if !valid {
            return Err(Problem::invalid_request(
                "metadata.locale must be a language tag such as \"id\" or \"en-US\" (it chooses the email's language)",
            ));
        }
    }
    Ok((request, value))
}

fn generated_order_id() -> String {
    format!("ord_{:016x}{:08x}", fastrand::u64(..), fastrand::u32(..))
}

/// Checks, in order: authentication (401), the key (400), the request (400, never stored), then
/// the key's record. The claim, the order and the stored response commit in one transaction.
/// Every answer is counted, those refused at the door too (a client whose token was revoked, a
/// caller guessing tokens): their extractors' refusals come here rather than answer by
/// themselves.
pub async fn create_order(
    client: Result<ApiClient, Problem>,
    key: Result<IdempotencyKey, Problem>,
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, Problem> {
    use crate::metrics::OrdersApiResult;
    let metrics = state.metrics.clone();
    // With the API off (no tokens) there is no API whose requests to count: the 404 is not one.
    let counted = !state.api_tokens.is_empty();
    let answer = match (client, key) {
        (Err(refused), _) | (Ok(_), Err(refused)) => Err(refused),
        (Ok(client), Ok(key)) => answer_create_order(client, key, req, payload, state).await,
    };
    if !counted {
        return answer;
    }
    metrics.orders_api(match &answer {
        Ok(response) if response.headers().contains_key("idempotent-replayed") => {
            OrdersApiResult::Replayed
        }
        Ok(response) => OrdersApiResult::of_status(response.status().as_u16()),
        Err(problem) => OrdersApiResult::of_status(problem.status),
    });
    answer
}

async fn answer_create_order(
    client: ApiClient,
    key: IdempotencyKey,
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, Problem> {
    let body = super::read_limited_body(&req, payload, state.max_body_bytes, state.body_timeout)
        .await
        .map_err(|e| match e {
            super::BodyError::TooLarge { limit } => Problem::too_large(limit),
            super::BodyError::TimedOut { deadline } => Problem::body_timed_out(deadline),
            super::BodyError::Read(e) => {
                Problem::invalid_request(format!("the request body could not be read: {e}"))
            }
        })?;
    let (request, value) = validate(&body)?;
    let order = NewOrder {
        order_id: request.order_id.unwrap_or_else(generated_order_id),
        amount: request.amount,
        exponent: providers::amount_exponent(&request.provider, &request.currency),
        currency: request.currency,
        provider: request.provider,
        customer_email: request.customer_email,
        metadata: request
            .metadata
            .map(|m| serde_json::Value::Object(m).to_string()),
    };
    let order_id = order.order_id.clone();
    let respond = Box::new(
        move |created: Option<&crate::store::OrderView>| match created {
            Some(view) => StoredResponse {
                status: 201,
                content_type: "application/json".into(),
                body: serde_json::to_string(view).expect("an order serialises"),
            },
            None => Problem::order_exists(&order_id).stored(),
        },
    );
    let (stored, replayed) =
        api::idempotent(&state, client, key, &req, &value, order, respond).await?;
    let mut response = api::stored_response(&stored, replayed);
    if stored.status == 201 {
        // Where the created order is read: its id is in the stored body, which a replay (of a
        // generated id too) returns as it was.
        let created: serde_json::Value =
            serde_json::from_str(&stored.body).expect("a stored order is JSON");
        if let Some(id) = created["order_id"].as_str() {
            response.headers_mut().insert(
                actix_web::http::header::LOCATION,
                actix_web::http::header::HeaderValue::from_str(&order_location(id))
                    .expect("a percent-encoded path is a header value"),
            );
        }
    }
    Ok(response)
}

/// `/orders/{order_id}`, the id one path segment (an order id may hold `:`).
fn order_location(order_id: &str) -> String {
    format!("/orders/{}", text::path_segment(order_id))
}

pub async fn get_order(
    _client: ApiClient,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, Problem> {
    let order_id = path.into_inner();
    match read(state.store.order(order_id.clone())).await? {
        Some(view) => Ok(HttpResponse::Ok().json(view)),
        None => Err(Problem::not_found(&order_id)),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    status: Option<String>,
    limit: Option<u32>,
    after: Option<String>,
}

pub const DEFAULT_PAGE: u32 = 20;
pub const MAX_PAGE: u32 = 100;

/// Orders in `order_id` order; `next_after` is the cursor for the next page (null on the last).
pub async fn list_orders(
    _client: ApiClient,
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, Problem> {
    let query = web::Query::<ListQuery>::from_query(req.query_string())
        .map_err(|e| Problem::invalid_request(format!("query: {e}")))?
        .into_inner();
    let status = query
        .status
        .as_deref()
        .map(str::parse::<OrderStatus>)
        .transpose()
        .map_err(|e| {
            let valid: Vec<&str> = OrderStatus::ALL.iter().map(|s| s.as_str()).collect();
            Problem::invalid_request(format!("status: {e}; it is one of {}", valid.join(", ")))
        })?;
    let limit = query.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(Problem::invalid_request(format!(
            "limit must be between 1 and {MAX_PAGE}"
        )));
    }
    let page = read(state.store.orders(OrderQuery {
        status,
        after: query.after,
        limit,
    }))
    .await?;
    let next_after = (page.len() == limit as usize)
        .then(|| page.last().map(|o| o.order_id.clone()))
        .flatten();
    // A struct, not `json!`: serde_json's map sorts its keys, and each order would then list its
    // fields in another order than `GET /orders/{id}` does.
    Ok(HttpResponse::Ok().json(OrderPage {
        orders: page,
        next_after,
    }))
}

/// A page of `GET /orders`.
#[derive(serde::Serialize)]
struct OrderPage {
    orders: Vec<crate::store::OrderView>,
    /// The cursor for the next page; null on the last.
    next_after: Option<String>,
}

/// Awaits a read of the store; any failure is an opaque 503 for the caller and a full error in
/// the log.
async fn read<T>(
    query: impl std::future::Future<Output = Result<T, crate::store::StoreError>>,
) -> Result<T, Problem> {
    query.await.map_err(|e| {
        tracing::error!(error = %ErrorChain(&e), "reading orders failed");
        Problem::unavailable()
    })
}
