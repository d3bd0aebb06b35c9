//! The operator console at `/console`: what happened (deliveries, an event's payload, an
//! order's whole story, the outboxes' dead and pending rows) and what an operator may do about
//! it (retry or skip an outbox row, set an order's status with a reason), in server-rendered
//! pages that work without JavaScript.
//!
//! Off (404) unless it has login tokens (`SEKALI_CONSOLE_TOKENS`, else the orders API's). A
//! login gives a session cookie; every action is a POST from the console's own page, with the
//! session's CSRF token (see [`session`]). Reads and actions go through the store's
//! [`Maintenance`] interface, as the `sekali` commands do, on a connection of their own
//! outside the async workers; so any instance serves the console, on either engine.

mod render;
pub mod session;
mod throttle;

pub use throttle::LoginThrottle;

use crate::domain::text::{is_path_step, path_segment as segment};
use actix_web::http::{header, StatusCode};
use actix_web::{web, HttpRequest, HttpResponse};
use minijinja::{context, Value};
use serde::Deserialize;

use crate::domain::{OrderStatus, Outcome};
use crate::routes::AppState;
use crate::store::{
    EventQuery, Maintenance, OperatorChange, OutboxQuery, Retried, SetStatusError, Skipped,
    StoreError,
};
use crate::telemetry::ErrorChain;
use render::page;
use session::Session;

/// An answer given before a handler's work: the console is off, no session, a refused action,
/// a database that could not be read.
type Early = Box<HttpResponse>;

/// Events per page of the list.
const PAGE: u32 = 50;
/// Dead and pending rows shown per outbox.
const OUTBOX_ROWS: u32 = 200;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::scope("/console")
            // The answers no handler wrote (a form or a path actix could not read: a 400, a 404)
            // carry the console's headers too; a handler's own headers are left as they are.
            .wrap(render::default_headers())
            .route("", web::get().to(overview))
            .route("/", web::get().to(overview))
            .route("/login", web::get().to(login_page))
            .route("/login", web::post().to(login))
            .route("/logout", web::post().to(logout))
            .route("/static/console.css", web::get().to(stylesheet))
            .route("/events", web::get().to(events))
            .route("/events/{provider}/{event_id}", web::get().to(event))
            .route("/orders/{order_id}", web::get().to(order))
            .route("/orders/{order_id}/status", web::post().to(set_status))
            .route("/outbox", web::get().to(outbox))
            .route(
                "/outbox/{outbox}/{id}/{action}",
                web::post().to(outbox_action),
            )
            .default_service(web::to(not_found)),
    );
}

/// An id as a path segment of the console's links. An id that is a step of the path
/// ([`is_path_step`]; a provider's, not the orders API's) would link to another page: it, and
/// every id that starts with `~`, is written with a `~` in front, which [`id_of_segment`] takes
/// off.
fn id_segment(id: &str) -> String {
    if is_path_step(id) || id.starts_with('~') {
        segment(&format!("~{id}"))
    } else {
        segment(id)
    }
}

/// The id a path segment of [`id_segment`] stands for (actix has decoded it).
fn id_of_segment(segment: String) -> String {
    match segment.strip_prefix('~') {
        Some(id) => id.to_owned(),
        None => segment,
    }
}

fn order_href(order_id: &str) -> String {
    format!("/console/orders/{}", id_segment(order_id))
}

fn event_href(provider: &str, event_id: &str) -> String {
    format!(
        "/console/events/{}/{}",
        segment(provider),
        id_segment(event_id)
    )
}

/// A page for a logged-in operator: `extra` with what the layout needs.
fn signed_in(
    status: StatusCode,
    template: &str,
    session: &Session,
    title: &str,
    notice: Option<String>,
    extra: Value,
) -> HttpResponse {
    page(
        status,
        template,
        context! {
            operator => &session.operator,
            csrf => &session.csrf,
            title => title,
            notice => notice,
            ..extra
        },
    )
}

fn problem(
    status: StatusCode,
    session: Option<&Session>,
    title: &str,
    message: &str,
) -> HttpResponse {
    page(
        status,
        "error.html",
        context! {
            operator => session.map(|s| s.operator.clone()),
            csrf => session.map(|s| s.csrf.clone()),
            title => title,
            message => message,
        },
    )
}

