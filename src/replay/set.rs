//! `sekali replay --set PATH=VALUE`: a field of each file overridden before it is signed, as
//! `stripe trigger --override` sets a field of the object it creates. A shop's own order id in a
//! fixture, say: `--set data.object.metadata.order_id=ord_42` (Stripe), `--set order_id=ORDER-9
//! --set gross_amount=99000.00` (Midtrans, whose `signature_key` is then computed over the new
//! values, because signing comes after), `--set external_id=inv_42` (Xendit).
//!
//! **Paths** are keys separated by dots; a segment of digits indexes an array (`va_numbers.0.bank`),
//! and indexing one past an array's end appends an element. A missing object, or a `null` on the
//! way, is created: an array where the next segment is an index, else an object. A key with a dot
//! in it cannot be named.
//!
//! **Values** are typed by the field they replace, so that a value cannot change a field's type
//! by accident: a field that exists keeps its JSON type. A string stays a string whatever the text
//! (`gross_amount=99000.00` stays the string Midtrans sends, `order_id=123` the string `"123"`);
//! a number, a boolean, an object or an array takes only a JSON text of that type (`amount=99000`).
//! A new field, or one that is `null`, takes the text as JSON when it is a JSON text
//! (`123`, `true`, `{"a":1}`, `"123"` for a string of digits) and as a string otherwise.
//!
//! What cannot be done is refused, naming the path: a path through a string, number or boolean,
//! a number indexing an object, a key into an array, an index past an array's end, a value of
//! the wrong type.
//!
//! Only the containers along the path are rebuilt: every other value keeps its bytes, copied as
//! they were (`RawValue`), so a 2-space indented file (as every fixture is) comes out byte for byte
//! the same but for the field set.

use serde::de::{MapAccess, Visitor};
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// One `--set PATH=VALUE`, parsed at the edge: a path of at least one segment, none empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetField {
    path: Vec<Segment>,
    value: String,
}

/// A step of a path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Key(String),
    /// All digits: an array's element.
    Index(usize),
}

/// Why a `--set` argument is not of the form PATH=VALUE.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetSyntaxError {
    #[error("expected PATH=VALUE, such as data.object.metadata.order_id=ord_42")]
    NoEquals,
    #[error("the path `{0}` has an empty segment: name each field, separated by single dots")]
    EmptySegment(String),
    #[error("the index `{0}` in the path is too large")]
    IndexTooLarge(String),
}

/// Why a `--set` cannot be applied to a body. Each names the path as far as it got (`the body`
/// for the whole document).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetError {
    #[error("the body is not JSON: {0}")]
    NotJson(String),
    #[error("{at} is {kind}: there is no `{segment}` inside it to set")]
    ThroughScalar {
        at: String,
        kind: &'static str,
        segment: String,
    },
    #[error("{at} is {kind}, not an array: the index `{index}` cannot be taken in it")]
    IndexIntoNonArray {
        at: String,
        kind: &'static str,
        index: usize,
    },
    #[error("{at} is an array: index it with a number, not `{key}`")]
    KeyIntoArray { at: String, key: String },
    #[error("{at} has {len} elements: the index {index} is past its end ({len} appends one)")]
    OutOfRange {
        at: String,
        index: usize,
        len: usize,
    },
    #[error("{at} is {kind}, and `{value}` is not one (a field that exists keeps its JSON type)")]
    WrongType {
        at: String,
        kind: &'static str,
        value: String,
    },
}

