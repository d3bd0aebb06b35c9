//! What each command does. Each returns its exit status or an error, which
//! [`run`](super::run) prints once.

use std::process::ExitCode;
use std::sync::Arc;

use super::args::{
    BackupArgs, BenchArgs, CopyArgs, DbArgs, EventsCommand, ForwardCommand, OutboxCommand,
    RelayCommandArgs, ReplayArgs, ServeArgs, Switch,
};
use super::{print_columns, print_json_line, write_stdout};
use crate::clock::{Clock, SystemClock};
use crate::config::{self, Settings};
use crate::domain::text::{escaped_block, escaped_json, Escaped};
use crate::domain::OrderStatus;
use crate::jobs::relay::RelayHost;
use crate::providers::{ProviderSettings, Providers};
use crate::startup::Application;
use crate::store::{
    EventQuery, Maintenance, NextTry, OperatorChange, OutboxQuery, OutboxRow, Retried, Skipped,
    Store, StoreError, DEFAULT_PURGE_BATCH,
};

/// The provider settings of the command line, by `(provider, option)`: the generic
/// `--retention` and `--provider-option`, and the flags that name one provider's option.
fn provider_options(args: &ServeArgs) -> std::collections::BTreeMap<(String, String), String> {
    let mut options = std::collections::BTreeMap::new();
    let mut set = |provider: &str, option: &str, value: String| {
        options.insert((provider.to_owned(), option.to_owned()), value);
    };
    for ((provider, option), value) in &args.provider_options {
        set(provider, option, value.clone());
    }
    for (provider, duration) in &args.retentions {
        set(provider, "retention", duration.clone());
    }
    if let Some(tolerance) = args.stripe_tolerance {
        set("stripe", "tolerance", tolerance.to_string());
    }
    if let Some(retention) = &args.stripe_retention {
        set("stripe", "retention", retention.clone());
    }
    if let Some(retention) = &args.midtrans_retention {
        set("midtrans", "retention", retention.clone());
    }
    if let Some(check) = args.midtrans_status_check {
        let value = if check == Switch::On { "on" } else { "off" };
        set("midtrans", "status-check", value.to_owned());
    }
    if let Some(url) = &args.midtrans_api_url {
        set("midtrans", "api-url", url.clone());
    }
    options
}

/// The providers whose secrets are set in the environment, with these options.
fn configure_providers(
    options: &std::collections::BTreeMap<(String, String), String>,
) -> Result<Providers, String> {
    let env = |name: &str| std::env::var(name).ok();
    Providers::configure(&ProviderSettings { env: &env, options })
}

/// What a command returns: its exit status, or the error [`super::run`] prints.
type CommandResult = Result<ExitCode, Box<dyn std::error::Error>>;

/// Why a command could not open its database.
#[derive(Debug, thiserror::Error)]
enum OpenError {
    /// The first mistake of a new user: the command ran in another directory than `serve`, or
    /// without the `--db` that `serve` was given, and found no file where it looked. The store
    /// knows only the path; which settings chose it is the command line's to say.
    #[error("database file {0} does not exist (choose the file with --db or SEKALI_DB; sekali serve creates it)")]
    Missing(String),
    /// The same on a database server: the database exists (the server would have said
    /// otherwise) but `serve` never ran on it.
    #[error("the database {0} holds no sekali tables (choose the database with --db or SEKALI_DB; sekali serve creates them)")]
    NoTables(String),
    #[error(transparent)]
    Store(StoreError),
}

impl From<StoreError> for OpenError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Missing(path) => OpenError::Missing(path),
            StoreError::NoTables(target) => OpenError::NoTables(target),
            other => OpenError::Store(other),
        }
    }
}

/// The command's connection to the database of `--db`, which must exist; `writable` brings its
/// schema up to date.
fn open_maintenance(db: &DbArgs, writable: bool) -> Result<Box<dyn Maintenance>, OpenError> {
    Ok(crate::store::maintenance(&db.db, writable)?)
}

const DONE: CommandResult = Ok(ExitCode::SUCCESS);

