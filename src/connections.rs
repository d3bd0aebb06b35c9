//! How many connections the server holds at once, and what it says when it holds them all.
//!
//! Every connection is an open file, and so is every file the process needs besides them: the
//! database and its WAL, the mail directory's unnamed files, a connection to Midtrans's status
//! API while a delivery waits for it. Left to actix's default (25,000 per worker), a flood of
//! connections that send nothing (or a body that never comes) used up the open-file limit: the
//! accept loop then logged `Too many open files` every 500 ms, and a signed delivery got no
//! answer at all. So the server takes at most [`connection_limit`] connections, sized from the
//! limit in force; past it, new connections wait in the kernel's listen backlog until the
//! header or body deadline ends a slow one, and [`ConnectionGauge`] says so once.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Open files kept for everything that is neither a connection nor an email: the database
/// (writer, read pool, each with its WAL and shared memory), the listener, each worker's event
/// loop, the blocking pool, stdio, and the mail transport's own connections (SMTP or the email
/// API, at most a batch of them).
pub const RESERVED_FILES: u64 = 128;

/// Fewer connections than this per worker would make the server useless; a limit that allows
/// no more is warned of at startup.
pub const MIN_CONNECTIONS_PER_WORKER: usize = 8;

/// actix's own default per worker, the most the limit is ever raised to.
pub const MAX_CONNECTIONS_PER_WORKER: usize = 25_000;

/// The connections one worker may hold, from the open-file limit in force (`open_files`): what
/// is left of it once the mail directory's files (`mail_files`: two batches of unnamed files can
/// be open at once) and [`RESERVED_FILES`] are set aside, divided by the files one connection
/// may hold (`files_per_connection`: its socket, and one more where a delivery asks a
/// provider's API before it is answered), and by the `workers` that share the listener.
pub fn connection_limit(
    open_files: u64,
    mail_files: u64,
    files_per_connection: u64,
    workers: usize,
) -> usize {
    let for_connections = open_files
        .saturating_sub(mail_files)
        .saturating_sub(RESERVED_FILES)
        / files_per_connection.max(1);
    let per_worker = for_connections / workers.max(1) as u64;
    usize::try_from(per_worker)
        .unwrap_or(usize::MAX)
        .clamp(MIN_CONNECTIONS_PER_WORKER, MAX_CONNECTIONS_PER_WORKER)
}

/// Counts the server's open connections, and says once when they reach the limit (the accept
/// loop then stops taking new ones) and once when the episode ends: under a flood that holds the
/// server at its limit, one line, not one per connection or per second. [`ConnectionGauge::report`]
/// runs once a second, beside the report of refused deliveries.
#[derive(Debug)]
pub struct ConnectionGauge {
    open: AtomicUsize,
    limit: usize,
    /// The open-file limit the connection limit was sized from, for the log line.
    open_files: u64,
    /// Set when a connection brings the count to the limit; taken by the next report.
    reached: AtomicBool,
    /// Connections accepted since the last report.
    accepted: AtomicU64,
    episode: std::sync::Mutex<Episode>,
}

/// What the reports know of the current stretch at the limit.
#[derive(Debug, Default)]
struct Episode {
    /// When the limit was first reached, while it lasts.
    since: Option<Instant>,
    /// When the connections last fell below nine tenths of the limit, while they stay there.
    calm_since: Option<Instant>,
    /// Connections accepted since it began.
    accepted: u64,
}

/// How long the connections must stay below nine tenths of the limit for a stretch at the limit
/// to be over: a flood whose connections the deadlines cut in bursts leaves the count low for a
/// moment each time, and that is not its end.
pub const CALM_BEFORE_REPORT: Duration = Duration::from_secs(10);

/// Held in a connection's extensions for as long as the connection lives; dropped with it.
#[derive(Debug)]
pub struct OpenConnection(Arc<ConnectionGauge>);

impl ConnectionGauge {
    /// A gauge for `limit` connections in all, sized from `open_files`.
    pub fn new(limit: usize, open_files: u64) -> Arc<Self> {
        Arc::new(ConnectionGauge {
            open: AtomicUsize::new(0),
            limit,
            open_files,
            reached: AtomicBool::new(false),
            accepted: AtomicU64::new(0),
            episode: Default::default(),
        })
    }

