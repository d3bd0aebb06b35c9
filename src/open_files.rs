//! How many files the process may hold open.
//!
//! Most Linux systems start a process with a soft limit of 1,024 open files and a hard limit far
//! above it (systemd: 524,288). The mail directory holds a file open per email of a batch, from
//! its write until its name (see [`crate::mail::eml`]), and `sekali relay` writes 4,096 at once;
//! under the soft limit most of such a batch failed with "Too many open files". So `serve` and
//! `relay` raise the soft limit to the hard one when they start, as the Go runtime does for
//! every program, and the mail directory sizes its batches from what is then in force.

/// Raises the soft limit on open files to the hard limit. Returns the limit before and after
/// (the same when it was at the hard limit already, or could not be raised).
pub fn raise_limit() -> (u64, u64) {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

    let before = getrlimit(Resource::Nofile);
    let raised = Rlimit {
        current: before.maximum,
        maximum: before.maximum,
    };
    if before.current != before.maximum {
        if let Err(e) = setrlimit(Resource::Nofile, raised) {
            tracing::warn!(error = %e, "could not raise the open-file limit to its hard limit");
        }
    }
    (before.current.unwrap_or(u64::MAX), soft_limit())
}

/// The soft limit on open files now in force (`u64::MAX`: none).
pub fn soft_limit() -> u64 {
    rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX)
}
