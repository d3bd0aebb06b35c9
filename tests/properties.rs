//! Property tests for the pure provider functions: signing and verification round-trip, any
//! single-bit change is rejected, and the parsers never panic on arbitrary input.
//!
//! Case counts are kept moderate so the file runs in seconds in debug builds; raise them for a
//! longer local run with `PROPTEST_CASES=10000 cargo test --release --test properties`.

use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use proptest::sample::{select, Index};
use secrecy::SecretString;
use serde_json::{json, Map, Value};

use sekali::providers::midtrans::{
    compute_signature_key, parse_notification, verify_midtrans_signature, with_signature_key,
};
use sekali::providers::stripe::{
    compute_signature, parse_event, parse_signature_header, signature_header,
    verify_stripe_signature, SignatureError, DEFAULT_TOLERANCE_SECS, MAX_SIGNATURE_HEADER_BYTES,
};
use sekali::providers::{read_stored, REGISTRY};

const TOLERANCE: u64 = DEFAULT_TOLERANCE_SECS;

/// `default_cases` cases, or `PROPTEST_CASES` when it is set (an explicit case count would
/// otherwise override the environment variable).
fn config(default_cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_cases);
    ProptestConfig::with_cases(cases)
}

fn secrets(list: &[&str]) -> Vec<SecretString> {
    list.iter()
        .map(|s| SecretString::from(s.to_string()))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------------------

/// A request body: arbitrary bytes, not necessarily UTF-8 or JSON.
fn body() -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), 0..4096)
}

/// A non-empty body, so that it has a bit to flip.
fn non_empty_body() -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), 1..4096)
}

/// A signing secret: 1 to 64 printable characters (any script, no control characters).
fn secret() -> impl Strategy<Value = String> {
    "\\PC{1,64}"
}

/// A signing timestamp, far enough from the ends of i64 that `t ± tolerance` does not overflow.
fn timestamp() -> impl Strategy<Value = i64> {
    prop_oneof![
        1_000_000_000i64..4_000_000_000,
        -(1i64 << 60)..(1i64 << 60),
        Just(0i64),
    ]
}

/// Strings built from the pieces a `Stripe-Signature` header is made of, so that the parser sees
/// many near-valid headers and not only noise.
fn header_like() -> impl Strategy<Value = String> {
    let fragment = prop_oneof![
        Just("t=".to_owned()),
        Just("v1=".to_owned()),
        Just("v0=".to_owned()),
        Just(",".to_owned()),
        Just("=".to_owned()),
        Just(" ".to_owned()),
        Just("-".to_owned()),
        Just("+".to_owned()),
        Just("\t".to_owned()),
        "[0-9]{1,20}",
        "[0-9a-fA-F]{0,66}",
        "[a-z0-9_]{1,4}=",
        "\\PC{1,4}",
        any::<i64>().prop_map(|n| n.to_string()),
    ];
    vec(fragment, 0..40).prop_map(|parts| parts.concat())
}

/// Any string a header could hold: noise, header-like text, or text around the length limit.
fn any_header() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => any::<String>(),
        8 => header_like(),
        1 => (MAX_SIGNATURE_HEADER_BYTES - 8..MAX_SIGNATURE_HEADER_BYTES + 8)
            .prop_map(|len| format!("t=1,v1={}", "a".repeat(len.saturating_sub(7)))),
        1 => ("\\PC{0,3}", 1000..1400usize).prop_map(|(unit, n)| unit.repeat(n)),
    ]
}

/// Object keys: mostly names the parsers look for, sometimes anything.
const KNOWN_KEYS: &[&str] = &[
    "id",
    "type",
    "data",
    "object",
    "amount",
    "amount_total",
    "amount_refunded",
    "currency",
    "metadata",
    "order_id",
    "client_reference_id",
    "payment_intent",
    "payment_status",
    "receipt_email",
    "customer_details",
    "billing_details",
    "email",
    "last_payment_error",
    "payment_method",
    "status_code",
    "gross_amount",
    "signature_key",
    "transaction_status",
    "fraud_status",
    "refund_amount",
    "refunds",
    "refund_key",
    "refund_chargeback_id",
    "created_at",
];

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => select(KNOWN_KEYS).prop_map(str::to_owned),
        1 => "\\PC{0,8}",
    ]
}

