//! The command line's arguments: what each command takes, its defaults and its checks. What the
//! commands do is in `cli::commands`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::config;

#[derive(Debug, Parser)]
#[command(
    name = "sekali",
    version,
    about = "Exactly-once Stripe, Midtrans and Xendit webhook receiver on SQLite"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Receive webhooks. Each provider's secret comes from the environment (see below); at
    /// least one must be set.
    #[command(after_help = serve_environment())]
    Serve(Box<ServeArgs>),
    /// Delete expired event ids, and expired Idempotency-Keys of the orders API with their
    /// stored responses, now (one purge pass, as serve's purge job runs every
    /// --purge-interval), and print how many of each.
    Purge(DbArgs),
    /// Copy the database while sekali runs (SQLite online backup), then check the copy.
    Backup(BackupArgs),
    /// Copy a whole database to another engine: a shop moving from the embedded SQLite file to
    /// PostgreSQL (`--from sekali.db --to postgres://…`), or back. Every table and row, from one
    /// consistent snapshot, into a new, empty target (refused otherwise), with each table's
    /// row count checked. Stop `serve` first: what it writes after the snapshot is not copied.
    Copy(CopyArgs),
    /// Sign fixture files as the provider would and POST them to a running sekali.
    Replay(ReplayArgs),
    /// Load generator: send signed deliveries to a running sekali and report throughput and
    /// latency (secrets from the same environment variables as serve).
    Bench(BenchArgs),
    /// Inspect processed events (read-only).
    #[command(subcommand)]
    Events(EventsCommand),
    /// Operator actions on orders.
    #[command(subcommand)]
    Orders(OrdersCommand),
    /// Run the outbox relay alone (for a separate process); `serve` runs one too unless
    /// --no-relay.
    Relay(RelayCommandArgs),
    /// Inspect the email outbox, and send a waiting or dead row now.
    #[command(subcommand)]
    Outbox(OutboxCommand),
    /// Inspect the order changes forwarded to the shop's endpoint, retry or skip one; make a
    /// signing secret.
    #[command(subcommand)]
    Forward(ForwardCommand),
}

/// `serve --help` ends with the settings that have no flag: secrets never go on a command line
/// (where `ps` shows them), and the mail transport is chosen by which of them is set. Each
/// provider's come from its registration.
fn serve_environment() -> String {
    let mut rows: Vec<(&str, String)> = Vec::new();
    for registration in crate::providers::REGISTRY {
        for (name, what) in registration.environment {
            rows.push((name, (*what).to_owned()));
        }
    }
    rows.extend([
        (
            config::ENV_API_TOKENS,
            "name:token pairs, comma-separated, for the orders API (unset: it is off)".to_owned(),
        ),
        (
            config::ENV_CONSOLE_TOKENS,
            "name:token pairs for the operator console at /console (unset: the API's; neither: off)"
                .to_owned(),
        ),
        (
            crate::forward::ENV_URL,
            "forward every order change to the shop's endpoint, http(s)://... (unset: off)"
                .to_owned(),
        ),
        (
            crate::forward::ENV_SECRET,
            "its Standard Webhooks secrets, whsec_..., comma-separated (sekali forward new-secret)"
                .to_owned(),
        ),
        (
            "SEKALI_SMTP_URL",
            "send emails over SMTP (smtp://user:pass@host:587 or smtps://...)".to_owned(),
        ),
        (
            "SEKALI_MAIL_API_URL",
            "else send them to an HTTP email API, with SEKALI_MAIL_API_KEY".to_owned(),
        ),
        (
            "SEKALI_MAIL_FROM",
            "the sender (default sekali@localhost; may be \"Shop <shop@example.com>\")".to_owned(),
        ),
        ("RUST_LOG", "log verbosity (default info)".to_owned()),
    ]);
    let width = rows.iter().map(|(name, _)| name.len()).max().unwrap_or(0);
    let mut text = String::from("Settings read only from the environment:\n");
    for (name, what) in rows {
        text.push_str(&format!("  {name:<width$}  {what}\n"));
    }
    text.push_str(
        "Neither SMTP nor an API set: emails are written as .eml files to --mail-dir.\n\n",
    );
    text.push_str("Provider options (--provider-option NAME.OPTION=VALUE; every provider also takes retention):\n");
    for registration in crate::providers::REGISTRY {
        for (option, what) in registration.options {
            text.push_str(&format!("  {}.{option}  {what}\n", registration.name));
        }
    }
    text
}

