//! Signature schemes checked against vectors computed independently with OpenSSL (the commands
//! are in the vector files).

use std::collections::HashMap;

use secrecy::SecretString;
use sekali::providers::{midtrans, stripe};

use crate::helpers::fixture;

fn vector(name: &str) -> HashMap<String, String> {
    String::from_utf8(fixture(&format!("kat/{name}")))
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap();
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

#[test]
fn stripe_signature_matches_the_openssl_vector() {
    let v = vector("stripe_signature.txt");
    let body = fixture(&v["body"]);
    let timestamp: i64 = v["timestamp"].parse().unwrap();
    assert_eq!(
        stripe::compute_signature(&v["secret"], timestamp, &body),
        v["v1"]
    );
    let header = format!("t={timestamp},v1={}", v["v1"]);
    let secrets = [SecretString::from(v["secret"].clone())];
    assert_eq!(
        stripe::verify_stripe_signature(Some(&header), &body, &secrets, timestamp, 300),
        Ok(())
    );
}

#[test]
fn midtrans_signature_key_matches_the_openssl_vector_and_the_fixture() {
    let v = vector("midtrans_signature.txt");
    let computed = midtrans::compute_signature_key(
        &v["order_id"],
        &v["status_code"],
        &v["gross_amount"],
        &v["server_key"],
    );
    assert_eq!(computed, v["signature_key"]);
    let notification = midtrans::parse_notification(&fixture("midtrans/settlement.json")).unwrap();
    assert_eq!(
        notification.signature_key, v["signature_key"],
        "the committed fixture carries it"
    );
    let key = SecretString::from(v["server_key"].clone());
    assert_eq!(
        midtrans::verify_midtrans_signature(&notification, &key),
        Ok(())
    );
}