fn json_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from), // non-finite becomes null
        select(vec![0i64, -1, 1, i64::MIN, i64::MAX]).prop_map(Value::from),
    ]
}

/// Any JSON value, nested a few levels.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        json_number(),
        "\\PC{0,16}".prop_map(Value::String),
        amount_text().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..8).prop_map(Value::Array),
            btree_map(key(), inner, 0..8).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Decimal amounts as Midtrans writes them, plus near misses and overflowing ones.
fn amount_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9]{1,6}\\.[0-9]{2}",
        "[0-9]{1,25}(\\.[0-9]{0,3})?",
        "[-+ ]?[0-9.,e]{0,8}",
    ]
}

/// A value for a field the parser reads: usually one of the expected type, sometimes anything.
fn text_or_anything() -> impl Strategy<Value = Value> {
    prop_oneof![
        12 => "\\PC{0,12}".prop_map(Value::String),
        1 => Just(Value::String(String::new())),
        1 => json_value(),
    ]
}

/// A Stripe amount (an integer in minor units), usually well-typed.
fn stripe_amount() -> impl Strategy<Value = Value> {
    prop_oneof![
        8 => (-1i64..10_000_000).prop_map(Value::from),
        1 => json_number(),
        1 => amount_text().prop_map(Value::String),
        1 => json_value(),
    ]
}

/// A Midtrans text field (`status_code`, `gross_amount`, ...): a string, sometimes a number.
fn midtrans_text() -> impl Strategy<Value = Value> {
    prop_oneof![
        6 => amount_text().prop_map(Value::String),
        2 => "[0-9]{3}".prop_map(Value::String),
        2 => json_number(),
        1 => json_value(),
    ]
}

