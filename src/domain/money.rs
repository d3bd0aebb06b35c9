//! Money. Past the edge every amount is an integer in minor units, and its currency says how many
//! decimals those units have: ISO 4217's exponent (JPY 0, USD 2, BHD 3) unless the provider's own
//! units differ (Stripe's table, in `providers::stripe`). The order keeps the exponent its
//! provider gave it (`orders.amount_exponent`).
//!
//! People read amounts through CLDR, the Unicode locale data: `¥5,000`, `$15.00`, `BHD 1.500`,
//! `Rp 150.000`. Symbols, grouping, decimals and where the symbol goes come from ICU4X's currency
//! formatter, not from a table kept here.

use icu_experimental::dimension::currency::formatter::CurrencyFormatter as CldrCurrencyFormatter;
use icu_experimental::dimension::currency::CurrencyType;

/// ICU4X's formatter of currency amounts in full (not compact) decimal notation.
type CurrencyFormatter = CldrCurrencyFormatter<icu_decimal::DecimalFormatter>;

/// Decimals of `currency`'s minor unit under ISO 4217 (`iso_currency`'s data): JPY 0, IDR 2,
/// BHD 3. A code ISO does not know, or one without minor units (XAU), counts as 2: the common
/// case, and what sekali assumed for every currency before it knew better.
pub fn iso_exponent(currency: &str) -> u32 {
    iso_currency::Currency::from_code(&currency.to_ascii_uppercase())
        .and_then(|c| c.exponent())
        .map_or(2, u32::from)
}

/// True when ISO 4217 knows `currency` (in any case: `usd`, `IDR`).
pub fn is_iso_currency(currency: &str) -> bool {
    iso_currency::Currency::from_code(&currency.to_ascii_uppercase()).is_some()
}

/// Parses a decimal amount as Midtrans sends it (`"10000.00"`, `"10000"`, `"10000.5"`) into minor
/// units with `exponent` decimals: `"10000.00"` at 2 is `1000000`. Exact: no floating point on
/// the way. More decimals than the currency has are refused rather than rounded.
pub fn parse_decimal_minor_units(text: &str, exponent: u32) -> Option<i64> {
    let text = text.trim();
    let (whole, frac) = match text.split_once('.') {
        Some((whole, frac)) => (whole, frac),
        None => (text, ""),
    };
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if frac.len() > exponent as usize || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let scale = 10i64.checked_pow(exponent)?;
    let whole: i64 = whole.parse().ok()?;
    let frac: i64 = if frac.is_empty() {
        0
    } else {
        let digits: i64 = frac.parse().ok()?;
        digits * 10i64.pow(exponent - frac.len() as u32)
    };
    whole.checked_mul(scale)?.checked_add(frac)
}

/// An amount as people read it in `locale` (`en`, `id`): `¥5,000`, `$15.00`, `BHD 1.500`,
/// `Rp 150.000` (CLDR puts a no-break space between a code or `Rp` and the number, so the two
/// never part at a line break). `minor` is in units of `exponent` decimals. A currency CLDR does not know is
/// written as its code and the plain number (`XTS 12.34`).
pub fn format_amount(minor: i64, currency: &str, exponent: u32, locale: &str) -> String {
    let code = currency.to_ascii_uppercase();
    let decimal_text = decimal_text(minor, exponent);
    let formatted = with_formatter(locale, &code, |formatter| {
        let decimal: fixed_decimal::Decimal = decimal_text.parse().ok()?;
        let text = formatter.format_fixed_decimal(&decimal).to_string();
        Some(text)
    });
    formatted.unwrap_or_else(|| format!("{code} {decimal_text}"))
}