fn see_other(location: String) -> HttpResponse {
    render::with_headers(HttpResponse::SeeOther())
        .insert_header((header::LOCATION, location))
        .finish()
}

async fn not_found(state: web::Data<AppState>, req: HttpRequest) -> HttpResponse {
    if state.console_tokens.is_empty() {
        return HttpResponse::NotFound().finish();
    }
    let session = session::of_request(&req, &state.console_tokens, state.clock.now_unix());
    problem(
        StatusCode::NOT_FOUND,
        session.as_ref(),
        "Not found",
        "The console has no such page.",
    )
}

/// The session of a page's request; without one, the answer to give (404 while the console is
/// off, else to the login page). A session logged out of (on any instance) is none.
async fn viewer(state: &AppState, req: &HttpRequest) -> Result<Session, Early> {
    if state.console_tokens.is_empty() {
        return Err(Box::new(HttpResponse::NotFound().finish()));
    }
    let to_login = || Box::new(see_other("/console/login".to_owned()));
    let session = session::of_request(req, &state.console_tokens, state.clock.now_unix())
        .ok_or_else(to_login)?;
    if logged_out(state, &session).await? {
        return Err(to_login());
    }
    Ok(session)
}

/// Whether `session` was logged out of.
async fn logged_out(state: &AppState, session: &Session) -> Result<bool, Early> {
    let id = session.id.clone();
    with_db(state, false, move |db| db.console_session_ended(&id)).await
}

/// The session of an action's request, once it is shown to come from the console's own page
/// with the session's CSRF token; else the refusal (403), logged.
async fn actor(state: &AppState, req: &HttpRequest, csrf: &str) -> Result<Session, Early> {
    if state.console_tokens.is_empty() {
        return Err(Box::new(HttpResponse::NotFound().finish()));
    }
    let refuse = |session: Option<&Session>, why: &str, message: &str| {
        tracing::warn!(path = %req.path(), why, "console action refused");
        Box::new(problem(StatusCode::FORBIDDEN, session, "Refused", message))
    };
    if let Some(why) = session::foreign_origin(req) {
        return Err(refuse(
            None,
            &why,
            "This form was sent from another site's page. Nothing was changed.",
        ));
    }
    let Some(session) = session::of_request(req, &state.console_tokens, state.clock.now_unix())
    else {
        return Err(refuse(
            None,
            "no valid session",
            "You are not logged in (or your session ended). Log in, then try again. Nothing was changed.",
        ));
    };
    if !session::csrf_matches(&session, csrf) {
        return Err(refuse(
            Some(&session),
            "a missing or stale CSRF token",
            "This form is from an earlier session or another page. Reload the page and try again. Nothing was changed.",
        ));
    }
    if logged_out(state, &session).await? {
        return Err(refuse(
            None,
            "a session logged out of",
            "This session was logged out of. Log in, then try again. Nothing was changed.",
        ));
    }
    Ok(session)
}

/// Runs `work` on a maintenance connection of its own, off the async workers. A database that
/// cannot be opened or read answers 503.
async fn with_db<T: Send + 'static>(
    state: &AppState,
    writable: bool,
    work: impl FnOnce(&dyn Maintenance) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, Early> {
    // Each call opens a connection of its own (on PostgreSQL a server backend): a few at a time,
    // so that a busy console, or a loop over it, cannot take the connections the webhooks'
    // writers reconnect with. The others wait their turn.
    static DB_SLOTS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(4);
    let _slot = DB_SLOTS
        .acquire()
        .await
        .expect("the semaphore is never closed");
    let location = state.db.clone();
    let result = web::block(move || {
        let db = crate::store::maintenance(&location, writable)?;
        work(db.as_ref())
    })
    .await;
    match result {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => {
            tracing::error!(error = %ErrorChain(&e), "console: the database failed");
            Err(Box::new(problem(
                StatusCode::SERVICE_UNAVAILABLE,
                None,
                "Database unavailable",
                "The database could not be read or written just now; the log says why. Try again.",
            )))
        }
        Err(_) => Err(Box::new(problem(
            StatusCode::SERVICE_UNAVAILABLE,
            None,
            "Unavailable",
            "The server is shutting down.",
        ))),
    }
}