/// An object holding some of `fields` (each present with probability `presence`), each with a
/// value from its strategy.
fn object_of(
    presence: f64,
    fields: Vec<(&'static str, BoxedStrategy<Value>)>,
) -> BoxedStrategy<Value> {
    let entries: Vec<BoxedStrategy<Option<(&'static str, Value)>>> = fields
        .into_iter()
        .map(|(name, strategy)| {
            proptest::option::weighted(presence, strategy.prop_map(move |v| (name, v))).boxed()
        })
        .collect();
    entries
        .prop_map(|entries| {
            let map: Map<String, Value> = entries
                .into_iter()
                .flatten()
                .map(|(k, v)| (k.to_owned(), v))
                .collect();
            Value::Object(map)
        })
        .boxed()
}

fn contact() -> BoxedStrategy<Value> {
    prop_oneof![
        6 => object_of(0.8, vec![("email", text_or_anything().boxed())]),
        1 => json_value(),
    ]
    .boxed()
}

const STRIPE_TYPES: &[&str] = &[
    "payment_intent.succeeded",
    "payment_intent.processing",
    "payment_intent.payment_failed",
    "checkout.session.completed",
    "checkout.session.async_payment_succeeded",
    "checkout.session.async_payment_failed",
    "charge.refunded",
    "charge.dispute.created",
    "charge.",
    "customer.created",
    "",
];

/// A Stripe event with the shape sekali reads and arbitrary values in every field.
fn stripe_event_shaped() -> impl Strategy<Value = Value> {
    let object = object_of(
        0.8,
        vec![
            ("id", text_or_anything().boxed()),
            ("amount", stripe_amount().boxed()),
            ("amount_total", stripe_amount().boxed()),
            ("amount_refunded", stripe_amount().boxed()),
            ("currency", text_or_anything().boxed()),
            (
                "metadata",
                prop_oneof![
                    6 => object_of(0.8, vec![("order_id", text_or_anything().boxed())]),
                    1 => json_value(),
                ]
                .boxed(),
            ),
            ("client_reference_id", text_or_anything().boxed()),
            (
                "payment_intent",
                prop_oneof![
                    3 => text_or_anything(),
                    1 => object_of(0.8, vec![("id", text_or_anything().boxed())]),
                ]
                .boxed(),
            ),
            (
                "payment_status",
                prop_oneof![
                    select(vec!["paid", "unpaid", "no_payment_required"])
                        .prop_map(|s| Value::String(s.to_owned())),
                    text_or_anything(),
                ]
                .boxed(),
            ),
            ("receipt_email", text_or_anything().boxed()),
            ("customer_details", contact()),
            ("billing_details", contact()),
            (
                "last_payment_error",
                object_of(
                    0.8,
                    vec![(
                        "payment_method",
                        object_of(0.8, vec![("billing_details", contact())]),
                    )],
                ),
            ),
        ],
    );
    let kind = prop_oneof![
        8 => select(STRIPE_TYPES).prop_map(|s| Value::String(s.to_owned())),
        1 => json_value(),
    ];
    let id = prop_oneof![
        8 => "evt_[A-Za-z0-9]{0,24}".prop_map(Value::String),
        1 => json_value(),
    ];
    (id, kind, object, proptest::bool::weighted(0.9)).prop_map(|(id, kind, object, wrapped)| {
        let data = if wrapped {
            json!({ "object": object })
        } else {
            object
        };
        json!({ "id": id, "type": kind, "data": data })
    })
}

const MIDTRANS_STATUSES: &[&str] = &[
    "settlement",
    "capture",
    "pending",
    "deny",
    "cancel",
    "expire",
    "failure",
    "refund",
    "partial_refund",
    "authorize",
    "",
];

/// A Midtrans notification with the shape sekali reads and arbitrary values in every field.
fn midtrans_notification_shaped() -> impl Strategy<Value = Value> {
    let refund = object_of(
        0.8,
        vec![
            ("refund_key", text_or_anything().boxed()),
            ("refund_chargeback_id", midtrans_text().boxed()),
            ("refund_amount", midtrans_text().boxed()),
            (
                "created_at",
                prop_oneof![
                    "20[0-9]{2}-[01][0-9]-[0-3][0-9] [0-2][0-9]:[0-5][0-9]:[0-5][0-9]"
                        .prop_map(Value::String),
                    text_or_anything(),
                ]
                .boxed(),
            ),
        ],
    );
    let required = object_of(
        0.95,
        vec![
            ("order_id", text_or_anything().boxed()),
            ("status_code", midtrans_text().boxed()),
            ("gross_amount", midtrans_text().boxed()),
            ("signature_key", text_or_anything().boxed()),
        ],
    );
    let optional = object_of(
        0.6,
        vec![
            (
                "transaction_status",
                prop_oneof![
                    4 => select(MIDTRANS_STATUSES).prop_map(|s| Value::String(s.to_owned())),
                    1 => text_or_anything(),
                ]
                .boxed(),
            ),
            (
                "fraud_status",
                prop_oneof![
                    select(vec!["accept", "challenge", "deny", ""])
                        .prop_map(|s| Value::String(s.to_owned())),
                    text_or_anything(),
                ]
                .boxed(),
            ),
            ("transaction_id", text_or_anything().boxed()),
            ("currency", text_or_anything().boxed()),
            ("refund_amount", midtrans_text().boxed()),
            (
                "refunds",
                prop_oneof![
                    6 => vec(refund, 0..6).prop_map(Value::Array),
                    1 => json_value(),
                ]
                .boxed(),
            ),
            ("customer_details", contact()),
        ],
    );
    (required, optional, proptest::bool::weighted(0.9)).prop_map(|(required, optional, status)| {
        let mut fields = required.as_object().cloned().unwrap_or_default();
        fields.extend(optional.as_object().cloned().unwrap_or_default());
        if status && !fields.contains_key("transaction_status") {
            fields.insert("transaction_status".into(), json!("settlement"));
        }
        Value::Object(fields)
    })
}

/// The bytes of `value`, compact or pretty.
fn encoded(value: &Value, pretty: bool) -> Vec<u8> {
    if pretty {
        serde_json::to_vec_pretty(value).unwrap()
    } else {
        serde_json::to_vec(value).unwrap()
    }
}

/// Runs every parser on `bytes`; the point is that none of them panics.
fn parse_everything(bytes: &[u8]) {
    let _ = parse_event(bytes);
    if let Ok(notification) = parse_notification(bytes) {
        let _ = notification.derived_event_id();
        let _ = notification.refunded_amount();
        let _ = verify_midtrans_signature(
            &notification,
            &SecretString::from("SB-Mid-server-x".to_owned()),
        );
        let _ = notification.normalise();
    }
    for registration in REGISTRY {
        let _ = read_stored(registration.name, "settlement", bytes);
    }
}

// ---------------------------------------------------------------------------------------------
// Stripe: signatures
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn a_body_signed_with_a_secret_verifies_with_that_secret(
        body in body(),
        secret in secret(),
        t in timestamp(),
        skew in -(TOLERANCE as i64)..=(TOLERANCE as i64),
    ) {
        let header = signature_header(&[&secret], t, &body);
        prop_assert_eq!(
            verify_stripe_signature(Some(&header), &body, &secrets(&[&secret]), t + skew, TOLERANCE),
            Ok(())
        );
    }

    #[test]
    fn flipping_any_single_bit_of_the_body_is_rejected(
        body in non_empty_body(),
        secret in secret(),
        t in timestamp(),
        at in any::<Index>(),
        bit in 0u8..8,
    ) {
        let header = signature_header(&[&secret], t, &body);
        let mut tampered = body.clone();
        tampered[at.index(body.len())] ^= 1 << bit;
        prop_assert_eq!(
            verify_stripe_signature(Some(&header), &tampered, &secrets(&[&secret]), t, TOLERANCE),
            Err(SignatureError::NoMatchingSignature)
        );
    }

    #[test]
    fn flipping_any_single_bit_of_the_signature_is_rejected(
        body in body(),
        secret in secret(),
        t in timestamp(),
        bit in 0usize..256,
        upper_case in any::<bool>(),
    ) {
        let mut signature = hex::decode(compute_signature(&secret, t, &body)).unwrap();
        prop_assert_eq!(signature.len(), 32);
        signature[bit / 8] ^= 1 << (bit % 8);
        let hex_sig = if upper_case {
            hex::encode_upper(&signature)
        } else {
            hex::encode(&signature)
        };
        let header = format!("t={t},v1={hex_sig}");
        prop_assert_eq!(
            verify_stripe_signature(Some(&header), &body, &secrets(&[&secret]), t, TOLERANCE),
            Err(SignatureError::NoMatchingSignature)
        );
    }

    #[test]
    fn a_signature_made_with_another_secret_is_rejected(
        body in body(),
        signer in secret(),
        configured in secret(),
        t in timestamp(),
    ) {
        prop_assume!(signer != configured);
        let header = signature_header(&[&signer], t, &body);
        prop_assert_eq!(
            verify_stripe_signature(Some(&header), &body, &secrets(&[&configured]), t, TOLERANCE),
            Err(SignatureError::NoMatchingSignature)
        );
    }

    #[test]
    fn a_signature_for_another_timestamp_is_rejected(
        body in body(),
        secret in secret(),
        t in timestamp(),
        shift in prop_oneof![-(TOLERANCE as i64)..0, 1..=(TOLERANCE as i64)],
    ) {
        // The timestamp is covered by the signature: rewriting `t` inside the tolerance window
        // does not keep the old signature valid.
        let signature = compute_signature(&secret, t, &body);
        let header = format!("t={},v1={signature}", t + shift);
        prop_assert_eq!(
            verify_stripe_signature(Some(&header), &body, &secrets(&[&secret]), t, TOLERANCE),
            Err(SignatureError::NoMatchingSignature)
        );
    }

    #[test]
    fn a_valid_signature_outside_the_tolerance_is_rejected_as_stale(
        body in vec(any::<u8>(), 0..256),
        secret in secret(),
        t in timestamp(),
        distance in (TOLERANCE as i64 + 1)..1_000_000,
        future in any::<bool>(),
    ) {
        let header = signature_header(&[&secret], t, &body);
        let now = if future { t - distance } else { t + distance };
        prop_assert_eq!(
            verify_stripe_signature(Some(&header), &body, &secrets(&[&secret]), now, TOLERANCE),
            Err(SignatureError::TimestampOutsideTolerance { tolerance_secs: TOLERANCE })
        );
    }

    #[test]
    fn any_one_of_several_configured_secrets_signing_is_accepted(
        body in vec(any::<u8>(), 0..1024),
        configured in vec(secret(), 1..6),
        signer in any::<Index>(),
        stranger in secret(),
        t in timestamp(),
        rotation in any::<bool>(),
    ) {
        let signer = &configured[signer.index(configured.len())];
        // During a rotation Stripe sends one v1 per active secret; here an unknown secret's
        // signature comes first, so acceptance cannot depend on the matching v1 being first.
        let header = if rotation {
            signature_header(&[&stranger, signer], t, &body)
        } else {
            signature_header(&[signer], t, &body)
        };
        let configured: Vec<&str> = configured.iter().map(String::as_str).collect();
        prop_assert_eq!(
            verify_stripe_signature(Some(&header), &body, &secrets(&configured), t, TOLERANCE),
            Ok(())
        );
    }

    #[test]
    fn a_generated_header_parses_back_to_its_timestamp_and_signatures(
        body in vec(any::<u8>(), 0..256),
        signers in vec(secret(), 1..6),
        t in any::<i64>(),
    ) {
        let signers: Vec<&str> = signers.iter().map(String::as_str).collect();
        let header = signature_header(&signers, t, &body);
        let parsed = parse_signature_header(&header).unwrap();
        prop_assert_eq!(parsed.timestamp, t);
        let expected: Vec<String> =
            signers.iter().map(|s| compute_signature(s, t, &body)).collect();
        prop_assert_eq!(parsed.v1, expected);
    }
}

// ---------------------------------------------------------------------------------------------
// Stripe: the header parser never panics
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(2048))]

    #[test]
    fn the_header_parser_never_panics_on_arbitrary_strings(header in any_header()) {
        if let Ok(parsed) = parse_signature_header(&header) {
            prop_assert!(!parsed.v1.is_empty());
            prop_assert!(header.len() <= MAX_SIGNATURE_HEADER_BYTES);
        }
    }

    #[test]
    fn verification_never_panics_on_arbitrary_headers_and_never_accepts_them(
        header in any_header(),
        body in vec(any::<u8>(), 0..64),
        now in any::<i64>(),
        tolerance in prop_oneof![Just(TOLERANCE), any::<u64>()],
    ) {
        let configured = secrets(&["whsec_property_test"]);
        let verdict = verify_stripe_signature(Some(&header), &body, &configured, now, tolerance);
        prop_assert!(verdict.is_err(), "accepted {:?}", header);
        let _ = verify_stripe_signature(None, &body, &configured, now, tolerance);
        let _ = verify_stripe_signature(Some(&header), &body, &[], now, tolerance);
    }
}