/// The long-running commands hold a file per email of a batch, and a socket per connection:
/// they take all the open files the system allows them (see [`crate::open_files`]).
fn raise_open_file_limit() {
    let (before, after) = crate::open_files::raise_limit();
    if after > before {
        tracing::debug!(
            before,
            after,
            "raised the open-file limit to its hard limit"
        );
    }
}

pub(super) fn serve(args: ServeArgs) -> CommandResult {
    crate::telemetry::init();
    raise_open_file_limit();
    let providers = configure_providers(&provider_options(&args))?;
    let api_tokens = config::api_tokens_from_env()?;
    let mut settings = Settings::new(args.listen, args.db, providers);
    settings.require_a_provider()?;
    settings.console_tokens = config::console_tokens_from_env(&api_tokens)?;
    if !settings.console_tokens.is_empty()
        && std::env::var_os(config::ENV_CONSOLE_TOKENS).is_none_or(|v| v.is_empty())
    {
        tracing::warn!(
            "the operator console (/console) logs in with the orders API's tokens, as {} is not set: every service holding one can set orders' statuses there; give operators tokens of their own in {}",
            config::ENV_CONSOLE_TOKENS,
            config::ENV_CONSOLE_TOKENS
        );
    }
    settings.api_tokens = api_tokens;
    settings.max_body_bytes = args.max_body_bytes;
    settings.body_timeout = args.body_timeout;
    settings.purge_interval = args.purge_interval;
    settings.batch_max = args.batch_max as usize;
    settings.queue_capacity = args.queue_capacity;
    if let Some(writers) = args.pg_writers {
        if !matches!(settings.db, crate::store::Location::Server(_)) {
            return Err(format!(
                "--pg-writers (SEKALI_PG_WRITERS) is {writers}, but the database {} is SQLite, \
                 which has one writer: it applies to a PostgreSQL database only",
                settings.db
            )
            .into());
        }
        settings.pg_writers = writers;
    }
    settings.workers = args.workers;
    settings.idempotency_retention = args.idempotency_retention;
    settings.forward = crate::forward::ForwardConfig::from_env()?;
    settings.metrics_listen = args.metrics_listen;
    settings.forward_sends = !args.no_relay;
    if !args.no_relay {
        settings.relay = Some(
            args.relay
                .into_config(settings.db.clone(), RelayHost::Serve),
        );
    }
    let served = actix_web::rt::System::new().block_on(async move {
        let app = Application::build(settings, Arc::new(SystemClock))?;
        Ok::<_, Box<dyn std::error::Error>>(app.run_until_stopped().await?)
    });
    served?;
    DONE
}

pub(super) fn purge(args: DbArgs) -> CommandResult {
    let purged = open_maintenance(&args, true)?
        .purge_all_expired(SystemClock.now_unix(), DEFAULT_PURGE_BATCH)?;
    crate::outln!("purged {} expired event ids", purged.events);
    crate::outln!(
        "purged {} expired idempotency keys",
        purged.idempotency_keys
    );
    DONE
}

pub(super) fn copy(args: CopyArgs) -> CommandResult {
    if args.from == args.to {
        return Err(format!("--from and --to are the same database ({})", args.from).into());
    }
    let source = crate::store::maintenance(&args.from, false).map_err(OpenError::from)?;
    let report = crate::store::copy::copy(&*source, &args.to)?;
    let rows: i64 = report.tables.iter().map(|(_, rows)| rows).sum();
    crate::outln!(
        "copied {} to {}: {rows} rows, every table's count checked",
        args.from,
        args.to
    );
    for (table, rows) in &report.tables {
        crate::outln!("  {table}: {rows}");
    }
    DONE
}

pub(super) fn backup(args: BackupArgs) -> CommandResult {
    let report = open_maintenance(&args.db, false)?.backup(&args.out)?;
    crate::outln!(
        "backed up {} to {}: {} pages, {} processed events, {} orders, integrity ok",
        args.db.db,
        args.out.display(),
        report.pages,
        report.processed_events,
        report.orders
    );
    DONE
}