/// On or off, for a setting that has no third value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Switch {
    On,
    Off,
}

/// A duration such as `90s`, `12h` or `30d`, longer than zero: a zero interval would spin and
/// a zero retention would keep nothing.
fn positive_duration(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(d) if d.is_zero() => Err("must be longer than zero".into()),
        Ok(d) => Ok(d),
        Err(e) => Err(e.to_string()),
    }
}

/// A duration as [`positive_duration`] takes it, kept as its text (the provider parses it).
fn positive_duration_text(text: &str) -> Result<String, String> {
    positive_duration(text).map(|_| text.to_owned())
}

/// `NAME=DURATION`, for a registered provider.
fn provider_retention(text: &str) -> Result<(String, String), String> {
    let (name, duration) = text
        .split_once('=')
        .ok_or("expected NAME=DURATION, such as stripe=30d")?;
    registered(name)?;
    positive_duration(duration)?;
    Ok((name.to_owned(), duration.to_owned()))
}

/// `NAME.OPTION=VALUE`, for a registered provider.
fn provider_option(text: &str) -> Result<((String, String), String), String> {
    let (key, value) = text
        .split_once('=')
        .ok_or("expected NAME.OPTION=VALUE, such as midtrans.status-check=off")?;
    let (name, option) = key
        .split_once('.')
        .ok_or("expected NAME.OPTION=VALUE, such as midtrans.status-check=off")?;
    registered(name)?;
    Ok(((name.to_owned(), option.to_owned()), value.to_owned()))
}

fn registered(name: &str) -> Result<(), String> {
    if crate::providers::is_registered(name) {
        Ok(())
    } else {
        Err(format!(
            "no provider is called `{name}` (known: {})",
            crate::providers::known()
        ))
    }
}

/// A registered provider's name, for `--provider`.
fn provider_name(text: &str) -> Result<String, String> {
    registered(text).map(|()| text.to_owned())
}

pub use crate::clock::Since;

/// What `--since` takes; the help of each listing's `--since` says the same.
const SINCE_FORMS: &str = "expected a duration such as 90s, 1h or 2d (that long ago), or an RFC \
    3339 time such as 2026-11-29T10:15:02Z (as the listings print it) or \
    2026-11-29T17:15:02+07:00";

/// `--since`: see [`crate::clock::parse_since`].
fn since(text: &str) -> Result<Since, String> {
    crate::clock::parse_since(text).ok_or_else(|| SINCE_FORMS.to_owned())
}

/// A stored outcome's name, for `events list --outcome`.
fn stored_outcome() -> impl clap::builder::TypedValueParser<Value = crate::domain::Outcome> {
    use crate::domain::Outcome;
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(Outcome::STORED.map(Outcome::as_str)).map(|name| {
        Outcome::STORED
            .into_iter()
            .find(|outcome| outcome.as_str() == name)
            .expect("a possible value names a stored outcome")
    })
}

/// An `http://` or `https://` URL with a host.
fn http_url(text: &str) -> Result<String, String> {
    match text.parse::<awc::http::Uri>() {
        Ok(uri) if matches!(uri.scheme_str(), Some("http" | "https")) && uri.host().is_some() => {
            Ok(text.trim_end_matches('/').to_owned())
        }
        _ => Err("expected an http:// or https:// URL such as https://api.midtrans.com".into()),
    }
}

