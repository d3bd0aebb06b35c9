//! Amounts are integers in minor units everywhere past the edge.

/// Parses a decimal amount as Midtrans sends it (`"10000.00"`, `"10000"`, `"10000.5"`) into
/// minor units (hundredths): `"10000.00"` → `1000000`. Exact: no floating point on the way.
pub fn parse_decimal_minor_units(text: &str) -> Option<i64> {
    let text = text.trim();
    let (whole, frac) = match text.split_once('.') {
        Some((whole, frac)) => (whole, frac),
        None => (text, ""),
    };
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if frac.len() > 2 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole: i64 = whole.parse().ok()?;
    let frac: i64 = match frac.len() {
        0 => 0,
        1 => frac.parse::<i64>().ok()? * 10,
        _ => frac.parse().ok()?,
    };
    whole.checked_mul(100)?.checked_add(frac)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_strings_become_hundredths() {
        assert_eq!(parse_decimal_minor_units("10000.00"), Some(1_000_000));
        assert_eq!(parse_decimal_minor_units("10000"), Some(1_000_000));
        assert_eq!(parse_decimal_minor_units("0.5"), Some(50));
        assert_eq!(parse_decimal_minor_units("12.34"), Some(1234));
    }

    #[test]
    fn anything_else_is_rejected_rather_than_guessed() {
        for bad in [
            "",
            ".5",
            "1.234",
            "-1.00",
            "1e5",
            "abc",
            "1,000.00",
            "99999999999999999999",
        ] {
            assert_eq!(parse_decimal_minor_units(bad), None, "{bad}");
        }
    }
}