/// A formatter is kept per thread for each locale and currency it was asked for: loading one
/// from CLDR's data costs more than the rest of an email's rendering. `None` for a locale or
/// currency CLDR does not know.
fn with_formatter(
    locale: &str,
    code: &str,
    format: impl FnOnce(&CurrencyFormatter) -> Option<String>,
) -> Option<String> {
    type Formatters = std::collections::HashMap<(String, String), Option<CurrencyFormatter>>;
    thread_local! {
        static FORMATTERS: std::cell::RefCell<Formatters> = Default::default();
    }
    /// Two locales times the currencies a shop takes; past this, a hostile stream of made-up
    /// codes starts the cache over rather than growing it.
    const KEPT: usize = 512;
    FORMATTERS.with_borrow_mut(|formatters| {
        let key = (locale.to_owned(), code.to_owned());
        if formatters.len() >= KEPT && !formatters.contains_key(&key) {
            formatters.clear();
        }
        let formatter = formatters.entry(key).or_insert_with(|| {
            let locale: icu_locale::Locale = locale.parse().ok()?;
            let currency = CurrencyType::try_from_str(code).ok()?;
            CldrCurrencyFormatter::try_new_symbol(locale.into(), currency, Default::default()).ok()
        });
        format(formatter.as_ref()?)
    })
}

/// `minor` with `exponent` decimals as plain decimal text: `(150050, 2)` is `1500.50`.
fn decimal_text(minor: i64, exponent: u32) -> String {
    let sign = if minor < 0 { "-" } else { "" };
    let digits = minor.unsigned_abs().to_string();
    let exponent = exponent as usize;
    if exponent == 0 {
        return format!("{sign}{digits}");
    }
    let padded = format!("{digits:0>width$}", width = exponent + 1);
    let (whole, frac) = padded.split_at(padded.len() - exponent);
    format!("{sign}{whole}.{frac}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_strings_become_minor_units_of_the_currencys_exponent() {
        assert_eq!(parse_decimal_minor_units("10000.00", 2), Some(1_000_000));
        assert_eq!(parse_decimal_minor_units("10000", 2), Some(1_000_000));
        assert_eq!(parse_decimal_minor_units("0.5", 2), Some(50));
        assert_eq!(parse_decimal_minor_units("12.34", 2), Some(1234));
        assert_eq!(parse_decimal_minor_units("5000", 0), Some(5000));
        assert_eq!(parse_decimal_minor_units("1.5", 3), Some(1500));
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
            assert_eq!(parse_decimal_minor_units(bad, 2), None, "{bad}");
        }
        assert_eq!(parse_decimal_minor_units("5000.5", 0), None);
    }

    #[test]
    fn iso_exponents_come_from_iso_4217() {
        assert_eq!(iso_exponent("JPY"), 0);
        assert_eq!(iso_exponent("jpy"), 0);
        assert_eq!(iso_exponent("IDR"), 2);
        assert_eq!(iso_exponent("usd"), 2);
        assert_eq!(iso_exponent("BHD"), 3);
        assert_eq!(iso_exponent("KWD"), 3);
        assert_eq!(iso_exponent("ISK"), 0);
        assert_eq!(iso_exponent("ZZZ"), 2);
    }

    #[test]
    fn amounts_are_written_as_people_of_the_locale_read_them() {
        assert_eq!(format_amount(5000, "JPY", 0, "en"), "¥5,000");
        assert_eq!(format_amount(1500, "usd", 2, "en"), "$15.00");
        assert_eq!(format_amount(123_456_789, "USD", 2, "en"), "$1,234,567.89");
        assert_eq!(format_amount(1500, "BHD", 3, "en"), "BHD\u{a0}1.500");
        assert_eq!(format_amount(5, "EUR", 2, "en"), "€0.05");
        assert_eq!(format_amount(1500, "SGD", 2, "en"), "SGD\u{a0}15.00");
        assert_eq!(format_amount(15_000_000, "IDR", 2, "id"), "Rp\u{a0}150.000");
        assert_eq!(format_amount(1500, "XTS", 2, "en"), "XTS\u{a0}15.00");
        assert_eq!(
            format_amount(1500, "not a code", 2, "en"),
            "NOT A CODE 15.00"
        );
    }

    #[test]
    fn decimal_text_places_the_point_by_the_exponent() {
        assert_eq!(decimal_text(150_050, 2), "1500.50");
        assert_eq!(decimal_text(5, 2), "0.05");
        assert_eq!(decimal_text(5000, 0), "5000");
        assert_eq!(decimal_text(-1500, 3), "-1.500");
    }
}