impl SetField {
    /// `PATH=VALUE`; the value is everything after the first `=`, and may be empty.
    pub fn parse(text: &str) -> Result<SetField, SetSyntaxError> {
        let (path, value) = text.split_once('=').ok_or(SetSyntaxError::NoEquals)?;
        let path = path
            .split('.')
            .map(|segment| {
                if segment.is_empty() {
                    Err(SetSyntaxError::EmptySegment(path.to_owned()))
                } else if segment.bytes().all(|b| b.is_ascii_digit()) {
                    segment
                        .parse()
                        .map(Segment::Index)
                        .map_err(|_| SetSyntaxError::IndexTooLarge(segment.to_owned()))
                } else {
                    Ok(Segment::Key(segment.to_owned()))
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(SetField {
            path,
            value: value.to_owned(),
        })
    }

    /// `body` with this field set (see the module's documentation for the typing), re-serialised
    /// with 2-space indentation and the untouched values' bytes kept; a trailing newline is
    /// kept if `body` had one.
    pub fn apply(&self, body: &[u8]) -> Result<Vec<u8>, SetError> {
        let root: Box<RawValue> =
            serde_json::from_slice(body).map_err(|e| SetError::NotJson(e.to_string()))?;
        let node = set(Some(&root), &self.path, 0, self)?;
        let mut out = serde_json::to_vec_pretty(&node).expect("serialising JSON already parsed");
        if body.ends_with(b"\n") {
            out.push(b'\n');
        }
        Ok(out)
    }

    /// The first `depth` segments, as written (`the body` for none).
    fn path_to(&self, depth: usize) -> String {
        if depth == 0 {
            return "the body".to_owned();
        }
        self.path[..depth]
            .iter()
            .map(|segment| match segment {
                Segment::Key(key) => key.clone(),
                Segment::Index(index) => index.to_string(),
            })
            .collect::<Vec<_>>()
            .join(".")
    }
}

/// A body being rebuilt: the containers along the path are taken apart, every other value is
/// kept as its text.
enum Node {
    Raw(Box<RawValue>),
    Object(Vec<(String, Node)>),
    Array(Vec<Node>),
}

impl Serialize for Node {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Node::Raw(raw) => raw.serialize(serializer),
            Node::Object(entries) => {
                let mut map = serializer.serialize_map(Some(entries.len()))?;
                for (key, value) in entries {
                    map.serialize_entry(key, value)?;
                }
                map.end()
            }
            Node::Array(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
        }
    }
}

/// An object's members in the order written (serde_json's own map sorts them).
struct Members(Vec<(String, Box<RawValue>)>);

impl<'de> Deserialize<'de> for Members {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MembersVisitor;
        impl<'de> Visitor<'de> for MembersVisitor {
            type Value = Members;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry()? {
                    members.push(member);
                }
                Ok(Members(members))
            }
        }
        deserializer.deserialize_map(MembersVisitor)
    }
}

/// The JSON type of a value, from its first byte, as the messages name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    String,
    Number,
    Boolean,
    Null,
    Object,
    Array,
}

impl Kind {
    fn of(raw: &RawValue) -> Kind {
        match raw.get().as_bytes().first() {
            Some(b'"') => Kind::String,
            Some(b'{') => Kind::Object,
            Some(b'[') => Kind::Array,
            Some(b't' | b'f') => Kind::Boolean,
            Some(b'n') => Kind::Null,
            _ => Kind::Number,
        }
    }

    fn of_value(value: &serde_json::Value) -> Kind {
        use serde_json::Value;
        match value {
            Value::String(_) => Kind::String,
            Value::Number(_) => Kind::Number,
            Value::Bool(_) => Kind::Boolean,
            Value::Null => Kind::Null,
            Value::Object(_) => Kind::Object,
            Value::Array(_) => Kind::Array,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::String => "a string",
            Kind::Number => "a number",
            Kind::Boolean => "a boolean",
            Kind::Null => "null",
            Kind::Object => "an object",
            Kind::Array => "an array",
        }
    }
}

/// `existing` (absent: `None`) with `field`'s value set at `path`, the rest of `field.path`
/// below `depth`.
fn set(
    existing: Option<&RawValue>,
    path: &[Segment],
    depth: usize,
    field: &SetField,
) -> Result<Node, SetError> {
    let Some((segment, rest)) = path.split_first() else {
        return typed(existing, field, depth).map(Node::Raw);
    };
    // A missing container, or a null one, is created: as the segment needs it.
    let kind = existing.map_or(Kind::Null, Kind::of);
    match (kind, segment) {
        (Kind::Null, Segment::Key(key)) => Ok(Node::Object(vec![(
            key.clone(),
            set(None, rest, depth + 1, field)?,
        )])),
        (Kind::Null, Segment::Index(0)) => {
            Ok(Node::Array(vec![set(None, rest, depth + 1, field)?]))
        }
        (Kind::Null, Segment::Index(index)) => Err(SetError::OutOfRange {
            at: field.path_to(depth),
            index: *index,
            len: 0,
        }),
        (Kind::Object, Segment::Key(key)) => {
            let raw = existing.expect("an object exists");
            let Members(members) =
                serde_json::from_str(raw.get()).map_err(|e| SetError::NotJson(e.to_string()))?;
            let mut found = false;
            let mut entries = Vec::with_capacity(members.len() + 1);
            for (name, value) in members {
                if !found && name == *key {
                    found = true;
                    entries.push((name, set(Some(&value), rest, depth + 1, field)?));
                } else {
                    entries.push((name, Node::Raw(value)));
                }
            }
            if !found {
                entries.push((key.clone(), set(None, rest, depth + 1, field)?));
            }
            Ok(Node::Object(entries))
        }
        (Kind::Array, Segment::Index(index)) => {
            let raw = existing.expect("an array exists");
            let items: Vec<Box<RawValue>> =
                serde_json::from_str(raw.get()).map_err(|e| SetError::NotJson(e.to_string()))?;
            let len = items.len();
            if *index > len {
                return Err(SetError::OutOfRange {
                    at: field.path_to(depth),
                    index: *index,
                    len,
                });
            }
            let mut nodes: Vec<Node> = Vec::with_capacity(len + 1);
            for (i, item) in items.into_iter().enumerate() {
                nodes.push(if i == *index {
                    set(Some(&item), rest, depth + 1, field)?
                } else {
                    Node::Raw(item)
                });
            }
            if *index == len {
                nodes.push(set(None, rest, depth + 1, field)?);
            }
            Ok(Node::Array(nodes))
        }
        (Kind::Object, Segment::Index(index)) => Err(SetError::IndexIntoNonArray {
            at: field.path_to(depth),
            kind: kind.name(),
            index: *index,
        }),
        (Kind::Array, Segment::Key(key)) => Err(SetError::KeyIntoArray {
            at: field.path_to(depth),
            key: key.clone(),
        }),
        (Kind::String | Kind::Number | Kind::Boolean, segment) => Err(SetError::ThroughScalar {
            at: field.path_to(depth),
            kind: kind.name(),
            segment: match segment {
                Segment::Key(key) => key.clone(),
                Segment::Index(index) => index.to_string(),
            },
        }),
    }
}

