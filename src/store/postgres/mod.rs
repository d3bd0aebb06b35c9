//! The PostgreSQL engine, for shops that outgrow one machine: several sekali instances on one
//! database, which a streaming standby can take over. Every SQL statement sekali runs on
//! PostgreSQL is in this folder, with its schema (`schema.sql` here, the translation of the
//! top-level one) and its migrations.
//!
//! The same thread model as the SQLite engine: one writer thread per instance owns one
//! connection and commits whatever is queued in one transaction ([`writer`]); reads go through
//! a small pool. The driver is `postgres`, the blocking face of `tokio-postgres`, whose client
//! runs on a runtime of its own: it must never be called on the async executor, so every call
//! is made on the writer's thread, a blocking task, or a command's thread.
//!
//! Where several instances meet, the database decides: the claim is a unique key (a second
//! instance's insert waits for the first's commit and then finds the row), an order's row is
//! locked (`FOR UPDATE`) before it is read for a change, batches touch orders in key order, and
//! a deadlock or serialization failure (40P01, 40001) reruns the batch.

pub mod connect;
pub mod console;
pub mod copy;
mod engine;
pub mod events;
pub mod forward;
pub mod idempotency;
pub mod ledger;
pub mod orders;
pub mod outbox;
pub mod purge;
pub mod reads;
pub mod runs;
pub mod schema;
pub mod writer;

use postgres::types::ToSql;
use postgres::{Row, Statement, Transaction};

use super::ErrorKind;
pub use super::StoreError;

pub use connect::Target;
pub use engine::{PgMaintenance, PgStore};
pub use writer::WriterConfig;