async fn stylesheet(state: web::Data<AppState>) -> HttpResponse {
    if state.console_tokens.is_empty() {
        return HttpResponse::NotFound().finish();
    }
    render::with_headers(HttpResponse::Ok())
        .content_type("text/css; charset=utf-8")
        .body(render::STYLESHEET)
}

fn login_form(status: StatusCode, error: Option<&str>) -> HttpResponse {
    page(
        status,
        "login.html",
        context! { title => "Log in", error => error, operator => None::<String> },
    )
}

async fn login_page(state: web::Data<AppState>) -> HttpResponse {
    if state.console_tokens.is_empty() {
        return HttpResponse::NotFound().finish();
    }
    login_form(StatusCode::OK, None)
}

#[derive(Deserialize)]
struct LoginForm {
    #[serde(default)]
    token: String,
}

async fn login(
    state: web::Data<AppState>,
    req: HttpRequest,
    form: web::Form<LoginForm>,
) -> HttpResponse {
    if state.console_tokens.is_empty() {
        return HttpResponse::NotFound().finish();
    }
    if let Some(why) = session::foreign_origin(&req) {
        tracing::warn!(why, "console login refused");
        return problem(
            StatusCode::FORBIDDEN,
            None,
            "Refused",
            "This login was sent from another site's page.",
        );
    }
    if let Some(address) = req.peer_addr().map(|a| a.ip()) {
        if let Err(wait) = state.login_throttle.take(address) {
            let seconds = wait.as_secs() + 1;
            tracing::warn!(%address, "console login refused: too many tries from this address");
            let mut response = login_form(
                StatusCode::TOO_MANY_REQUESTS,
                Some(&format!(
                    "Too many logins from this address: try again in {seconds} s."
                )),
            );
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from(seconds));
            return response;
        }
    }
    match crate::config::matching_token(&state.console_tokens, form.token.trim()) {
        Some(token) => {
            tracing::info!(operator = %crate::domain::text::Escaped(&token.name), "console login");
            let value = session::issue(token, state.clock.now_unix());
            let mut response = see_other("/console".to_owned());
            response
                .add_cookie(&session::cookie(&req, value))
                .expect("a cookie of printable ASCII");
            response
        }
        None => {
            tracing::warn!("console login with a wrong token");
            login_form(
                StatusCode::UNAUTHORIZED,
                Some("That is not a console token."),
            )
        }
    }
}

#[derive(Deserialize)]
struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

async fn logout(
    state: web::Data<AppState>,
    req: HttpRequest,
    form: web::Form<CsrfForm>,
) -> HttpResponse {
    let session = match actor(&state, &req, &form.csrf).await {
        Ok(session) => session,
        Err(refused) => return *refused,
    };
    // Ended for every instance, not only this browser: a copy of the cookie is refused too.
    let (id, expires, now) = (
        session.id.clone(),
        session.expires_unix,
        state.clock.now_unix(),
    );
    if let Err(answer) = with_db(&state, true, move |db| {
        db.end_console_session(&id, expires, now)
    })
    .await
    {
        return *answer;
    }
    tracing::info!(operator = %crate::domain::text::Escaped(&session.operator), "console logout");
    let mut response = see_other("/console/login".to_owned());
    response
        .add_cookie(&session::removal(&req))
        .expect("a cookie of printable ASCII");
    response
}

/// How long ago, for a person: `3m 12s`.
fn age(duration: std::time::Duration) -> String {
    if duration.is_zero() {
        return "none due".to_owned();
    }
    humantime::format_duration(std::time::Duration::from_secs(duration.as_secs())).to_string()
}

