//! Black-box tests: the real HTTP server on port 0 with a temporary SQLite file, driven over
//! HTTP, and the real `sekali` binary for the commands.

mod cli;

mod bench_safety;
mod changes;
mod concurrency;
mod console;
mod environment;
mod forward;
mod helpers;
mod hostile;
mod inspect;
mod known_answers;
mod ledger;
mod ledger_model;
mod limits;
mod metrics;
mod midtrans;
mod midtrans_status;
mod migration;
mod ordering;
mod orders;
mod purge;
mod relay;
mod replay;
mod schema;
mod stalls;
mod startup;
mod stripe;
mod stripe_shapes;
mod xendit;
