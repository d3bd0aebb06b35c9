//! The change feed's rows (`GET /changes`): each order change (`order_transitions`) as the shop
//! receives it, and the cursor that pages through them in commit order. Both engines read their
//! rows into [`ChangeRow`]; the shape of a change is defined here once.

use std::fmt;

use serde::Serialize;

/// Where a client is in the feed: after the change at this place.
///
/// SQLite has one writer, so a change's row id is commit order, and its place. PostgreSQL's ids
/// are not (several instances take ids, then commit in another order): there a change gets its
/// place once it has committed (`order_transitions.position`), from one publisher at a time,
/// so a change never lands behind a cursor that has passed it. A copy from SQLite gives the
/// copied changes their ids as places, so a SQLite cursor goes on where it was.
///
/// As text: the place in decimal. Opaque to clients.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct ChangeCursor(pub i64);

impl ChangeCursor {
    /// Reads a cursor this feed gave out; `None` for anything else.
    pub fn parse(text: &str) -> Option<ChangeCursor> {
        // Digits only: no sign, no spaces, no leading `+`.
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        text.parse().ok().map(ChangeCursor)
    }
}

impl fmt::Display for ChangeCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// One order change as the feed serves it (and forwarding will send it): field names are part
/// of sekali's interface (docs/changes.md).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Change {
    /// `chg_` and the change's row id (`order_transitions.id`): stable, for deduplication.
    pub id: String,
    /// `order.` and the new status.
    #[serde(rename = "type")]
    pub kind: String,
    pub order_id: String,
    pub status: String,
    /// `None` for the change that created the order.
    pub previous_status: Option<String>,
    /// The order's amount and currency at the change, in minor units.
    pub amount: Option<i64>,
    pub refunded_amount: i64,
    pub currency: Option<String>,
    /// The order's provider.
    pub provider: String,
    /// The provider's event that made the change; `None` for the API's and the operator's.
    pub provider_event_id: Option<String>,
    /// A provider's name, `api` or `operator`.
    pub changed_by: String,
    pub changed_at: String,
    /// The order's change number: 1, 2, ...
    pub sequence: i64,
    /// The order's metadata (given to `POST /orders`), when it has some.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Value>,
    /// Where the feed goes on after this change.
    #[serde(skip)]
    pub cursor: ChangeCursor,
}

/// A change's columns as an engine reads them (`order_transitions` joined with its order).
pub struct ChangeRow {
    /// The change's place in the feed (its id on SQLite).
    pub position: i64,
    pub id: i64,
    pub order_id: String,
    pub from_status: Option<String>,
    pub to_status: String,
    pub refunded_amount: i64,
    /// `order_transitions.provider`: who made the change.
    pub changed_by: String,
    pub event_id: String,
    pub changed_at: String,
    pub sequence: i64,
    pub amount: Option<i64>,
    pub currency: Option<String>,
    /// `orders.provider`.
    pub provider: String,
    /// `orders.metadata`, JSON text.
    pub metadata: Option<String>,
}

impl From<ChangeRow> for Change {
    fn from(row: ChangeRow) -> Change {
        let by_provider = !matches!(row.changed_by.as_str(), "api" | "operator");
        Change {
            id: format!("chg_{}", row.id),
            kind: format!("order.{}", row.to_status),
            order_id: row.order_id,
            status: row.to_status,
            previous_status: row.from_status,
            amount: row.amount,
            refunded_amount: row.refunded_amount,
            currency: row.currency,
            provider: row.provider,
            provider_event_id: by_provider.then_some(row.event_id),
            changed_by: row.changed_by,
            changed_at: row.changed_at,
            sequence: row.sequence,
            // Validated as a JSON object when the API stored it; text that is not JSON (written
            // by hand) is passed on as a string rather than dropped.
            metadata: row
                .metadata
                .map(|text| serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text))),
            cursor: ChangeCursor(row.position),
        }
    }
}

/// At most this many changes a page (`limit`).
pub const MAX_CHANGES_PAGE: u32 = 1000;

#[cfg(test)]
mod tests {
    use super::ChangeCursor;

    #[test]
    fn a_cursor_reads_back_what_it_prints_and_nothing_else() {
        for cursor in [ChangeCursor(0), ChangeCursor(42), ChangeCursor(i64::MAX)] {
            assert_eq!(ChangeCursor::parse(&cursor.to_string()), Some(cursor));
        }
        for bad in [
            "",
            "-1",
            "+1",
            " 1",
            "1.5",
            "1-2",
            "abc",
            "99999999999999999999",
        ] {
            assert_eq!(ChangeCursor::parse(bad), None, "{bad:?}");
        }
    }
}