async fn overview(state: web::Data<AppState>, req: HttpRequest) -> HttpResponse {
    let session = match viewer(&state, &req).await {
        Ok(session) => session,
        Err(answer) => return *answer,
    };
    let since = state.clock.now_unix() - 3600;
    let counts = match with_db(&state, false, move |db| db.event_counts(since)).await {
        Ok(counts) => counts,
        Err(answer) => return *answer,
    };
    let deliveries: Vec<Value> = counts
        .iter()
        .map(|c| {
            Value::from_serialize(serde_json::json!({
                "provider": c.provider,
                "outcome": c.outcome,
                "count": c.count,
                "href": format!(
                    "/console/events?provider={}&outcome={}&since=1h",
                    segment(&c.provider),
                    segment(&c.outcome)
                ),
            }))
        })
        .collect();
    let backlog = match state.store.outbox_backlog(state.clock.now_millis()).await {
        Ok(backlog) => backlog,
        Err(e) => {
            tracing::error!(error = %ErrorChain(&e), "console: the outbox backlog could not be read");
            return problem(
                StatusCode::SERVICE_UNAVAILABLE,
                Some(&session),
                "Database unavailable",
                "The outboxes' backlog could not be read just now; the log says why.",
            );
        }
    };
    let outboxes: Vec<Value> = backlog
        .iter()
        .map(|(kind, b)| {
            Value::from_serialize(serde_json::json!({
                "outbox": kind.label(),
                "pending": b.pending,
                "dead": b.dead,
                "oldest_due": age(b.oldest_due_age),
            }))
        })
        .collect();
    let tallies = state.metrics.since_start();
    let tally = |t: &crate::metrics::Tally, key: &str| {
        Value::from_serialize(serde_json::json!({
            "provider": t.provider, key: t.what, "count": t.count,
        }))
    };
    signed_in(
        StatusCode::OK,
        "overview.html",
        &session,
        "Overview",
        None,
        context! {
            deliveries => deliveries,
            answered => tallies.answered.iter().map(|t| tally(t, "outcome")).collect::<Vec<_>>(),
            refusals => tallies.refusals.iter().map(|t| tally(t, "reason")).collect::<Vec<_>>(),
            recent_refusals => tallies
                .refusals_last_hour
                .iter()
                .map(|t| tally(t, "reason"))
                .collect::<Vec<_>>(),
            started => humantime::format_rfc3339_seconds(tallies.started).to_string(),
            outboxes => outboxes,
            writer => Value::from_serialize(state.store.stats().writer),
        },
    )
}

#[derive(Deserialize, Default)]
struct EventFilter {
    #[serde(default)]
    provider: String,
    #[serde(default)]
    outcome: String,
    #[serde(default, rename = "type")]
    event_type: String,
    #[serde(default)]
    since: String,
    #[serde(default)]
    until: String,
    before: Option<i64>,
}

/// A moment from a filter's field: a duration (`1h`: that long ago), an RFC 3339 time, or what
/// an `<input type="datetime-local">` sends (`2026-12-06T10:15`, taken as UTC).
fn moment(field: &str, text: &str, now_unix: i64) -> Result<Option<i64>, String> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    let with_zone = match text.len() {
        16 => format!("{text}:00Z"),
        19 => format!("{text}Z"),
        _ => text.to_owned(),
    };
    crate::clock::parse_since(text)
        .or_else(|| crate::clock::parse_since(&with_zone))
        .map(|since| Some(since.unix(now_unix)))
        .ok_or_else(|| {
            format!(
                "{field}: expected a duration such as 30m or 2h (that long ago), or a UTC time such as 2026-12-06T10:15"
            )
        })
}

impl EventFilter {
    fn query(&self, now_unix: i64) -> Result<EventQuery, String> {
        let outcome = match self.outcome.as_str() {
            "" => None,
            name => Some(
                Outcome::parse(name)
                    .filter(|o| Outcome::STORED.contains(o))
                    .ok_or_else(|| format!("outcome: no stored outcome is called {name:?}"))?,
            ),
        };
        let some = |text: &str| Some(text.trim().to_owned()).filter(|t| !t.is_empty());
        Ok(EventQuery {
            provider: some(&self.provider),
            outcome,
            event_type: some(&self.event_type),
            since_unix: moment("since", &self.since, now_unix)?,
            until_unix: moment("until", &self.until, now_unix)?,
            before_seq: self.before,
            ..EventQuery::newest(PAGE + 1)
        })
    }