#[derive(Debug, Args)]
pub struct DbArgs {
    /// The database: a SQLite file, or a PostgreSQL URL (postgres://user@host/db).
    #[arg(long, env = "SEKALI_DB", default_value = "sekali.db")]
    pub db: crate::store::Location,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "SEKALI_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// Serve `GET /metrics` on this address instead of --listen's (an address Prometheus
    /// reaches and the internet does not); --listen then answers /metrics with 404.
    #[arg(long, env = "SEKALI_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// The database: a SQLite file (created if missing), or a PostgreSQL URL
    /// (postgres://user@host/db; several hosts with target_session_attrs=read-write follow a
    /// failover; the password from the URL or PGPASSWORD).
    #[arg(long, env = "SEKALI_DB", default_value = "sekali.db")]
    pub db: crate::store::Location,
    /// Accepted distance in seconds between a Stripe signature's timestamp and now, both ways
    /// [default: 300] (the option stripe.tolerance).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub stripe_tolerance: Option<u64>,
    /// Largest accepted request body in bytes; larger ones get 413.
    #[arg(long, default_value_t = config::DEFAULT_MAX_BODY_BYTES,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1024..))]
    pub max_body_bytes: usize,
    /// How long a request's body may take to arrive once its headers have; a body that stalls
    /// or trickles past it gets 408 and its connection is closed.
    #[arg(long, default_value = "10s", value_parser = positive_duration)]
    pub body_timeout: Duration,
    /// How long Stripe event ids are remembered, longer than Stripe's 30-day resend window
    /// [default: 30d] (the same as --retention stripe=DURATION).
    #[arg(long, value_parser = positive_duration_text)]
    pub stripe_retention: Option<String>,
    /// How long Midtrans event ids are remembered, longer than its retries of about 6 hours
    /// [default: 7d] (the same as --retention midtrans=DURATION).
    #[arg(long, value_parser = positive_duration_text)]
    pub midtrans_retention: Option<String>,
    /// How long a provider's event ids are remembered, as NAME=DURATION (xendit=14d);
    /// repeatable. Each provider's default outlasts its redelivery window.
    #[arg(long = "retention", value_name = "NAME=DURATION", value_parser = provider_retention)]
    pub retentions: Vec<(String, String)>,
    /// A provider's setting, as NAME.OPTION=VALUE (midtrans.status-check=off); repeatable. The
    /// options are listed below.
    #[arg(long = "provider-option", value_name = "NAME.OPTION=VALUE", value_parser = provider_option)]
    pub provider_options: Vec<((String, String), String)>,
    /// How often expired event ids are purged.
    #[arg(long, default_value = "1h", value_parser = positive_duration)]
    pub purge_interval: Duration,
    /// Most deliveries committed by one transaction (1 = one transaction per delivery).
    #[arg(long, default_value_t = config::DEFAULT_BATCH_MAX as u32, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub batch_max: u32,
    /// PostgreSQL only: writer threads of this instance, each with a connection of its own,
    /// committing batches side by side [default: 2]. With several instances on one database,
    /// fewer per instance make bigger batches: keep the writers of all instances together near
    /// the database server's cores (docs/postgres.md#sizing). SQLite has one writer.
    #[arg(long, env = "SEKALI_PG_WRITERS",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    pub pg_writers: Option<usize>,
    /// Deliveries that may wait for the writer before new ones get 503 with Retry-After.
    #[arg(long, default_value_t = config::DEFAULT_QUEUE_CAPACITY,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub queue_capacity: usize,
    /// How long Idempotency-Keys of the orders API and their stored responses are kept.
    #[arg(long, default_value = "24h", value_parser = positive_duration)]
    pub idempotency_retention: Duration,
    /// HTTP worker threads, at most 512 (0: one per core).
    #[arg(long, default_value_t = 0,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=512))]
    pub workers: usize,
    /// Do not run the outbox relay in this process (run `sekali relay` elsewhere), nor send
    /// forwarded changes (they are still queued, for an instance without this flag).
    #[arg(long)]
    pub no_relay: bool,
    /// Confirm each Midtrans notification with Midtrans's status API before applying it
    /// [default: on, or SEKALI_MIDTRANS_STATUS_CHECK]. The signature covers no
    /// transaction_status; with `off`, a status forged within its status code's class (a refund
    /// signed as a settlement) is believed.
    #[arg(long, value_enum)]
    pub midtrans_status_check: Option<Switch>,
    /// Base URL of Midtrans's status API [default: MIDTRANS_API_URL, else
    /// https://api.sandbox.midtrans.com for a sandbox key (SB-...), else
    /// https://api.midtrans.com].
    #[arg(long, value_parser = http_url)]
    pub midtrans_api_url: Option<String>,
    #[command(flatten)]
    pub relay: RelayArgs,
}