/// A statement's parameters.
pub type Params<'p> = &'p [&'p (dyn ToSql + Sync)];

impl From<postgres::Error> for StoreError {
    /// The SQLSTATE decides the kind: a serialization failure, a deadlock, a lock or statement
    /// timeout, or a server short of resources passes by itself; a connection that closed, or a
    /// server shutting down or in recovery (a standby, during a failover), takes a new
    /// connection (to whichever host is the primary now); anything else is permanent.
    fn from(error: postgres::Error) -> Self {
        let kind = match error.code().map(|c| c.code()) {
            _ if error.is_closed() => ErrorKind::ConnectionLost,
            // No SQLSTATE: the socket failed under the client (an I/O error, a reset).
            None => ErrorKind::ConnectionLost,
            Some(code) => classify(code),
        };
        StoreError::database(kind, error)
    }
}

/// The kind of an error with SQLSTATE `code`.
fn classify(code: &str) -> ErrorKind {
    match code {
        // serialization_failure, deadlock_detected: worth running again at once.
        "40001" | "40P01" => ErrorKind::Conflict,
        // lock_not_available (lock_timeout), query_canceled (statement_timeout), and class 53:
        // insufficient resources (disk full, out of memory, too many connections).
        "55P03" | "57014" => ErrorKind::Transient,
        c if c.starts_with("53") => ErrorKind::Transient,
        // Class 08: connection exceptions; 57P01-57P03: admin or crash shutdown, cannot connect
        // now; 25006: read-only transaction (the host became a standby).
        c if c.starts_with("08") => ErrorKind::ConnectionLost,
        "57P01" | "57P02" | "57P03" | "25006" => ErrorKind::ConnectionLost,
        _ => ErrorKind::Permanent,
    }
}

/// The statements a connection has prepared, by the address of their `&'static str`: sekali's
/// statements are constants, so a pointer compare finds one, and each is parsed once per
/// connection rather than once per use (a round trip saved on every statement).
#[derive(Default)]
pub struct Statements {
    held: Vec<(&'static str, Statement)>,
}

impl Statements {
    /// Forgets every statement (after the connection they were prepared on is gone).
    pub fn clear(&mut self) {
        self.held.clear();
    }
}

/// One transaction (or savepoint) and the statements of its connection: what every function of
/// this engine that reads or writes takes.
pub struct Db<'a, 't> {
    tx: &'a mut Transaction<'t>,
    statements: &'a mut Statements,
}

impl<'a, 't> Db<'a, 't> {
    pub fn new(tx: &'a mut Transaction<'t>, statements: &'a mut Statements) -> Self {
        Db { tx, statements }
    }

    fn prepared(&mut self, sql: &'static str) -> Result<Statement, StoreError> {
        if let Some((_, statement)) = self
            .statements
            .held
            .iter()
            .find(|(held, _)| std::ptr::eq(*held, sql))
        {
            return Ok(statement.clone());
        }
        let statement = self.tx.prepare(sql)?;
        self.statements.held.push((sql, statement.clone()));
        Ok(statement)
    }

    /// Runs `sql`, returning the number of rows it changed.
    pub fn execute(&mut self, sql: &'static str, params: Params<'_>) -> Result<u64, StoreError> {
        let statement = self.prepared(sql)?;
        Ok(self.tx.execute(&statement, params)?)
    }

    pub fn query(&mut self, sql: &'static str, params: Params<'_>) -> Result<Vec<Row>, StoreError> {
        let statement = self.prepared(sql)?;
        Ok(self.tx.query(&statement, params)?)
    }

    pub fn query_opt(
        &mut self,
        sql: &'static str,
        params: Params<'_>,
    ) -> Result<Option<Row>, StoreError> {
        let statement = self.prepared(sql)?;
        Ok(self.tx.query_opt(&statement, params)?)
    }

    pub fn query_one(&mut self, sql: &'static str, params: Params<'_>) -> Result<Row, StoreError> {
        let statement = self.prepared(sql)?;
        Ok(self.tx.query_one(&statement, params)?)
    }

    /// Runs SQL built at run time (a listing's filters), unprepared and not kept.
    pub fn query_built(&mut self, sql: &str, params: Params<'_>) -> Result<Vec<Row>, StoreError> {
        Ok(self.tx.query(sql, params)?)
    }

    /// Runs `f` in a savepoint of this transaction, rolled back unless it returns `Ok` and `keep`
    /// says so. PostgreSQL refuses every statement of a transaction after an error until it is
    /// rolled back to a savepoint: so the error is the work's own, and the transaction goes on.
    pub fn in_savepoint<T>(
        &mut self,
        f: impl FnOnce(&mut Db<'_, '_>) -> Result<T, StoreError>,
        keep: impl Fn(&T) -> bool,
    ) -> Result<Result<T, StoreError>, StoreError> {
        let mut savepoint = self.tx.savepoint("unit")?;
        let result = f(&mut Db::new(&mut savepoint, self.statements));
        if matches!(&result, Ok(value) if keep(value)) {
            savepoint.commit()?;
        } else {
            savepoint.rollback()?;
        }
        Ok(result)
    }
}

/// Holds `key` until the transaction ends (a transaction-scoped advisory lock on its 64-bit
/// hash): what locks a row that may not exist yet. Every writer of an order holds
/// [`order_key`] before it reads the order to change it, and every writer of a payment its
/// [`payment_key`], so a second instance's change waits for the first's commit and then reads
/// what it wrote, whether the row existed before or not. Unlike inserting a row to lock its key,
/// it writes nothing. Two keys whose hashes collide only wait for each other.
pub fn hold(db: &mut Db<'_, '_>, key: &str) -> Result<(), StoreError> {
    db.query_one(
        "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
        &[&key],
    )?;
    Ok(())
}

/// The key [`hold`] takes for an order.
pub fn order_key(order_id: &str) -> String {
    format!("order\u{1f}{order_id}")
}

/// The key [`hold`] takes for a payment.
pub fn payment_key(provider: &str, reference: &str) -> String {
    format!("payment\u{1f}{provider}\u{1f}{reference}")
}

/// Reads column `index` of `row`, as a store error (not a panic) when its type does not match.
pub fn get<'r, T: postgres::types::FromSql<'r>>(
    row: &'r Row,
    index: usize,
) -> Result<T, StoreError> {
    Ok(row.try_get(index)?)
}

#[cfg(test)]
mod tests {
    use super::{classify, ErrorKind};

    #[test]
    fn sqlstates_map_to_the_kinds_of_store_error() {
        assert_eq!(classify("40001"), ErrorKind::Conflict);
        assert_eq!(classify("40P01"), ErrorKind::Conflict);
        assert_eq!(classify("55P03"), ErrorKind::Transient);
        assert_eq!(classify("53100"), ErrorKind::Transient);
        assert_eq!(classify("08006"), ErrorKind::ConnectionLost);
        assert_eq!(classify("57P01"), ErrorKind::ConnectionLost);
        assert_eq!(classify("25006"), ErrorKind::ConnectionLost);
        assert_eq!(classify("23505"), ErrorKind::Permanent);
        assert_eq!(classify("42601"), ErrorKind::Permanent);
    }
}
