//! The SQLite side of a copy between engines (see [`crate::store::copy`]): reading every table
//! in one read transaction, and filling a new database file.

use std::path::{Path, PathBuf};

use rusqlite::types::{Value, ValueRef};
use rusqlite::Connection;

use super::{open_for_writing, StoreError, DEFAULT_BUSY_TIMEOUT};
use crate::store::copy::{Cell, Import, Visit, TABLES};

/// `SELECT` of table `index`'s columns, in arrival order for `processed_events`.
fn select_sql(index: usize) -> String {
    let (table, columns) = TABLES[index];
    let order = if table == "processed_events" {
        " ORDER BY rowid"
    } else {
        ""
    };
    format!("SELECT {} FROM {table}{order}", columns.join(", "))
}

/// Every row of every table, read in one transaction (a consistent snapshot: WAL lets the
/// writer go on meanwhile).
pub fn export(conn: &Connection, visit: Visit<'_>) -> Result<(), StoreError> {
    conn.execute_batch("BEGIN")?;
    let result = (|| {
        for (index, (table, columns)) in TABLES.iter().enumerate() {
            let mut statement = conn.prepare(&select_sql(index))?;
            let width = columns.len();
            let mut rows = statement.query([])?;
            let mut cells = Vec::with_capacity(width);
            while let Some(row) = rows.next()? {
                cells.clear();
                for column in 0..width {
                    cells.push(match row.get_ref(column)? {
                        ValueRef::Null => Cell::Null,
                        ValueRef::Integer(i) => Cell::Int(i),
                        ValueRef::Text(t) => Cell::Text(String::from_utf8_lossy(t).into_owned()),
                        other => {
                            return Err(StoreError::StoredEvent(format!(
                                "{}.{} holds a {:?} value, which sekali never writes",
                                table,
                                columns[column],
                                other.data_type()
                            )))
                        }
                    });
                }
                visit(index, &cells)?;
            }
        }
        Ok(())
    })();
    let _ = conn.execute_batch("COMMIT");
    result
}

/// Creates the database file `path` (which must not exist) with the schema, for a copy to fill
/// in one transaction.
pub fn create(path: &Path) -> Result<Box<dyn Import>, StoreError> {
    if path.exists() {
        return Err(StoreError::Exists(path.display().to_string()));
    }
    let conn = open_for_writing(path, DEFAULT_BUSY_TIMEOUT)?;
    conn.execute_batch("BEGIN IMMEDIATE")?;
    Ok(Box::new(SqliteImport {
        conn,
        path: path.to_owned(),
    }))
}

struct SqliteImport {
    conn: Connection,
    path: PathBuf,
}

impl Import for SqliteImport {
    fn insert(&mut self, table: usize, row: &[Cell]) -> Result<(), StoreError> {
        let (name, columns) = TABLES[table];
        let placeholders: Vec<String> = (1..=columns.len()).map(|i| format!("?{i}")).collect();
        let sql = format!(
            "INSERT INTO {name} ({}) VALUES ({})",
            columns.join(", "),
            placeholders.join(", ")
        );
        let values = row.iter().map(|cell| match cell {
            Cell::Null => Value::Null,
            Cell::Int(i) => Value::Integer(*i),
            Cell::Text(t) => Value::Text(t.clone()),
        });
        self.conn
            .prepare_cached(&sql)?
            .execute(rusqlite::params_from_iter(values))?;
        Ok(())
    }

    /// Commits, then leaves one self-contained file: the WAL checkpointed into it and the
    /// journal mode back to `delete` (a copy is moved and opened elsewhere, without its -wal),
    /// synced before this returns. sekali puts it in WAL mode again when it opens it.
    fn finish(self: Box<Self>) -> Result<Vec<i64>, StoreError> {
        let conn = self.conn;
        conn.execute_batch("COMMIT")?;
        let counts = TABLES
            .iter()
            .map(|(table, _)| {
                conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |row| {
                    row.get(0)
                })
            })
            .collect::<Result<Vec<i64>, _>>()?;
        let check: String = conn.query_row("PRAGMA integrity_check", [], |row| row.get(0))?;
        if check != "ok" {
            return Err(StoreError::Integrity(check));
        }
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        let _: String =
            conn.pragma_update_and_check(None, "journal_mode", "DELETE", |row| row.get(0))?;
        drop(conn);
        std::fs::File::open(&self.path)
            .and_then(|f| f.sync_all())
            .map_err(|e| StoreError::BackupOut {
                path: self.path.display().to_string(),
                reason: format!("syncing the copy: {e}"),
            })?;
        Ok(counts)
    }
}

/// The size of the database file at `path`, in pages.
pub fn page_count(path: &Path) -> Result<i64, StoreError> {
    let conn = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    Ok(conn.query_row("PRAGMA page_count", [], |row| row.get(0))?)
}

#[cfg(test)]
mod tests {
    use crate::store::copy::TABLES;

    /// A copy moves every column: the shared table list names each of the schema's tables with
    /// all of its columns, in order (and `processed_events` its rowid first), so that a column
    /// added to the schema and not to the list fails here rather than vanish in a copy.
    #[test]
    fn the_copy_names_every_table_and_column_of_the_schema() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.execute_batch(super::super::schema::SCHEMA_SQL)
            .unwrap();
        let tables: Vec<String> = conn
            .prepare("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name")
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let mut listed: Vec<&str> = TABLES.iter().map(|(table, _)| *table).collect();
        listed.sort_unstable();
        assert_eq!(tables, listed);
        for (table, columns) in TABLES {
            let mut schema: Vec<String> = conn
                .prepare(&format!(
                    "SELECT name FROM pragma_table_info('{table}') ORDER BY cid"
                ))
                .unwrap()
                .query_map([], |row| row.get(0))
                .unwrap()
                .map(Result::unwrap)
                .collect();
            if *table == "processed_events" {
                schema.insert(0, "rowid".into());
            }
            assert_eq!(&schema, columns, "{table}");
        }
    }
}