    /// This filter's URL with `before` for the next page.
    fn older(&self, before: i64) -> String {
        let mut url = url_query(&[
            ("provider", &self.provider),
            ("outcome", &self.outcome),
            ("type", &self.event_type),
            ("since", &self.since),
            ("until", &self.until),
        ]);
        url.push_str(&format!("before={before}"));
        format!("/console/events?{url}")
    }
}

/// `name=value&` for each pair with a value, percent-encoded.
fn url_query(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .filter(|(_, value)| !value.is_empty())
        .map(|(name, value)| format!("{name}={}&", segment(value)))
        .collect()
}

fn event_rows(events: &[crate::store::EventSummary]) -> Vec<Value> {
    events
        .iter()
        .map(|e| {
            Value::from_serialize(serde_json::json!({
                "received_at": e.received_at,
                "provider": e.provider,
                "event_id": e.event_id,
                "event_type": e.event_type,
                "outcome": e.outcome,
                "order_id": e.order_id,
                "href": event_href(&e.provider, &e.event_id),
                "order_href": e.order_id.as_deref().map(order_href),
            }))
        })
        .collect()
}

async fn events(
    state: web::Data<AppState>,
    req: HttpRequest,
    filter: Option<web::Query<EventFilter>>,
) -> HttpResponse {
    let session = match viewer(&state, &req).await {
        Ok(session) => session,
        Err(answer) => return *answer,
    };
    let Some(web::Query(filter)) = filter else {
        return problem(
            StatusCode::BAD_REQUEST,
            Some(&session),
            "Bad filter",
            "The filter's fields could not be read (before must be a number).",
        );
    };
    let query = match filter.query(state.clock.now_unix()) {
        Ok(query) => query,
        Err(message) => {
            return problem(
                StatusCode::BAD_REQUEST,
                Some(&session),
                "Bad filter",
                &message,
            )
        }
    };
    let mut rows = match with_db(&state, false, move |db| db.events(&query)).await {
        Ok(rows) => rows,
        Err(answer) => return *answer,
    };
    let older = (rows.len() > PAGE as usize).then(|| {
        rows.truncate(PAGE as usize);
        filter.older(rows.last().map_or(0, |e| e.seq))
    });
    let providers: Vec<String> = state
        .providers
        .iter()
        .map(|p| p.name().as_str().to_owned())
        .collect();
    signed_in(
        StatusCode::OK,
        "events.html",
        &session,
        "Events",
        None,
        context! {
            events => event_rows(&rows),
            older => older,
            providers => providers,
            outcomes => Outcome::STORED.map(Outcome::as_str),
            filter => context! {
                provider => filter.provider,
                outcome => filter.outcome,
                type => filter.event_type,
                since => filter.since,
                until => filter.until,
            },
        },
    )
}

async fn event(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
) -> HttpResponse {
    let session = match viewer(&state, &req).await {
        Ok(session) => session,
        Err(answer) => return *answer,
    };
    let (provider, event_id) = path.into_inner();
    let event_id = id_of_segment(event_id);
    // The event, and what it did: the changes of its order that name it.
    let found = {
        let event_id = event_id.clone();
        with_db(&state, false, move |db| {
            let mut found = db.find_events(&event_id, Some(&provider))?;
            if found.is_empty() {
                return Ok(None);
            }
            let event = found.remove(0);
            let changes = match &event.summary.order_id {
                Some(order_id) => db
                    .transitions(order_id)?
                    .into_iter()
                    .filter(|t| t.provider == provider && t.event_id == event_id)
                    .collect(),
                None => Vec::new(),
            };
            Ok(Some((event, changes)))
        })
        .await
    };
    let (event, changes) = match found {
        Ok(Some(found)) => found,
        Ok(_) => {
            return problem(
                StatusCode::NOT_FOUND,
                Some(&session),
                "No such event",
                &format!(
                    "No stored event has the id {event_id} (its retention may have ended, or it was never stored)."
                ),
            )
        }
        Err(answer) => return *answer,
    };
    let order_link = event.summary.order_id.as_deref().map(order_href);
    signed_in(
        StatusCode::OK,
        "event.html",
        &session,
        &format!("Event {}", event.summary.event_id),
        None,
        context! {
            event => Value::from_serialize(&event),
            order_href => order_link,
            changes => Value::from_serialize(&changes),
        },
    )
}