// ---------------------------------------------------------------------------------------------
// Event parsers never panic
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn the_event_parsers_never_panic_on_arbitrary_bytes(bytes in vec(any::<u8>(), 0..2048)) {
        parse_everything(&bytes);
    }

    #[test]
    fn the_event_parsers_never_panic_on_arbitrary_json(value in json_value(), pretty in any::<bool>()) {
        parse_everything(&encoded(&value, pretty));
    }

    #[test]
    fn the_event_parsers_never_panic_on_truncated_or_corrupted_json(
        value in stripe_event_shaped(),
        cut in any::<Index>(),
        at in any::<Index>(),
        byte in any::<u8>(),
    ) {
        let bytes = encoded(&value, false);
        parse_everything(&bytes[..cut.index(bytes.len() + 1)]);
        let mut corrupted = bytes.clone();
        corrupted[at.index(bytes.len())] = byte;
        parse_everything(&corrupted);
    }

    #[test]
    fn stripe_parse_event_never_panics_on_event_shaped_json(
        value in stripe_event_shaped(),
        pretty in any::<bool>(),
    ) {
        let bytes = encoded(&value, pretty);
        parse_everything(&bytes);
        if let Ok(event) = parse_event(&bytes) {
            prop_assert_eq!(Some(event.event_id.as_str()), value["id"].as_str());
            prop_assert!(!event.event_id.is_empty());
        }
    }

    #[test]
    fn midtrans_parse_notification_never_panics_on_notification_shaped_json(
        value in midtrans_notification_shaped(),
        pretty in any::<bool>(),
    ) {
        let bytes = encoded(&value, pretty);
        parse_everything(&bytes);
        if let Ok(notification) = parse_notification(&bytes) {
            prop_assert!(!notification.order_id.is_empty());
            let event = notification.normalise();
            // The id's first part is the order id, escaped, and it splits back into exactly
            // the parts it was made of: no two notifications with different parts share an id.
            let parts = unescaped_parts(&event.event_id);
            prop_assert_eq!(parts[0].as_str(), value["order_id"].as_str().unwrap());
            prop_assert_eq!(parts[1].as_str(), value["transaction_status"].as_str().unwrap());
        }
    }

    #[test]
    fn midtrans_derived_ids_split_back_into_their_parts(
        parts in proptest::collection::vec("[a-z:\\\\]{0,6}", 3..6),
        deny in any::<bool>(),
    ) {
        // Build a notification whose id parts are `parts` (order id, status, code, fraud...),
        // with, when there are five, a partial refund's key as the last part, or for a deny the
        // transaction it is for.
        let status = if deny { "deny" } else { "partial_refund" };
        let mut value = serde_json::json!({
            "order_id": format!("o{}", parts[0]),
            "transaction_status": status,
            "status_code": parts[1],
            "gross_amount": "1.00",
            "signature_key": "",
        });
        if parts.len() > 3 {
            value["fraud_status"] = format!("f{}", parts[3]).into();
        }
        if parts.len() > 4 && deny {
            value["transaction_id"] = format!("k{}", parts[4]).into();
        } else if parts.len() > 4 {
            value["refunds"] = serde_json::json!([{"refund_key": format!("k{}", parts[4]), "refund_amount": "1.00"}]);
        }
        let notification = parse_notification(&serde_json::to_vec(&value).unwrap()).unwrap();
        let id = notification.normalise().event_id;
        let mut expected = vec![
            format!("o{}", parts[0]),
            status.to_owned(),
            parts[1].clone(),
        ];
        if parts.len() > 3 {
            expected.push(format!("f{}", parts[3]));
        }
        if parts.len() > 4 {
            expected.push(format!("k{}", parts[4]));
        }
        prop_assert_eq!(unescaped_parts(&id), expected);
    }
}