/// How the relay sends: SEKALI_SMTP_URL (smtp:// or smtps://user:pass@host), else
/// SEKALI_MAIL_API_URL with SEKALI_MAIL_API_KEY (an HTTP email API), else .eml files in
/// --mail-dir. Sender: SEKALI_MAIL_FROM (default sekali@localhost).
#[derive(Debug, Args)]
pub struct RelayArgs {
    /// Where emails are written when no SMTP server or email API is configured.
    #[arg(long, default_value = "mail")]
    pub mail_dir: PathBuf,
    /// Backoff base: after failure n the delay is random(0, min(max, base*2^(n-1))).
    #[arg(long, default_value = "30s", value_parser = positive_duration)]
    pub relay_base_delay: Duration,
    /// Backoff cap (also caps a server's Retry-After).
    #[arg(long, default_value = "1h", value_parser = positive_duration)]
    pub relay_max_delay: Duration,
    /// Transport tries before a row is dead.
    #[arg(long, default_value_t = crate::jobs::relay::DEFAULT_MAX_ATTEMPTS)]
    pub relay_max_attempts: u32,
    /// How long a relay holds the rows it claimed; longer than the transport timeout.
    #[arg(long, default_value = "5m", value_parser = positive_duration)]
    pub relay_lease: Duration,
    /// Longest a single send may take.
    #[arg(long, default_value = "30s", value_parser = positive_duration)]
    pub relay_timeout: Duration,
    /// How often an idle relay looks for due rows.
    #[arg(long, default_value = "1s", value_parser = positive_duration)]
    pub relay_poll_interval: Duration,
}

impl RelayArgs {
    pub(super) fn into_config(
        self,
        db: crate::store::Location,
        host: crate::jobs::relay::RelayHost,
    ) -> (
        crate::jobs::relay::RelayConfig,
        crate::mail::transport::MailConfig,
    ) {
        let mail = crate::mail::transport::MailConfig::from_env(self.mail_dir, self.relay_timeout);
        // Host and process for the operator to read (`outbox list` shows it), and a random
        // part: instances on one PostgreSQL database must never share an owner, and two
        // containers' processes can have the same host name (unset) and the same pid.
        let owner = format!(
            "{}:{}:{:08x}",
            std::env::var("HOSTNAME").unwrap_or_else(|_| "sekali".into()),
            std::process::id(),
            fastrand::u32(..)
        );
        let config = crate::jobs::relay::RelayConfig {
            db,
            busy_timeout: crate::config::DEFAULT_BUSY_TIMEOUT,
            base_delay: self.relay_base_delay,
            max_delay: self.relay_max_delay,
            max_attempts: self.relay_max_attempts,
            lease: self.relay_lease,
            transport_timeout: self.relay_timeout,
            batch: host.batch(mail.smtp_url.is_some() || mail.http_url.is_some()),
            poll_interval: self.relay_poll_interval,
            owner,
            from: mail.from.clone(),
            seed: None,
        };
        (config, mail)
    }
}

#[derive(Debug, Args)]
pub struct RelayCommandArgs {
    #[command(flatten)]
    pub db: DbArgs,
    #[command(flatten)]
    pub relay: RelayArgs,
}

