//! Prepared statements held for the length of a batch.

use rusqlite::{CachedStatement, Connection};

/// The statements one writer batch has used so far, kept prepared until the batch ends.
///
/// `Connection::prepare_cached` hashes the whole SQL text on every call, and again when the
/// statement goes back to the cache: measured with callgrind on `cargo bench --bench writer`,
/// a tenth of the writer's instructions. A batch asks for the same nine or ten statements for
/// every delivery, so it looks them up here by the address of their `&'static str` (a pointer
/// compare over a short list) and pays the cache once per statement per batch.
pub struct Statements<'c> {
    conn: &'c Connection,
    held: Vec<(&'static str, CachedStatement<'c>)>,
}

impl<'c> Statements<'c> {
    pub fn new(conn: &'c Connection) -> Self {
        Statements {
            conn,
            held: Vec::with_capacity(16),
        }
    }

    pub fn conn(&self) -> &'c Connection {
        self.conn
    }

    /// The prepared statement for `sql`, reset and ready to bind. Two literals with the same
    /// text at different addresses are only prepared twice, never confused.
    pub fn prepare(&mut self, sql: &'static str) -> rusqlite::Result<&mut CachedStatement<'c>> {
        let index = match self
            .held
            .iter()
            .position(|(held, _)| std::ptr::eq(*held, sql))
        {
            Some(index) => index,
            None => {
                let statement = self.conn.prepare_cached(sql)?;
                self.held.push((sql, statement));
                self.held.len() - 1
            }
        };
        Ok(&mut self.held[index].1)
    }
}
