//! `GET /changes`: the order changes, in commit order, for shops that pull rather than receive
//! webhooks (docs/changes.md). Behind the orders API's bearer tokens.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;

use super::api::ApiClient;
use super::problem::Problem;
use super::AppState;
use crate::store::{Change, ChangeCursor, MAX_CHANGES_PAGE};
use crate::telemetry::ErrorChain;

/// Changes a page when `limit` is not given.
pub const DEFAULT_CHANGES_PAGE: u32 = 100;

#[derive(Deserialize)]
struct FeedQuery {
    after: Option<String>,
    limit: Option<u32>,
}

/// A page of the feed.
#[derive(serde::Serialize)]
struct ChangePage {
    changes: Vec<Change>,
    /// The cursor of the last change on the page; on an empty page the `after` given (null when
    /// none was): what the client passes as `after` next, whether the page was full or not.
    next_after: Option<String>,
}

pub async fn list_changes(
    _client: ApiClient,
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, Problem> {
    let query = web::Query::<FeedQuery>::from_query(req.query_string())
        .map_err(|e| Problem::invalid_request(format!("query: {e}")))?
        .into_inner();
    let limit = query.limit.unwrap_or(DEFAULT_CHANGES_PAGE);
    if !(1..=MAX_CHANGES_PAGE).contains(&limit) {
        return Err(Problem::invalid_request(format!(
            "limit must be between 1 and {MAX_CHANGES_PAGE}"
        )));
    }
    let after = match query.after.as_deref() {
        None => None,
        Some(text) => Some(ChangeCursor::parse(text).ok_or_else(|| {
            Problem::invalid_request(
                "after: not a cursor of this feed; pass the next_after of a page as it came, or leave it out to start at the first change",
            )
        })?),
    };
    let changes = state.store.changes(after, limit).await.map_err(|e| {
        tracing::error!(error = %ErrorChain(&e), "reading the change feed failed");
        Problem::unavailable()
    })?;
    let next_after = changes
        .last()
        .map(|change| change.cursor)
        .or(after)
        .map(|cursor| cursor.to_string());
    Ok(HttpResponse::Ok().json(ChangePage {
        changes,
        next_after,
    }))
}