/// What an order's page shows.
struct Story {
    order: crate::store::OrderView,
    transitions: Vec<crate::store::Transition>,
    events: Vec<crate::store::EventSummary>,
    /// Each email and forward, as JSON, with its `attempts_log`.
    emails: Vec<serde_json::Value>,
    forwards: Vec<serde_json::Value>,
}

/// `row` as JSON with every result recorded for it (`attempts_log`).
fn with_attempts(
    db: &dyn Maintenance,
    outbox: crate::store::OutboxKind,
    id: i64,
    row: &impl serde::Serialize,
) -> Result<serde_json::Value, StoreError> {
    let mut value = serde_json::to_value(row).unwrap_or_default();
    value["attempts_log"] =
        serde_json::to_value(db.outbox_attempts(outbox, id)?).unwrap_or_default();
    Ok(value)
}

fn story(db: &dyn Maintenance, order_id: &str) -> Result<Option<Story>, StoreError> {
    let Some(order) = db.order(order_id)? else {
        return Ok(None);
    };
    let rows = |limit| OutboxQuery {
        order_id: Some(order_id.to_owned()),
        ..OutboxQuery::newest(limit)
    };
    Ok(Some(Story {
        order,
        transitions: db.transitions(order_id)?,
        events: db.events(&EventQuery {
            order_id: Some(order_id.to_owned()),
            ..EventQuery::newest(500)
        })?,
        emails: db
            .outbox(&rows(500))?
            .iter()
            .map(|row| with_attempts(db, crate::store::OutboxKind::Email, row.id, row))
            .collect::<Result<_, _>>()?,
        forwards: db
            .forwards(&rows(500))?
            .iter()
            .map(|row| with_attempts(db, crate::store::OutboxKind::Forward, row.id, row))
            .collect::<Result<_, _>>()?,
    }))
}

#[derive(Deserialize, Default)]
struct NoticeQuery {
    notice: Option<String>,
}

/// The notices an action's redirect may carry: a code the page turns into its sentence, signed
/// by the session (see [`Session::signed_notice`]), so that a link from elsewhere cannot make
/// the console say anything, not even one of its own sentences.
fn notice_text(code: Option<&str>) -> Option<String> {
    let code = code?;
    let (what, id) = code.split_once(':').unwrap_or((code, ""));
    let id: i64 = id.parse().ok()?;
    let sentence = match what {
        "email-revived" => format!("email {id}: dead -> pending, due now, its tries started over"),
        "email-due" => format!("email {id}: due now"),
        "email-skipped" => format!("email {id}: skipped; it will not be sent"),
        "forward-revived" => {
            format!("forward {id}: dead -> pending, due now, its tries started over")
        }
        "forward-due" => format!("forward {id}: due now"),
        "forward-skipped" => {
            format!(
                "forward {id}: skipped; it will not be sent, and its order's later changes may go"
            )
        }
        "status-set" => "the status was set; the change is at the end of its history".to_owned(),
        _ => return None,
    };
    Some(sentence)
}