/// Splits a derived Midtrans id at its unescaped `:` and undoes the escaping of each part (the
/// test's own reading of the documented form: `\\` and `\:` inside a part).
fn unescaped_parts(id: &str) -> Vec<String> {
    let mut parts = vec![String::new()];
    let mut chars = id.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => parts.last_mut().unwrap().extend(chars.next()),
            ':' => parts.push(String::new()),
            other => parts.last_mut().unwrap().push(other),
        }
    }
    parts
}

#[test]
fn the_event_parsers_never_panic_on_deeply_nested_json() {
    for depth in [127, 128, 129, 10_000, 100_000] {
        let arrays = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        parse_everything(arrays.as_bytes());
        let objects = format!("{}1{}", "{\"data\":".repeat(depth), "}".repeat(depth));
        parse_everything(objects.as_bytes());
        let unclosed = "{\"id\":\"evt\",\"data\":{\"object\":".to_owned() + &"[".repeat(depth);
        parse_everything(unclosed.as_bytes());
    }
}

// ---------------------------------------------------------------------------------------------
// Midtrans: signature_key
// ---------------------------------------------------------------------------------------------

/// Either a JSON string or, where it can be, the same text as a JSON number (Midtrans' fields are
/// strings, but sekali also accepts numbers and signs over their text).
fn signed_field(text: String, as_number: bool) -> Value {
    if as_number {
        if let Ok(n) = text.parse::<u64>() {
            // Only where the number's text is the same text ("007" would become "7").
            if n.to_string() == text {
                return Value::from(n);
            }
        }
    }
    Value::String(text)
}