/// `field`'s value as the JSON that replaces `existing` (see the module's documentation).
fn typed(
    existing: Option<&RawValue>,
    field: &SetField,
    depth: usize,
) -> Result<Box<RawValue>, SetError> {
    let text = field.value.as_str();
    let string = || {
        RawValue::from_string(serde_json::to_string(text).expect("a string serialises"))
            .expect("a serialised string is JSON")
    };
    let literal = serde_json::from_str::<serde_json::Value>(text).ok();
    let verbatim = || RawValue::from_string(text.trim().to_owned()).expect("parsed as JSON above");
    match existing.map_or(Kind::Null, Kind::of) {
        Kind::String => Ok(string()),
        Kind::Null => Ok(if literal.is_some() {
            verbatim()
        } else {
            string()
        }),
        kind => match literal {
            Some(value) if Kind::of_value(&value) == kind => Ok(verbatim()),
            _ => Err(SetError::WrongType {
                at: field.path_to(depth),
                kind: kind.name(),
                value: text.to_owned(),
            }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::{SetError, SetField, SetSyntaxError};

    fn set(body: &str, field: &str) -> Result<String, SetError> {
        SetField::parse(field)
            .unwrap()
            .apply(body.as_bytes())
            .map(|b| String::from_utf8(b).unwrap())
    }

    fn value(body: &str, field: &str) -> serde_json::Value {
        serde_json::from_str(&set(body, field).unwrap()).unwrap()
    }

    /// Every value but the one set keeps its bytes: a fixture whose field is set to the value
    /// it has comes out as it went in, key order, indentation, number forms and all.
    #[test]
    fn setting_a_field_to_the_value_it_has_leaves_every_fixture_byte_for_byte_as_it_was() {
        let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures");
        let cases = [
            (
                "stripe/payment_intent.succeeded.json",
                "data.object.metadata.order_id=ord_1001",
            ),
            ("midtrans/settlement.json", "order_id=ORDER-2001"),
            ("midtrans/pending.json", "va_numbers.0.bank=bca"),
            ("xendit/invoice.paid.json", "amount=150000"),
        ];
        for (file, field) in cases {
            let body = std::fs::read(format!("{fixtures}/{file}")).unwrap();
            let out = SetField::parse(field).unwrap().apply(&body).unwrap();
            assert_eq!(
                String::from_utf8(out).unwrap(),
                String::from_utf8(body).unwrap(),
                "{file}"
            );
        }
    }

    #[test]
    fn only_the_field_set_changes_and_keys_keep_their_order() {
        let body = "{\n  \"z\": 1.50,\n  \"a\": {\n    \"k\": \"v\",\n    \"b\": [\n      1\n    ]\n  }\n}\n";
        assert_eq!(
            set(body, "a.k=w").unwrap(),
            "{\n  \"z\": 1.50,\n  \"a\": {\n    \"k\": \"w\",\n    \"b\": [\n      1\n    ]\n  }\n}\n"
        );
    }

    #[test]
    fn a_field_that_exists_keeps_its_json_type() {
        let body = r#"{"s":"10000.00","n":5,"b":true,"o":{"x":1},"a":[1]}"#;
        assert_eq!(value(body, "s=99000.00")["s"], "99000.00");
        assert_eq!(value(body, "s=123")["s"], "123");
        assert_eq!(value(body, "s=")["s"], "");
        assert_eq!(value(body, "n=99000.50")["n"], 99000.5);
        assert_eq!(value(body, "b=false")["b"], false);
        assert_eq!(value(body, r#"o={"y":2}"#)["o"]["y"], 2);
        assert_eq!(value(body, "a=[3,4]")["a"][1], 4);
        for (field, kind) in [
            ("n=ten", "a number"),
            ("n=\"5\"", "a number"),
            ("b=yes", "a boolean"),
            ("o=1", "an object"),
            ("a={}", "an array"),
        ] {
            let path = &field[..1];
            assert!(
                matches!(set(body, field), Err(SetError::WrongType { at, kind: k, .. }) if at == path && k == kind),
                "{field}"
            );
        }
    }

    #[test]
    fn a_new_or_null_field_takes_a_json_text_as_json_and_anything_else_as_a_string() {
        let body = r#"{"nothing":null}"#;
        assert_eq!(value(body, "amount=99000")["amount"], 99000);
        assert_eq!(value(body, "paid=true")["paid"], true);
        assert_eq!(value(body, r#"id="123""#)["id"], "123");
        assert_eq!(value(body, "id=ORDER-9")["id"], "ORDER-9");
        assert_eq!(value(body, r#"meta={"a":[1]}"#)["meta"]["a"][0], 1);
        assert_eq!(value(body, "nothing=7")["nothing"], 7);
    }

    #[test]
    fn missing_objects_and_arrays_are_created_and_an_index_at_the_end_appends() {
        let body = r#"{"list":[{"a":1}],"gone":null}"#;
        assert_eq!(
            value(body, "data.object.metadata.order_id=ord_42")["data"]["object"]["metadata"]
                ["order_id"],
            "ord_42"
        );
        assert_eq!(value(body, "list.1.a=2")["list"][1]["a"], 2);
        assert_eq!(
            value(body, "list.0.b=x")["list"][0],
            serde_json::json!({"a":1,"b":"x"})
        );
        assert_eq!(
            value(body, "refunds.0.key=rf-1")["refunds"][0]["key"],
            "rf-1"
        );
        assert_eq!(value(body, "gone.x=1")["gone"]["x"], 1);
    }

    #[test]
    fn what_cannot_be_set_is_refused_naming_the_path() {
        let body = r#"{"id":"x","n":1,"o":{"k":1},"list":[1,2]}"#;
        let refusal = |field: &str| set(body, field).unwrap_err().to_string();
        assert_eq!(
            refusal("id.more=1"),
            "id is a string: there is no `more` inside it to set"
        );
        assert_eq!(
            refusal("n.0=1"),
            "n is a number: there is no `0` inside it to set"
        );
        assert_eq!(
            refusal("o.0=1"),
            "o is an object, not an array: the index `0` cannot be taken in it"
        );
        assert_eq!(
            refusal("list.first=1"),
            "list is an array: index it with a number, not `first`"
        );
        assert_eq!(
            refusal("list.5=1"),
            "list has 2 elements: the index 5 is past its end (2 appends one)"
        );
        assert_eq!(
            refusal("fresh.3=1"),
            "fresh has 0 elements: the index 3 is past its end (0 appends one)"
        );
        assert_eq!(
            SetField::parse("x=1")
                .unwrap()
                .apply(b"[1]")
                .unwrap_err()
                .to_string(),
            "the body is an array: index it with a number, not `x`"
        );
        assert!(matches!(
            SetField::parse("x=1").unwrap().apply(b"{"),
            Err(SetError::NotJson(_))
        ));
    }

    #[test]
    fn a_set_argument_needs_a_path_an_equals_sign_and_no_empty_segment() {
        assert_eq!(SetField::parse("order_id"), Err(SetSyntaxError::NoEquals));
        for path in ["=x", "a..b=x", ".a=x", "a.=x"] {
            assert!(
                matches!(SetField::parse(path), Err(SetSyntaxError::EmptySegment(_))),
                "{path}"
            );
        }
        assert!(matches!(
            SetField::parse("a.99999999999999999999999=x"),
            Err(SetSyntaxError::IndexTooLarge(_))
        ));
        // The value is everything after the first `=`.
        assert_eq!(value("{}", "a=b=c")["a"], "b=c");
    }
}