#[derive(Debug, Subcommand)]
pub enum OutboxCommand {
    /// The newest outbox rows.
    List {
        #[command(flatten)]
        db: DbArgs,
        /// Only rows with this status.
        #[arg(long, value_parser = ["pending", "sent", "dead", "skipped"])]
        status: Option<String>,
        /// Only the emails of this order.
        #[arg(long = "order", value_name = "ORDER_ID")]
        order_id: Option<String>,
        /// Only rows queued at or after this time: a duration such as 90s, 1h or 2d (that long
        /// ago), or an RFC 3339 time such as 2026-11-29T10:15:02Z (as listed) or
        /// 2026-11-29T17:15:02+07:00.
        #[arg(long, value_parser = since)]
        since: Option<Since>,
        /// Most rows to print, newest first.
        #[arg(long, default_value_t = 20)]
        limit: u32,
        /// Print each row as one line of JSON with all its fields (JSON Lines, for jq) instead
        /// of the table.
        #[arg(long)]
        json: bool,
    },
    /// One row, with its parameters and last error (as indented JSON).
    Show {
        /// The row's id (the ID column of `outbox list`).
        id: i64,
        #[command(flatten)]
        db: DbArgs,
        /// Print the row as one line of JSON (as outbox list --json does) instead of indented.
        #[arg(long)]
        json: bool,
    },
    /// Send a row now: a pending row waiting for its next try becomes due now, its attempts
    /// kept; a dead row becomes pending and due now, its attempts reset. A sent or skipped row,
    /// or one a relay is sending, is left alone.
    Retry {
        /// The row's id (the ID column of `outbox list`).
        id: i64,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Never send a pending or dead email (its status becomes skipped, its last error says an
    /// operator did it). A sent or skipped row, or one a relay is sending, is left alone.
    Skip {
        /// The row's id (the ID column of `outbox list`).
        id: i64,
        #[command(flatten)]
        db: DbArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum ForwardCommand {
    /// The newest forwarding rows (one per order change while forwarding is on).
    List {
        #[command(flatten)]
        db: DbArgs,
        /// Only rows with this status.
        #[arg(long, value_parser = ["pending", "sent", "dead", "skipped"])]
        status: Option<String>,
        /// Only the changes of this order.
        #[arg(long = "order", value_name = "ORDER_ID")]
        order_id: Option<String>,
        /// Only rows queued at or after this time: a duration such as 90s, 1h or 2d (that long
        /// ago), or an RFC 3339 time.
        #[arg(long, value_parser = since)]
        since: Option<Since>,
        /// Most rows to print, newest first.
        #[arg(long, default_value_t = 20)]
        limit: u32,
        /// Print each row as one line of JSON (JSON Lines, for jq) instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// One row, with the message it sends (the change, as the shop receives it).
    Show {
        /// The row's id (the ID column of `forward list`).
        id: i64,
        #[command(flatten)]
        db: DbArgs,
        /// Print the row as one line of JSON instead of indented.
        #[arg(long)]
        json: bool,
    },
    /// Send a row now: a pending row waiting for its next try becomes due now, its attempts
    /// kept; a dead row becomes pending and due now, its attempts reset (its order's later
    /// changes follow it). A sent or skipped row, or one being sent, is left alone.
    Retry {
        /// The row's id (the ID column of `forward list`).
        id: i64,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Never send a pending or dead row, so that its order's later changes go (a dead row holds
    /// them). The shop does not receive that change; the change feed still has it.
    Skip {
        /// The row's id (the ID column of `forward list`).
        id: i64,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Print a new signing secret (whsec_ and 32 random bytes in base64), alone on stdout: for
    /// SEKALI_FORWARD_SECRET, and for the shop's verifier.
    NewSecret,
}

#[derive(Debug, Args)]
pub struct CopyArgs {
    /// The database to copy: a SQLite file, or a PostgreSQL URL.
    #[arg(long)]
    pub from: crate::store::Location,
    /// Where to copy it: a SQLite file that does not exist yet, or a PostgreSQL URL whose
    /// database holds no sekali data (its tables are created if missing).
    #[arg(long)]
    pub to: crate::store::Location,
}

#[derive(Debug, Args)]
pub struct BackupArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// Where to write the copy; must not exist yet.
    pub out: PathBuf,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// The webhook URL, e.g. http://127.0.0.1:8080/webhooks/stripe. Repeat it for several
    /// instances on one database: connections go to them in turn, so a redelivery, sent next
    /// on another connection, races its first delivery on another instance.
    #[arg(long, required = true)]
    pub url: Vec<String>,
    /// Provider to imitate; by default taken from the URL path.
    #[arg(long, value_parser = provider_name)]
    pub provider: Option<String>,
    /// Unique events to send.
    #[arg(long, default_value_t = 20_000)]
    pub events: usize,
    /// Redeliveries per unique event (0.2: one in six requests is a redelivery).
    #[arg(long, default_value_t = 0.2)]
    pub dup_ratio: f64,
    /// Concurrent keep-alive connections.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Stop sending after this many seconds.
    #[arg(long, default_value_t = 60.0)]
    pub max_seconds: f64,
    /// Client threads.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Offer this many requests per second, spread evenly over the connections, on a fixed
    /// schedule. A request that goes out late, because its connection was still waiting for an
    /// answer, is timed from when it was due, so a server that falls behind shows it (default:
    /// each connection sends as soon as its previous answer arrives).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Give events, PaymentIntents and orders ids in random order instead of ascending, as a
    /// shop with random (UUIDv4) order ids would see: several times the bytes written per
    /// delivery (see docs/performance.md, "Sizing your own deployment").
    #[arg(long)]
    pub random_ids: bool,
    /// Send a delivery answered 5xx (a full queue's 503, say) again after its Retry-After (1 s
    /// without one), re-signed, as the providers do, until it is answered otherwise or its next
    /// try could fall after --max-seconds. With --check-db, this shows that nothing refused
    /// under overload is lost.
    #[arg(long)]
    pub retry: bool,
    /// The database of the server bench sends to (a SQLite file, or a PostgreSQL URL). Before sending, bench refuses it when it
    /// holds orders that are not the load generator's (real orders; see --force); afterwards it
    /// checks that every unique event has exactly one row and one effect. Without it bench
    /// cannot see the database, and warns.
    #[arg(long)]
    pub check_db: Option<PathBuf>,
    /// Send even when --check-db holds orders that are not the load generator's: bench then
    /// writes thousands of paid orders (bench_RUN_N), each with a receipt the server's relay
    /// sends, into a database with real ones. Rather run it against a copy (sekali backup).
    #[arg(long)]
    pub force: bool,
    /// After the run and its check, delete every row the run wrote from --check-db (its events,
    /// orders, their transitions and payments, its emails) in one transaction, and its .eml
    /// files from --mail-dir. It first waits for the server's relay to finish sending any of
    /// the run's emails it holds (at most 6 minutes). Needs --check-db.
    #[arg(long, requires = "check_db")]
    pub cleanup: bool,
    /// The server's mail directory (serve's --mail-dir), where --cleanup removes the run's .eml
    /// files.
    #[arg(long, default_value = "mail")]
    pub mail_dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The webhook URL, e.g. http://127.0.0.1:8080/webhooks/stripe.
    #[arg(long)]
    pub url: String,
    /// Provider of the files; by default taken from the URL path.
    #[arg(long, value_parser = provider_name)]
    pub provider: Option<String>,
    /// Set a field of each file before it is signed, as PATH=VALUE; repeatable, applied in
    /// order. PATH is keys separated by dots, a number indexing an array
    /// (data.object.metadata.order_id, va_numbers.0.bank); missing objects are created. A field
    /// that exists keeps its JSON type (gross_amount=99000.00 stays a string; a number takes
    /// only a number); a new one takes VALUE as JSON when it is JSON, else as a string. Midtrans's
    /// signature_key is computed over the values set.
    #[arg(long = "set", value_name = "PATH=VALUE", value_parser = crate::replay::SetField::parse)]
    pub sets: Vec<crate::replay::SetField>,
    /// Event bodies to sign and send, in order.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum OrdersCommand {
    /// Move an order to any other status by hand (for example out of needs_review), recorded
    /// as an `operator` transition with who and why; the new status's customer email is queued.
    SetStatus {
        /// The order id.
        id: String,
        /// pending, paid, failed, cancelled, expired, partially_refunded, refunded, disputed or
        /// needs_review; not the status the order has.
        status: crate::domain::OrderStatus,
        /// Why the order is moved (kept with the transition, in the order's history).
        #[arg(long)]
        reason: String,
        /// Who moves it [default: the OS user: SUDO_USER, USER or LOGNAME, else the user id's
        /// name].
        #[arg(long)]
        by: Option<String>,
        #[command(flatten)]
        db: DbArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum EventsCommand {
    /// The newest processed events.
    List {
        #[command(flatten)]
        db: DbArgs,
        /// Most events to print, newest first.
        #[arg(long, default_value_t = 20)]
        limit: u32,
        /// Only events from this provider.
        #[arg(long, value_parser = provider_name)]
        provider: Option<String>,
        /// Only events stored with this outcome.
        #[arg(long, value_parser = stored_outcome())]
        outcome: Option<crate::domain::Outcome>,
        /// Only events of this order.
        #[arg(long = "order", value_name = "ORDER_ID")]
        order_id: Option<String>,
        /// Only events received at or after this time: a duration such as 90s, 1h or 2d (that
        /// long ago), or an RFC 3339 time such as 2026-11-29T10:15:02Z (as listed) or
        /// 2026-11-29T17:15:02+07:00.
        #[arg(long, value_parser = since)]
        since: Option<Since>,
        /// Print each event as one line of JSON with all its fields (JSON Lines, for jq)
        /// instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// One event with its stored payload.
    Show {
        /// The event id (Stripe evt_..., or the derived Midtrans id).
        id: String,
        #[command(flatten)]
        db: DbArgs,
        /// Only the event from this provider (two providers may use the same id).
        #[arg(long, value_parser = provider_name)]
        provider: Option<String>,
        /// Print each event as one line of JSON with all its fields, the payload as a string
        /// (JSON Lines, for jq).
        #[arg(long)]
        json: bool,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_a_duration_ago_or_an_rfc_3339_time_in_utc_or_with_an_offset() {
        assert_eq!(since("1h"), Ok(Since::Ago(Duration::from_secs(3600))));
        assert_eq!(since("1h").unwrap().unix(10_000), 6_400);
        assert_eq!(
            since("2d 3h").unwrap(),
            Since::Ago(Duration::from_secs(2 * 86_400 + 3 * 3600))
        );
        let utc = 1_795_947_302; // 2026-11-29T10:15:02Z
        assert_eq!(since("2026-11-29T10:15:02Z"), Ok(Since::At(utc)));
        assert_eq!(since("2026-11-29T10:15:02.750Z"), Ok(Since::At(utc)));
        assert_eq!(since("2026-11-29T17:15:02+07:00"), Ok(Since::At(utc)));
        assert_eq!(since("2026-11-29T05:15:02-05:00"), Ok(Since::At(utc)));
        assert_eq!(since("2026-11-29T10:15:02+00:00"), Ok(Since::At(utc)));
        assert_eq!(Since::At(utc).unix(0), utc);
        for wrong in [
            "yesterday",
            "2026-11-29",
            "2026-11-29T10:15:02",
            "2026-11-29T10:15:02+24:00",
            "2026-11-29T10:15:02Z+07:00",
            "2026-11-29 10:15:02Z",
            "+07:00",
            "ééééééé",
        ] {
            assert_eq!(since(wrong), Err(SINCE_FORMS.to_owned()), "{wrong}");
        }
    }
}
