//! The PostgreSQL side of a copy between engines (see [`crate::store::copy`]): reading every
//! table from one snapshot, and filling an empty database.

use std::collections::HashMap;

use bytes::BytesMut;
use postgres::types::{to_sql_checked, IsNull, ToSql, Type};
use postgres::{Client, IsolationLevel, Statement};

use super::{schema, StoreError, Target};
use crate::store::copy::{Cell, Import, Visit, TABLES};

/// The tables whose identity column a copy fills with the source's values.
const IDENTITIES: [(&str, &str); 5] = [
    ("processed_events", "rowid"),
    ("order_transitions", "id"),
    ("email_outbox", "id"),
    ("forward_outbox", "id"),
    ("outbox_attempts", "id"),
];

impl ToSql for Cell {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            Cell::Null => Ok(IsNull::Yes),
            Cell::Int(i) => i.to_sql(ty, out),
            Cell::Text(t) => t.to_sql(ty, out),
        }
    }

    fn accepts(ty: &Type) -> bool {
        <i64 as ToSql>::accepts(ty) || <String as ToSql>::accepts(ty)
    }

    to_sql_checked!();
}

/// Every row of every table, from one REPEATABLE READ snapshot: a copy taken while instances
/// keep writing is the database as it was at one moment.
pub fn export(client: &mut Client, visit: Visit<'_>) -> Result<(), StoreError> {
    let mut tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()?;
    for (index, (table, columns)) in TABLES.iter().enumerate() {
        let order = if *table == "processed_events" {
            " ORDER BY rowid"
        } else {
            ""
        };
        let sql = format!("SELECT {} FROM {table}{order}", columns.join(", "));
        let mut cells = Vec::with_capacity(columns.len());
        for row in tx.query(sql.as_str(), &[])? {
            cells.clear();
            for (i, column) in row.columns().iter().enumerate() {
                cells.push(if *column.type_() == Type::INT8 {
                    row.try_get::<_, Option<i64>>(i)?
                        .map_or(Cell::Null, Cell::Int)
                } else {
                    row.try_get::<_, Option<String>>(i)?
                        .map_or(Cell::Null, Cell::Text)
                });
            }
            visit(index, &cells)?;
        }
    }
    tx.commit()?;
    Ok(())
}

/// Connects to `target`, puts the schema in place, and refuses a database that holds sekali's
/// data already: a copy fills a new database, it never merges into one.
pub fn create(target: &Target) -> Result<Box<dyn Import>, StoreError> {
    let mut client = target.connect()?;
    schema::migrate(&mut client)?;
    for (table, _) in TABLES {
        let sql = format!("SELECT EXISTS (SELECT 1 FROM {table})");
        let has_rows: bool = client.query_one(sql.as_str(), &[])?.try_get(0)?;
        if has_rows {
            return Err(StoreError::Unfit(format!(
                "the database {target} holds sekali's data already ({table} has rows); a copy goes into a new, empty database only"
            )));
        }
    }
    client.batch_execute("BEGIN")?;
    Ok(Box::new(PgImport {
        client,
        statements: HashMap::new(),
    }))
}

struct PgImport {
    client: Client,
    statements: HashMap<usize, Statement>,
}

impl Import for PgImport {
    fn insert(&mut self, table: usize, row: &[Cell]) -> Result<(), StoreError> {
        let statement = match self.statements.get(&table) {
            Some(statement) => statement.clone(),
            None => {
                let (name, columns) = TABLES[table];
                let placeholders: Vec<String> =
                    (1..=columns.len()).map(|i| format!("${i}")).collect();
                let overriding = if IDENTITIES.iter().any(|(t, _)| *t == name) {
                    " OVERRIDING SYSTEM VALUE"
                } else {
                    ""
                };
                let sql = format!(
                    "INSERT INTO {name} ({}){overriding} VALUES ({})",
                    columns.join(", "),
                    placeholders.join(", ")
                );
                let statement = self.client.prepare(&sql)?;
                self.statements.insert(table, statement.clone());
                statement
            }
        };
        let params: Vec<&(dyn ToSql + Sync)> =
            row.iter().map(|c| c as &(dyn ToSql + Sync)).collect();
        self.client.execute(&statement, &params)?;
        Ok(())
    }

    /// Moves each identity past the largest value copied (so that the next row gets a new
    /// one), commits (durable: `synchronous_commit` is on for sekali's sessions), and counts.
    fn finish(mut self: Box<Self>) -> Result<Vec<i64>, StoreError> {
        for (table, column) in IDENTITIES {
            let sql = format!(
                "SELECT setval(pg_get_serial_sequence('{table}', '{column}'),
                               COALESCE(max({column}), 0) + 1, false) FROM {table}"
            );
            self.client.query_one(sql.as_str(), &[])?;
        }
        // The copied changes keep their place in the change feed: SQLite's is the id, so that a
        // feed client's cursor goes on where it was; the changes written here come after them.
        self.client
            .batch_execute("UPDATE order_transitions SET position = id")?;
        self.client.batch_execute("COMMIT")?;
        TABLES
            .iter()
            .map(|(table, _)| {
                let sql = format!("SELECT count(*) FROM {table}");
                Ok(self.client.query_one(sql.as_str(), &[])?.try_get(0)?)
            })
            .collect()
    }
}