    /// Connections the server takes in all.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// A connection was accepted: counted until the returned guard is dropped.
    pub fn opened(self: &Arc<Self>) -> OpenConnection {
        let open = self.open.fetch_add(1, Ordering::Relaxed) + 1;
        self.accepted.fetch_add(1, Ordering::Relaxed);
        if open >= self.limit {
            self.reached.store(true, Ordering::Relaxed);
        }
        OpenConnection(self.clone())
    }

    /// Logs the start of a stretch at the limit, and its end once the connections have stayed
    /// below nine tenths of it for [`CALM_BEFORE_REPORT`]; nothing in between. Called once a
    /// second, at `now`.
    pub fn report(&self, now: Instant) {
        let reached = self.reached.swap(false, Ordering::Relaxed);
        let accepted = self.accepted.swap(0, Ordering::Relaxed);
        let open = self.open();
        let mut episode = self.episode.lock().expect("the gauge's lock");
        if reached {
            episode.calm_since = None;
            if episode.since.is_none() {
                episode.since = Some(now);
                episode.accepted = 0;
                tracing::warn!(
                    open,
                    limit = self.limit,
                    open_files = self.open_files,
                    "connection limit reached: new connections wait in the listen backlog until \
                     open ones end (a client that sends no request within 5 s, or no body within \
                     --body-timeout, is cut). The limit is sized from the open-file limit; raise \
                     that (ulimit -n, LimitNOFILE=) for more. Said again when it is over"
                );
            }
        }
        let Some(since) = episode.since else {
            return;
        };
        episode.accepted += accepted;
        if open >= self.limit / 10 * 9 {
            episode.calm_since = None;
            return;
        }
        let calm_since = *episode.calm_since.get_or_insert(now);
        if now.duration_since(calm_since) >= CALM_BEFORE_REPORT {
            tracing::info!(
                open,
                limit = self.limit,
                accepted = episode.accepted,
                lasted_s = calm_since.duration_since(since).as_secs(),
                "connections below the limit again"
            );
            *episode = Episode::default();
        }
    }

    fn closed(&self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.closed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_what_the_open_files_leave_per_connection_and_worker() {
        // 20,000 open files, two 256-file mail batches, the reserve: 19,360 for connections.
        assert_eq!(connection_limit(20_000, 512, 1, 2), 9_680);
        // A delivery that asks Midtrans holds two files.
        assert_eq!(connection_limit(20_000, 512, 2, 2), 4_840);
        // Without a relay there is no mail to set aside.
        assert_eq!(connection_limit(20_000, 0, 1, 1), 19_872);
        // The usual soft limit of 1,024: what is left is little, never nothing.
        assert_eq!(connection_limit(1_024, 512, 1, 2), 192);
        assert_eq!(connection_limit(256, 128, 2, 4), MIN_CONNECTIONS_PER_WORKER);
        // No limit at all: actix's own default.
        assert_eq!(
            connection_limit(u64::MAX, 512, 1, 2),
            MAX_CONNECTIONS_PER_WORKER
        );
    }

    #[test]
    fn the_gauge_counts_connections_until_their_guards_drop() {
        let gauge = ConnectionGauge::new(10, 100);
        let held: Vec<_> = (0..10).map(|_| gauge.opened()).collect();
        assert_eq!(gauge.open(), 10);
        drop(held);
        assert_eq!(gauge.open(), 0);
    }

    /// A stretch at the limit starts at the first report after the limit is reached and ends
    /// only after ten calm seconds: connections cut in bursts and the limit reached again do
    /// not end it.
    #[test]
    fn a_stretch_at_the_limit_ends_only_after_ten_calm_seconds() {
        let gauge = ConnectionGauge::new(10, 100);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let since = |g: &ConnectionGauge| g.episode.lock().unwrap().since;
        gauge.report(at(0));
        assert_eq!(since(&gauge), None);
        let mut held: Vec<_> = (0..10).map(|_| gauge.opened()).collect();
        gauge.report(at(1));
        assert_eq!(since(&gauge), Some(at(1)));
        for second in 2..30 {
            // Every other second the deadlines cut them all, and the flood fills the limit again.
            held.clear();
            gauge.report(at(second));
            held = (0..10).map(|_| gauge.opened()).collect();
        }
        assert_eq!(since(&gauge), Some(at(1)), "a flood is one stretch");
        held.clear();
        gauge.report(at(30));
        gauge.report(at(39));
        assert_eq!(since(&gauge), Some(at(1)));
        gauge.report(at(40));
        assert_eq!(since(&gauge), None, "ten calm seconds end it");
    }
}
