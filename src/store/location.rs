//! Where the database is, and opening it: the one place that picks an engine. Everything
//! outside `store/` names a [`Location`] and gets a [`Store`] or a [`Maintenance`], never an
//! engine's type.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::{postgres, sqlite, CommitFaults, Maintenance, Store, StoreError};
use crate::clock::SharedClock;

/// The database of `--db` (or `SEKALI_DB`): a SQLite file, the embedded default, or a
/// PostgreSQL URL (`postgres://…` or `postgresql://…`). Shown without a password.
#[derive(Clone, PartialEq, Eq)]
pub enum Location {
    File(PathBuf),
    /// The URL as given; read when the database is opened, so that a mistake in it is reported
    /// by sekali, which never repeats a password, rather than by the argument parser.
    Server(String),
}

impl Location {
    /// The SQLite file, if this is one.
    pub fn file(&self) -> Option<&Path> {
        match self {
            Location::File(path) => Some(path),
            Location::Server(_) => None,
        }
    }
}

impl From<&str> for Location {
    fn from(text: &str) -> Self {
        if postgres::connect::is_url(text) {
            Location::Server(text.to_owned())
        } else {
            Location::File(PathBuf::from(text))
        }
    }
}

impl From<PathBuf> for Location {
    fn from(path: PathBuf) -> Self {
        match path.to_str() {
            Some(text) if postgres::connect::is_url(text) => Location::Server(text.to_owned()),
            _ => Location::File(path),
        }
    }
}

impl std::str::FromStr for Location {
    type Err = std::convert::Infallible;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Ok(Location::from(text))
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::File(path) => write!(f, "{}", path.display()),
            Location::Server(url) => f.write_str(&postgres::connect::redact(url)),
        }
    }
}

impl fmt::Debug for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Location({self})")
    }
}

/// How the server's store runs.
#[derive(Clone)]
pub struct Options {
    /// Most units of work committed by one transaction.
    pub batch_max: usize,
    /// Deliveries waiting for the writer before new ones get 503.
    pub queue_capacity: usize,
    /// PostgreSQL: writer threads, each with a connection of its own.
    pub pg_writers: usize,
    /// SQLite: how long a statement waits for another process's lock.
    pub busy_timeout: Duration,
    /// SQLite: caps the database at this many pages.
    pub max_page_count: Option<u64>,
    /// Reads stored bodies back (the SQLite ledger's rebuild of an older database).
    pub reread: Option<sqlite::events::RereadStored>,
    /// Refuse a database that does not exist yet (`sekali relay`), rather than create it.
    pub must_exist: bool,
    pub commit_faults: CommitFaults,
}

/// Opens the server's store at `location`: creates the database's tables if it is new (unless
/// `options.must_exist`), migrates it, and starts its writer.
pub fn open(
    location: &Location,
    options: Options,
    clock: SharedClock,
) -> Result<Arc<dyn Store>, StoreError> {
    Ok(match location {
        Location::File(path) => {
            let config = sqlite::WriterConfig {
                db_path: path.clone(),
                batch_max: options.batch_max,
                queue_capacity: options.queue_capacity,
                busy_timeout: options.busy_timeout,
                max_page_count: options.max_page_count,
                reread: options.reread,
                commit_faults: options.commit_faults,
            };
            if options.must_exist {
                Arc::new(sqlite::SqliteStore::open_existing(config, clock)?)
            } else {
                Arc::new(sqlite::SqliteStore::open(config, clock)?)
            }
        }
        Location::Server(url) => Arc::new(postgres::PgStore::open(
            postgres::WriterConfig {
                target: postgres::Target::parse(url)?,
                writers: options.pg_writers,
                batch_max: options.batch_max,
                queue_capacity: options.queue_capacity,
                commit_faults: options.commit_faults,
            },
            clock,
        )?),
    })
}

/// An operator's connection to the database at `location`, which must exist; `writable`
/// brings its schema up to date.
pub fn maintenance(
    location: &Location,
    writable: bool,
) -> Result<Box<dyn Maintenance>, StoreError> {
    Ok(match location {
        Location::File(path) => Box::new(sqlite::SqliteMaintenance::open(path, writable)?),
        Location::Server(url) => Box::new(postgres::PgMaintenance::open(
            &postgres::Target::parse(url)?,
            writable,
        )?),
    })
}

#[cfg(test)]
mod tests {
    use super::Location;

    #[test]
    fn a_url_is_a_server_and_anything_else_a_file_shown_without_a_password() {
        let server = Location::from("postgres://shop:s3cret@db/sekali");
        assert!(matches!(server, Location::Server(_)));
        assert_eq!(server.to_string(), "postgres://shop:***@db/sekali");
        assert_eq!(
            format!("{server:?}"),
            "Location(postgres://shop:***@db/sekali)"
        );
        let file = Location::from("data/sekali.db");
        assert_eq!(file.file(), Some(std::path::Path::new("data/sekali.db")));
    }
}