fn signed_notification(
    order_id: &str,
    status_code: Value,
    gross_amount: Value,
    key: &str,
) -> Vec<u8> {
    let body = json!({
        "order_id": order_id,
        "status_code": status_code,
        "gross_amount": gross_amount,
        "transaction_status": "settlement",
        "signature_key": "",
    });
    with_signature_key(&serde_json::to_vec(&body).unwrap(), key).unwrap()
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn a_notification_signed_by_with_signature_key_verifies(
        order_id in "\\PC{1,40}",
        status_code in prop_oneof!["[0-9]{3}", "\\PC{0,8}"],
        gross_amount in prop_oneof![amount_text(), "\\PC{0,20}"],
        numbers in any::<bool>(),
        key in "\\PC{1,64}",
    ) {
        let body = signed_notification(
            &order_id,
            signed_field(status_code.clone(), numbers),
            signed_field(gross_amount.clone(), numbers),
            &key,
        );
        let notification = parse_notification(&body).unwrap();
        prop_assert_eq!(
            notification.signature_key.as_str(),
            compute_signature_key(&order_id, &status_code, &gross_amount, &key)
        );
        prop_assert_eq!(
            verify_midtrans_signature(&notification, &SecretString::from(key.clone())),
            Ok(())
        );
    }

    #[test]
    fn a_gross_amount_sent_as_a_json_number_is_verified_over_its_digits_as_sent(
        order_id in "\\PC{1,40}",
        digits in "-?(0|[1-9][0-9]{0,24})(\\.[0-9]{1,4})?([eE][-+]?[0-9]{1,3})?",
        key in "\\PC{1,64}",
    ) {
        let signature = compute_signature_key(&order_id, "200", &digits, &key);
        let body = format!(
            r#"{{"order_id":{},"status_code":"200","gross_amount":{digits},"transaction_status":"settlement","signature_key":"{signature}"}}"#,
            Value::String(order_id.clone()),
        );
        let notification = parse_notification(body.as_bytes()).unwrap();
        prop_assert_eq!(notification.gross_amount.as_text(), digits.as_str());
        prop_assert_eq!(
            verify_midtrans_signature(&notification, &SecretString::from(key)),
            Ok(())
        );
    }

    #[test]
    fn changing_any_one_character_of_gross_amount_breaks_verification(
        order_id in "\\PC{1,40}",
        status_code in "[0-9]{3}",
        gross_amount in prop_oneof![amount_text(), "\\PC{1,20}"].prop_filter("has a character", |s| !s.is_empty()),
        at in any::<Index>(),
        replacement in any::<char>(),
        key in "\\PC{1,64}",
    ) {
        let chars: Vec<char> = gross_amount.chars().collect();
        let at = at.index(chars.len());
        prop_assume!(chars[at] != replacement);
        let mut changed = chars.clone();
        changed[at] = replacement;
        let changed: String = changed.into_iter().collect();

        let body = signed_notification(&order_id, json!(status_code), json!(gross_amount), &key);
        let mut value: Value = serde_json::from_slice(&body).unwrap();
        value["gross_amount"] = Value::String(changed);
        let notification = parse_notification(&serde_json::to_vec(&value).unwrap()).unwrap();
        prop_assert_eq!(
            verify_midtrans_signature(&notification, &SecretString::from(key)),
            Err(sekali::providers::midtrans::SignatureError::Mismatch)
        );
    }

    #[test]
    fn a_notification_signed_with_another_server_key_is_rejected(
        order_id in "\\PC{1,40}",
        gross_amount in amount_text(),
        signer in "\\PC{1,64}",
        configured in "\\PC{1,64}",
    ) {
        prop_assume!(signer != configured);
        let body = signed_notification(&order_id, json!("200"), json!(gross_amount), &signer);
        let notification = parse_notification(&body).unwrap();
        prop_assert_eq!(
            verify_midtrans_signature(&notification, &SecretString::from(configured)),
            Err(sekali::providers::midtrans::SignatureError::Mismatch)
        );
    }
}