pub(super) fn bench(args: BenchArgs) -> CommandResult {
    if let Some(rate) = args.rate.filter(|r| !(r.is_finite() && *r > 0.0)) {
        return Err(format!("--rate {rate}: give a positive number of requests per second").into());
    }
    let configured = configure_providers(&Default::default())?;
    let provider =
        crate::replay::choose_provider(&configured, args.provider.as_deref(), &args.url[0])?;
    let config = crate::bench::BenchConfig {
        urls: args.url,
        provider,
        events: args.events,
        dup_ratio: args.dup_ratio.max(0.0),
        concurrency: args.concurrency.max(1),
        max_seconds: args.max_seconds,
        threads: args.threads.max(1),
        rate: args.rate,
        random_ids: args.random_ids,
        retry: args.retry,
        check_db: args.check_db,
        force: args.force,
        cleanup: args.cleanup.then_some(args.mail_dir),
    };
    let report = crate::bench::run_bench(&config)?;
    crate::outln!(
        "{}",
        serde_json::to_string(&report).expect("a report serialises")
    );
    write_stdout(format_args!("{}", report.table()));
    match report.failure() {
        None => DONE,
        Some(why) => Err(why.into()),
    }
}

pub(super) fn replay(args: ReplayArgs) -> CommandResult {
    let configured = configure_providers(&Default::default())?;
    let provider =
        crate::replay::choose_provider(&configured, args.provider.as_deref(), &args.url)?;
    let all_accepted = actix_web::rt::System::new().block_on(crate::replay::replay_files(
        &args.url,
        provider.as_ref(),
        &args.files,
        &args.sets,
        SystemClock.now_unix(),
    ))?;
    // Each refused file was reported as it was sent.
    Ok(if all_accepted {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

pub(super) fn relay(args: RelayCommandArgs) -> CommandResult {
    crate::telemetry::init();
    raise_open_file_limit();
    let (config, mail) = args.relay.into_config(args.db.db, RelayHost::Alone);
    // Validated first: `check` creates the mail directory.
    config.validate(mail.uses_http_api())?;
    mail.check()?;
    actix_web::rt::System::new().block_on(async move {
        let shutdown = tokio_util::sync::CancellationToken::new();
        let on_signal = shutdown.clone();
        actix_web::rt::spawn(async move {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("SIGTERM handler");
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            on_signal.cancel();
        });
        let clock: crate::clock::SharedClock = Arc::new(SystemClock);
        // Its own write connection: a writer of its own, which commits each claim and each
        // batch of results in one transaction.
        let store: Arc<dyn Store> = crate::store::open(
            &config.db,
            crate::store::Options {
                batch_max: crate::config::DEFAULT_BATCH_MAX,
                queue_capacity: crate::config::DEFAULT_QUEUE_CAPACITY,
                pg_writers: crate::store::DEFAULT_PG_WRITERS,
                busy_timeout: config.busy_timeout,
                max_page_count: None,
                reread: None,
                must_exist: true,
                commit_faults: Default::default(),
            },
            clock.clone(),
        )
        .map_err(OpenError::from)?;
        let queue = crate::jobs::relay::Queue::own(store.clone());
        let result = crate::jobs::relay::run_relay(config, mail, clock, shutdown, queue).await;
        let _ = actix_web::rt::task::spawn_blocking(move || store.shutdown()).await;
        Ok::<_, Box<dyn std::error::Error>>(result?)
    })?;
    DONE
}

/// An outbox row as `outbox list --json` and `outbox show` print it: its columns, and when a
/// relay will really try it next.
#[derive(serde::Serialize)]
struct ShownRow<'a> {
    #[serde(flatten)]
    row: &'a OutboxRow,
    /// The earliest a relay may claim the row, as of the command's run: null for a sent, dead
    /// or skipped row; for one under a live lease, the lease's end (the row is being sent, and
    /// is tried again then only if its relay died), not its `next_attempt_at`, which has
    /// passed; else its `next_attempt_at`. A time at or before the command's run (the table's
    /// `now`) means due: the next relay to look claims it.
    next_try_at: Option<String>,
}

impl<'a> ShownRow<'a> {
    fn at(row: &'a OutboxRow, now_ms: i64) -> Self {
        let next_try_at = match row.next_try(now_ms) {
            NextTry::Never => None,
            NextTry::Now { since } => Some(since),
            NextTry::At(at) => Some(at),
            NextTry::Leased { until, .. } => Some(until),
        };
        ShownRow { row, next_try_at }
    }
}

/// What `outbox skip` and `forward skip` print: the change on stdout, or why there was none
/// as the command's error.
fn report_skip(row: &str, id: i64, skipped: Skipped, meaning: &str) -> CommandResult {
    let refused = match skipped {
        Skipped::Skipped { was } => {
            crate::outln!("{row} {id}: {was} -> skipped ({meaning})");
            return DONE;
        }
        Skipped::Leased { owner, until } => format!(
            "{row} {id} is being sent by {} (its lease runs until {until}); skip it after that \
             if it is still pending",
            Escaped(&owner)
        ),
        Skipped::Finished { status } => format!("{row} {id} is {status} already"),
        Skipped::Missing => format!("no {row} with id {id}"),
    };
    Err(refused.into())
}

pub(super) fn outbox(command: OutboxCommand) -> CommandResult {
    let (db, writable) = match &command {
        OutboxCommand::List { db, .. } | OutboxCommand::Show { db, .. } => (db, false),
        OutboxCommand::Retry { db, .. } | OutboxCommand::Skip { db, .. } => (db, true),
    };
    let store = open_maintenance(db, writable)?;
    match command {
        OutboxCommand::List {
            status,
            order_id,
            since,
            limit,
            json,
            ..
        } => {
            let rows = store.outbox(&OutboxQuery {
                status,
                order_id,
                since_unix: since.map(|s| s.unix(SystemClock.now_unix())),
                limit,
            })?;
            let now_ms = SystemClock.now_millis();
            if json {
                for row in &rows {
                    print_json_line(&ShownRow::at(row, now_ms));
                }
                return DONE;
            }
            let rows = rows.into_iter().map(|r| {
                let next_try = match r.next_try(now_ms) {
                    NextTry::Never => "-".to_owned(),
                    NextTry::Now { .. } => "now".to_owned(),
                    NextTry::At(at) => at,
                    NextTry::Leased { owner, until } => format!("leased by {owner} until {until}"),
                };
                [
                    r.id.to_string(),
                    r.status,
                    r.attempts.to_string(),
                    r.template,
                    r.order_id,
                    next_try,
                    r.last_error.unwrap_or_default(),
                ]
            });
            print_columns(
                [
                    "ID",
                    "STATUS",
                    "ATTEMPTS",
                    "TEMPLATE",
                    "ORDER_ID",
                    "NEXT_TRY",
                    "LAST_ERROR",
                ],
                rows.collect(),
            );
        }
        OutboxCommand::Show { id, json, .. } => {
            let row = store
                .outbox_row(id)?
                .ok_or_else(|| format!("no outbox row with id {id}"))?;
            let shown = ShownRow::at(&row, SystemClock.now_millis());
            if json {
                print_json_line(&shown);
            } else {
                // Escaped as a line of JSON is (see `print_json_line`).
                let pretty = serde_json::to_string_pretty(&shown).expect("a row serialises");
                crate::outln!("{}", escaped_json(&pretty));
            }
        }
        OutboxCommand::Retry { id, .. } => {
            let refused = match store.retry(id, SystemClock.now_millis())? {
                Retried::Revived => {
                    crate::outln!("outbox row {id}: dead -> pending");
                    return DONE;
                }
                Retried::DueNow { was, attempts } => {
                    crate::outln!(
                        "outbox row {id}: pending, due now (was due at {was}; attempts kept: \
                         {attempts})"
                    );
                    return DONE;
                }
                Retried::Leased { owner, until } => format!(
                    "outbox row {id} is being sent by {} (its lease runs until {until}); if that \
                     relay died, the row is tried again then",
                    Escaped(&owner)
                ),
                Retried::Finished { status } => {
                    let why = match status.as_str() {
                        "sent" => "the transport confirmed it",
                        "skipped" => "it has no recipient address",
                        _ => "there is nothing to send again",
                    };
                    format!(
                        "outbox row {id} is {status}: {why} (only pending and dead rows can be \
                         retried)"
                    )
                }
                Retried::Missing => format!("no outbox row with id {id}"),
            };
            return Err(refused.into());
        }
        OutboxCommand::Skip { id, .. } => {
            let skipped = store.skip_email(id, SystemClock.now_millis())?;
            return report_skip("outbox row", id, skipped, "never sent");
        }
    }
    DONE
}

pub(super) fn forward(command: ForwardCommand) -> CommandResult {
    let (db, writable) = match &command {
        ForwardCommand::NewSecret => {
            let secret = crate::forward::new_secret()
                .map_err(|e| format!("the operating system gave no random bytes: {e}"))?;
            crate::outln!("{secret}");
            return DONE;
        }
        ForwardCommand::List { db, .. } | ForwardCommand::Show { db, .. } => (db, false),
        ForwardCommand::Retry { db, .. } | ForwardCommand::Skip { db, .. } => (db, true),
    };
    let store = open_maintenance(db, writable)?;
    match command {
        ForwardCommand::NewSecret => unreachable!("answered above"),
        ForwardCommand::List {
            status,
            order_id,
            since,
            limit,
            json,
            ..
        } => {
            let rows = store.forwards(&OutboxQuery {
                status,
                order_id,
                since_unix: since.map(|s| s.unix(SystemClock.now_unix())),
                limit,
            })?;
            if json {
                for row in &rows {
                    print_json_line(row);
                }
                return DONE;
            }
            let rows = rows.into_iter().map(|r| {
                let next_try = match (&r.lease_owner, &r.lease_until, &r.next_attempt_at) {
                    (Some(owner), Some(until), _) if r.status == "pending" => {
                        format!("leased by {owner} until {until}")
                    }
                    (_, _, Some(at)) => at.clone(),
                    _ => "-".to_owned(),
                };
                [
                    r.id.to_string(),
                    r.status,
                    r.attempts.to_string(),
                    r.kind,
                    r.order_id,
                    r.message_id,
                    next_try,
                    r.last_error.unwrap_or_default(),
                ]
            });
            print_columns(
                [
                    "ID",
                    "STATUS",
                    "ATTEMPTS",
                    "TYPE",
                    "ORDER_ID",
                    "WEBHOOK_ID",
                    "NEXT_TRY",
                    "LAST_ERROR",
                ],
                rows.collect(),
            );
        }
        ForwardCommand::Show { id, json, .. } => {
            let (row, body) = store
                .forward_row(id)?
                .ok_or_else(|| format!("no forwarding row with id {id}"))?;
            let message: serde_json::Value =
                serde_json::from_str(&body).expect("the store's own JSON");
            let shown = serde_json::json!({ "row": row, "message": message });
            if json {
                print_json_line(&shown);
            } else {
                let pretty = serde_json::to_string_pretty(&shown).expect("a row serialises");
                crate::outln!("{}", escaped_json(&pretty));
            }
        }
        ForwardCommand::Retry { id, .. } => {
            let refused = match store.retry_forward(id, SystemClock.now_millis())? {
                Retried::Revived => {
                    crate::outln!("forwarding row {id}: dead -> pending");
                    return DONE;
                }
                Retried::DueNow { was, attempts } => {
                    crate::outln!(
                        "forwarding row {id}: pending, due now (was due at {was}; attempts kept: \
                         {attempts}); it goes once no earlier change of its order is pending"
                    );
                    return DONE;
                }
                Retried::Leased { owner, until } => format!(
                    "forwarding row {id} is being sent by {} (its lease runs until {until})",
                    Escaped(&owner)
                ),
                Retried::Finished { status } => format!(
                    "forwarding row {id} is {status}: there is nothing to send again (only \
                     pending and dead rows can be retried)"
                ),
                Retried::Missing => format!("no forwarding row with id {id}"),
            };
            return Err(refused.into());
        }
        ForwardCommand::Skip { id, .. } => {
            let skipped = store.skip_forward(id, SystemClock.now_millis())?;
            return report_skip(
                "forwarding row",
                id,
                skipped,
                "never sent; its order's later changes may go",
            );
        }
    }
    DONE
}

/// Who runs the command, for the audit trail: the person behind `sudo` (`SUDO_USER`), else the
/// login name of the environment (`USER`, `LOGNAME`), else the name of the process's user id.
fn os_user() -> Result<String, String> {
    ["SUDO_USER", "USER", "LOGNAME"]
        .iter()
        .filter_map(|name| std::env::var(name).ok())
        .find(|value| !value.trim().is_empty())
        .map_or_else(
            || {
                whoami::username()
                    .map_err(|e| format!("cannot tell who you are ({e}); name yourself with --by"))
            },
            Ok,
        )
}

pub(super) fn set_status(
    id: &str,
    status: OrderStatus,
    reason: String,
    by: Option<String>,
    db: &DbArgs,
) -> CommandResult {
    if reason.trim().is_empty() {
        return Err(
            "--reason is empty: say why the order is moved (it is kept in its history)".into(),
        );
    }
    let operator = match by.filter(|b| !b.trim().is_empty()) {
        Some(name) => name,
        None => os_user()?,
    };
    let change = OperatorChange {
        status,
        operator,
        reason,
    };
    let previous =
        open_maintenance(db, true)?.set_status_by_operator(id, &change, SystemClock.now_unix())?;
    crate::outln!(
        "order {}: {previous} -> {status} (by {})",
        Escaped(id),
        Escaped(&change.operator)
    );
    DONE
}

pub(super) fn events(command: EventsCommand) -> CommandResult {
    let db = match &command {
        EventsCommand::List { db, .. } | EventsCommand::Show { db, .. } => db,
    };
    let store = open_maintenance(db, false)?;
    match command {
        EventsCommand::List {
            limit,
            provider,
            outcome,
            order_id,
            since,
            json,
            ..
        } => {
            let rows = store.events(&EventQuery {
                provider,
                outcome,
                order_id,
                since_unix: since.map(|s| s.unix(SystemClock.now_unix())),
                ..EventQuery::newest(limit)
            })?;
            if json {
                rows.iter().for_each(print_json_line);
                return DONE;
            }
            let rows = rows.into_iter().map(|row| {
                [
                    row.received_at,
                    row.provider,
                    row.outcome,
                    row.event_type,
                    row.order_id.unwrap_or_else(|| "-".into()),
                    row.event_id,
                ]
            });
            print_columns(
                [
                    "RECEIVED_AT",
                    "PROVIDER",
                    "OUTCOME",
                    "EVENT_TYPE",
                    "ORDER_ID",
                    "EVENT_ID",
                ],
                rows.collect(),
            );
        }
        EventsCommand::Show {
            id, provider, json, ..
        } => {
            let rows = store.find_events(&id, provider.as_deref())?;
            if rows.is_empty() {
                return Err(format!("no stored event with id {id}").into());
            }
            if json {
                rows.iter().for_each(print_json_line);
                return DONE;
            }
            for row in rows {
                let s = &row.summary;
                let field = |text: &str| Escaped(text).to_string();
                crate::outln!("provider:          {}", field(&s.provider));
                crate::outln!("event_id:          {}", field(&s.event_id));
                crate::outln!("event_type:        {}", field(&s.event_type));
                crate::outln!(
                    "order_id:          {}",
                    field(s.order_id.as_deref().unwrap_or("-"))
                );
                crate::outln!("outcome:           {}", s.outcome);
                crate::outln!("received_at:       {}", s.received_at);
                crate::outln!("expires_at:        {}", s.expires_at);
                crate::outln!(
                    "payment_intent_id: {}",
                    field(row.payment_intent_id.as_deref().unwrap_or("-"))
                );
                crate::outln!("payload:\n{}", escaped_block(row.payload.trim_end()));
            }
        }
    }
    DONE
}
