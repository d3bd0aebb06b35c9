//! sekali ("once"): receives payment webhooks (Stripe, Midtrans, Xendit) and applies each
//! event's effects exactly once, durably, before answering 2xx.
//!
//! Layout (the folders are the architecture; a delivery walks down them in one line, and nothing
//! below calls back up):
//! - [`routes`]: thin HTTP handlers; one generic handler serves `/webhooks/{provider}` and maps
//!   errors onto each provider's retry protocol.
//! - [`providers`]: one module per provider behind the [`providers::Provider`] trait, listed in
//!   [`providers::REGISTRY`]: verify headers + raw body into a [`domain::NormalizedEvent`], sign
//!   for replay and tests; no HTTP server, no SQL.
//! - [`domain`]: newtypes, the forward-only order state machine, money, and the pure decision of
//!   what an event does to its order ([`domain::decide`]).
//! - [`store`]: the [`store::Store`] and [`store::Maintenance`] interfaces in domain types, and
//!   each engine in its own folder with all its SQL ([`store::sqlite`]: the schema, the single
//!   writer thread and the read pool).
//! - [`console`]: the operator console at `/console`, on the store's `Maintenance` interface.
//! - [`jobs`]: background work fed through the store (the purge of expired event ids, the
//!   outbox relay).
//! - [`mail`]: rendering emails and the file, SMTP and HTTP transports.
//! - [`clients`]: outbound HTTP to other services (Midtrans's status API).
//! - [`cli`]: the command line (arguments apart from commands); [`mod@bench`] and [`replay`] sign
//!   deliveries with the same providers the server verifies with.
//! - [`startup`]: builds the HTTP server from [`config::Settings`] and opens the store; tests
//!   build it on port 0.
//! - [`clock`]: injectable time; [`durable`]: directory syncs; [`open_files`]: the open-file
//!   limit, and [`connections`]: the connections it allows; [`telemetry`]: logging.

#![forbid(unsafe_code)]

/// `println!` for the commands' output on stdout (see [`cli::write_stdout`]): when the reader
/// has gone away, as in `sekali events list | head`, the rest is dropped instead of panicking.
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cli::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

pub mod bench;
pub mod cli;
pub mod clients;
pub mod clock;
pub mod config;
pub mod connections;
pub mod console;
pub mod domain;
pub mod durable;
pub mod forward;
pub mod jobs;
pub mod mail;
pub mod metrics;
pub mod open_files;
pub mod providers;
pub mod replay;
pub mod routes;
pub mod startup;
pub mod store;
pub mod telemetry;