async fn order(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    query: Option<web::Query<NoticeQuery>>,
) -> HttpResponse {
    let session = match viewer(&state, &req).await {
        Ok(session) => session,
        Err(answer) => return *answer,
    };
    let order_id = id_of_segment(path.into_inner());
    let found = {
        let order_id = order_id.clone();
        with_db(&state, false, move |db| story(db, &order_id)).await
    };
    let story = match found {
        Ok(Some(story)) => story,
        Ok(None) => {
            return problem(
                StatusCode::NOT_FOUND,
                Some(&session),
                "No such order",
                &format!("No order has the id {order_id}."),
            )
        }
        Err(answer) => return *answer,
    };
    let notice = query.and_then(|q| {
        notice_text(
            q.notice
                .as_deref()
                .and_then(|n| session.notice_code(n, &order_href(&order_id))),
        )
    });
    let transitions: Vec<Value> = story
        .transitions
        .iter()
        .map(|t| {
            let is_event = !matches!(t.provider.as_str(), "api" | "operator");
            Value::from_serialize(serde_json::json!({
                "changed_at": t.changed_at,
                "from_status": t.from_status,
                "to_status": t.to_status,
                "refunded_amount": t.refunded_amount,
                "provider": t.provider,
                "event_id": t.event_id,
                "actor": t.actor,
                "reason": t.reason,
                "href": is_event.then(|| event_href(&t.provider, &t.event_id)),
            }))
        })
        .collect();
    let metadata = story
        .order
        .metadata
        .as_ref()
        .map(|m| render::pretty_json(&m.to_string()))
        .unwrap_or_else(|| "none".to_owned());
    signed_in(
        StatusCode::OK,
        "order.html",
        &session,
        &format!("Order {order_id}"),
        notice,
        context! {
            order => Value::from_serialize(&story.order),
            metadata => metadata,
            transitions => transitions,
            events => event_rows(&story.events),
            emails => Value::from_serialize(&story.emails),
            forwards => Value::from_serialize(&story.forwards),
            statuses => OrderStatus::ALL.map(OrderStatus::as_str),
            set_status_action => format!("{}/status", order_href(&order_id)),
        },
    )
}

#[derive(Deserialize)]
struct StatusForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    reason: String,
}

async fn set_status(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    form: web::Form<StatusForm>,
) -> HttpResponse {
    let session = match actor(&state, &req, &form.csrf).await {
        Ok(session) => session,
        Err(refused) => return *refused,
    };
    let order_id = id_of_segment(path.into_inner());
    let bad = |message: &str| {
        problem(
            StatusCode::BAD_REQUEST,
            Some(&session),
            "Not changed",
            message,
        )
    };
    let Ok(status) = form.status.parse::<OrderStatus>() else {
        return bad("Choose one of the statuses listed. Nothing was changed.");
    };
    let reason = form.reason.trim().to_owned();
    if reason.is_empty() {
        return bad(
            "Say why the order is moved: the reason is kept in its history. Nothing was changed.",
        );
    }
    let change = OperatorChange {
        status,
        operator: session.operator.clone(),
        reason,
    };
    let now = state.clock.now_unix();
    // Through `with_db` as every other action (its connection slots, its 503): the store's
    // own failures inside the set-status come back as `SetStatusError::Store`.
    let result = {
        let order_id = order_id.clone();
        with_db(&state, true, move |db| {
            Ok(db.set_status_by_operator(&order_id, &change, now))
        })
        .await
    };
    match result {
        Ok(Ok(previous)) => {
            tracing::info!(
                order_id = %crate::domain::text::Escaped(&order_id),
                %previous,
                %status,
                operator = %crate::domain::text::Escaped(&session.operator),
                "console: an operator set an order's status"
            );
            see_other(format!(
                "{}?notice={}",
                order_href(&order_id),
                session.signed_notice("status-set:0", &order_href(&order_id))
            ))
        }
        Ok(Err(SetStatusError::Store(e))) => {
            tracing::error!(error = %ErrorChain(&e), "console: set-status failed");
            problem(
                StatusCode::SERVICE_UNAVAILABLE,
                Some(&session),
                "Not changed",
                "The database could not be written just now; the log says why. Nothing was changed; try again.",
            )
        }
        Ok(Err(refused)) => bad(&format!("{refused}.")),
        Err(answer) => *answer,
    }
}

async fn outbox(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: Option<web::Query<NoticeQuery>>,
) -> HttpResponse {
    let session = match viewer(&state, &req).await {
        Ok(session) => session,
        Err(answer) => return *answer,
    };
    let rows = with_db(&state, false, |db| {
        let of = |status: &str| OutboxQuery {
            status: Some(status.to_owned()),
            ..OutboxQuery::newest(OUTBOX_ROWS)
        };
        let mut emails = db.outbox(&of("dead"))?;
        emails.extend(db.outbox(&of("pending"))?);
        let mut forwards = db.forwards(&of("dead"))?;
        forwards.extend(db.forwards(&of("pending"))?);
        emails.sort_by_key(|row| std::cmp::Reverse(row.id));
        forwards.sort_by_key(|row| std::cmp::Reverse(row.id));
        Ok((emails, forwards))
    })
    .await;
    let (emails, forwards) = match rows {
        Ok(rows) => rows,
        Err(answer) => return *answer,
    };
    let with_order = |value: serde_json::Value| {
        let mut value = value;
        if let Some(order_id) = value.get("order_id").and_then(|o| o.as_str()) {
            let href = order_href(order_id);
            value["order_href"] = serde_json::Value::String(href);
        }
        Value::from_serialize(value)
    };
    let emails: Vec<Value> = emails
        .iter()
        .map(|row| with_order(serde_json::to_value(row).unwrap_or_default()))
        .collect();
    let forwards: Vec<Value> = forwards
        .iter()
        .map(|row| with_order(serde_json::to_value(row).unwrap_or_default()))
        .collect();
    let notice = query.and_then(|q| {
        notice_text(
            q.notice
                .as_deref()
                .and_then(|n| session.notice_code(n, "/console/outbox")),
        )
    });
    signed_in(
        StatusCode::OK,
        "outbox.html",
        &session,
        "Outbox",
        notice,
        context! { emails => emails, forwards => forwards },
    )
}

async fn outbox_action(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, i64, String)>,
    form: web::Form<CsrfForm>,
) -> HttpResponse {
    let session = match actor(&state, &req, &form.csrf).await {
        Ok(session) => session,
        Err(refused) => return *refused,
    };
    let (outbox, id, action) = path.into_inner();
    if !matches!(outbox.as_str(), "email" | "forward")
        || !matches!(action.as_str(), "retry" | "skip")
    {
        return problem(
            StatusCode::NOT_FOUND,
            Some(&session),
            "Not found",
            "The console has no such action.",
        );
    }
    let now_ms = state.clock.now_millis();
    let kind = outbox.clone();
    let verb = action.clone();
    let done = with_db(&state, true, move |db| {
        Ok(match (kind.as_str(), verb.as_str()) {
            ("email", "retry") => Done::Retried(db.retry(id, now_ms)?),
            ("forward", "retry") => Done::Retried(db.retry_forward(id, now_ms)?),
            ("email", _) => Done::Skipped(db.skip_email(id, now_ms)?),
            _ => Done::Skipped(db.skip_forward(id, now_ms)?),
        })
    })
    .await;
    let done = match done {
        Ok(done) => done,
        Err(answer) => return *answer,
    };
    tracing::info!(
        outbox,
        id,
        action,
        result = ?done,
        operator = %crate::domain::text::Escaped(&session.operator),
        "console: an operator acted on an outbox row"
    );
    let code = match &done {
        Done::Retried(Retried::Revived) => "revived",
        Done::Retried(Retried::DueNow { .. }) => "due",
        Done::Skipped(Skipped::Skipped { .. }) => "skipped",
        Done::Retried(Retried::Leased { until, .. }) | Done::Skipped(Skipped::Leased { until, .. }) => {
            return problem(
                StatusCode::CONFLICT,
                Some(&session),
                "Not changed",
                &format!("{outbox} {id} is being sent by a relay right now (its lease runs until {until}); look again after that."),
            )
        }
        Done::Retried(Retried::Finished { status }) | Done::Skipped(Skipped::Finished { status }) => {
            return problem(
                StatusCode::CONFLICT,
                Some(&session),
                "Not changed",
                &format!("{outbox} {id} is {status} already; there is nothing to {action}."),
            )
        }
        Done::Retried(Retried::Missing) | Done::Skipped(Skipped::Missing) => {
            return problem(
                StatusCode::NOT_FOUND,
                Some(&session),
                "Not found",
                &format!("There is no {outbox} row {id}."),
            )
        }
    };
    see_other(format!(
        "/console/outbox?notice={}",
        session.signed_notice(&format!("{outbox}-{code}:{id}"), "/console/outbox")
    ))
}

/// What an outbox action did.
#[derive(Debug)]
enum Done {
    Retried(Retried),
    Skipped(Skipped),
}
